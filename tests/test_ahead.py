"""Weights loaded ahead (``kernelgen.ahead``): a chained kernel's weight loads from DDR move into
the GB during an earlier kernel's idle DDR time, with the same values and fewer cycles."""

from dataclasses import replace

import numpy as np
from helpers import ddr, lb, make_program

from tvm_dsa import hardware
from tvm_dsa.isa import Dma, Operand, TensorArg, Vector, validate
from tvm_dsa.kernelgen import ahead as ahead_pass
from tvm_dsa.kernelgen.ahead import IDLE_SHARE, loaded_ahead
from tvm_dsa.runtime import simulate
from tvm_dsa.runtime.timing import simulate_program

HW = hardware.get("stcp920")
N = 16384  # float16 elements of the weight: 32 KiB
X, W, T, Y = 0, 4096, 4096 + 2 * N, 8192 + 2 * N  # DDR offsets of x, w, the kernels' scratch, y
ROWS, COLUMNS = 64, N // 64  # the weight's shape where each core loads half of its columns
G = 1 << 20  # where kernel 1 promotes the weight in each GB


def _program(busy_ops: int, writes_weight: bool = False, columns: bool = False, halves=(0, 1),
             promoted: bool = False):
    """Kernel 0: core 0 loads ``x`` (256 values), runs ``busy_ops`` additions over 8192 values of
    its LB (DDR idle) and stores ``x`` to the scratch ``t``. Kernel 1 (chained): cores 0 and 8 (two clusters)
    each load the weight ``w`` from DDR, add ``t`` to its first 256 values and store them into
    their half of ``y``. With ``writes_weight`` kernel 0 also overwrites ``w``'s first values; with
    ``columns`` the weight is ``ROWS`` x ``COLUMNS`` and each core loads half of its columns (of
    ``halves``: which cores take part); with ``promoted`` each cluster's DMA promotes the weight
    into its GB (one multicast) and the cores load it from there."""
    f16 = "float16"
    first = [Dma(0, (256,), lb(0, f16, 1), ddr(X, f16, 1))]
    for n in range(busy_ops):
        first.append(Vector(0, "vme", "add", (8192,), lb(4096, f16, 1), (lb(4096, f16, 1), 1.0),
                            deps=(len(first) - 1,)))
    first.append(Dma(0, (256,), ddr(T, f16, 1), lb(0, f16, 1), deps=(len(first) - 1,)))
    if columns or promoted:  # a core of the second cluster busy too: its DMA queue may copy into its GB
        first += [Vector(8, "vme", "add", (8192,), lb(4096, f16, 1, core=8), (lb(4096, f16, 1, core=8), 1.0))]
    if writes_weight:
        first.append(Dma(0, (256,), ddr(W, f16, 1), lb(0, f16, 1), deps=(len(first) - 1,)))
    second = []
    for half, core in [(h, 8 * h) for h in halves]:
        at = len(second)
        load = (Dma(core, (ROWS, COLUMNS // 2), lb(0, f16, COLUMNS // 2, 1, core=core),
                    ddr(W + half * COLUMNS, f16, COLUMNS, 1)) if columns else
                Dma(core, (N,), lb(0, f16, 1, core=core), ddr(W, f16, 1), multicast=True))
        if promoted:
            second.append(Dma(core, (N,), Operand("gb", half, G, f16, (1,)), ddr(W, f16, 1), multicast=True))
            load, at = replace(load, src=Operand("gb", half, G, f16, (1,)), deps=(at,), multicast=False), at + 1
        second += [load,
                   Dma(core, (256,), lb(2 * N, f16, 1, core=core), ddr(T, f16, 1)),
                   Vector(core, "vme", "add", (256,), lb(0, f16, 1, core=core),
                          (lb(0, f16, 1, core=core), lb(2 * N, f16, 1, core=core)), deps=(at, at + 1)),
                   Dma(core, (256,), ddr(Y + 512 * half, f16, 1), lb(0, f16, 1, core=core), deps=(at + 2,))]
    args = [TensorArg("x", "input", (256,), f16, f16, X),
            TensorArg("w", "input", (ROWS, COLUMNS) if columns else (N,), f16, f16, W),
            TensorArg("y", "output", (512,), f16, f16, Y)]
    program = make_program([first, second], args, Y + 1024)
    return replace(program, kernels=(program.kernels[0], replace(program.kernels[1], chained=True)))


def _inputs():
    rng = np.random.default_rng(0)
    return [rng.standard_normal(256).astype(np.float16), rng.standard_normal(N).astype(np.float16)]



def _assert_same_values(program, ahead):
    """``ahead`` computes what ``program`` does (one weight, not in columns): w[:256] + x."""
    x, w = _inputs()
    expected = simulate(program, [x, w]).outputs[0]
    np.testing.assert_array_equal(simulate(ahead, [x, w]).outputs[0], expected)
    np.testing.assert_array_equal(expected[:256], (w[:256].astype(np.float32) + x).astype(np.float16))

def test_a_weight_is_copied_into_a_gb_while_the_kernel_before_computes():
    program = _program(busy_ops=40)
    ahead = loaded_ahead(program, [])
    validate(ahead)
    before, after = simulate_program(program, HW), simulate_program(ahead, HW)  # dependency tokens checked
    copies = [i for i in ahead.kernels[0].instructions if type(i) is Dma and i.dst.mem == "gb"]
    assert sum(i.shape[0] for i in copies) == 2 * N  # the weight's bytes (copied as bytes), into one GB
    assert {(i.src.mem, i.dst.index) for i in copies} == {("ddr", copies[0].dst.index)}
    loads = [i for i in ahead.kernels[1].instructions if type(i) is Dma and i.shape == (N,)]
    assert [(i.src.mem, i.src.index, i.src.offset) for i in loads] == [("gb", copies[0].dst.index,
                                                                       copies[0].dst.offset)] * 2
    # the second kernel reads the weight at the GB port's rate, not DDR's; the first is no longer
    assert after.kernels[1].cycles < before.kernels[1].cycles
    assert after.kernels[0].cycles == before.kernels[0].cycles
    assert after.cycles < before.cycles
    _assert_same_values(program, ahead)


def test_a_copy_waits_for_the_instruction_that_ends_as_ddr_goes_idle():
    ahead = loaded_ahead(_program(busy_ops=40), [])
    first = ahead.kernels[0].instructions
    copy = next(n for n, i in enumerate(first) if type(i) is Dma and i.dst.mem == "gb")
    (dep,) = first[copy].deps
    assert first[dep] == _program(busy_ops=40).kernels[0].instructions[0]  # the load of x: DDR idles after it
    assert [m.name for m in ahead.kernels[0].layers] == ["promote"]


def test_no_copy_where_ddr_has_no_time_to_spare_or_the_weight_is_written():
    short = _program(busy_ops=1)  # DDR idles fewer cycles than a copy of the weight takes
    timing = simulate_program(short, HW).kernels[0]
    assert timing.cycles < 2 * N / HW.ddr_bytes_per_cycle / IDLE_SHARE
    assert loaded_ahead(short, []) is short
    written = _program(busy_ops=40, writes_weight=True)
    assert loaded_ahead(written, []) is written


def test_the_columns_each_cluster_reads_are_copied_into_its_own_gb():
    program = _program(busy_ops=40, columns=True)
    ahead = loaded_ahead(program, [])
    validate(ahead)
    before, after = simulate_program(program, HW), simulate_program(ahead, HW)
    copies = [i for i in ahead.kernels[0].instructions if type(i) is Dma and i.dst.mem == "gb"]
    # one box a cluster: its columns of every row, packed in its own GB
    assert sorted((i.dst.index, i.src.offset % (2 * COLUMNS), i.src.strides, i.dst.strides) for i in copies) == sorted(
        {(c, W % (2 * COLUMNS) + c * COLUMNS, (COLUMNS, 1), (COLUMNS // 2, 1)) for c in (0, 1)})
    assert sum(np.prod(i.shape) for i in copies) == N
    loads = [i for i in ahead.kernels[1].instructions if type(i) is Dma and i.shape == (ROWS, COLUMNS // 2)]
    assert [(i.src.mem, i.src.index, i.src.strides) for i in loads] == [("gb", 0, (COLUMNS // 2, 1)),
                                                                       ("gb", 1, (COLUMNS // 2, 1))]
    assert after.kernels[1].cycles < before.kernels[1].cycles
    x, w = _inputs()
    expected = simulate(program, [x, w.reshape(ROWS, COLUMNS)]).outputs[0]
    np.testing.assert_array_equal(simulate(ahead, [x, w.reshape(ROWS, COLUMNS)]).outputs[0], expected)
    halves = w.reshape(ROWS, COLUMNS)[:2].reshape(2, 2, COLUMNS // 2).transpose(1, 0, 2).reshape(2, 256)
    np.testing.assert_array_equal(expected, (halves.astype(np.float32) + x).astype(np.float16).reshape(-1))


def test_the_columns_one_cluster_reads_are_copied_without_the_others():
    program = _program(busy_ops=40, columns=True, halves=(1,))
    ahead = loaded_ahead(program, [])
    (copy,) = [i for i in ahead.kernels[0].instructions if type(i) is Dma and i.dst.mem == "gb"]
    assert (copy.dst.index, copy.src.offset, copy.shape) == (1, W + COLUMNS, (ROWS, COLUMNS // 2))
    x, w = _inputs()
    np.testing.assert_array_equal(simulate(ahead, [x, w.reshape(ROWS, COLUMNS)]).outputs[0],
                                  simulate(program, [x, w.reshape(ROWS, COLUMNS)]).outputs[0])


def test_a_weight_promoted_into_the_gbs_is_copied_there_while_the_kernel_before_computes():
    program = _program(busy_ops=40, promoted=True)
    ahead = loaded_ahead(program, [])
    validate(ahead)
    before, after = simulate_program(program, HW), simulate_program(ahead, HW)  # dependency tokens checked
    copies = [i for i in ahead.kernels[0].instructions if type(i) is Dma and i.dst.mem == "gb"]
    # the weight's bytes into both GBs, one place, read from DDR once (a multicast)
    assert {(i.src.mem, i.dst.index, i.multicast) for i in copies} == {("ddr", 0, True), ("ddr", 1, True)}
    assert sum(i.shape[0] for i in copies) == 2 * 2 * N
    assert len({i.dst.offset for i in copies if i.src.offset == W}) == 1
    place = next(i.dst.offset for i in copies if i.src.offset == W)
    second = ahead.kernels[1].instructions
    assert not [i for i in second if type(i) is Dma and i.dst.mem == "gb"]  # the promotions are gone
    loads = [i for i in second if type(i) is Dma and i.shape == (N,)]
    assert [(i.src.mem, i.src.index, i.src.offset) for i in loads] == [("gb", 0, place), ("gb", 1, place)]
    assert after.kernels[1].cycles < before.kernels[1].cycles
    assert after.cycles < before.cycles
    _assert_same_values(program, ahead)


def test_a_copy_for_a_later_kernel_is_not_taken_for_a_promotion_of_the_kernel_it_sits_in(monkeypatch):
    """Three kernels, each computing while DDR idles; kernel 1 and kernel 2 each load a weight of
    their own. Taking the readers last first, kernel 2's weight is copied ahead first, into
    kernel 1's idle stretch; kernel 1's weight then goes into kernel 0's. The copy in kernel 1 is
    no promotion of kernel 1 (nothing there reads it): taken out, kernel 2 read a GB place never
    written (a random graph's attention block, seed 1108, went wrong so). Both orders of the
    readers are tried (``ahead._moved``), each checked here, and the faster kept."""
    f16, n = "float16", 4096
    w1, w2, y = 8192, 8192 + 2 * n, 8192 + 4 * n

    def busy(core: int, ops: int) -> list:
        return [Vector(core, "vme", "add", (8192,), lb(40960, f16, 1, core=core), (lb(40960, f16, 1, core=core), 1.0))
                for _ in range(ops)]

    first = busy(0, 40) + busy(8, 40)
    waits = busy(0, 40)  # for kernel 1's weight: its load is worth moving
    second = [Dma(0, (n,), lb(0, f16, 1), ddr(w1, f16, 1)), replace(waits[0], deps=(0,))] + waits[1:] + busy(8, 40)
    second.append(Dma(0, (256,), ddr(y, f16, 1), lb(0, f16, 1), deps=(0,)))
    third = [Dma(8, (n,), lb(0, f16, 1, core=8), ddr(w2, f16, 1)),
             Dma(8, (256,), ddr(y + 512, f16, 1), lb(0, f16, 1, core=8), deps=(0,))]
    args = [TensorArg("w1", "input", (n,), f16, f16, w1), TensorArg("w2", "input", (n,), f16, f16, w2),
            TensorArg("y", "output", (512,), f16, f16, y)]
    program = make_program([first, second, third], args, y + 1024)
    program = replace(program, kernels=(program.kernels[0], *(replace(k, chained=True) for k in program.kernels[1:])))
    tried = []
    moved = ahead_pass._moved
    monkeypatch.setattr(ahead_pass, "_moved", lambda *a: tried.append(moved(*a)) or tried[-1])
    ahead = loaded_ahead(program, [])
    assert len(tried) == 2 and simulate_program(ahead, HW).cycles == min(
        simulate_program(replace(program, kernels=tuple(k)), HW).cycles for k, _ in tried)
    rng = np.random.default_rng(2)
    weights = [rng.standard_normal(n).astype(np.float16) for _ in range(2)]
    for each in [ahead] + [replace(program, kernels=tuple(k)) for k, _ in tried]:
        validate(each)
        simulate_program(each, HW)  # dependency tokens checked
        out = simulate(each, weights).outputs[0]
        np.testing.assert_array_equal(out, simulate(program, weights).outputs[0])
        np.testing.assert_array_equal(out, np.concatenate([weights[0][:256], weights[1][:256]]))
    copies = [(k, i) for k, kernel in enumerate(ahead.kernels) for i in kernel.instructions
              if type(i) is Dma and i.dst.mem == "gb"]
    assert sorted((k, i.src.offset) for k, i in copies) == [(0, w1), (1, w2)]
