"""A tensor kept in the GBs in bands (``kernelgen.banded``): each cluster's rows in its own GB, a
load across two bands cut into one per band, the same values, fewer cycles than kept whole."""

from dataclasses import replace

import numpy as np
from helpers import ddr, lb, make_program

from tvm_dsa import hardware
from tvm_dsa.isa import Dma, TensorArg, validate
from tvm_dsa.kernelgen.resident import kept_in_gbs
from tvm_dsa.runtime import simulate
from tvm_dsa.runtime.timing import simulate_program

HW = hardware.get("stcp920")
F16 = "float16"
C, H, W = 32, 16, 64  # the tensor t between the kernels: (1, C, H, W), rows H split over two clusters
STRIDES = (C * H * W, H * W, W, 1)
SIZE = C * H * W * 2
X, Y0, Y1, T = 0, SIZE, 2 * SIZE, 3 * SIZE  # DDR offsets: x, the outputs, t


def _rows(off: int, first: int) -> object:
    return ddr(off + first * W * 2, F16, *STRIDES)


def _program():
    """Kernel 0: core 0 (cluster 0) copies rows 0-7 of ``x`` into ``t``, core 8 (cluster 1) rows
    8-15. Kernel 1 (chained): core 0 loads rows 0-8 of ``t`` (one row of cluster 1's) and stores
    them as ``y0``, core 8 rows 7-15 as ``y1``."""
    half = (1, C, H // 2, W)
    into = lb(0, F16, C * H // 2 * W, H // 2 * W, W, 1)
    first = []
    for n, core in enumerate((0, 8)):
        at = replace(into, index=core)
        first += [Dma(core, half, at, _rows(X, 8 * n)),
                  Dma(core, half, _rows(T, 8 * n), at, deps=(len(first),))]
    window = (1, C, 9, W)
    second = []
    for core, row, out in ((0, 0, Y0), (8, 7, Y1)):
        at = lb(0, F16, C * 9 * W, 9 * W, W, 1, core=core)
        second += [Dma(core, window, at, _rows(T, row)),
                   Dma(core, window, ddr(out, F16, C * 9 * W, 9 * W, W, 1), at, deps=(len(second),))]
    args = [TensorArg("x", "input", (1, C, H, W), F16, F16, X),
            TensorArg("y0", "output", window, F16, F16, Y0), TensorArg("y1", "output", window, F16, F16, Y1)]
    program = make_program([first, second], args, T + SIZE)
    return replace(program, kernels=(program.kernels[0], replace(program.kernels[1], chained=True)))


def test_each_cluster_keeps_its_rows_in_its_own_gb_and_a_load_across_two_bands_is_cut():
    program = _program()
    tensors = (TensorArg("t", "output", (1, C, H, W), F16, F16, T),)
    places: list = []
    kept, timing = kept_in_gbs(program, places, tensors)
    validate(kept)
    stores = [i for i in kept.kernels[0].instructions if i.dst.mem != "lb"]
    assert [(i.core, i.dst.mem, i.dst.index) for i in stores] == [(0, "gb", 0), (8, "gb", 1)]
    band = C * H // 2 * W * 2
    assert sorted((p[0], p[1], p[3] - p[2], p[4]) for p in places) == [(0, 1, band, 0), (0, 1, band, 1)]
    loads = [(n, i) for n, i in enumerate(kept.kernels[1].instructions) if i.dst.mem == "lb"]
    assert [(i.core, i.src.index, i.shape[2]) for _, i in loads] == [(0, 0, 8), (0, 1, 1), (8, 0, 1), (8, 1, 8)]
    assert [i.deps for i in kept.kernels[1].instructions if i.dst.mem == "ddr"] == [(0, 1), (3, 4)]
    whole, _ = kept_in_gbs(program, [])  # kept in one GB
    assert {i.dst.index for i in whole.kernels[0].instructions if i.dst.mem == "gb"} == {0}
    assert timing.cycles == simulate_program(kept, HW).cycles < simulate_program(whole, HW).cycles  # hazards checked
    x = np.random.default_rng(0).standard_normal((1, C, H, W)).astype(np.float16)
    y0, y1 = simulate(kept, [x]).outputs
    np.testing.assert_array_equal(y0, x[:, :, :9])
    np.testing.assert_array_equal(y1, x[:, :, 7:])
