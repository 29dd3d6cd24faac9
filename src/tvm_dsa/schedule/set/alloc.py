"""Tile allocation for S-cuts (seed 002 §3.3.2): how many tiles each child gets, and which.

How many: proportional to the children's normalised processing time (NPT), in whole tiles. The
S-cut runs as fast as its slowest child, whose time per sample is ``npt_i / x_i`` on ``x_i`` tiles,
so the best integer allocation minimises ``max_i npt_i / x_i`` subject to ``sum x_i = G`` and
``x_i >= min_i`` (a child needs at least its own minimum). ``allocate`` is the greedy that gives
the next tile to the child with the largest ``npt_i / x_i``; it is optimal (see its docstring).

Which: tiles carry ids along a stripe order of the mesh (§3.3.2, after Tangram): bottom row left to
right, the next row right to left, ... (a snake, so that consecutive ids are neighbours and every
range of ids is a connected region). An S-cut gives its children consecutive ranges of its own ids,
left to right; a T-cut gives every child all of its ids.
"""

from __future__ import annotations

import heapq


def allocate(npt: list[float], minimum: list[int], tiles: int) -> list[int]:
    """Integer tile counts ``x`` with ``sum(x) == tiles``, ``x[i] >= minimum[i]``, minimising
    ``max_i npt[i] / x[i]``; ties go to the earlier child.

    Optimal: let ``V*`` be the optimum. Any feasible allocation with value ``<= V*`` needs
    ``x_i >= need_i = max(minimum_i, ceil(npt_i / V*))``, and ``sum need_i <= tiles``. The greedy
    only adds a tile to a child whose ratio is the current maximum; while that maximum is above
    ``V*`` the child has ``x_i < need_i``, so the greedy never exceeds ``need`` on a child whose
    ratio is above ``V*`` before all are at or below it, which happens within ``sum need_i`` tiles.
    """
    if len(npt) != len(minimum):
        raise ValueError("allocate: one minimum per child")
    if sum(minimum) > tiles:
        raise ValueError(f"allocate: the children need {sum(minimum)} tiles, the group has {tiles}")
    if any(p < 0 for p in npt):
        raise ValueError("allocate: processing times must be non-negative")
    x = list(minimum)
    heap = [(-p / m, i) for i, (p, m) in enumerate(zip(npt, x))]
    heapq.heapify(heap)
    for _ in range(tiles - sum(x)):
        _, i = heapq.heappop(heap)
        x[i] += 1
        heapq.heappush(heap, (-npt[i] / x[i], i))
    return x


def imbalance(npt: list[float], x: list[int]) -> float:
    """The S-cut's time per sample under allocation ``x`` (the slowest child)."""
    return max(p / n for p, n in zip(npt, x))


def stripe_order(width: int, height: int) -> list[tuple[int, int]]:
    """(x, y) mesh coordinates of tile ids 0, 1, ...: rows from the bottom, snaking."""
    order = []
    for y in range(height):
        xs = range(width) if y % 2 == 0 else reversed(range(width))
        order.extend((x, y) for x in xs)
    return order


def split_range(lo: int, counts: list[int]) -> list[tuple[int, int]]:
    """Consecutive id ranges [start, end) of the given sizes from ``lo`` on."""
    out = []
    for n in counts:
        out.append((lo, lo + n))
        lo += n
    return out
