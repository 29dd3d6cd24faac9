"""Issue 4's target on the dynamic models' executables: peak intermediate memory (what a VM run
allocates, ``vm_memory.measure``) at most half of Relax's default pipeline. Expected peaks are
derived from the shapes; outputs are checked against onnxruntime at every shape."""

import functools
import warnings

import numpy as np
import onnxruntime as ort
import pytest
import tvm
from helpers import aligned
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

import tvm_dsa
from tvm_dsa.harness import max_relative_error
from tvm_dsa.models.dynamic import DYNAMIC
from tvm_dsa.relax_passes.rdp_apply import ApplyRDP
from tvm_dsa.harness.vm_memory import measure

warnings.filterwarnings("ignore", module="tvm.relax.frontend.onnx")


@functools.lru_cache(maxsize=None)
def builds(name: str):
    """(the dsa build, Relax's default pipeline for llvm — with ApplyRDP first where Relax alone
    cannot build the model —, what the dsa build offloaded)."""
    mod = from_onnx(DYNAMIC[name](), keep_params_in_input=False)
    try:
        default = tvm.compile(mod, target="llvm")
    except tvm.error.InternalError:
        default = tvm.compile(ApplyRDP()(mod), target="llvm")
    dsa = tvm.compile(mod, target="dsa/stcp920", relax_pipeline="dsa")
    return relax.VirtualMachine(dsa, tvm.cpu()), relax.VirtualMachine(default, tvm.cpu()), tvm_dsa.pipeline_result()


def check(name: str, shape: tuple, expected_peak: int, rng) -> None:
    dsa, default, _ = builds(name)
    sess = ort.InferenceSession(DYNAMIC[name]().SerializeToString())
    x = rng.standard_normal(shape).astype(np.float32)
    ref = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    out = dsa["main"](tvm.runtime.tensor(x)).numpy()
    assert max_relative_error([out], [ref]) < 1e-2  # fp16 storage on the DSA
    peak = measure(dsa, "main", tvm.runtime.tensor(x)).peak
    assert peak == expected_peak
    assert peak <= measure(default, "main", tvm.runtime.tensor(x)).peak / 2


# shapes other than test_dynamic_dsa's, which expects new shapes to build new programs
@pytest.mark.parametrize("shape", [(1, 3, 12, 16), (2, 3, 13, 20), (1, 3, 9, 10)])
def test_cnn_peak_is_two_pooled_stem_outputs(shape, rng):
    """The stem's convolution and max pooling run as one kernel (``FusePooling``): its S bytes of
    output exist only as LB tiles. The peak is then the first residual block's: its input P (the
    pooled stem, 8 channels at half the height and width) and its first convolution's output P,
    the second convolution writing over the input (its residual add)."""
    batch, _, height, width = shape
    pooled = batch * 8 * ((height - 1) // 2 + 1) * ((width - 1) // 2 + 1) * 4
    check("cnn", shape, 2 * aligned(pooled), rng)
    pools = [k for k in builds("cnn")[2].dsa if "max_pool2d" in k]
    assert len(pools) == 1 and "conv2d" in pools[0]


@pytest.mark.parametrize("shape", [(1, 8, 64), (2, 16, 64), (3, 6, 64)])
def test_shape_chain_runs_in_one_activation(shape, rng):
    """The positional add reads its rows of the table directly (``GatherOfRangeAsSlice``), the two
    transposes around the softmax cancel (``CancelTransposePairs``), and the first linear layer,
    the softmax and the second linear layer each write over their input row by row (``PlanArena``,
    on the DSA): the run holds one [batch, seq, 64] activation, which ends as the result."""
    batch, seq, hidden = shape
    check("shape_chain", shape, aligned(batch * seq * hidden * 4), rng)
    assert all(why.startswith("a pure reshape") for why in builds("shape_chain")[2].host.values())  # views only
