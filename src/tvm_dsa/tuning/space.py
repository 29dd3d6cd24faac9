"""The tuning space of a DSA kernel: what meta-schedule samples, and the check that a sample fits.

A kernel is tiled by ``tir_passes.tile_anchor``, the same transformation ``lower_kernel`` applies
with its fixed ``TilePlan``; here every split factor is a ``sample_perfect_tile`` decision (the
tile size of each spatial loop of the anchor and the chunk of its first reduction loop), and the
order of the tile loops is one design space per permutation. Both change the DSA program: the tile
sizes set every instruction's box and how many tiles the cores share, the chunk how often partial
sums are accumulated, the order which loop is dealt over the clusters and whether consecutive tiles
on a core reuse the operand already in its LB. ``FitsDSA`` rejects samples whose working set
exceeds the LB or whose indices stop being affine, before they are measured.
"""

from __future__ import annotations

import itertools

from tvm import s_tir
from tvm.s_tir import meta_schedule as ms
from tvm.ir.utils import derived_object

from .. import hardware
from ..codegen.kernel_ir import plan_lb, read_kernel
from ..hardware import Hardware
from ..tir_passes import TilePlan, Unsupported, anchor_info, assign_scopes, lower_to_dsa
from ..tir_passes.tile import tile_anchor

MAX_ORDERS = 24  # design spaces per kernel: all orders of up to four tiled loops


def tile_orders(spatial: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Orders of the tile loops worth trying: loops of extent 1 stay where they are (they have one
    tile whatever the order), the others are permuted; the anchor's own order comes first. Beyond
    ``MAX_ORDERS`` permutations, only the rotations of the identity are kept."""
    free = [i for i, e in enumerate(spatial) if e > 1]
    perms = list(itertools.permutations(free))
    if len(perms) > MAX_ORDERS:
        perms = [tuple(free[k:] + free[:k]) for k in range(len(free))]
    orders = []
    for perm in perms:
        order, it = list(range(len(spatial))), iter(perm)
        for i in free:
            order[i] = next(it)
        orders.append(tuple(order))
    return orders


def sample_tiling(sch: s_tir.Schedule, order: tuple[int, ...], plan: TilePlan | None = None) -> None:
    """Tile ``sch``'s anchor with sampled factors (decisions of ``plan`` when given) in ``order``."""

    def factors(s, loop, extent, index):
        if plan is None:
            decision = None
        else:
            t = plan.chunk if index is None else plan.tiles[index]
            decision = None if t is None else [extent // t, t]
        return s.sample_perfect_tile(loop, n=2, max_innermost_factor=extent, decision=decision)

    tile_anchor(sch, factors, order)


def design_spaces(sch: s_tir.Schedule) -> list[s_tir.Schedule]:
    """One design space per tile-loop order, each with sampled tile sizes and chunk."""
    info = anchor_info(sch.mod["main"])
    out = []
    for order in tile_orders(info.spatial):
        s = sch.copy()
        sample_tiling(s, order)
        out.append(s)
    return out


def lower_scheduled(func, hw: Hardware):
    """A tiled PrimFunc (a tuning sample or record) lowered for the DSA: scopes, DSA operations,
    and the check that a tile's working set fits the LB (``Unsupported`` if not)."""
    sch = s_tir.Schedule(func)
    assign_scopes(sch)
    lower_to_dsa(sch)
    lowered = sch.mod["main"]
    plan_lb(read_kernel(lowered), hw)
    return lowered


@derived_object
class FitsDSA(ms.postproc.PyPostproc):
    """Postprocessor: accept a sample only if it lowers to a DSA kernel on the task's chip."""

    def __init__(self, hw: Hardware | None = None):
        super().__init__()
        self.hw = hw

    def _initialize_with_tune_context(self, context) -> None:
        self.hw = hardware.from_target(context.target)

    def apply(self, sch: s_tir.Schedule) -> bool:
        try:
            lower_scheduled(sch.mod["main"], self.hw)
        except Unsupported:
            return False
        return True

    def clone(self) -> "FitsDSA":
        return FitsDSA(self.hw)


def space_generator() -> ms.space_generator.ScheduleFn:
    """The DSA design spaces with no CPU schedule rules, the LB check as the only postprocessor
    and tile-size mutation for the evolutionary search."""
    return ms.space_generator.ScheduleFn(design_spaces, sch_rules=[], postprocs=[FitsDSA()],
                                         mutator_probs={ms.mutator.MutateTileSize(): 1.0})
