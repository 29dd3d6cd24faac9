"""The tuning space of a DSA kernel: what meta-schedule samples, and the check that a sample fits.

A kernel is tiled by ``tir_passes.tile_anchor``, the same transformation ``lower_kernel`` applies
with its fixed ``TilePlan``; here every split factor is a ``sample_perfect_tile`` decision (the
tile size of each spatial loop of the anchor and the chunk of its first reduction loop), and the
order of the tile loops is one design space per permutation. Both change the DSA program: the tile
sizes set every instruction's box and how many tiles the cores share, the chunk how often partial
sums are accumulated, the order which loop is dealt over the clusters and whether consecutive tiles
on a core reuse the operand already in its LB. Double buffering is a ``sample_categorical``
decision annotated on the root block (``dsa.double_buffer``): two LB copies let loads overlap
compute, one leaves room for larger tiles. Which unit runs a contraction is another, annotated on
the anchor (``dsa.vector_contraction``), offered where the MME would use one PE column
(``unit_choice``): the MME, or the vector units as products and a sum reduction. ``FlipChoice``
flips either decision. ``FitsDSA`` rejects, before they are measured,
samples whose working set exceeds the LB, whose indices stop being affine, or whose tiles are
below the floor under which per-tile overheads always lose (``below_floor``).

On a large layer most uniform samples fail that check (BERT's FFN GEMMs: none of 40), so the
space also has **capacity boxes** (``capacity_boxes``): tilings grown from the smallest one above
the floor, loop by loop, each to the largest tile that still fits the chip's LB; every tiling
between that floor and such a top fits and clears the floor, and the box's spaces sample each
loop's tile among those sizes with ``sample_categorical``, largest first (a box is for one unit:
on the vector units a tile also holds its products). ``StepTile`` moves one of those decisions to
a neighbouring size.
"""

from __future__ import annotations

import functools
import itertools
import math
import random
from dataclasses import dataclass

import tvm_ffi
from tvm import s_tir
from tvm.s_tir import meta_schedule as ms
from tvm.ir.utils import derived_object

from tvm_dsa import hardware
from tvm_dsa.kernel.ir import plan_lb, read_kernel
from tvm_dsa.hardware import Hardware
from tvm_dsa.schedule.set.ops import divisors
from tvm_dsa.tir_passes.tile import TilePlan, anchor_info
from tvm_dsa.kernel.analysis import Unsupported
from tvm_dsa.tir_passes.scopes import assign_scopes
from tvm_dsa.tir_passes.lower import lower_to_dsa
from tvm_dsa.tir_passes import lower_with_plan
from tvm_dsa.kernel.attrs import DOUBLE_BUFFER, VECTOR_CONTRACTION
from tvm_dsa.tir_passes.tile import (
    AnchorInfo, annotate_double_buffer, annotate_vector_contraction, tile_anchor, unit_choice
)

MAX_ORDERS = 24  # design spaces per kernel: all orders of up to four tiled loops
MIN_VECTOR_TILE = 64  # innermost tile of a kernel without contraction (as ``parallel_plans``)


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


@dataclass(frozen=True)
class CapacityBox:
    """Tile sizes a capacity space samples, largest first: per spatial loop of the anchor, and for
    the chunk of its first reduction loop (None: no reduction loop). Every tiling that takes one
    size per loop fits the LB and clears ``below_floor``."""

    tiles: tuple[tuple[int, ...], ...]
    chunk: tuple[int, ...] | None
    vector: bool = False  # the tilings of the contraction on the vector units, not the MME


def largest_first(n: int) -> list[float]:
    """Probabilities of ``n`` sizes listed largest first: each half the one before."""
    weights = [2.0 ** -i for i in range(n)]
    return [w / sum(weights) for w in weights]


