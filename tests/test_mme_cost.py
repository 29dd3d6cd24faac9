"""The MME described by its PE array, interconnect and dataflow; an MME instruction costed by TENET."""

import math
import sys
import warnings

import numpy as np
import pytest
from helpers import brute_force, f16, lb, mme_tile, preset, run_lb

from tvm_dsa.dataflow import PEArray, closed
from tvm_dsa.dataflow.library import BENCHMARKS, standard_dataflows
from tvm_dsa.dataflow.mme import cache_info, tile_cycles, tile_metrics
from tvm_dsa.dataflow.notation import interconnect
from tvm_dsa.hardware import HardwareError, get
from tvm_dsa.hardware.model import Hardware
from tvm_dsa.isa import Mme
from tvm_dsa.runtime.cost import mme_cycles, mme_traffic


OS = "output-stationary, systolic, pipelined"  # the tests below derive its cycles and volumes


def chip(name="stcp920", **mme):
    d = preset(name)
    d["mme"] = {**d["mme"], **mme}
    return d


def test_presets_describe_their_mme():
    stcp = get("stcp920").mme
    assert (stcp.rows, stcp.cols, stcp.interconnect, stcp.dataflow, stcp.model) == \
        (16, 32, "systolic-2d", "weight-stationary, systolic, pipelined", "tenet")
    for name in ("set-edge16", "set-cloud144", "set-edge16-fp16", "set-cloud144-fp16"):
        mme = get(name).mme
        assert (mme.interconnect, mme.dataflow, mme.model) == ("multicast-31", "weight-stationary", "tenet")


@pytest.mark.parametrize("field,value,msg", [
    ("model", "fast", "field 'mme.model' must be one of \\['flat', 'tenet'\\], got 'fast'"),
    ("interconnect", "torus", "field 'mme.interconnect' must be one of .*got 'torus'"),
    ("interconnect", "multicast-0", "field 'mme.interconnect' must be one of .*got 'multicast-0'"),
    ("dataflow", "row-stationary", "field 'mme.dataflow' must be one of .*'output-stationary, systolic'.*"
                                   "got 'row-stationary'"),
])
def test_bad_mme_fields_are_named(field, value, msg):
    with pytest.raises(HardwareError, match=msg):
        Hardware.from_dict(chip(**{field: value}))


def parts(size, axis):
    """The extents of the tiles of ``size`` on an ``axis``-long array axis."""
    return [min(axis, size - start) for start in range(0, size, axis)]


def test_tenet_tile_cost_on_the_systolic_mme():
    """Output-stationary and skewed on a 16 x 32 systolic array, compute-bound: each r x c output tile
    takes K stamps plus the wavefront's (r - 1) + (c - 1); the flat model charges the fill/drain once."""
    flat = Hardware.from_dict(chip(model="flat"))  # pinned: the flat formula is compared
    tenet = Hardware.from_dict(chip(model="tenet", dataflow="output-stationary, systolic"))
    for m, n, k in [(64, 64, 64), (16, 8, 36), (40, 40, 8)]:
        tiles = math.ceil(m / 16) * math.ceil(n / 32)
        assert tile_cycles(tenet, m, n, k) == sum(k + r - 1 + c - 1 for r in parts(m, 16) for c in parts(n, 32))
        assert mme_cycles(3, m, n, k, tenet) == 3 * tile_cycles(tenet, m, n, k)
        assert mme_cycles(3, m, n, k, flat) == 3 * tiles * k + 16 + 32


def test_pipelined_tiles_overlap_their_wavefronts():
    """Tile t (row-major) starts K stamps after tile t - 1 and its r x c wavefront ends K + r + c - 2
    stamps after it starts: the cycles are the latest end; one fill/drain, as the flat model charges."""
    tenet = Hardware.from_dict(chip(model="tenet", dataflow=OS))
    for m, n, k in [(64, 64, 64), (40, 40, 8), (16, 8, 36)]:
        tiles = [(r, c) for r in parts(m, 16) for c in parts(n, 32)]
        assert tile_cycles(tenet, m, n, k) == max(t * k + k + r + c - 2 for t, (r, c) in enumerate(tiles))
    assert tile_cycles(tenet, 64, 64, 64) == 8 * 64 + 15 + 31 < mme_cycles(1, 64, 64, 64, Hardware.from_dict(chip(model="flat")))


