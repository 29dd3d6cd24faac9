"""The simulator against independent references: numpy numerics, cycle formulas, byte counts."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace

import numpy as np
import pytest
from helpers import chain, ddr, f16, lb, make_program, mme_tile, preset, run_lb

from tvm_dsa import isa
from tvm_dsa.emit.emitter import KernelEmitter
from tvm_dsa.hardware.model import Hardware
from tvm_dsa.isa.instructions import multicast_groups
from tvm_dsa.isa import (
    Dma, Fill, LayerMark, Mme, Operand, Program, ProgramError, Reduce, TensorArg, Vector, disassemble, operands,
    validate,
)
from tvm_dsa.runtime import (
    HazardError, Report, compute_cycles, dma_demand, instruction_cycles, simulate, write_trace,
)
from tvm_dsa.runtime.cost import dma_cycles, mesh_route, vector_cycles
from tvm_dsa.runtime.functional import erf
from tvm_dsa.runtime.hazards import HazardTracker

HW = Hardware.from_dict(preset())
LAUNCH = HW.kernel_launch_cycles
DMA_LAT = HW.dma_latency_cycles


def events(result, name) -> list[dict]:
    return [e for e in result.trace_events if e["ph"] == "X" and e["name"] == name]


# -- numerics of each instruction class -----------------------------------------------------------

def test_dma_transpose_and_broadcast():
    x, v = f16(8, 24), f16(24, seed=1)
    body = [
        Dma(0, (24, 8), lb(4096, "float16", 8, 1), lb(0, "float16", 1, 24)),  # transpose
        Dma(0, (5, 24), lb(8192, "float16", 24, 1), lb(1024, "float16", 0, 1)),  # broadcast rows
    ]
    t, b = run_lb(body, [(0, x), (1024, v)], [(4096, (24, 8), "float16"), (8192, (5, 24), "float16")]).outputs
    np.testing.assert_array_equal(t, x.T)
    np.testing.assert_array_equal(b, np.broadcast_to(v, (5, 24)))


def test_fill_writes_only_its_box():
    x = f16(6, 16)
    body = [Fill(0, (3, 4), lb(2 * (16 + 2), "float16", 16, 1), 2.5)]  # rows 1..3, columns 2..5
    (out,) = run_lb(body, [(0, x)], [(0, (6, 16), "float16")]).outputs
    ref = x.copy()
    ref[1:4, 2:6] = 2.5
    np.testing.assert_array_equal(out, ref)


def test_mme_matmul_and_accumulate():
    m, n, k = 20, 40, 24
    a, b = f16(m, k), f16(k, n, seed=1)
    mm = Mme(0, (m, n, k), (False, False, True), lb(8192, "float32", n, 1, 0),
             lb(0, "float16", k, 0, 1), lb(4096, "float16", 0, 1, n))
    (once,) = run_lb([mm], [(0, a), (4096, b)], [(8192, (m, n), "float32")]).outputs
    (twice,) = run_lb([mm, replace(mm, accumulate=True)], [(0, a), (4096, b)], [(8192, (m, n), "float32")]).outputs
    ref = a.astype(np.float32) @ b.astype(np.float32)
    np.testing.assert_allclose(once, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(twice, 2 * ref, rtol=1e-5, atol=1e-5)


def test_mme_batched_matmul():
    bt, m, n, k = 3, 8, 16, 12
    a, b = f16(bt, m, k), f16(bt, k, n, seed=1)
    mm = Mme(0, (bt, m, n, k), (False, False, False, True), lb(16384, "float32", m * n, n, 1, 0),
             lb(0, "float16", m * k, k, 0, 1), lb(4096, "float16", k * n, 0, 1, n))
    (out,) = run_lb([mm], [(0, a), (4096, b)], [(16384, (bt, m, n), "float32")]).outputs
    np.testing.assert_allclose(out, np.matmul(a.astype(np.float32), b.astype(np.float32)), rtol=1e-5, atol=1e-5)
    assert compute_cycles(mm, HW) == bt * mme_tile(m, n, k)  # the batch dim is indexed by both operands


def test_mme_stride2_conv_through_window_strides():
    h = w = 9
    c, o, kh, kw, s = 4, 8, 3, 3, 2
    oh = ow = (h - kh) // s + 1
    x, wt = f16(h, w, c), f16(kh, kw, c, o, seed=1)
    conv = Mme(0, (oh, ow, o, kh, kw, c), (False, False, False, True, True, True),
               dst=lb(2048, "float32", ow * o, o, 1, 0, 0, 0),
               a=lb(0, "float16", s * w * c, s * c, 0, w * c, c, 1),  # overlapping windows
               b=lb(1024, "float16", 0, 0, 1, kw * c * o, c * o, o))
    r = run_lb([conv], [(0, x), (1024, wt)], [(2048, (oh, ow, o), "float32")])
    ref = np.zeros((oh, ow, o), np.float32)
    xf, wf = x.astype(np.float32), wt.astype(np.float32)
    for i in range(oh):
        for j in range(ow):
            for q in range(o):
                ref[i, j, q] = np.sum(xf[s * i:s * i + kh, s * j:s * j + kw, :] * wf[:, :, :, q])
    np.testing.assert_allclose(r.outputs[0], ref, rtol=1e-5, atol=1e-5)
    # M = oh*ow on the PE rows, N = o on the columns, K = kh*kw*c in time
    expected = mme_tile(oh * ow, o, kh * kw * c)
    assert compute_cycles(conv, HW) == expected
    assert r.report.busy["mme"] == expected


def test_vector_ops_on_vme_and_vec():
    n = 64
    x = np.linspace(-3, 3, n).astype(np.float32)
    y = np.random.default_rng(2).standard_normal(n).astype(np.float32)
    cond = (np.arange(n) % 3 == 0).astype(np.float32)
    src = lambda off: lb(off, "float32", 1)  # noqa: E731
    dst = lambda k: lb(4096 + 256 * k, "float32", 1)  # noqa: E731
    body = [
        Vector(0, "vme", "add", (n,), dst(0), (src(0), 1.5)),
        Vector(0, "vme", "relu", (n,), dst(1), (src(0),)),
        Vector(0, "vme", "div", (n,), dst(2), (src(0), src(256))),
        Vector(0, "vec", "erf", (n,), dst(3), (src(0),)),
        Vector(0, "vec", "tanh", (n,), dst(4), (src(0),)),
        Vector(0, "vec", "select", (n,), dst(5), (src(512), src(0), -7.0)),
        Vector(0, "vec", "lt", (n,), dst(6), (src(0), src(256))),
        Vector(0, "vec", "rsqrt", (n,), dst(7), (src(256),)),
    ]
    outs = run_lb(body, [(0, x), (256, y), (512, cond)], [(4096 + 256 * k, (n,), "float32") for k in range(8)]).outputs
    np.testing.assert_allclose(outs[0], x + 1.5, rtol=1e-6)
    np.testing.assert_array_equal(outs[1], np.maximum(x, 0))
    np.testing.assert_allclose(outs[2], x / y, rtol=1e-6)
    np.testing.assert_allclose(outs[3], [math.erf(v) for v in x.astype(np.float64)], atol=2e-7)
    np.testing.assert_allclose(outs[4], np.tanh(x), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(outs[5], np.where(cond != 0, x, -7.0))
    np.testing.assert_array_equal(outs[6], (x < y).astype(np.float32))
    with np.errstate(invalid="ignore"):
        np.testing.assert_allclose(outs[7], 1 / np.sqrt(y), rtol=1e-6)


def test_mac_multiplies_and_accumulates_in_place_at_two_lane_ops_an_element():
    """``mac(a, b, c) = a * b + c``, the product rounded to float32 first (a ``mul`` then an
    ``add``); one pass over the lanes (the cycles of a ``mul``), two lane operations of energy."""
    n = 64
    rng = np.random.default_rng(3)
    a, b, c = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    src = lambda off: lb(off, "float32", 1)  # noqa: E731
    body = [Vector(0, "vme", "mac", (n,), src(512), (src(0), src(256), src(512)))]
    r = run_lb(body, [(0, a), (256, b), (512, c)], [(512, (n,), "float32")])
    np.testing.assert_array_equal(r.outputs[0], (a * b) + c)
    assert r.report.vector_lane_ops == 2 * n
    assert compute_cycles(body[0], HW) == compute_cycles(Vector(0, "vme", "mul", (n,), src(512), (src(0), src(256))), HW)



def test_clip_clamps_in_one_pass_at_two_lane_ops_an_element():
    """``clip(a, lo, hi) = min(max(a, lo), hi)`` (a ReLU6 with immediates 0 and 6, or bounds
    read from the LB) in one pass over the lanes: a ``max``'s cycles, two lane operations."""
    n = 64
    rng = np.random.default_rng(4)
    a, lo, hi = rng.standard_normal(n).astype(np.float32) * 8, rng.standard_normal(n).astype(np.float32), \
        rng.standard_normal(n).astype(np.float32) + 1
    src = lambda off: lb(off, "float32", 1)  # noqa: E731
    body = [Vector(0, "vme", "clip", (n,), src(768), (src(0), 0.0, 6.0)),
            Vector(0, "vme", "clip", (n,), src(1024), (src(0), src(256), src(512)))]
    r = run_lb(body, [(0, a), (256, lo), (512, hi)], [(768, (n,), "float32"), (1024, (n,), "float32")])
    np.testing.assert_array_equal(r.outputs[0], np.minimum(np.maximum(a, 0), 6))
    np.testing.assert_array_equal(r.outputs[1], np.minimum(np.maximum(a, lo), hi))
    assert r.report.vector_lane_ops == 2 * 2 * n
    assert compute_cycles(body[0], HW) == compute_cycles(Vector(0, "vme", "max", (n,), src(768), (src(0), 0.0)), HW)

