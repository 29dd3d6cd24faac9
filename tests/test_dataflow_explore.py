"""Data-centric (MAESTRO-style) dataflows and the design-space exploration over both notations."""

import pytest

from tvm_dsa.dataflow import NotationError, PEArray, TensorOp, analyse, multicast, systolic_2d
from tvm_dsa.dataflow import relations as rel
from tvm_dsa.dataflow.datacentric import DataCentric
from tvm_dsa.dataflow.explore import (best_datacentric, best_relation, datacentric_space, explore,
                                      relation_space, time_loop_sets)
from tvm_dsa.dataflow.library import BENCHMARKS, stationary

GEMM = "Y[i,j] += A[i,k] * B[k,j]"
BUSES = multicast(1, 2, (0, 1))


def gemm(i, j, k):
    return TensorOp.parse("GEMM", GEMM, {"i": i, "j": j, "k": k})


def test_directives_are_the_rectangular_relation():
    op = gemm(4, 6, 3)
    dc = DataCentric.parse(op, "SpatialMap(1,1) i; SpatialMap(1,1) j; TemporalMap(1,1) k")
    assert rel.theta(dc.relation((2, 3))).is_equal(rel.theta(stationary(op, ("i", "j"), ("k",), (2, 3))))
    # A SpatialMap's folds run in time where the directive stands; a loop that fits is not folded.
    late = DataCentric.parse(op, "SpatialMap i\nTemporalMap k\nSpatialMap j")
    assert str(late.relation((4, 3))) == "PE[i, j % 3] | T[k, j // 3]"


def test_estimate_is_exact_where_its_assumptions_hold():
    """Sizes that tile the array, buses that share a stamp's values, reuse across the innermost loop only:
    the polynomials give the exact counts."""
    array = PEArray((2, 2), BUSES, 4)
    conv = BENCHMARKS["conv2d"].op({"k": 2, "c": 2, "ox": 4, "oy": 4, "rx": 3, "ry": 3})
    for op, text in [(gemm(4, 4, 4), "SpatialMap i; SpatialMap j; TemporalMap k"),        # output-stationary
                     (gemm(4, 4, 4), "TemporalMap i; SpatialMap k; SpatialMap j"),        # weight-stationary
                     (conv, "SpatialMap k; SpatialMap c; TemporalMap ox; TemporalMap rx; TemporalMap ry; "
                            "TemporalMap oy")]:                                          # sliding window on A
        dc = DataCentric.parse(op, text)
        est, m = dc.estimate(array), analyse(dc.relation(array.shape), array)
        assert est.steps == m.time_stamps
        assert est.fetched == {t.tensor: t.unique for t in m.tensors}
        assert est.latency == m.latency


def test_estimate_sees_only_the_innermost_reuse():
    """B[k,c,rx,ry] stays on the array across both output folds (oy // 2 innermost, ox // 2 next): the
    relations count it once per element; the estimate fetches it again each time ox // 2 moves."""
    op = BENCHMARKS["conv2d"].op({"k": 2, "c": 2, "ox": 4, "oy": 4, "rx": 3, "ry": 3})
    dc = DataCentric.parse(op, "TemporalMap k; TemporalMap c; TemporalMap rx; TemporalMap ry; "
                               "SpatialMap ox; SpatialMap oy")
    array = PEArray((2, 2), BUSES, 4)
    est, m = dc.estimate(array), analyse(dc.relation(array.shape), array)
    assert m.tensor("B").unique == 2 * 2 * 3 * 3
    folds_ox = 4 // 2
    assert est.fetched["B"] == folds_ox * m.tensor("B").unique
    assert est.latency > m.latency


@pytest.mark.parametrize("text,msg", [
    ("SpatialMap i; SpatialMap j", "needs one directive per loop of GEMM"),
    ("SpatialMap i; SpatialMap j; TemporalMap k; TemporalMap k", "needs one directive per loop"),
    ("SpatialMap i; SpatialMap j; TemporalMap x", "x not a loop of GEMM"),
    ("TemporalMap i; TemporalMap j; TemporalMap k", "no SpatialMap"),
    ("SpatialMap(2,2) i; SpatialMap j; TemporalMap k", "only size = offset = 1"),
    ("SpatialMap i, SpatialMap j", "expected 'SpatialMap\\(1,1\\) loop'"),
])
def test_bad_directives_are_named(text, msg):
    with pytest.raises(NotationError, match=msg):
        DataCentric.parse(gemm(2, 2, 2), text)


def test_directives_must_match_the_array():
    dc = DataCentric.parse(gemm(2, 2, 2), "SpatialMap i; TemporalMap j; TemporalMap k")
    with pytest.raises(NotationError, match="1 SpatialMap\\(s\\) but the PE array \\(2, 2\\) has 2 axes"):
        dc.relation((2, 2))


def test_spaces():
    op = gemm(4, 3, 2)
    dcs = datacentric_space(op, (2, 2))
    # 6 ordered SpatialMap pairs, one temporal loop each; a fold of the second SpatialMap can be innermost
    # too when its loop exceeds the axis (j = 3 > 2, i = 4 > 2, k = 2 fits).
    assert len(dcs) == 6 + sum(op.sizes[s1] > 2 for s0 in op.loops for s1 in op.loops if s0 != s1)
    rcs = relation_space(op, (2, 2), skew=True)
    assert {str(dc.relation((2, 2))) for dc in dcs} <= {str(df) for df in rcs}
    assert len({str(df) for df in rcs}) == len(rcs)
    # ox + rx and oy + ry on the array: the other four loops, plus one loop of each sum, determine them all.
    conv = BENCHMARKS["conv2d"].op()
    assert time_loop_sets(conv, ("ox + rx", "oy + ry")) == [
        ("k", "c", "ox", "oy"), ("k", "c", "ox", "ry"), ("k", "c", "oy", "rx"), ("k", "c", "rx", "ry")]
    assert time_loop_sets(conv, ("ox + rx", "ox + rx")) == []


@pytest.mark.parametrize("interconnect", [BUSES, systolic_2d()], ids=["buses", "systolic"])
def test_branch_and_bound_finds_the_best_of_the_space(interconnect):
    """The search's best latency equals the minimum over every candidate analysed, and it analysed fewer."""
    op = gemm(3, 4, 3)
    array = PEArray((2, 3), interconnect, 3)
    space = relation_space(op, array.shape, skew=interconnect.delay == 1)
    brute = min(analyse(df, array).latency for df in space)
    found = explore("relation-centric", space, array)
    assert found.best.metrics.latency == brute
    assert found.evaluated < found.candidates
    assert found.best.metrics == analyse(next(df for df in space if str(df) == found.best.metrics.dataflow), array)


def test_relation_centric_beats_data_centric_on_a_systolic_array():
    """A skewed dataflow (inexpressible with directives) lets operands hop PE to PE; the best rectangular
    one cannot share a value between neighbours that need it in the same stamp."""
    op = gemm(4, 4, 8)
    array = PEArray((2, 2), systolic_2d(), 2)
    dc, rc = best_datacentric(op, array), best_relation(op, array)
    assert rc.best.metrics.latency < dc.best.metrics.latency
    assert "+" in rc.best.metrics.dataflow.split("|")[1]          # the winner's time is skewed
    assert dc.best.metrics.latency == min(analyse(d.relation((2, 2)), array).latency
                                          for d in datacentric_space(op, (2, 2)))
    buses = PEArray((2, 2), BUSES, 2)
    assert best_relation(op, buses).best.metrics.latency <= best_datacentric(op, buses).best.metrics.latency
