"""Static execution planning (seed 001 §4.3): the exact order search equals brute force over all
topological orders, the greedy order is a valid order never better than it, and an order's peak
is the lower bound of the memory plan on its lifetimes."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_dsa.relax_passes.exec_plan import (DataflowGraph, greedy_order, lifetimes, optimal_order, peak_of,
                                            plan_order, topological)
from tvm_dsa.memory_plan import lower_bound


@st.composite
def graphs(draw, max_ops=7):
    n = draw(st.integers(1, max_ops))
    inputs = tuple(tuple(sorted(draw(st.sets(st.integers(0, v - 1), max_size=min(v, 3))))) if v else ()
                   for v in range(n))
    sizes = tuple(draw(st.integers(0, 8)) * 4 for _ in range(n))
    outputs = frozenset(draw(st.sets(st.integers(0, n - 1), max_size=2)))
    return DataflowGraph(sizes, inputs, outputs)


def all_orders(g):
    for order in itertools.permutations(range(len(g.sizes))):
        pos = {v: i for i, v in enumerate(order)}
        if all(pos[u] < pos[v] for v, p in enumerate(g.inputs) for u in p):
            yield order


@settings(max_examples=150, deadline=None)
@given(graphs())
def test_optimal_order_equals_brute_force(g):
    best = min(peak_of(g, o) for o in all_orders(g))
    found = optimal_order(g)
    assert found.peak == best == peak_of(g, found.order)
    greedy = greedy_order(g)
    assert greedy.peak == peak_of(g, greedy.order) >= best


@settings(max_examples=150, deadline=None)
@given(graphs())
def test_peak_is_the_lower_bound_of_the_memory_plan(g):
    order = topological(g)
    assert peak_of(g, order) == lower_bound(lifetimes(g, order))


def test_order_matters_on_two_branches():
    """Two branches from one input x (4 bytes): a makes 16 bytes then reduces them to 1; b makes
    8 and reduces them to 1; c joins. Running a's reduction before starting b peaks at
    x + a + a' = 21; interleaving (a, b, then the reductions) peaks at x + a + b = 28."""
    sizes = (4, 16, 1, 8, 1, 2)          # x, a, a', b, b', c
    inputs = ((), (0,), (1,), (0,), (3,), (2, 4))
    g = DataflowGraph(sizes, inputs, frozenset({5}))
    assert peak_of(g, (0, 1, 3, 2, 4, 5)) == 28
    assert optimal_order(g).peak == 21 and peak_of(g, optimal_order(g).order) == 21
    assert greedy_order(g).peak == 21


def test_plan_order_falls_back_to_greedy_beyond_the_budget():
    n = 14  # 14 independent ops: 2**14 sets to search
    g = DataflowGraph(tuple(range(1, n + 1)), ((),) * n, frozenset(range(n)))
    assert optimal_order(g, max_states=1000) is None
    assert plan_order(g, max_states=1000) == greedy_order(g)
    assert plan_order(g).peak == sum(range(1, n + 1))   # everything is returned: all live at the end


def test_bad_graphs_and_orders_are_named():
    with pytest.raises(ValueError, match="op 1 reads op 5, which is not another op"):
        DataflowGraph((1, 1), ((), (5,)))
    with pytest.raises(ValueError, match="the graph has a cycle"):
        DataflowGraph((1, 1), ((1,), (0,)))
    g = DataflowGraph((1, 1), ((), (0,)))
    with pytest.raises(ValueError, match="op 1 runs before one of its inputs"):
        peak_of(g, (1, 0))
