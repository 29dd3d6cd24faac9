"""Scratch kept in the GBs (``kernelgen.resident``): the DDR bytes a launch's kernels write and read
back move into one GB place, every transfer of them rewritten alike, with the same values and
fewer cycles; bytes read before any transfer writes them stay in DDR."""

from dataclasses import replace

import numpy as np
from helpers import ddr, lb, make_program

from tvm_dsa import hardware
from tvm_dsa.isa import Dma, Kernel, Operand, TensorArg, Vector, stuck_multicasts, validate
from tvm_dsa.kernelgen.edits import plain_where_stuck
from tvm_dsa.kernelgen.resident import kept_in_gbs
from tvm_dsa.runtime import simulate
from tvm_dsa.runtime.timing import simulate_program

HW = hardware.get("stcp920")
N = 8192  # float16 values each of two cores writes of the scratch t
F16 = "float16"
X, Y, COPY, T, U = 0, 4 * N, 8 * N, 12 * N, 16 * N  # DDR offsets: x, y, the copy of t, t, u


def gb(off: int, cluster: int, *strides: int) -> Operand:
    return Operand("gb", cluster, off, F16, strides)


def _program(unwritten: bool = False, copied_by: int | None = None, promoted_by: int | None = None):
    """Kernel 0: cores 0 and 8 (clusters 0 and 1) load their halves of ``x`` and store them into
    the scratch ``t``. Kernel 1 (chained): each cluster's DMA promotes ``t`` into its GB (one
    multicast), core 0 adds its GB copy's first half to its LB and core 8 loads the second half
    of ``t`` straight from DDR; both store into ``y``. With ``promoted_by`` a core, its cluster's
    DMA also copies its GB copy of ``t`` to the output ``copy``. With ``unwritten``, core 0 also adds bytes
    ``u`` of the scratch nobody writes (zeros in DDR); with ``copied_by`` a core, its cluster's DMA
    copies ``t`` to the output ``copy`` in DDR."""
    first = []
    for half, core in enumerate((0, 8)):
        first += [Dma(core, (N,), lb(0, F16, 1, core=core), ddr(X + 2 * N * half, F16, 1)),
                  Dma(core, (N,), ddr(T + 2 * N * half, F16, 1), lb(0, F16, 1, core=core), deps=(len(first),))]
    second = [Dma(core, (2 * N,), gb(0, core // 8, 1), ddr(T, F16, 1), multicast=True) for core in (0, 8)]
    second += [Dma(0, (N,), lb(2 * N, F16, 1), gb(0, 0, 1), deps=(0,)),
               Vector(0, "vme", "add", (N,), lb(0, F16, 1), (lb(0, F16, 1), lb(2 * N, F16, 1)), deps=(2,))]
    if unwritten:
        second += [Dma(0, (N,), lb(2 * N, F16, 1), ddr(U, F16, 1), deps=(3,)),
                   Vector(0, "vme", "add", (N,), lb(0, F16, 1), (lb(0, F16, 1), lb(2 * N, F16, 1)),
                          deps=(len(second),))]
    second.append(Dma(0, (N,), ddr(Y, F16, 1), lb(0, F16, 1), deps=(len(second) - 1,)))
    second += [Dma(8, (N,), lb(0, F16, 1, core=8), ddr(T + 2 * N, F16, 1)),
               Dma(8, (N,), ddr(Y + 2 * N, F16, 1), lb(0, F16, 1, core=8), deps=(len(second),))]
    args = [TensorArg("x", "input", (2 * N,), F16, F16, X), TensorArg("y", "output", (2 * N,), F16, F16, Y)]
    if copied_by is not None:
        second.append(Dma(copied_by, (2 * N,), ddr(COPY, F16, 1), ddr(T, F16, 1)))
        args.append(TensorArg("copy", "output", (2 * N,), F16, F16, COPY))
    if promoted_by is not None:
        second.append(Dma(promoted_by, (2 * N,), ddr(COPY, F16, 1), gb(0, promoted_by // 8, 1),
                          deps=(promoted_by // 8,)))
        args.append(TensorArg("copy", "output", (2 * N,), F16, F16, COPY))
    program = make_program([first, second], args, U + 2 * N)
    return replace(program, kernels=(program.kernels[0], replace(program.kernels[1], chained=True)))


def _outputs(program):
    x = np.random.default_rng(0).standard_normal(2 * N).astype(np.float16)
    return simulate(program, [x]).outputs, x


def _scratch_operands(program) -> list:
    return [o for k in program.kernels for i in k.instructions if type(i) is Dma for o in (i.src, i.dst)
            if o.mem == "ddr" and o.offset >= T]


def test_a_tensor_between_two_kernels_stays_in_one_gb():
    program = _program()
    places: list = []
    kept, timing = kept_in_gbs(program, places)
    validate(kept)
    assert _scratch_operands(kept) == []  # no transfer of t touches DDR
    stores = [i for i in kept.kernels[0].instructions if i.dst.mem == "gb"]
    ((owner, at),) = {(i.dst.index, i.dst.offset - 2 * N * n) for n, i in enumerate(stores)}
    assert places == [(0, 1, at, at + 4 * N, owner)] and at >= 2 * N * 2  # above the GB bytes the kernels use
    # the promotions into each cluster's GB are dropped: core 0 loads the region itself, at once
    assert [i for i in kept.kernels[1].instructions if i.dst.mem == "gb"] == []
    load, direct = kept.kernels[1].instructions[0], kept.kernels[1].instructions[-2]
    assert (load.src.mem, load.src.index, load.src.offset, load.deps) == ("gb", owner, at, ())
    assert (direct.src.mem, direct.src.index, direct.src.offset) == ("gb", owner, at + 2 * N)
    after = simulate_program(kept, HW)  # dependency tokens checked
    assert after.cycles < simulate_program(program, HW).cycles
    assert timing.cycles == after.cycles  # the timing handed on to ``loaded_ahead`` is the kept program's
    (y,), x = _outputs(kept)
    np.testing.assert_array_equal(y, _outputs(program)[0][0])
    np.testing.assert_array_equal(y[:N], (x[:N].astype(np.float32) * 2).astype(np.float16))


def test_bytes_read_before_they_are_written_stay_in_ddr():
    program = _program(unwritten=True)
    kept, _ = kept_in_gbs(program, [])
    assert [o.offset for o in _scratch_operands(kept)] == [U]  # t moved, u (never written) did not
    np.testing.assert_array_equal(_outputs(kept)[0][0], _outputs(program)[0][0])


def test_a_cluster_dma_copying_the_tensor_to_ddr_keeps_it_in_its_own_gb():
    program = _program(copied_by=8)
    kept, _ = kept_in_gbs(program, [])
    validate(kept)
    copy = kept.kernels[1].instructions[-1]
    assert (copy.src.mem, copy.src.index, copy.dst.mem) == ("gb", 1, "ddr")  # cluster 1's DMA: its GB
    assert {i.dst.index for i in kept.kernels[0].instructions if i.dst.mem == "gb"} == {1}
    y, copied = _outputs(kept)[0]
    np.testing.assert_array_equal(copied, _outputs(program)[0][1])
    np.testing.assert_array_equal(y, _outputs(program)[0][0])


def test_a_promotion_a_cluster_dma_copies_on_to_ddr_stays():
    """A cluster DMA reaches DDR from its own GB only: the copy it makes out of its GB copy of the
    region cannot read the region in another GB, so that cluster's promotion stays; the other
    cluster's, read only by a core's load, goes."""
    program = _program(promoted_by=8)
    kept, _ = kept_in_gbs(program, [])
    validate(kept)
    promotions = [i for i in kept.kernels[1].instructions if i.dst.mem == "gb"]
    assert [(i.src.mem, i.dst.index) for i in promotions] == [("gb", 1)]
    assert kept.kernels[1].instructions[-1].src == gb(0, 1, 1)  # the copy out reads the promotion's copy
    y, copied = _outputs(kept)[0]
    np.testing.assert_array_equal(copied, _outputs(program)[0][1])
    np.testing.assert_array_equal(y, _outputs(program)[0][0])


def test_a_promotion_with_gaps_stays_where_a_read_within_its_extent_reads_them():
    """Copied into the GB with gaps (every other run of 64 values: an exchange's halo rows), a
    region's copy is read by a load spanning the gaps, which the core filled itself: that load
    cannot read the region instead, and the copy stays (values as the original program's)."""
    program = _program()
    second = list(program.kernels[1].instructions)
    runs = (N // 64, 64)  # the first half of t as runs of 64 values, every other one copied
    second[0] = replace(second[0], shape=runs, src=Operand("ddr", 0, T, F16, (128, 1)),
                        dst=gb(0, 0, 128, 1), multicast=False)
    second[1] = replace(second[1], shape=runs, src=Operand("ddr", 0, T, F16, (128, 1)),
                        dst=gb(0, 1, 128, 1), multicast=False)
    fill = Dma(0, runs, gb(128, 0, 128, 1), lb(4 * N, F16, 64, 1), deps=(0,))  # the gaps, from core 0's LB
    second = [second[0], second[1], fill] + [
        replace(i, deps=tuple(d + 1 if d >= 2 else d for d in i.deps) + ((2,) if n == 0 else ()))
        for n, i in enumerate(second[2:])]
    program = replace(program, kernels=(program.kernels[0], replace(program.kernels[1], instructions=tuple(second))))
    kept, _ = kept_in_gbs(program, [])
    validate(kept)
    assert [(i.src.mem, i.dst.index) for i in kept.kernels[1].instructions
            if i.dst.mem == "gb" and i.src.mem == "gb"] == [("gb", 0), ("gb", 1)]
    np.testing.assert_array_equal(_outputs(kept)[0][0], _outputs(program)[0][0])


def test_an_edit_that_pairs_loads_across_each_others_queues_leaves_them_plain():
    """``edits.plain_where_stuck``, which the launch passes run on every kernel they edit: cores 0
    and 1 load GB boxes X and Y to the same LB places, core 0 X then Y, core 1 Y then X (as a
    re-sourced load can come to pair with another cluster's, layers on): each load's transfer
    waits for a partner behind the other, and they are made plain; a pair behind them that meets
    stays one transfer. A kernel with nothing stuck is returned as it is."""
    cpc = hardware.get("stcp920").cores_per_cluster

    def load(core, offset, place):
        return Dma(core, (4096,), lb(place, "float16", 1, core=core), Operand("gb", 0, offset, "float16", (1,)),
                   multicast=True)

    x0, y0, x1, y1, z0, z1 = load(0, 0, 0), load(0, 1 << 14, 1 << 13), load(1, 0, 0), load(1, 1 << 14, 1 << 13), \
        load(0, 1 << 15, 1 << 14), load(1, 1 << 15, 1 << 14)
    crossed = Kernel("crossed", (0, 1), (x0, y0, y1, x1, z0, z1))
    assert stuck_multicasts(list(crossed.instructions), cpc) == {0, 1, 2, 3}
    fixed = plain_where_stuck(crossed, cpc)
    assert [i.multicast for i in fixed.instructions] == [False] * 4 + [True] * 2
    assert stuck_multicasts(list(fixed.instructions), cpc) == set()
    met = Kernel("met", (0, 1), (x0, y0, x1, y1))
    assert plain_where_stuck(met, cpc) is met
