"""Compile a small CNN for the DSA, run it on the simulator, check it against llvm, print the cost."""

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend import onnx as rx_onnx

import tvm_dsa
from tvm_dsa.models import TINY, example_inputs, get_model

name = "resnet18"
model = get_model(name, **TINY[name])
inputs = example_inputs(model)
mod = rx_onnx.from_onnx(model, keep_params_in_input=False)
args = [tvm.runtime.tensor(v) for v in inputs.values()]
ref = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())["main"](*args).numpy()
ex = tvm.compile(mod, target="dsa/stcp920", relax_pipeline="dsa")
out = relax.VirtualMachine(ex, tvm.cpu())["main"](*args).numpy()
err = np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-12)
result = tvm_dsa.pipeline_result()
print(f"{name} (tiny): max |dsa - llvm| / max|llvm| = {err:.2e}")
print(f"kernels on the DSA: {len(result.dsa)}, on the host: {len(result.host)}; "
      f"MACs on the DSA: {result.dsa_macs / max(result.dsa_macs + result.host_macs, 1):.1%}")
print(tvm_dsa.last_report())