def test_tenet_tile_cost_is_the_brute_force_latency_when_read_bound():
    """A small weight-stationary array on buses with a narrow LB: the latency counted by enumeration."""
    d = chip(rows=2, cols=3, interconnect="multicast-2", dataflow="weight-stationary", model="tenet")
    d["lb_bytes_per_cycle"] = 4.0                     # 2 fp16 elements per cycle
    hw = Hardware.from_dict(d)
    for m, n, k in [(5, 4, 3), (2, 3, 2)]:
        op = BENCHMARKS["gemm"].op({"i": m, "j": n, "k": k})
        array = PEArray((2, 3), interconnect("multicast-2", 2), 2.0)
        _, _, times, volumes = brute_force(standard_dataflows(BENCHMARKS["gemm"], op, (2, 3))["weight-stationary"],
                                           array)
        reads = sum(v.unique for t, v in volumes.items() if t != "Y") / 2.0
        assert tile_cycles(hw, m, n, k) == math.ceil(max(times, reads, volumes["Y"].unique / 2.0))
    assert tile_cycles(hw, 5, 4, 3) > math.ceil(5 / 2) * math.ceil(4 / 3) * 3    # read-bound, not compute


def test_tile_costs_are_cached_per_shape():
    hw = Hardware.from_dict(chip(model="tenet"))
    tile_cycles(hw, 48, 24, 5)
    before = cache_info()
    assert tile_cycles(hw, 48, 24, 5) == tile_cycles(hw, 48, 24, 5)
    after = cache_info()
    assert (after.hits - before.hits, after.misses - before.misses) == (2, 0)


def conv_tile():
    """A 3 x 3 conv tile on a 6 x 6 x 4 input, 8 output channels: (M, N, K) = (16, 8, 36)."""
    h = w = 6
    c, o, kh, kw = 4, 8, 3, 3
    oh, ow = h - kh + 1, w - kw + 1
    ins = Mme(0, (oh, ow, o, kh, kw, c), (False, False, False, True, True, True),
              dst=lb(2048, "float32", ow * o, o, 1, 0, 0, 0),
              a=lb(0, "float16", w * c, c, 0, w * c, c, 1),
              b=lb(1024, "float16", 0, 0, 1, kw * c * o, c * o, o))
    return ins, [(0, f16(h, w, c)), (1024, f16(kh, kw, c, o, seed=1))], [(2048, (oh, ow, o), "float32")]


def test_the_simulator_charges_the_tenet_cost():
    """A conv tile (M = oh*ow, N = o, K = kh*kw*c) on the MME: same numbers, busy time from the dataflow."""
    conv, inputs, outputs = conv_tile()
    runs = {model: run_lb([conv], inputs, outputs, hw=chip(model=model, dataflow=OS))
            for model in ("flat", "tenet")}                      # one tile: pipelined or not, the same
    np.testing.assert_array_equal(runs["flat"].outputs[0], runs["tenet"].outputs[0])
    m, n, k = 4 * 4, 8, 3 * 3 * 4
    assert runs["flat"].report.busy["mme"] == k + 16 + 32
    assert runs["tenet"].report.busy["mme"] == k + (m - 1) + (n - 1)      # one 16 x 8 tile, skewed