def test_erf_accuracy():
    x = np.linspace(-6, 6, 24001)
    assert np.max(np.abs(erf(x) - np.array([math.erf(v) for v in x]))) < 2e-7


def test_reduce_sum_and_max_accumulate():
    r, c = 6, 40
    x, y = f16(r, c), f16(r, c, seed=1)
    body = [
        Reduce(0, "vme", "sum", (r, c), (False, True), lb(8192, "float32", 1, 0), lb(0, "float16", c, 1)),
        Reduce(0, "vec", "max", (r, c), (False, True), lb(8448, "float32", 1, 0), lb(0, "float16", c, 1)),
        Reduce(0, "vec", "max", (r, c), (False, True), lb(8448, "float32", 1, 0), lb(4096, "float16", c, 1),
               accumulate=True),
        Reduce(0, "vme", "sum", (c, r), (False, True), lb(8704, "float32", 1, 0), lb(0, "float16", 1, c)),
    ]
    s, mx, cols = run_lb(body, [(0, x), (4096, y)],
                         [(8192, (r,), "float32"), (8448, (r,), "float32"), (8704, (c,), "float32")]).outputs
    xf, yf = x.astype(np.float32), y.astype(np.float32)
    np.testing.assert_allclose(s, xf.sum(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(mx, np.maximum(xf.max(1), yf.max(1)))
    np.testing.assert_allclose(cols, xf.sum(0), rtol=1e-5, atol=1e-6)


def test_results_round_to_fp16_nearest_even():
    x = np.array([1 + 2**-11, 1 + 3 * 2**-11, 65504 * 2, 1e-8], np.float32)  # ties, overflow, underflow
    body = [Vector(0, "vme", "copy", (4,), lb(256, "float16", 1), (lb(0, "float32", 1),))]
    (out,) = run_lb(body, [(0, x)], [(256, (4,), "float16")]).outputs
    np.testing.assert_array_equal(out, np.array([1.0, 1 + 2**-9, np.inf, 0.0], np.float16))


def test_integer_destinations_round_half_even_and_saturate():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.6, 300.0, -300.0, 126.7], np.float32)
    body = [Vector(0, "vme", "copy", (8,), lb(256, "int8", 1), (lb(0, "float32", 1),)),
            Vector(0, "vme", "mul", (8,), lb(512, "int32", 1), (lb(0, "float32", 1), 1e10))]
    out8, out32 = run_lb(body, [(0, x)], [(256, (8,), "int8"), (512, (8,), "int32")]).outputs
    np.testing.assert_array_equal(out8, np.array([0, 2, 2, 0, -2, 127, -128, 127], np.int8))
    assert out32.max() == 2**31 - 1 and out32.min() == -(2**31)


def test_int8_matmul_is_exact_on_int8_preset():
    hw = preset("set-edge16")
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (16, 64)).astype(np.int8)
    b = rng.integers(-128, 128, (64, 32)).astype(np.int8)
    mm = Mme(0, (16, 32, 64), (False, False, True), lb(8192, "int32", 32, 1, 0),
             lb(0, "int8", 64, 0, 1), lb(4096, "int8", 0, 1, 32))
    (out,) = run_lb([mm], [(0, a), (4096, b)], [(8192, (16, 32), "int32")], hw=hw).outputs
    np.testing.assert_array_equal(out, a.astype(np.int64) @ b.astype(np.int64))


def test_float_model_on_int8_preset_is_timing_only():
    hw = preset("set-edge16")
    x = np.ones(64, np.float32)
    program = make_program([[Dma(0, (64,), lb(0, "int8", 1), ddr(0, "int8", 1))]],
                           [TensorArg("x", "input", (64,), "int8", "float32", 0)], 64, hw)
    with pytest.raises(ValueError, match="preset 'set-edge16' stores int8.*only timing"):
        simulate(program, [x])
    r = simulate(program, mode="timing")
    assert r.outputs == [] and r.report.cycles > LAUNCH


