"""A contraction whose stride skips rows (a 1x1 stride-2 convolution) loads only the rows it reads:
the tile's input box in the LB is R rows (of whole columns), filled by a DMA whose source steps
over the skipped rows (``tir_passes.strided``)."""

import math

import numpy as np
import pytest
from helpers import HW, fuse, random_args, relax_graph, run_llvm
from tvm import relax, tirx

from tvm_dsa import isa
from tvm_dsa.emit.emitter import build_program
from tvm_dsa.runtime import simulate
from tvm_dsa.tir_passes import lower_with_plan
from tvm_dsa.tir_passes.strided import compact_strided_windows
from tvm_dsa.tir_passes.tile import TilePlan, simplify_indices

C, H, K = 16, 12, 32  # input channels, input rows (= columns), output channels


def kernel(**conv):
    op = relax.op
    mod = fuse(relax_graph([(1, C, H, H), (K, C, *conv.pop("window", (1, 1)))],
                           lambda x, w: op.nn.relu(op.nn.conv2d(x, w, **conv))))
    (func,) = [f for _, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)]
    return func


def input_loads(program, window=1):
    """The DMAs into an LB but those of the weights (16 output x 8 input channels x the window)."""
    kern = program.expanded().kernels[0]
    ins = [i for i in kern.instructions if isinstance(i, isa.Dma) and i.dst.mem == "lb" and i.src.mem == "ddr"]
    return [i for i in ins if math.prod(i.shape) != 16 * 8 * window]


@pytest.mark.parametrize("simplified", [False, True])
def test_a_1x1_stride_2_tile_loads_only_the_rows_it_reads(rng, simplified):
    """Output tile: 16 channels x 2 rows x 6 columns, input chunks of 8 channels. The tile reads
    input rows 4t, 4t+2 and columns 0, 2, ..., 10: each chunk's load is 8 x 2 x 11 pixels (it was
    8 x 3 x 11, rows 4t..4t+2), the source stepping 2 rows of 12 and over contiguous columns (a
    DDR burst holds many); and the kernel computes what llvm does. Also where the indices were
    simplified first (the tiling search lowers that form: a batch of one indexed 0)."""
    func = kernel(strides=2)
    check_loads(rng, func, simplify_indices(func) if simplified else func, [8, 2, 11], [H * H, 2 * H, 1])


def test_from_the_gb_a_1x1_stride_2_tile_loads_only_the_pixels_it_reads(rng):
    """With the input in the GB (``on_chip`` position 0), where a load's cost is its bytes, the
    columns are compacted too: each chunk's load is 8 x 2 x 6 pixels, the source stepping 2
    columns and 2 rows of 12."""
    func = kernel(strides=2)
    check_loads(rng, func, simplify_indices(func, frozenset({0})), [8, 2, 6], [H * H, 2 * H, 2])


def check_loads(rng, func, compacted, box, steps):
    """``compacted`` (``func`` compacted) in tiles of 16 channels x 2 rows x 6 columns, chunks of
    8 channels: 2 x 3 x 2 input loads of ``box`` whose source walks with ``steps``; the program
    computes what llvm does."""
    lowered = lower_with_plan(compacted, TilePlan((1, 16, 2, 6), 8))
    program = build_program(lowered, HW, "conv1x1s2")
    isa.validate(program)
    loads = input_loads(program)
    assert len(loads) == 2 * 3 * 2
    for dma in loads:
        assert [n for n in dma.shape if n > 1] == box and math.prod(dma.shape) == math.prod(box)
        assert [s for n, s in zip(dma.shape, dma.src.strides) if n > 1] == steps
    args = random_args(func, rng)
    ref = run_llvm(func, args)
    np.testing.assert_array_equal(run_llvm(lowered, args), ref)
    out = simulate(program, args[:-1]).outputs[0]
    np.testing.assert_allclose(out, ref, rtol=1e-2, atol=5e-3 * max(np.abs(ref).max(), 1))


def test_only_windows_that_skip_pixels_are_compacted():
    """A 3x3 stride-2 window reads every row, a stride-1 1x1 too: the kernel stays as it is. A
    2x2 window of stride 3 skips one row in three: the rows are split by 3, the columns stay."""
    for conv in (dict(strides=2, padding=1, window=(3, 3)), dict(strides=1)):
        func = kernel(**conv)
        assert compact_strided_windows(func) is func
    compact = compact_strided_windows(kernel(strides=3, window=(2, 2)))
    shapes = [tuple(int(n) for n in b.shape) for b in compact.body.block.alloc_buffers]
    assert (1, C, H // 3, 3, H) in shapes


def test_a_window_narrower_than_its_stride_computes_what_llvm_does(rng):
    """2x2 window, stride 3: a 4 x 4 output in tiles of 16 channels x 2 x 3 (the second column
    tile clamped back onto the first's last column), chunks of 8 input channels: 2 x 2 x 2 x 2
    loads, each of the 2 window rows of 2 output rows, over the 8 columns 3 windows span."""
    func = kernel(strides=3, window=(2, 2))
    lowered = lower_with_plan(func, TilePlan((1, 16, 2, 3), 8))
    args = random_args(func, rng)
    ref = run_llvm(func, args)
    np.testing.assert_array_equal(run_llvm(lowered, args), ref)
    program = build_program(lowered, HW, "conv2x2s3")
    isa.validate(program)
    out = simulate(program, args[:-1]).outputs[0]
    np.testing.assert_allclose(out, ref, rtol=1e-2, atol=5e-3 * max(np.abs(ref).max(), 1))
    loads = input_loads(program, 4)
    assert len(loads) == 16
    for dma in loads:  # 8 channels x 2 output rows x 2 window rows x 8 columns
        assert math.prod(dma.shape) == 8 * 2 * 2 * 8
        assert [s for n, s in zip(dma.shape, dma.src.strides) if n > 1] == [H * H, 3 * H, H, 1]