def test_tenet_traffic_and_energy_come_from_the_dataflow_volumes():
    """A 40 x 40 x 8 matmul on stcp920's systolic MME, output-stationary (4 tiles): the LB moves each tensor's unique
    volume, the PE links its spatial reuse, the registers its temporal reuse; energy per tensor from the
    same volumes adds up to the report's LB (MME part) and PE-array energy. The flat model streams
    every operand element once and knows no links."""
    m, n, k = 40, 40, 8
    a, b = f16(m, k), f16(k, n, seed=1)
    mm = Mme(0, (m, n, k), (False, False, True), lb(8192, "float32", n, 1, 0),
             lb(0, "float16", k, 0, 1), lb(4096, "float16", 0, 1, n))
    size = {"A": 2, "B": 2, "Y": 4}
    runs = {model: run_lb([mm], [(0, a), (4096, b)], [(8192, (m, n), "float32")], hw=chip(model=model, dataflow=OS))
            for model in ("flat", "tenet")}
    np.testing.assert_array_equal(runs["flat"].outputs[0], runs["tenet"].outputs[0])
    hw = Hardware.from_dict(chip(model="tenet", dataflow=OS))
    volumes = {t.tensor: t for t in tile_metrics(hw, m, n, k).tensors}
    assert volumes["A"].unique == m * k * 2 and volumes["B"].unique == k * n * 3   # re-fed per column / row tile
    flat, tenet = runs["flat"].report, runs["tenet"].report
    staged, read_back = 2 * (m * k + k * n), 4 * m * n                # the DMAs into and out of the LB
    assert tenet.lb_read - read_back == (volumes["A"].unique + volumes["B"].unique) * 2
    assert flat.lb_read - read_back == (m * k + k * n) * 2
    assert tenet.lb_write - staged == volumes["Y"].unique * size["Y"] == m * n * 4 == flat.lb_write - staged
    assert tenet.pe_link_bytes == sum(v.spatial_reuse * size[t] for t, v in volumes.items()) > 0
    assert tenet.pe_register_bytes == sum(v.temporal_reuse * size[t] for t, v in volumes.items()) > 0
    assert flat.pe_link_bytes == flat.pe_register_bytes == 0
    e = hw.energy
    per_tensor = tile_metrics(hw, m, n, k).energy(size, e.lb_pj_per_bit, e.pe_link_pj_per_bit, e.pe_register_pj_per_bit)
    mme_lb = sum(v.unique * size[t] for t, v in volumes.items()) * 8 * e.lb_pj_per_bit
    assert sum(per_tensor.values()) * 1e-12 == pytest.approx(tenet.energy["pe_array"] + mme_lb * 1e-12)
    assert tenet.energy["lb"] == pytest.approx((staged + read_back + sum(v.unique * size[t] for t, v in volumes.items()))
                                               * 8 * e.lb_pj_per_bit * 1e-12)


# -- without barvinok (the optional extra "tenet") ------------------------------------------------

def test_without_barvinok_an_mme_without_closed_forms_is_costed_flat_with_a_warning(monkeypatch):
    """An 8 x 16 MME has no stored closed forms; with islpy unimportable it cannot be counted, so the chip
    warns once (naming itself, the package and the extra) and its MME instructions cost the flat formula."""
    d = chip(rows=8, cols=16, model="tenet", dataflow="weight-stationary")
    d["name"] = "edge-no-barvinok"
    hw = Hardware.from_dict(d)
    assert ("weight-stationary", 8, 16, "systolic-2d") not in closed.stored()
    monkeypatch.setitem(sys.modules, "islpy", None)               # import islpy raises ImportError
    with pytest.warns(UserWarning) as caught:
        cycles = mme_cycles(3, 40, 40, 20, hw)
    [warning] = caught
    assert str(warning.message) == (
        "chip 'edge-no-barvinok': its MME ('weight-stationary' on a 8x16 systolic-2d array) has no stored closed "
        "forms and counting needs barvinok, but islpy-barvinok is not installed: its MME instructions are costed "
        'with the flat model instead (pip install "tvm-dsa[tenet]" for TENET\'s cost)')
    assert cycles == 3 * math.ceil(40 / 8) * math.ceil(40 / 16) * 20 + 8 + 16
    ins, inputs, outputs = conv_tile()
    with warnings.catch_warnings():
        warnings.simplefilter("error")                             # once per chip
        run = run_lb([ins], inputs, outputs, hw=d)
        traffic = mme_traffic(ins, hw)
    m, n, k = 4 * 4, 8, 3 * 3 * 4
    assert run.report.busy["mme"] == math.ceil(m / 8) * math.ceil(n / 16) * k + 8 + 16
    assert (traffic.a, traffic.b, traffic.dst) == (m * k * 2, k * n * 2, m * n * 4)    # each element once
    assert traffic.links == traffic.registers == 0


def test_without_barvinok_the_presets_mme_is_costed_from_its_closed_forms(monkeypatch):
    d = chip()
    d["name"] = "stcp920-no-barvinok"
    hw = Hardware.from_dict(d)
    monkeypatch.setitem(sys.modules, "islpy", None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert mme_cycles(2, 37, 45, 29, hw) == 2 * mme_tile(37, 45, 29)