def sample_tiling(sch: s_tir.Schedule, order: tuple[int, ...], plan: TilePlan | None = None,
                  double_buffer: bool | None = None, box: CapacityBox | None = None,
                  choose_unit: bool = False) -> None:
    """Tile ``sch``'s anchor with sampled factors in ``order``, sample double buffering and, with
    ``choose_unit``, the contraction's unit; the decisions are ``plan``'s and ``double_buffer``
    when given. With ``box`` each tile (and the chunk) is a ``sample_categorical`` among the box's
    sizes instead of any divisor, and the unit is the box's."""

    def factors(s, loop, extent, index):
        if box is not None:
            sizes = box.chunk if index is None else box.tiles[index]
            return None if sizes is None else [None, s.sample_categorical(list(sizes), largest_first(len(sizes)))]
        if plan is None:
            decision = None
        else:
            t = plan.chunk if index is None else plan.tiles[index]
            decision = None if t is None else [extent // t, t]
        return s.sample_perfect_tile(loop, n=2, max_innermost_factor=extent, decision=decision)

    tile_anchor(sch, factors, order)
    decision = None if double_buffer is None else int(double_buffer)
    annotate_double_buffer(sch, sch.sample_categorical([0, 1], [0.5, 0.5], decision=decision))
    if choose_unit:
        if box is not None:
            unit = sch.sample_categorical([int(box.vector)], [1.0])
        else:
            unit = sch.sample_categorical([0, 1], [0.5, 0.5], decision=None if plan is None else int(plan.vector))
        annotate_vector_contraction(sch, unit)


def design_spaces(sch: s_tir.Schedule, hw: Hardware | None = None) -> list[s_tir.Schedule]:
    """One design space per tile-loop order, each with sampled tile sizes and chunk; with ``hw``,
    also one per order and capacity box of the kernel on that chip (``capacity_boxes``), and the
    contraction's unit where the chip offers a choice (``unit_choice``)."""
    info = anchor_info(sch.mod["main"])
    boxes = [None] + (capacity_boxes(sch.mod["main"], hw) if hw is not None else [])
    choose = hw is not None and unit_choice(info, hw)
    out = []
    for box in boxes:
        for order in tile_orders(info.spatial):
            s = sch.copy()
            sample_tiling(s, order, box=box, choose_unit=choose)
            out.append(s)
    return out


def fits_lb(func, plan: TilePlan, hw: Hardware) -> bool:
    """Whether ``func`` tiled by ``plan`` lowers with one copy of each tile buffer in ``hw``'s LB."""
    try:
        plan_lb(read_kernel(lower_with_plan(func, plan)), hw)
    except Unsupported:
        return False
    return True


def _floor_tiling(info: AnchorInfo, sizes: list[list[int]], hw: Hardware) -> list[int]:
    """The smallest size of each loop, raised (inner loops first: long DMA rows) until the tiling
    clears ``below_floor``: a contraction's M and N products, another anchor's innermost loop."""
    lo = [s[0] for s in sizes]
    if "N" in info.roles:
        for role, floor in (("M", hw.mme.rows), ("N", hw.mme.cols)):
            loops = [i for i, r in enumerate(info.roles) if r == role]
            need = min(floor, math.prod(info.spatial[i] for i in loops))
            for i in reversed(loops):
                rest = math.prod(lo[j] for j in loops if j != i)
                lo[i] = next((t for t in sizes[i] if rest * t >= need), sizes[i][-1])
    elif lo:
        lo[-1] = next(t for t in sizes[-1] if t >= min(MIN_VECTOR_TILE, _widest(info, -1)))
    return lo


def capacity_boxes(func, hw: Hardware) -> list[CapacityBox]:
    """The capacity boxes (``unit_boxes``) of the kernel's contraction on the MME and, where the
    chip offers a choice (``unit_choice``), on the vector units."""
    units = (False, True) if unit_choice(anchor_info(func), hw) else (False,)
    return [box for vector in units for box in unit_boxes(func, hw, vector)]


def unit_boxes(func, hw: Hardware, vector: bool = False) -> list[CapacityBox]:
    """Boxes of tilings near the capacity of ``hw``'s LB that all fit it and clear the floor, the
    contraction on the vector units if ``vector``.

    From the smallest tiling above the floor (``_floor_tiling``), each loop with a choice (and the
    chunk) in turn takes the largest size with which the tiling still fits (a bisection over its
    sizes, each probe lowered); one box per rotation of the order in which loops grow (the first
    to grow takes the most of the LB). A box offers every size between the floor's and the top's:
    the working set grows with every tile size, so none of them leaves the LB. A loop's sizes are
    the divisors of its extent that divide its alignment (of the raw indices, so that every tiling
    stays affine). Empty when even the floor's tiling does not fit."""
    info = anchor_info(func, False)
    sizes = [divisors(_widest(info, i)) for i in range(len(info.spatial))]
    chunks = divisors(info.reduction[0]) if info.reduction else None
    lo, lo_chunk = _floor_tiling(info, sizes, hw), chunks[0] if chunks else None
    if below_floor(info, tuple(lo), hw) or not fits_lb(func, TilePlan(tuple(lo), lo_chunk, vector), hw):
        return []
    free = [i for i, s in enumerate(sizes) if s[-1] > lo[i]] + (["chunk"] if chunks and len(chunks) > 1 else [])
    boxes = []
    for k in range(len(free)):
        tiles, chunk = list(lo), lo_chunk
        for loop in free[k:] + free[:k]:
            if loop == "chunk":
                options = [c for c in chunks if c >= chunk]
                chunk = options[_last_true(len(options), lambda j: fits_lb(func, TilePlan(tuple(tiles), options[j], vector), hw))]
            else:
                options = [t for t in sizes[loop] if t >= tiles[loop]]
                grown = lambda j: TilePlan(tuple(tiles[:loop] + [options[j]] + tiles[loop + 1:]), chunk, vector)  # noqa: E731
                tiles[loop] = options[_last_true(len(options), lambda j: fits_lb(func, grown(j), hw))]
        box = CapacityBox(tuple(tuple(t for t in reversed(s) if lo[i] <= t <= tiles[i]) for i, s in enumerate(sizes)),
                          tuple(c for c in reversed(chunks) if c <= chunk) if chunks else None, vector)
        if box not in boxes:
            boxes.append(box)
    return boxes


def _last_true(n: int, pred) -> int:
    """Largest i in [0, n) with pred(i), for a pred true from 0 up to some point."""
    lo, hi = 0, n - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if pred(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def below_floor(info: AnchorInfo, tiles: tuple[int, ...], hw: Hardware) -> str | None:
    """Why ``tiles`` (the anchor's spatial tile sizes) are too small to be worth measuring, or
    None. A contraction's M and N tile products must reach the PE array's rows and columns (or
    the whole extent, if smaller); another anchor's innermost tile 64 elements (or the widest
    tile its alignment allows: a reshape's 16-element rows of a 64-wide loop take tiles of 16).
    Below that every instruction pays its fixed costs for a fraction of the work: on a 64-channel
    3x3 conv such samples measured 2.2 to 220 times slower than the default (docs/tuning.md)."""
    def product(values, role):
        return math.prod(v for v, r in zip(values, info.roles) if r == role)

    if "N" in info.roles:
        for role, floor in (("M", hw.mme.rows), ("N", hw.mme.cols)):
            if product(tiles, role) < min(floor, product(info.spatial, role)):
                return f"{role} tile {product(tiles, role)} is below the PE array's {floor}"
        return None
    if tiles and tiles[-1] < min(MIN_VECTOR_TILE, _widest(info, -1)):
        return f"innermost tile {tiles[-1]} is below {min(MIN_VECTOR_TILE, _widest(info, -1))} elements"
    return None


def _widest(info: AnchorInfo, i: int) -> int:
    """The widest tile of spatial loop ``i``: its extent, or the part of it that divides its alignment."""
    align = info.align[i] if info.align else 1
    return math.gcd(info.spatial[i], align) if align > 1 else info.spatial[i]


def sampled_tiles(sch: s_tir.Schedule, spatial: int) -> tuple[int, ...]:
    """The tile sizes a sample chose for the anchor's ``spatial`` loops: the inner factors of its
    first splits (``tile_anchor`` splits the spatial loops first, in order)."""
    splits = [inst for inst in sch.trace.insts if inst.kind.name == "Split"][:spatial]
    return tuple(int(sch.get(inst.inputs[-1])) for inst in splits)


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
    """Postprocessor: accept a sample only if it lowers to a DSA kernel on the task's chip.

    The verdict is remembered per scheduled function (its structural hash): the evolutionary
    search proposes the same sample again and again, and lowering one to check it costs 0.05-0.3 s
    on a full-size layer, where hashing it costs 0.3 ms."""

    def __init__(self, hw: Hardware | None = None, info: AnchorInfo | None = None, seen: dict | None = None):
        super().__init__()
        self.hw, self.info, self.seen = hw, info, {} if seen is None else seen

    def _initialize_with_tune_context(self, context) -> None:
        self.hw = hardware.from_target(context.target)
        self.info = anchor_info(context.mod["main"])

    def apply(self, sch: s_tir.Schedule) -> bool:
        if below_floor(self.info, sampled_tiles(sch, len(self.info.spatial)), self.hw):
            return False
        key = tvm_ffi.structural_hash(sch.mod["main"])
        if key not in self.seen:
            try:
                lower_scheduled(sch.mod["main"], self.hw)
                self.seen[key] = True
            except Unsupported:
                self.seen[key] = False
        return self.seen[key]

    def clone(self) -> "FitsDSA":
        return FitsDSA(self.hw, self.info, self.seen)


@derived_object
class FlipChoice(ms.mutator.PyMutator):
    """Mutator: the trace with one of its two-way decisions (double buffering, the contraction's
    unit) flipped (meta-schedule's own categorical mutator, ``MutateUnroll``, only touches unroll
    annotations)."""

    def _initialize_with_tune_context(self, context) -> None:
        pass

    def apply(self, trace, rand_state):
        uses = {inst.inputs[1] for inst in trace.insts
                if inst.kind.name == "Annotate" and str(inst.attrs[0]) in (DOUBLE_BUFFER, VECTOR_CONTRACTION)}
        choices = [inst for inst in trace.insts
                   if inst.kind.name == "SampleCategorical" and inst.outputs[0] in uses and len(inst.attrs[0]) == 2]
        if not choices:
            return None
        inst = random.Random(rand_state).choice(choices)
        return trace.with_decision(inst, 1 - int(trace.decisions[inst]), remove_postproc=True)

    def clone(self) -> "FlipChoice":
        return FlipChoice()


@derived_object
class StepTile(ms.mutator.PyMutator):
    """Mutator: a capacity space's tile (or chunk) decision moved to the next larger or smaller
    size of its box (``MutateTileSize`` only mutates ``sample_perfect_tile`` decisions)."""

    def _initialize_with_tune_context(self, context) -> None:
        pass

    def apply(self, trace, rand_state):
        factors = {inst.inputs[-1] for inst in trace.insts if inst.kind.name == "Split"}
        choices = [inst for inst in trace.insts
                   if inst.kind.name == "SampleCategorical" and inst.outputs[0] in factors and len(inst.attrs[0]) > 1]
        if not choices:
            return None
        rng = random.Random(rand_state)
        inst = rng.choice(choices)
        decision = int(trace.decisions[inst])
        step = rng.choice([d for d in (decision - 1, decision + 1) if 0 <= d < len(inst.attrs[0])])
        return trace.with_decision(inst, step, remove_postproc=True)

    def clone(self) -> "StepTile":
        return StepTile()


def space_generator(hw: Hardware) -> ms.space_generator.ScheduleFn:
    """The DSA design spaces of a kernel on chip ``hw`` (uniform and capacity boxes) with no CPU
    schedule rules, the LB check as the only postprocessor, tile-size mutation, tile steps within
    a box and flips of two-way choices for the evolutionary search."""
    return ms.space_generator.ScheduleFn(
        functools.partial(design_spaces, hw=hw), sch_rules=[], postprocs=[FitsDSA()],
        mutator_probs={ms.mutator.MutateTileSize(): 0.5, StepTile(): 0.3, FlipChoice(): 0.2})