# -- program format and validation --------------------------------------------------------------

def small_program() -> tuple[Program, list[np.ndarray]]:
    a, b = f16(16, 32), f16(32, 32, seed=1)
    args = [TensorArg("a", "input", (16, 32), "float16", "float32", 0),
            TensorArg("b", "input", (32, 32), "float16", "float32", 1024),
            TensorArg("c", "output", (16, 32), "float16", "float32", 4096)]
    instrs = chain([
        Dma(0, (16, 32), lb(0, "float16", 32, 1), ddr(0, "float16", 32, 1)),
        Dma(0, (32, 32), lb(1024, "float16", 32, 1), ddr(1024, "float16", 32, 1)),
        Mme(0, (16, 32, 32), (False, False, True), lb(4096, "float32", 32, 1, 0),
            lb(0, "float16", 32, 0, 1), lb(1024, "float16", 0, 1, 32)),
        Vector(0, "vme", "copy", (16, 32), lb(8192, "float16", 32, 1), (lb(4096, "float32", 32, 1),)),
        Dma(0, (16, 32), ddr(4096, "float16", 32, 1), lb(8192, "float16", 32, 1)),
    ])
    return make_program([instrs], args, 8192), [a.astype(np.float32), b.astype(np.float32)]


def test_program_round_trip(tmp_path):
    program, inputs = small_program()
    marks = (LayerMark(0, "matmul", (16, 32)), LayerMark(3, "copy", (16, 32)))
    program = replace(program, kernels=(replace(program.kernels[0], layers=marks),))
    text = program.serialize()
    again = Program.deserialize(text)
    assert again == program and again.kernels[0].layers == marks
    program.save(tmp_path / "p.json")
    loaded = Program.load(tmp_path / "p.json")
    assert loaded == program
    ref = (inputs[0] @ inputs[1]).astype(np.float16).astype(np.float32)
    outs = [simulate(p, inputs) for p in (program, again, loaded)]
    for r in outs:
        np.testing.assert_allclose(r.outputs[0], ref, rtol=1e-3, atol=1e-3)
        np.testing.assert_array_equal(r.outputs[0], outs[0].outputs[0])
        assert r.report.cycles == outs[0].report.cycles


@pytest.mark.parametrize("n, change, message", [
    (0, lambda i: replace(i, dst=replace(i.dst, offset=65536 - 512)),
     r"touches lb\[0\] bytes \[65024, 66048\) outside its 65536 bytes"),
    (3, lambda i: replace(i, op="erf"), "op 'erf' does not run on the vme"),
    (2, lambda i: replace(i, a=replace(i.a, dtype="float32")), "MME operands must be float16"),
    (3, lambda i: replace(i, srcs=(replace(i.srcs[0], index=1),)),
     r"src0 is in lb\[1\], but MME, vector and reduce instructions only touch their own core's LB \(lb\[0\]\)"),
    (2, lambda i: replace(i, b=replace(i.b, mem="ddr", index=0)), r"src1 is in ddr, but MME"),
    (2, lambda i: replace(i, deps=(3,)), "dependency 3 is not an earlier instruction"),
])
def test_validator_errors(n, change, message):
    program, inputs = small_program()
    k = program.kernels[0]
    instrs = list(k.instructions)
    instrs[n] = change(instrs[n])
    bad = replace(program, kernels=(replace(k, cores=(0, 1), instructions=tuple(instrs)),))
    with pytest.raises(ProgramError, match=f"kernel k0 instruction {n} .*{message}"):
        simulate(bad, inputs)


@pytest.mark.parametrize("firsts", [(3, 1), (9,)])
def test_layer_marks_out_of_order_are_rejected(firsts):
    program, inputs = small_program()
    k = program.kernels[0]
    bad = replace(program, kernels=(replace(k, layers=tuple(LayerMark(f, "a", ()) for f in firsts)),))
    with pytest.raises(ProgramError, match=re.escape(f"kernel k0: layer marks must start at increasing "
                                                     f"instruction indices below 5, not {list(firsts)}")):
        simulate(bad, inputs)


def test_input_errors_name_the_arg():
    program, (a, b) = small_program()
    with pytest.raises(ValueError, match=r"takes 2 input\(s\) \['a', 'b'\], got 1"):
        simulate(program, [a])
    with pytest.raises(ValueError, match=r"input 'b': shape \(32, 16\)"):
        simulate(program, [a, b[:, :16]])


# -- hazards and timing ---------------------------------------------------------------------------

def test_missing_dependency_is_a_hazard():
    program, inputs = small_program()
    k = program.kernels[0]
    raw = list(k.instructions)
    raw[2] = replace(raw[2], deps=(0,))  # the MME no longer waits for B's DMA
    with pytest.raises(HazardError, match=r"kernel 'k0': instruction 2 \(mme\) .* before instruction 1 \(dma\) "
                                          r"finished.*RAW on lb\[0\]\): add 1 to the deps of 2"):
        simulate(replace(program, kernels=(replace(k, instructions=tuple(raw)),)), inputs)
    war = list(k.instructions)  # reload A while the MME may still read it
    war.insert(4, Dma(0, (16, 32), lb(0, "float16", 32, 1), ddr(0, "float16", 32, 1), deps=(1,)))
    with pytest.raises(HazardError, match=r"instruction 4 \(dma\) .* instruction 2 \(mme\).*WAR on lb\[0\]"):
        simulate(replace(program, kernels=(replace(k, instructions=tuple(war)),)), inputs, mode="timing")
    # trusting the tokens: the same timing for a correct program, no check for a wrong one
    checked = simulate(program, mode="timing").report.cycles
    assert simulate(program, mode="timing", check_hazards=False).report.cycles == checked
    simulate(replace(program, kernels=(replace(k, instructions=tuple(war)),)), mode="timing", check_hazards=False)
    with pytest.raises(ValueError, match="functional run always checks"):
        simulate(program, inputs, check_hazards=False)


def test_dependency_orders_dma_then_mme():
    program, inputs = small_program()
    r = simulate(program, inputs, trace=True)
    a_dma = DMA_LAT + math.ceil(max(1024 / HW.ddr_bytes_per_cycle, 1024 / HW.lb_bytes_per_cycle))
    b_dma = DMA_LAT + math.ceil(max(2048 / HW.ddr_bytes_per_cycle, 2048 / HW.lb_bytes_per_cycle))
    mme = mme_tile(16, 32, 32)
    vme = math.ceil(16 * 32 / HW.vme_lanes) + HW.vector_latency_cycles
    (mme_event,) = events(r, "mme")
    us = 1e6 / HW.clock_hz
    assert mme_event["ts"] == pytest.approx((LAUNCH + a_dma + b_dma) * us)
    assert mme_event["dur"] == pytest.approx(mme * us)
    assert r.report.cycles == LAUNCH + a_dma + b_dma + mme + vme + a_dma
    # a serial chain takes the sum of the uncontended estimates the schedulers use
    assert r.report.cycles == LAUNCH + sum(instruction_cycles(i, HW) for i in program.kernels[0].instructions)


