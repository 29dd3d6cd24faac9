"""Memory allocation plans (seed 001 §4.4.1): every planner's plan is valid on random lifetimes
(no two tensors live at one step share a byte), no plan beats CP-SAT's optimum or the live-bytes
lower bound, and the peak-first order starts at the peak."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_dsa.memory_plan import (
    PLANNERS, Lifetime, best_greedy, greedy_by_size, live_bytes, lower_bound, optimal, peak_first,
    peak_first_order, place
)


@st.composite
def lifetimes(draw, max_tensors=14, steps=12):
    n = draw(st.integers(0, max_tensors))
    out = []
    for _ in range(n):
        first = draw(st.integers(0, steps - 1))
        out.append(Lifetime(draw(st.integers(0, 64)) * 4, first, draw(st.integers(first, steps - 1))))
    return out


def collisions(lts, offsets) -> list:
    """Brute force: pairs of tensors live at a common step whose byte ranges intersect."""
    return [(i, j) for i in range(len(lts)) for j in range(i + 1, len(lts))
            if lts[i].size and lts[j].size
            and max(lts[i].first, lts[j].first) <= min(lts[i].last, lts[j].last)
            and max(offsets[i], offsets[j]) < min(offsets[i] + lts[i].size, offsets[j] + lts[j].size)]


@pytest.mark.parametrize("planner", sorted(PLANNERS))
def test_plans_are_valid_on_random_lifetimes(planner):
    @settings(max_examples=200, deadline=None)
    @given(lifetimes())
    def valid(lts):
        plan = PLANNERS[planner](lts)
        assert len(plan.offsets) == len(lts) and min(plan.offsets, default=0) >= 0
        assert not collisions(lts, plan.offsets)
        assert plan.peak == max((o + t.size for o, t in zip(plan.offsets, lts)), default=0)
        assert plan.peak >= lower_bound(lts)

    valid()


@settings(max_examples=25, deadline=None)
@given(lifetimes(max_tensors=8, steps=6))
def test_no_plan_beats_the_optimum(lts):
    best = optimal(lts, seconds=5)
    assert best.proven and not collisions(lts, best.plan.offsets)
    assert lower_bound(lts) <= best.plan.peak <= min(p(lts).peak for p in PLANNERS.values())


@settings(max_examples=20, deadline=None)
@given(lifetimes(max_tensors=4, steps=4).filter(lambda lts: sum(t.size for t in lts) <= 48))
def test_optimum_equals_brute_force_on_tiny_instances(lts):
    """Every offset assignment on a 4-byte grid below the sum of the sizes (sizes are multiples
    of 4, so an optimal plan exists on that grid)."""
    total = sum(t.size for t in lts)
    best = min(max((o + t.size for o, t in zip(offs, lts)), default=0)
               for offs in itertools.product(range(0, total + 1, 4), repeat=len(lts)) if not collisions(lts, offs))
    assert optimal(lts).plan.peak == best


def test_peak_first_order_starts_with_the_peak_tensors_largest_first():
    lts = [Lifetime(8, 0, 1), Lifetime(32, 1, 2), Lifetime(16, 2, 3), Lifetime(4, 2, 2), Lifetime(8, 3, 4)]
    assert live_bytes(lts) == [8, 40, 52, 24, 8]
    order = peak_first_order(lts)
    assert order[:3] == [1, 2, 3]          # live at step 2, by size
    assert order[3:] == [0, 4]             # then step 1 (40 live) before step 3 (24)
    assert PLANNERS["peak_first"](lts).peak == 52


def test_best_greedy_takes_the_least_of_its_orders_where_peak_first_misses():
    a, b, c, d = Lifetime(8, 0, 1), Lifetime(8, 0, 2), Lifetime(16, 2, 3), Lifetime(8, 1, 1)
    lts = [a, b, c, d]
    assert live_bytes(lts) == [16, 24, 24, 16]
    # peak-first: a, b, d live at step 1 take 0, 8, 16; c (16 bytes, steps 2-3) finds no 16-byte
    # gap below b and goes above it: 32
    assert peak_first(lts).offsets == (0, 8, 16, 16) and peak_first(lts).peak == 32
    # largest first: c at 0; a (gone before c starts) at 0; b above both at 16; d in a..b's gap at 8
    assert greedy_by_size(lts).offsets == (0, 16, 0, 8)
    assert best_greedy(lts).peak == 24 == lower_bound(lts)


def test_bad_lifetimes_and_orders_are_named():
    with pytest.raises(ValueError, match="Lifetime.size must be a non-negative integer"):
        Lifetime(-1, 0, 0)
    with pytest.raises(ValueError, match=r"Lifetime.first \(3\) is after Lifetime.last \(2\)"):
        Lifetime(4, 3, 2)
    with pytest.raises(ValueError, match="order must list every tensor exactly once"):
        place([Lifetime(4, 0, 0)], [0, 0])
