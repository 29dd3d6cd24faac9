"""FusePooling (relax_passes.pool_fusion): a pooling joins the convolution kernel before it where
the DSA runs the two as one kernel, the pooling its anchor and the convolution's rows computed per
tile in the LB (tir_passes.tile.find_anchor, kernel.ir's clipped producers)."""

import numpy as np
import pytest
import tvm
from helpers import fuse, random_args, run_llvm
from tvm import relax

from tvm_dsa import hardware, isa
from tvm_dsa.emit.emitter import build_program
from tvm_dsa.relax_passes.pool_fusion import FusePooling, is_pooling
from tvm_dsa.runtime import simulate
from tvm_dsa.tir_passes.tile import anchor_info
from tvm_dsa.tiling import lower_kernel

HW = hardware.get("stcp920")


def conv_pool_module(shape=(2, 3, 23, 20), also_return_conv=False) -> tvm.IRModule:
    """conv 3x3 (8 channels) + bias + ReLU, then a 3x3 max pooling, stride 2, padding 1."""
    op = relax.op
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    w = relax.Var("w", relax.TensorType((8, shape[1], 3, 3), "float32"))
    b = relax.Var("b", relax.TensorType((1, 8, 1, 1), "float32"))
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            conv = bb.emit(op.nn.relu(op.add(op.nn.conv2d(x, w, padding=1), b)))
            pool = bb.emit(op.nn.max_pool2d(conv, 3, 2, 1))
            out = bb.emit_output(relax.Tuple([pool, conv]) if also_return_conv else pool)
        bb.emit_func_output(out)
    return fuse(bb.get())


def kernels(mod):
    return {gv.name_hint: f for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}


def test_the_pooling_joins_the_convolution_as_the_anchor():
    mod = conv_pool_module()
    assert sorted(is_pooling(f) for f in kernels(mod).values()) == [False, True]
    fused = kernels(FusePooling(HW)(mod))
    assert len(fused) == 1
    (func,) = fused.values()
    info = anchor_info(func)
    assert info.kind.kind == "reduce" and info.spatial == (2, 8, 12, 10)  # the pooled output is tiled


def test_a_convolution_output_used_elsewhere_stays_apart():
    mod = conv_pool_module(also_return_conv=True)
    assert FusePooling(HW)(mod).same_as(mod)


# at 4096 bytes: the convolution's sums, bias and ReLU share one place (computed in place, within
# the chunk: ``ir._shared_places``), which leaves room for 4 rows where three places took 3
@pytest.mark.parametrize("lb_bytes,rows", [(None, 12), (4096, 4), (2048, 1)])
def test_the_fused_kernel_computes_its_rows_per_tile_like_llvm(rng, lb_bytes, rows):
    """A smaller LB splits the 12 pooled rows into tiles of ``rows``; each tile computes the 2 rows
    + 1 convolution rows its windows need (at the borders, rows past the edge it never reads),
    and only the kernel's parameters are DDR tensors: the convolution's output is never written."""
    (func,) = kernels(FusePooling(HW)(conv_pool_module())).values()
    lowered, plan = lower_kernel(func, HW, lb_bytes=lb_bytes)
    assert plan.tiles[2] == rows
    program = build_program(lowered, HW, "conv_pool")
    isa.validate(program)
    assert [a.name for a in program.args] == [p.name for p in func.params]
    args = random_args(func, rng)
    ref = run_llvm(func, args)
    out = simulate(program, args[:-1]).outputs[0]
    np.testing.assert_allclose(out, ref, rtol=1e-2, atol=5e-3 * np.abs(ref).max())