def test_concurrent_ddr_transfers_share_bandwidth():
    nbytes = 32768
    one = lambda core: Dma(core, (nbytes // 2,), lb(0, "float16", 1, core=core), ddr(0, "float16", 1))  # noqa: E731
    alone = simulate(make_program([[one(0)]]), mode="timing").report.cycles - LAUNCH
    both = simulate(make_program([[one(0), one(8)]]), mode="timing").report.cycles - LAUNCH
    assert alone == DMA_LAT + nbytes / HW.ddr_bytes_per_cycle
    assert both - DMA_LAT == 2 * (alone - DMA_LAT)


def test_disjoint_tiles_sharing_granules_need_no_tokens():
    # four cores write 16-column (32-byte) tiles of the same DDR rows: no conflict, no tokens needed
    rows, cols, width = 4, 64, 16
    kernel = []
    for c in range(4):
        kernel.append(Fill(c, (rows, width), lb(0, "float16", width, 1, core=c), float(c + 1)))
        kernel.append(Dma(c, (rows, width), ddr(2 * width * c, "float16", cols, 1),
                          lb(0, "float16", width, 1, core=c), deps=(len(kernel) - 1,)))
    program = make_program([kernel], [TensorArg("y", "output", (rows, cols), "float16", "float32", 0)], 4096)
    (y,) = simulate(program).outputs
    np.testing.assert_array_equal(y, np.repeat(np.arange(1, 5, dtype=np.float32), width)[None].repeat(rows, 0))


def _reference_conflicts(instrs, units, kernel_starts) -> list[tuple[int, ...]]:
    """The hazard tracker's documented semantics, granule by granule from the exact bytes: per
    64-byte granule the last writer and, per unit, the latest reader since that write."""
    writer: dict = {}
    readers: dict = {}
    out = []
    for n, (ins, unit) in enumerate(zip(instrs, units)):
        if n in kernel_starts:
            writer.clear()
            readers.clear()
            base = n
        srcs, dst = operands(ins)

        def granules(o):
            points = np.indices(ins.shape).reshape(len(ins.shape), -1).T
            first = o.offset + o.itemsize * (points @ np.array(o.strides, dtype=np.int64))
            byte = (first[:, None] + np.arange(o.itemsize)).ravel()
            return [(o.mem, o.index, g) for g in np.unique(byte >> 6).tolist()]

        found = set()
        for o in srcs:
            for g in granules(o):
                if g in writer:
                    found.add(writer[g])
                readers.setdefault(g, {})[unit] = n
        for g in granules(dst):
            if g in writer:
                found.add(writer[g])
            found.update(readers.get(g, {}).values())
            writer[g] = n
            readers[g] = {}
        found.discard(n)
        out.append(tuple(sorted(j - base for j in found)))
    return out


def test_hazard_tracker_matches_a_granule_by_granule_reference():
    rng = np.random.default_rng(1)
    strides = [0, 1, 2, 3, 7, 16, 33, 40, 64, 100]

    def operand():
        dtype = ["int8", "float16", "float32"][rng.integers(3)]
        mem, index = [("ddr", 0), ("lb", 0), ("lb", 1), ("gb", 0)][rng.integers(4)]
        item = np.dtype(dtype).itemsize
        return Operand(mem, index, int(rng.integers(0, 2048)) * item, dtype,
                       tuple(int(rng.choice(strides)) for _ in range(3)))

    instrs = []
    for _ in range(600):
        shape = tuple(int(e) for e in rng.integers(1, 7, 3))
        if rng.random() < 0.5:
            instrs.append(Dma(0, shape, operand(), operand()))
        else:
            instrs.append(Mme(0, shape, (False, False, True), operand(), operand(), operand(),
                              accumulate=bool(rng.random() < 0.5)))
    units = rng.integers(0, 4, len(instrs)).tolist()
    kernel_starts = {0, 200, 450}
    tracker = HazardTracker({"ddr": 1 << 16, "gb": 1 << 16, "lb": 1 << 16})
    got = []
    for n, (ins, unit) in enumerate(zip(instrs, units)):
        if n in kernel_starts:
            tracker.begin_kernel()
        got.append(tracker.add(ins, unit))
    assert got == _reference_conflicts(instrs, units, kernel_starts)
    assert sum(map(len, got)) > len(instrs)  # the random accesses do conflict


def test_missing_token_on_a_strided_ddr_tile_is_a_hazard():
    # core 0 stores rows 0, 2, 4, 6 of a 128-byte-row matrix (gaps of a whole row between them)
    rows = Dma(0, (4, 64), ddr(0, "float16", 128, 1), lb(0, "float16", 64, 1))
    gap = Dma(1, (64,), ddr(128, "float16", 1), lb(0, "float16", 1, core=1))  # row 1: a gap
    hit = Dma(1, (64,), ddr(512, "float16", 1), lb(0, "float16", 1, core=1))  # row 4: written by core 0
    args = [TensorArg("y", "output", (8, 64), "float16", "float32", 0)]
    ok = simulate(make_program([[rows, gap]], args, 1024), mode="timing")
    assert ok.report.ddr_write == 5 * 128
    with pytest.raises(HazardError, match=r"instruction 1 \(dma\) .* instruction 0 \(dma\).*WAW on ddr\[0\]"):
        simulate(make_program([[rows, hit]], args, 1024), mode="timing")
    simulate(make_program([[rows, replace(hit, deps=(0,))]], args, 1024), mode="timing")


def test_strided_ddr_access_pays_whole_bursts():
    rows = 8  # 32-byte runs 2 KiB apart: each costs a 64-byte burst
    d = Dma(0, (rows, 16), lb(0, "float16", 16, 1), ddr(0, "float16", 1024, 1))
    r = simulate(make_program([[d]]), mode="timing").report
    assert r.ddr_read == rows * 32 and r.ddr_burst_bytes == rows * HW.ddr_burst_bytes
    assert r.cycles == LAUNCH + DMA_LAT + math.ceil(rows * HW.ddr_burst_bytes / HW.ddr_bytes_per_cycle)


def test_bus_transfer_between_cores_goes_through_the_gb():
    d = Dma(0, (512,), lb(0, "float16", 1, core=1), lb(0, "float16", 1))
    assert dma_demand(d, HW) == {("lb", 0): 1024, ("lb", 1): 1024, ("gb", 0): 1024}
    far = replace(d, dst=replace(d.dst, index=9))  # another cluster: both GBs on the way
    assert dma_demand(far, HW) == {("lb", 0): 1024, ("lb", 9): 1024, ("gb", 0): 1024, ("gb", 1): 1024}


def test_a_load_from_another_clusters_gb_goes_through_both_gbs():
    own = Dma(9, (512,), lb(0, "float16", 1, core=9), Operand("gb", 1, 0, "float16", (1,)))
    assert dma_demand(own, HW) == {("gb", 1): 1024, ("lb", 9): 1024}
    far = replace(own, src=replace(own.src, index=0))
    assert dma_demand(far, HW) == {("gb", 0): 1024, ("lb", 9): 1024, ("gb", 1): 1024}
    store = Dma(9, (512,), Operand("gb", 0, 0, "float16", (1,)), lb(0, "float16", 1, core=9))
    assert dma_demand(store, HW) == {("gb", 0): 1024, ("lb", 9): 1024, ("gb", 1): 1024}


def test_mesh_transfer_between_cores_uses_the_noc():
    hw = preset("set-edge16-fp16")
    x = f16(512)
    args = [TensorArg("x", "input", (512,), "float16", "float16", 0),
            TensorArg("y", "output", (512,), "float16", "float16", 1024)]
    instrs = chain([Dma(0, (512,), lb(0, "float16", 1), ddr(0, "float16", 1)),
                    Dma(0, (512,), lb(0, "float16", 1, core=5), lb(0, "float16", 1)),
                    Dma(5, (512,), ddr(1024, "float16", 1), lb(0, "float16", 1, core=5))])
    r = simulate(make_program([instrs], args, 2048, hw), [x], trace=True)
    np.testing.assert_array_equal(r.outputs[0], x)
    h = Hardware.from_dict(hw)
    hops = 2  # core 0 at (0, 0), core 5 at (1, 1)
    assert r.report.noc_bytes == 1024 and r.report.noc_hop_bytes == hops * 1024
    assert r.report.energy["noc"] == pytest.approx(hops * 1024 * 8 * h.energy.noc_hop_pj_per_bit * 1e-12)
    lb_to_lb = [e for e in events(r, "dma") if e["args"]["index"] == 1][0]
    assert lb_to_lb["dur"] == pytest.approx(
        (h.dma_latency_cycles + hops + math.ceil(1024 / h.noc_link_bytes_per_cycle)) * 1e6 / h.clock_hz)


def _copies(hw, pairs, nbytes=4096, by_sender=False):
    """Timing of one kernel: ``nbytes`` copied from core ``src``'s LB to core ``dst``'s for each
    pair, all at once: each issued by its receiver's DMA queue (by the sender's with
    ``by_sender``), one pair per queue."""
    n = nbytes // 2
    instrs = [Dma(src if by_sender else dst, (n,), lb(j * nbytes, "float16", 1, core=dst), lb(0, "float16", 1, core=src))
              for j, (src, dst) in enumerate(pairs)]
    return simulate(make_program([instrs], (), 1024, hw), mode="timing").report.cycles


def test_mesh_transfers_share_only_the_links_their_xy_routes_cross():
    """On set-edge16's 4 x 4 mesh (32 B/cycle per directed link, XY routing) core 5 at (1, 1)
    sends 4 kB to its four neighbours at once in the time of one copy, each over its own link;
    cores 0 and 1 sending to cores 3 and 2 share the link 1 -> 2 (and take twice as long); two
    copies into core 5 from its west and east neighbours cross no common link."""
    hw = preset("set-edge16-fp16")
    h = Hardware.from_dict(hw)
    assert mesh_route(0, 6, h) == [(0, 1), (1, 2), (2, 6)]
    assert mesh_route(14, 1, h) == [(14, 13), (13, 9), (9, 5), (5, 1)]
    one = 4096 / h.noc_link_bytes_per_cycle
    alone = _copies(hw, [(5, 6)])
    assert alone == LAUNCH + h.dma_latency_cycles + 1 + one
    assert _copies(hw, [(5, 4), (5, 6), (5, 1), (5, 9)]) == alone
    shared = _copies(hw, [(0, 3), (1, 2)])  # 0 -> 3 crosses 0 -> 1 -> 2 -> 3, 1 -> 2 its second link
    assert shared >= LAUNCH + h.dma_latency_cycles + 2 * one
    assert _copies(hw, [(4, 5), (6, 5)], by_sender=True) == alone  # into core 5 from the west and the east


def test_a_multicast_between_lbs_crosses_each_link_of_its_tree_once():
    """Core 0 sends one 4 kB box to the same place in cores 2 and 3 (routes 0 -> 1 -> 2 and
    0 -> 1 -> 2 -> 3). As two copies they share links 0 -> 1 and 1 -> 2 and take twice one
    copy's link time; as one multicast (``multicast_dma``) the union of the routes carries the box
    once: the farther destination's latency (three hops) and one link time, core 0's LB read
    once, three links' hop-bytes (the report's NoC energy)."""
    hw = preset("set-edge16-fp16")
    h = Hardware.from_dict(hw)
    n = 2048
    copies = [Dma(dst, (n,), lb(0, "float16", 1, core=dst), lb(0, "float16", 1), multicast=True) for dst in (2, 3)]
    one = 2 * n / h.noc_link_bytes_per_cycle
    together = simulate(make_program([copies], (), 1024, hw), mode="timing").report
    alone = simulate(make_program([[replace(c, multicast=False) for c in copies]], (), 1024, hw), mode="timing").report
    assert together.cycles == LAUNCH + h.dma_latency_cycles + 3 + one
    assert alone.cycles >= LAUNCH + h.dma_latency_cycles + 2 * one
    assert (together.lb_read, alone.lb_read) == (2 * n, 4 * n)
    assert (together.noc_hop_bytes, alone.noc_hop_bytes) == (3 * 2 * n, (2 + 3) * 2 * n)  # the tree's 3 links


def test_a_prefetch_dma_runs_on_the_cores_second_queue_beside_its_first():
    """Two loads of 64 kB by one core from DDR: on its one queue they run one after the other,
    the second marked ``prefetch`` runs at once on ``pdma`` (sharing DDR's bandwidth, so the pair
    takes the DDR time of both); refused on a chip without the queue; kept by serialisation.
    (Queues here move one transfer at a time: the chip's ``dma_run_ahead`` is off.)"""
    hw = dict(preset("set-edge16-fp16"), dma_run_ahead=False)
    h = Hardware.from_dict(hw)
    n = 32768
    a = Dma(0, (n,), lb(0, "float16", 1), ddr(0, "float16", 1))
    b = Dma(0, (n,), lb(2 * n, "float16", 1), ddr(2 * n, "float16", 1))
    ddr_time = math.ceil(2 * n / h.ddr_bytes_per_cycle)
    serial = simulate(make_program([[a, b]], (), 4 * n, hw), mode="timing")
    assert serial.report.cycles == LAUNCH + 2 * (h.dma_latency_cycles + ddr_time)
    program = make_program([[a, replace(b, prefetch=True)]], (), 4 * n, hw)
    both = simulate(program, mode="timing")
    assert both.report.cycles == LAUNCH + h.dma_latency_cycles + 2 * ddr_time
    assert both.report.busy["pdma"] == both.report.busy["dma"] == 2 * ddr_time + h.dma_latency_cycles
    assert Program.deserialize(program.serialize()).kernels[0].instructions[1].prefetch
    assert "pdma" in disassemble(program) and "busy pdma" in str(both.report)
    with pytest.raises(ProgramError, match="prefetch queue"):
        validate(make_program([[replace(a, prefetch=True)]], (), 4 * n, dict(preset(), prefetch_dma=False)))


def test_a_run_ahead_queue_sets_up_its_next_transfer_while_the_current_one_moves():
    """Core 6 copies two boxes from its neighbour core 5 (latency L = the DMA's and one hop, data
    D at one link's rate). One transfer at a time they take 2 (L + D). With ``dma_run_ahead`` the
    second's latency runs while the first moves, and its data follows the first's: L + max(L, D)
    + D, for long boxes (D > L) and short ones (D < L); the queue's busy time counts each cycle
    once. A multicast on two queues, one of them moving a long copy, sets up meanwhile and moves
    when that copy is done."""
    on = preset("set-edge16-fp16")
    off = dict(on, dma_run_ahead=False)
    h = Hardware.from_dict(on)
    assert h.dma_run_ahead and not Hardware.from_dict(off).dma_run_ahead
    latency = h.dma_latency_cycles + 1

    def copies(n):
        return [Dma(6, (n,), lb(j * 2 * n, "float16", 1, core=6), lb(j * 2 * n, "float16", 1, core=5)) for j in (0, 1)]

    for n in (2048, 256):
        data = 2 * n / h.noc_link_bytes_per_cycle
        assert (data > latency) == (n == 2048)
        serial = simulate(make_program([copies(n)], (), 1024, off), mode="timing").report
        ahead = simulate(make_program([copies(n)], (), 1024, on), mode="timing").report
        assert serial.cycles == LAUNCH + 2 * (latency + data)
        assert ahead.cycles == LAUNCH + latency + max(latency, data) + data
        assert ahead.busy["dma"] == ahead.cycles - LAUNCH  # the queue is never idle, nor counted twice
    # core 1 copies 8 kB from core 0, then both load one box of core 0's LB in one multicast
    n, m = 4096, 1024
    long = Dma(1, (n,), lb(0, "float16", 1, core=1), lb(0, "float16", 1, core=0))
    box = [Dma(c, (m,), lb(1 << 14, "float16", 1, core=c), lb(1 << 15, "float16", 1, core=0), multicast=True)
           for c in (1, 4)]
    latency_long, data_long = h.dma_latency_cycles + 1, 2 * n / h.noc_link_bytes_per_cycle
    multicast = dma_cycles(box[1], h)  # core 0 -> 4, one hop; 0 -> 1 shares that link's time
    ahead = simulate(make_program([[long, *box]], (), 1024, on), mode="timing").report.cycles
    serial = simulate(make_program([[long, *box]], (), 1024, off), mode="timing").report.cycles
    assert serial == LAUNCH + latency_long + data_long + multicast
    assert ahead == LAUNCH + latency_long + data_long + multicast - (h.dma_latency_cycles + 1)


def test_kernel_launch_cost_per_kernel_and_modes_agree():
    program, inputs = small_program()
    twice = replace(program, kernels=(program.kernels[0], replace(program.kernels[0], name="k1")))
    one = simulate(program, inputs).report.cycles
    functional = simulate(twice, inputs)
    timing = simulate(twice, mode="timing")
    assert functional.report.cycles == timing.report.cycles == 2 * one
    assert timing.outputs == [] and functional.report.kernels == 2
    assert one > LAUNCH


# -- report and trace -----------------------------------------------------------------------------

def test_report_counters_roofline_and_combine():
    program, inputs = small_program()
    r = simulate(program, inputs).report
    m, n, k = 16, 32, 32
    assert r.macs == m * n * k and r.instructions == 5 and r.kernels == 1
    assert (r.ddr_read, r.ddr_write) == (2 * (m * k + k * n), 2 * m * n)
    partial_sums = m * n * math.ceil(k / HW.mme.rows)  # weight-stationary: each K tile's written back (TENET)
    assert r.lb_write == 2 * (m * k + k * n) + 4 * partial_sums + 2 * m * n  # DMAs in, MME, vector
    assert r.lb_read == 2 * m * k + 2 * k * n + 4 * m * n + 2 * m * n  # MME a, b; vector; DMA out
    assert r.lb_peak_bytes == 2 * (m * k + k * n) + 4 * m * n + 2 * m * n
    assert r.busy["mme"] == mme_tile(m, n, k)
    assert r.utilisation["mme"] == pytest.approx(mme_tile(m, n, k) / (r.cycles * HW.cores))
    compulsory = 2 * (m * k + k * n + m * n)
    assert r.compulsory_ddr_bytes == compulsory
    assert r.roofline_cycles == max(m * n * k / HW.peak_macs_per_cycle, compulsory / HW.ddr_bytes_per_cycle)
    assert r.roofline_ratio == pytest.approx(r.cycles / r.roofline_cycles)
    assert r.energy["mac"] == pytest.approx(m * n * k * HW.energy.mac_pj * 1e-12)
    both = Report.combine([r, r])
    assert (both.cycles, both.macs, both.lb_read) == (2 * r.cycles, 2 * r.macs, 2 * r.lb_read)
    assert both.lb_peak_bytes == r.lb_peak_bytes and both.roofline_ratio == pytest.approx(r.roofline_ratio)
    assert both.busy["mme"] == 2 * r.busy["mme"]
    assert not r.model_bound and r.bound_macs == r.macs
    assert r.roofline_fraction == pytest.approx(r.roofline_cycles / r.cycles)
    big = r.with_bound(r.macs, 10**9)
    assert big.roofline_cycles == 10**9 / HW.ddr_bytes_per_cycle and r.compulsory_ddr_bytes == compulsory
    assert big.model_bound and "the model's bound" in str(big) and "its kernels' bound" in str(r)
    assert not Report.combine([big, r]).model_bound and Report.combine([big, big]).model_bound
    d = r.to_dict()
    assert d["hardware"] == "stcp920" and d["cycles"] == r.cycles and d["energy_total"] == r.energy_total
    json.dumps(d)
    assert "cycles" in str(r) and "energy total" in str(r)


def test_trace_has_one_track_per_unit_used(tmp_path):
    program, inputs = small_program()
    cd = Dma(0, (1024,), Operand("gb", 0, 0, "float16", (1,)), ddr(0, "float16", 1))
    program = replace(program, kernels=(replace(program.kernels[0],
                                                instructions=program.kernels[0].instructions + (cd,)),))
    r = simulate(program, inputs, trace=True, start_cycle=10_000)
    xs = [e for e in r.trace_events if e["ph"] == "X"]
    assert len(xs) == 6
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in r.trace_events if e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in xs} == set(threads)
    assert sorted(threads.values()) == ["cdma", "dma", "mme", "vme"]
    processes = {e["pid"]: e["args"]["name"] for e in r.trace_events if e["name"] == "process_name"}
    assert processes == {0: "core 0", HW.cores: "cluster 0"}
    assert min(e["ts"] for e in xs) == pytest.approx((10_000 + LAUNCH) * 1e6 / HW.clock_hz)
    assert {e["name"] for e in xs} == {"dma", "mme", "vector.copy"}
    assert all("layer" not in e["args"] for e in xs)  # the kernel has no layer marks
    marked = replace(program, kernels=(replace(program.kernels[0], layers=(LayerMark(2, "mm", (16, 32)),)),))
    layers = [e["args"].get("layer") for e in simulate(marked, inputs, trace=True).trace_events if e["ph"] == "X"]
    assert layers == [None] * 2 + ["mm"] * 4  # instructions 2.. belong to the mark
    write_trace(r.trace_events, tmp_path / "t.json")
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"] == r.trace_events


def _promotion(cluster: int, n: int, hw: Hardware, src: int = 0, multicast: bool = True) -> Dma:
    """Cluster ``cluster`` promoting ``n`` fp16 elements of DDR at ``src`` to offset 0 of its GB."""
    return Dma(cluster * hw.cores_per_cluster, (n,), Operand("gb", cluster, 0, "float16", (1,)),
               ddr(src, "float16", 1), multicast=multicast)


def test_the_clusters_multicast_promotions_of_one_box_read_ddr_once():
    """stcp920 (``multicast_dma``): four clusters promoting the same 64 kB of weights to one GB
    place move them as one transfer, in the DDR time of one (128 B/cycle; each GB takes 256), and
    the report reads them from DDR once; as plain DMAs they share DDR and take four times as long.
    A transfer waits for its last cluster: with cluster 3's promotion behind a vector copy on one
    of its cores, all four start when that ends. Serialisation keeps the flag (1 prefetch + 2 multicast)."""
    hw = preset()
    h = Hardware.from_dict(hw)
    n = 32768
    ddr_time = math.ceil(2 * n / h.ddr_bytes_per_cycle)
    together = make_program([[_promotion(c, n, h) for c in range(4)]], (), 2 * n, hw)
    run = simulate(together, mode="timing")
    assert run.report.cycles == LAUNCH + h.dma_latency_cycles + ddr_time
    assert run.report.ddr_read == 2 * n and run.report.gb_write == 4 * 2 * n
    plain = simulate(make_program([[_promotion(c, n, h, multicast=False) for c in range(4)]], (), 2 * n, hw),
                     mode="timing")
    assert plain.report.cycles == LAUNCH + h.dma_latency_cycles + 4 * ddr_time
    assert plain.report.ddr_read == 4 * 2 * n
    core, m = 3 * h.cores_per_cluster, 15872
    work = Vector(core, "vme", "copy", (m,), lb(0, "float16", 1, core=core), (lb(2 * m, "float16", 1, core=core),))
    late = [work] + [_promotion(c, n, h) for c in range(3)] + [replace(_promotion(3, n, h), deps=(0,))]
    timed = simulate(make_program([late], (), 2 * n, hw), mode="timing").report
    assert timed.cycles == LAUNCH + vector_cycles(m, "vme", h) + h.dma_latency_cycles + ddr_time
    assert Program.deserialize(together.serialize()).kernels[0].instructions[0].multicast


def test_multicast_dmas_that_cannot_meet_move_alone_and_each_reads_ddr():
    """Two clusters promote boxes A and B in opposite orders: each one's first waits for the
    other's, behind its own second. The simulator sees no way for them to meet and moves each
    alone, so the run ends, each reading DDR (the cycles and bytes of plain DMAs). A multicast
    needs a chip with ``multicast_dma`` and goes down from DDR or a GB."""
    hw = preset()
    h = Hardware.from_dict(hw)
    n = 8192
    a0, b0 = _promotion(0, n, h, 0), replace(_promotion(0, n, h, 2 * n), dst=Operand("gb", 0, 2 * n, "float16", (1,)))
    a1, b1 = _promotion(1, n, h, 0), replace(_promotion(1, n, h, 2 * n), dst=Operand("gb", 1, 2 * n, "float16", (1,)))
    crossed = simulate(make_program([[a0, b0, b1, a1]], (), 4 * n, hw), mode="timing").report
    alone = simulate(make_program([[replace(i, multicast=False) for i in (a0, b0, b1, a1)]], (), 4 * n, hw),
                     mode="timing").report
    assert (crossed.cycles, crossed.ddr_read) == (alone.cycles, alone.ddr_read) == (crossed.cycles, 4 * 2 * n)
    with pytest.raises(ProgramError, match="multicast_dma"):
        validate(make_program([[a0]], (), 4 * n, dict(hw, multicast_dma=False)))
    with pytest.raises(ProgramError, match="copies DDR or a GB to GBs or LBs, or an LB to LBs, not lb to ddr"):
        validate(make_program([[replace(a0, src=lb(0, "float16", 1), dst=ddr(0, "float16", 1))]], (), 4 * n, hw))


def test_transfers_that_wait_on_each_other_are_stuck_and_the_emitter_makes_them_plain():
    """``isa.stuck_multicasts``: cores 0 and 1 load GB boxes X and Y to the same LB places, core 0
    X then Y, core 1 Y then X. Inferred (the n-th load of a box into each LB), X's transfer waits
    for core 1's X, behind its Y, whose transfer waits for core 0's Y, behind its X: all four
    are stuck. In the same order on both cores none is, and a third pair behind them moves as
    one. The emitter (``KernelEmitter.kernel`` with ``unstick``) makes the stuck loads plain,
    also one that a replica copies (core 1's X here is a copy of core 0's, moved one core on),
    and every copy with it; the pair that can meet stays a multicast. Where a transfer from DDR
    is in the cycle, the loads from the GB go plain first."""
    def load(core, offset, place):
        return Dma(core, (4096,), lb(place, "float16", 1, core=core), Operand("gb", 0, offset, "float16", (1,)),
                   multicast=True)

    x0, y0, x1, y1, z0, z1 = load(0, 0, 0), load(0, 1 << 14, 1 << 13), load(1, 0, 0), load(1, 1 << 14, 1 << 13), \
        load(0, 1 << 15, 1 << 14), load(1, 1 << 15, 1 << 14)
    assert isa.stuck_multicasts([x0, y0, y1, x1, z0, z1], HW.cores_per_cluster) == {0, 1, 2, 3}
    assert isa.stuck_multicasts([x0, y0, x1, y1, z0, z1], HW.cores_per_cluster) == set()

    emitter = KernelEmitter(HW, "crossed", unstick=True)
    emitter.instructions = [x0, y0, y1, z0, z1]
    emitter.cores_used = {0, 1}
    emitter.compression.replicas = [isa.Replica(0, 1, 3, 1, ())]  # core 0's X again on core 1, after its Y
    kernel = emitter.kernel()
    assert [i.multicast for i in kernel.instructions] == [False, False, False, True, True]
    stream, origins = isa.expanded_stream(kernel.instructions, kernel.replicas)
    assert origins == [0, 1, 2, 0, 3, 4] and stream[3].core == 1 and not stream[3].multicast
    assert isa.stuck_multicasts(stream, HW.cores_per_cluster) == set()
    # crossed with a pair of loads from DDR, only the loads from the GB go plain: re-reading a GB
    # box costs its port, a DDR box the chip's DDR, every core's copy
    d0, d1 = (replace(x, src=ddr(0, "float16", 1)) for x in (y0, y1))
    emitter = KernelEmitter(HW, "crossed", unstick=True)
    emitter.instructions, emitter.cores_used = [x0, d0, d1, x1], {0, 1}
    kernel = emitter.kernel()
    assert [i.multicast for i in kernel.instructions] == [False, True, True, False]
    assert isa.stuck_multicasts(list(kernel.instructions), HW.cores_per_cluster) == set()


def test_loads_of_one_gb_box_pair_only_while_its_bytes_are_unwritten():
    """``multicast_groups`` pairs the n-th multicast load of one GB box to one LB place of each core
    counted since the box's bytes were last written: core 0's load of the box, a store into it,
    then core 1's load of the box are two transfers (the same address holds other data), and
    core 1's queue does not wait for a partner; with the store elsewhere they are one."""
    hw = preset()
    h = Hardware.from_dict(hw)
    n = 4096
    box = Operand("gb", 0, 0, "float16", (1,))

    def load(core):
        return Dma(core, (n,), lb(0, "float16", 1, core=core), box, multicast=True)

    def store(offset):  # core 2 writes n elements of the GB from its LB
        return Dma(2, (n,), Operand("gb", 0, offset, "float16", (1,)), lb(0, "float16", 1, core=2))

    rewritten = [load(0), replace(store(0), deps=(0,)), replace(load(1), deps=(1,))]
    assert multicast_groups(rewritten) == {0: (0,), 2: (2,)}
    assert multicast_groups([load(0), replace(store(4 * n), deps=(0,)), load(1)]) == {0: (0, 2), 2: (0, 2)}
    # core 1's load waits only for the store, then moves alone
    timed = simulate(make_program([rewritten], (), 1024, hw), mode="timing").report
    one = h.dma_latency_cycles + math.ceil(2 * n / h.gb_bytes_per_cycle)
    assert timed.cycles == LAUNCH + 3 * one and timed.gb_read == 2 * 2 * n


def test_a_named_transfer_group_pairs_the_loads_it_names():
    """Core 0 loads a GB box into its LB twice, core 1 once, after a long load from DDR. Inferred,
    the first load of each core is one transfer (``multicast_groups``): core 0's first waits for
    core 1's queue and its second follows. Named (``Dma.group``: core 0's second and core 1's
    load), core 0's first moves alone at once: one transfer's time less. The group survives the
    program's JSON form; validation rejects a group on a plain DMA, and a group of two boxes."""
    hw = preset()
    h = Hardware.from_dict(hw)
    n, m = 4096, 1 << 14
    box = Operand("gb", 0, 0, "float16", (1,))

    def load(core, **kw):
        return Dma(core, (n,), lb(0, "float16", 1, core=core), box, multicast=True, **kw)

    long = Dma(1, (m,), lb(1 << 14, "float16", 1, core=1), ddr(0, "float16", 1))
    inferred = [load(0), replace(load(0), deps=(0,)), long, replace(load(1), deps=(2,))]
    named = [replace(load(0), multicast=False), replace(load(0, group=5), deps=(0,)), long,
             replace(load(1, group=5), deps=(2,))]
    assert multicast_groups(inferred)[0] == (0, 3) and multicast_groups(named) == {1: (1, 3), 3: (1, 3)}
    one, slow = dma_cycles(inferred[0], h), dma_cycles(long, h)
    cycles = [simulate(make_program([p], (), 1 << 18, hw), mode="timing").report.cycles for p in (inferred, named)]
    assert cycles == [LAUNCH + slow + 2 * one, LAUNCH + slow + one]
    program = make_program([named], (), 1 << 18, hw)
    assert Program.deserialize(program.serialize()).kernels[0].instructions == program.kernels[0].instructions
    for bad, why in (([replace(named[1], deps=(), multicast=False)], "names a transfer group (5) only as a multicast"),
                     ([replace(named[1], deps=()), replace(named[3], deps=(), src=replace(box, offset=64))],
                      "its transfer group 5 copies another box than instruction 0")):
        with pytest.raises(ProgramError, match=re.escape(why)):
            validate(make_program([bad], (), 1 << 18, hw))


def test_a_clusters_cores_loading_one_gb_box_to_one_lb_place_share_one_transfer():
    """stcp920: the 8 cores of cluster 0 each load the same 16 kB of its GB into offset 0 of their
    LBs. As multicast DMAs they are one transfer: the GB read once at 256 B/cycle, each LB written;
    as plain DMAs the eight share the GB's port and take eight times as long. The report reads
    the GB once for the transfer."""
    hw = preset()
    h = Hardware.from_dict(hw)
    n = 8192
    loads = [Dma(c, (n,), lb(0, "float16", 1, core=c), Operand("gb", 0, 0, "float16", (1,)), multicast=True)
             for c in range(h.cores_per_cluster)]
    one = math.ceil(2 * n / h.gb_bytes_per_cycle)
    shared = simulate(make_program([loads], (), 1024, hw), mode="timing").report
    assert shared.cycles == LAUNCH + h.dma_latency_cycles + one
    assert shared.gb_read == 2 * n and shared.lb_write == h.cores_per_cluster * 2 * n
    plain = simulate(make_program([[replace(i, multicast=False) for i in loads]], (), 1024, hw), mode="timing").report
    assert plain.cycles == LAUNCH + h.dma_latency_cycles + h.cores_per_cluster * one
    assert plain.gb_read == h.cores_per_cluster * 2 * n
