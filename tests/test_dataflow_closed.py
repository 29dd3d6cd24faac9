"""Closed forms of the MME dataflows' counts (barvinok's parametric counting) against exact counts."""

import json
import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from helpers import PRESETS, brute_force, lb, make_program, preset

from tvm_dsa import hardware
from tvm_dsa.cli import main
from tvm_dsa.dataflow import PEArray, closed
from tvm_dsa.harness.dataflow_choice import mme_products, rank
from tvm_dsa.dataflow.expr import NotationError
from tvm_dsa.dataflow.library import BENCHMARKS, VARIANTS, mme_bandwidth, standard_dataflows, stationary
from tvm_dsa.dataflow.metrics import analyse
from tvm_dsa.dataflow.notation import interconnect
from tvm_dsa.hardware import get
from tvm_dsa.hardware.model import Hardware
from tvm_dsa.isa import Mme

# The chips of the shipped preset files (not those other tests register in the process).
SHIPPED = [hardware.get(path.stem) for path in sorted(PRESETS.glob("*.toml"))]

# Small arrays, so that enumeration is fast: every kind and variant (pipelined over systolic links).
SMALL = [(kind + variant, r, c, links)
         for r, c, links in ((2, 3, "systolic-2d"), (3, 2, "systolic-1d"), (3, 2, "mesh"), (2, 3, "multicast-2"))
         for kind in BENCHMARKS["gemm"].stationary for variant in VARIANTS
         if variant != closed.PIPELINED or closed.composable(interconnect(links, 2))]


@pytest.fixture(scope="module")
def small_forms():
    """The small arrays' closed forms, derived and turned into Python as for the stored ones."""
    forms = {}
    for key in SMALL:
        namespace = {}
        exec(closed.python_source(key, closed.derive(key)), namespace)
        forms[key] = namespace["FORMS"]
    return forms


def standard(key, m, n, k):
    name, rows, cols, links = key
    df = standard_dataflows(BENCHMARKS["gemm"], BENCHMARKS["gemm"].op({"i": m, "j": n, "k": k}), (rows, cols))[name]
    return df, PEArray((rows, cols), interconnect(links, 2), 2.0)


@settings(max_examples=150, deadline=None)
@given(key=st.sampled_from(SMALL), m=st.integers(1, 7), n=st.integers(1, 7), k=st.integers(1, 5))
def test_closed_forms_equal_enumeration_on_small_arrays(small_forms, key, m, n, k):
    """Every count, pipelined ones composed from tiles and pairs of tiles, equals the enumeration."""
    got = closed.metrics(key, 2.0, m, n, k, small_forms)
    instances, _, times, volumes = brute_force(*standard(key, m, n, k))
    assert (got.instances, got.time_stamps) == (instances, times)
    assert got.tensors == tuple(volumes[t.tensor] for t in got.tensors)


@settings(max_examples=40, deadline=None)
@given(key=st.sampled_from(closed.preset_keys(SHIPPED)), m=st.integers(1, 40), n=st.integers(1, 72), k=st.integers(1, 40))
def test_stored_closed_forms_equal_the_counts(key, m, n, k):
    """The shipped forms (the presets' MMEs) against barvinok's count at the shape: every field."""
    exact = analyse(*standard(key, m, n, k))
    got = closed.metrics(key, 2.0, m, n, k)
    assert (got.instances, got.time_stamps, got.tensors) == (exact.instances, exact.time_stamps, exact.tensors)
    assert got.latency == exact.latency


def test_stored_forms_cover_the_presets_mme_dataflows():
    for chip in SHIPPED:
        mme = chip.mme
        assert (mme.dataflow, mme.rows, mme.cols, mme.interconnect) in closed.stored()


def test_what_has_no_closed_form_is_refused():
    op = BENCHMARKS["gemm"].op({"i": 4, "j": 4, "k": 4})
    with pytest.raises(NotationError, match="its time strides are loop sizes, so it has no symbolic form"):
        stationary(op, ("i", "j"), ("k",), (2, 2), skew=True, pipelined=True, symbolic=True)
    for links in ("multicast-1", "mesh"):
        with pytest.raises(ValueError, match="pipelined forms are composed over systolic links only"):
            closed.derive(("output-stationary, systolic, pipelined", 2, 2, links))
    with pytest.raises(ValueError, match="GEMM sizes must be positive, got 0 x 4 x 4"):
        closed.counts(closed.preset_keys(SHIPPED)[0], 0, 4, 4)


def test_rank_charges_each_dataflow_its_exact_latency_per_product():
    """The ranking's cycles are Σ products x ⌈latency⌉ with the latency counted on the relations."""
    hw = get("stcp920")
    products = Counter({(16, 32, 24): 3, (40, 8, 20): 1, (5, 70, 3): 2})
    ranked = rank(hw, products)
    keys = [k for k in closed.stored() if k[1:] == (16, 32, "systolic-2d")]
    assert sorted(r.dataflow for r in ranked) == sorted(k[0] for k in keys)
    assert [r.cycles for r in ranked] == sorted(r.cycles for r in ranked)
    macs = sum(t * m * n * k for (m, n, k), t in products.items())
    for r in ranked:
        key = (r.dataflow, 16, 32, "systolic-2d")
        exact = sum(t * math.ceil(analyse(*standard(key, *shape)[:1], PEArray((16, 32), interconnect("systolic-2d", 2),
                                                                             mme_bandwidth(hw))).latency - 1e-9)
                    for shape, t in products.items())
        assert r.cycles == exact and r.utilisation == pytest.approx(macs / (exact * 512))
    with pytest.raises(ValueError, match="no MME products"):
        rank(hw, Counter())
    odd = Hardware.from_dict({**preset("stcp920"), "mme": {**preset("stcp920")["mme"], "rows": 8}})
    with pytest.raises(ValueError, match="no closed forms are stored for a 8x32 systolic-2d MME"):
        rank(odd, products)


def test_mme_products_count_batched_instructions_per_shape():
    conv = Mme(0, (4, 4, 8, 3, 3, 4), (False, False, False, True, True, True), dst=lb(2048, "float32", 32, 8, 1, 0, 0, 0),
               a=lb(0, "float16", 36, 4, 0, 36, 4, 1), b=lb(1024, "float16", 0, 0, 1, 96, 32, 8))
    batched = Mme(0, (3, 8, 16, 12), (False, False, False, True), lb(16384, "float32", 128, 16, 1, 0),
                  lb(0, "float16", 96, 12, 0, 1), lb(4096, "float16", 192, 0, 1, 16))
    program = make_program([[conv, batched, conv]])
    assert mme_products([program, program]) == Counter({(16, 8, 36): 4, (8, 16, 12): 6})


def test_cli_ranks_the_mme_dataflows_for_a_model(capsys):
    assert main(["dataflow", "--model", "dlrm", "--tiny", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    cycles = [r["cycles"] for r in out["ranked"]]
    assert cycles == sorted(cycles) and out["shapes"] > 0
    assert f"the preset runs {get('stcp920').mme.dataflow!r}" in out["head"]
    assert main(["dataflow"]) == 2
    assert "give an operation (a benchmark or a statement) or --model" in capsys.readouterr().err
