"""Every zoo model (tiny configuration) compiled for the DSA with each schedule: numerics against
llvm, the MAC accounting against the model's own count, and the share of MACs the DSA executes."""

import numpy as np
import pytest
import tvm
from helpers import by_tiny_model, tiny_llvm_output
from tvm import relax
from tvm.relax.frontend import onnx as rx_onnx

import tvm_dsa
from tvm_dsa.models import TINY, example_inputs, get_model, macs


def _first(out):
    return (out if hasattr(out, "numpy") else out[0]).numpy()


@pytest.mark.parametrize("schedule", ["layerwise", "graphturbo"])
@pytest.mark.parametrize("name", by_tiny_model(sorted(TINY)))
def test_tiny_model_on_dsa(name, schedule):
    model = get_model(name, **TINY[name])
    args = [tvm.runtime.tensor(v) for v in example_inputs(model).values()]
    mod = rx_onnx.from_onnx(model, keep_params_in_input=False)
    ref = tiny_llvm_output(name)
    ex = tvm.compile(mod, target="dsa/stcp920", relax_pipeline=tvm_dsa.pipeline(schedule))
    result = tvm_dsa.pipeline_result()
    out = _first(relax.VirtualMachine(ex, tvm.cpu())["main"](*args))
    scale = max(np.abs(ref).max(), 1e-6)
    assert np.abs(out - ref).max() / scale < 2e-2, "DSA output differs from llvm beyond fp16 error"
    assert result.dsa_macs + result.host_macs == macs(model)
    assert result.dsa_macs >= 0.95 * macs(model), result.host
    report = tvm_dsa.last_report()
    # the MME executes the offloaded MACs but those of contractions on the vector units (a
    # depthwise conv), which take a multiply and an add of the lanes each
    on_mme = result.dsa_macs - result.vector_macs
    assert report.vector_lane_ops >= 2 * result.vector_macs
    if schedule == "layerwise":
        assert report.macs == on_mme  # what the simulator executed is what was offloaded
    else:  # stitched instances recompute halo tiles, within the recomputation limit
        from tvm_dsa.kernelgen.stitch import RECOMPUTE_LIMIT

        assert on_mme <= report.macs <= RECOMPUTE_LIMIT * on_mme


@pytest.mark.parametrize("schedule", ["layerwise", "graphturbo"])
def test_vit_with_197_tokens_runs_in_overlapping_tiles(schedule, monkeypatch):
    """ViT at 224 x 224 in patches of 16 has 197 tokens, a prime: layerwise, its kernels over the
    tokens are tiled in parts that overlap at the end (``ClampTiles``), graphturbo's stitched
    layers too. Both compute what llvm does."""
    from tvm_dsa import tir_passes
    from tvm_dsa.models.transformer import vit

    clamped, clamp = [], tir_passes.clamp_tiles

    def spy(func):
        out = clamp(func)
        if out is not func:
            clamped.append(out)
        return out

    monkeypatch.setattr(tir_passes, "clamp_tiles", spy)
    model = vit(batch=2, image=224, patch=16, layers=1, hidden=64, heads=4, mlp=256, num_classes=10)
    args = [tvm.runtime.tensor(v) for v in example_inputs(model).values()]
    mod = rx_onnx.from_onnx(model, keep_params_in_input=False)
    ref = _first(relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())["main"](*args))
    ex = tvm.compile(mod, target="dsa/stcp920", relax_pipeline=tvm_dsa.pipeline(schedule))
    out = _first(relax.VirtualMachine(ex, tvm.cpu())["main"](*args))
    assert clamped
    if schedule == "graphturbo":  # and the model ran in stitched kernels
        assert tvm_dsa.pipeline_result().stitched
    assert np.abs(out - ref).max() / np.abs(ref).max() < 5e-3
