"""The tuning space of a DSA kernel: what meta-schedule samples, and the check that a sample fits.

A kernel is tiled by ``tir_passes.tile_anchor``, the same transformation ``lower_kernel`` applies
with its fixed ``TilePlan``; here every split factor is a ``sample_perfect_tile`` decision (the
tile size of each spatial loop of the anchor and the chunk of its first reduction loop), and the
order of the tile loops is one design space per permutation. Both change the DSA program: the tile
sizes set every instruction's box and how many tiles the cores share, the chunk how often partial
sums are accumulated, the order which loop is dealt over the clusters and whether consecutive tiles
on a core reuse the operand already in its LB. Double buffering is a ``sample_categorical``
decision annotated on the root block (``dsa.double_buffer``), flipped by ``FlipDoubleBuffer``:
two LB copies let loads overlap compute, one leaves room for larger tiles. ``FitsDSA`` rejects, before they are measured,
samples whose working set exceeds the LB, whose indices stop being affine, or whose tiles are
below the floor under which per-tile overheads always lose (``below_floor``).
"""

from __future__ import annotations

import itertools
import math

import tvm_ffi
from tvm import s_tir
from tvm.s_tir import meta_schedule as ms
from tvm.ir.utils import derived_object

from .. import hardware
from ..codegen.kernel_ir import plan_lb, read_kernel
from ..hardware import Hardware
from ..tir_passes import TilePlan, Unsupported, anchor_info, assign_scopes, lower_to_dsa
from ..tir_passes.tile import DOUBLE_BUFFER, AnchorInfo, annotate_double_buffer, tile_anchor

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


def sample_tiling(sch: s_tir.Schedule, order: tuple[int, ...], plan: TilePlan | None = None,
                  double_buffer: bool | None = None) -> None:
    """Tile ``sch``'s anchor with sampled factors in ``order`` and sample double buffering; the
    decisions are ``plan``'s and ``double_buffer`` when given."""

    def factors(s, loop, extent, index):
        if plan is None:
            decision = None
        else:
            t = plan.chunk if index is None else plan.tiles[index]
            decision = None if t is None else [extent // t, t]
        return s.sample_perfect_tile(loop, n=2, max_innermost_factor=extent, decision=decision)

    tile_anchor(sch, factors, order)
    decision = None if double_buffer is None else int(double_buffer)
    annotate_double_buffer(sch, sch.sample_categorical([0, 1], [0.5, 0.5], decision=decision))


def design_spaces(sch: s_tir.Schedule) -> list[s_tir.Schedule]:
    """One design space per tile-loop order, each with sampled tile sizes and chunk."""
    info = anchor_info(sch.mod["main"])
    out = []
    for order in tile_orders(info.spatial):
        s = sch.copy()
        sample_tiling(s, order)
        out.append(s)
    return out


def below_floor(info: AnchorInfo, tiles: tuple[int, ...], hw: Hardware) -> str | None:
    """Why ``tiles`` (the anchor's spatial tile sizes) are too small to be worth measuring, or
    None. A contraction's M and N tile products must reach the PE array's rows and columns (or
    the whole extent, if smaller); another anchor's innermost tile 64 elements (or the extent).
    Below that every instruction pays its fixed costs for a fraction of the work: on a 64-channel
    3x3 conv such samples measured 2.2 to 220 times slower than the default (docs/tuning.md)."""
    def product(values, role):
        return math.prod(v for v, r in zip(values, info.roles) if r == role)

    if "N" in info.roles:
        for role, floor in (("M", hw.mme.rows), ("N", hw.mme.cols)):
            if product(tiles, role) < min(floor, product(info.spatial, role)):
                return f"{role} tile {product(tiles, role)} is below the PE array's {floor}"
        return None
    if tiles and tiles[-1] < min(MIN_VECTOR_TILE, info.spatial[-1]):
        return f"innermost tile {tiles[-1]} is below {MIN_VECTOR_TILE} elements"
    return None


def sampled_tiles(sch: s_tir.Schedule, spatial: int) -> tuple[int, ...]:
    """The tile sizes a sample chose for the anchor's ``spatial`` loops (its first decisions)."""
    trace = sch.trace
    decisions = [trace.decisions[i] for i in trace.insts if i.kind.name == "SamplePerfectTile"]
    return tuple(int(d[1]) for d in decisions[:spatial])


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
class FlipDoubleBuffer(ms.mutator.PyMutator):
    """Mutator: the trace with its double-buffering decision flipped (meta-schedule's own
    categorical mutator, ``MutateUnroll``, only touches unroll annotations)."""

    def _initialize_with_tune_context(self, context) -> None:
        pass

    def apply(self, trace, _rand_state):
        uses = {inst.inputs[1] for inst in trace.insts
                if inst.kind.name == "Annotate" and str(inst.attrs[0]) == DOUBLE_BUFFER}
        for inst in trace.insts:
            if inst.kind.name == "SampleCategorical" and inst.outputs[0] in uses:
                return trace.with_decision(inst, 1 - int(trace.decisions[inst]), remove_postproc=True)
        return None

    def clone(self) -> "FlipDoubleBuffer":
        return FlipDoubleBuffer()


def space_generator() -> ms.space_generator.ScheduleFn:
    """The DSA design spaces with no CPU schedule rules, the LB check as the only postprocessor,
    tile-size mutation and double-buffering flips for the evolutionary search."""
    return ms.space_generator.ScheduleFn(design_spaces, sch_rules=[], postprocs=[FitsDSA()],
                                         mutator_probs={ms.mutator.MutateTileSize(): 0.8, FlipDoubleBuffer(): 0.2})
