"""TileForLB: tile a kernel around its anchor so every tile's working set fits the local buffer.

The anchor is the kernel's (last) contraction block (conv / matmul) — or a pooling that follows
it (a reduction over a window of its result: the contraction is then computed per tile of the
pooling, with the overlap the window needs) — or, without one, its last block. A contraction
before the anchor (a depthwise convolution fused into the pointwise one reading it,
``kernelgen.blocks``) is a producer like any other: computed per chunk, its N loops never tiled
(``AnchorInfo.whole``).
Every spatial loop of the anchor is split into (tile, point) loops — an extent-1 tile loop where it
is not tiled, so every kernel has the same shape — and the first reduction loop into (chunk,
point). Consumers move under the innermost tile loop (``reverse_compute_at``), producers under the
chunk loop when the anchor has one (so input tiles are loaded chunk by chunk) or the tile loop.
Tile loops are annotated ``dsa.loop = "tile"``, the chunk loop ``dsa.loop = "chunk"``; the codegen
iterates them, and each remaining loop nest becomes one DSA instruction. The root block's
``dsa.double_buffer`` annotation (``annotate_double_buffer``), when present, decides whether the
LB holds two copies of every tile buffer; without it the codegen takes two when they fit. The
anchor's ``dsa.vector_contraction`` annotation (``annotate_vector_contraction``) puts a
contraction on the vector units instead of the MME.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir import SBlock

from tvm_dsa.kernel.analysis import (
    REDUCE_ITER, StageKind, Unsupported, classify, contraction, copy_func, int_value, reads_window, sch_annotate,
    sch_children, sch_compute_at, sch_get, sch_get_sblock, sch_loops, sch_reorder, sch_reverse_compute_at,
    sch_split
)
from tvm_dsa.kernel.attrs import CLAMP, DOUBLE_BUFFER, VECTOR_CONTRACTION
from tvm_dsa.tir_passes.strided import compact_strided_windows



@dataclass(frozen=True)
class TilePlan:
    """Tile sizes of the anchor's spatial loops (in loop order) and the chunk of its first reduction
    loop (``None``: no reduction loop)."""

    tiles: tuple[int, ...]
    chunk: int | None = None
    vector: bool = False  # the contraction runs on the vector units (``annotate_vector_contraction``)
    strips: int = 1  # the epilogue runs in this many strips of the tile's rows (``StripEpilogue``)
    resident: bool = False  # weights every tile reads alike are loaded whole, once a core (``AssignScopes``)


@dataclass(frozen=True)
class AnchorInfo:
    name: str
    kind: StageKind
    spatial: tuple[int, ...]  # extents of the anchor's spatial loops
    reduction: tuple[int, ...]  # extents of its reduction loops
    roles: tuple[str, ...]  # per spatial loop: "M", "N" or "B" (mme anchors), "" otherwise
    # per spatial loop: D > 1 when the loop's index sits inside floordiv/floormod by D (a reshape):
    # its tile must divide D so that, inside a tile, the index stays affine
    align: tuple[int, ...] = ()
    # spatial loops no tile splits: a contraction's N loops where contractions are fused before
    # it (``producers``), which every tile of N would compute again
    whole: frozenset = frozenset()
    producers: int = 0  # contractions computed per chunk before the anchor (a fused depthwise convolution)


def leaf_blocks(sch: s_tir.Schedule) -> list:
    try:
        root = sch_get_sblock(sch, "root")
    except s_tir.ScheduleError:
        raise Unsupported("no root block: a kernel written as low-level TIR (e.g. TOPI's sort)") from None
    return list(sch_children(sch, root))


def find_anchor(sch: s_tir.Schedule) -> tuple[int, list]:
    """Index of the anchor among the root's blocks, and every block's stage kind."""
    blocks = leaf_blocks(sch)
    kinds = [classify(sch_get(sch, b)) for b in blocks]
    mmes = [i for i, k in enumerate(kinds) if k.kind == "mme"]
    if not mmes:
        return len(blocks) - 1, kinds
    pools = [i for i in range(mmes[-1] + 1, len(blocks))
             if kinds[i].kind == "reduce" and reads_window(sch_get(sch, blocks[i]))]
    return (pools[-1] if pools else mmes[-1]), kinds


def _loop_roles(sch, block_rv):
    """(loops, is_reduction flags) of a block whose loops bind its iter vars one to one."""
    block = sch_get(sch, block_rv)
    loops = sch_loops(sch, block_rv)
    iters = list(block.iter_vars)
    if len(loops) != len(iters):
        raise Unsupported(f"block {block.name_hint}: {len(loops)} loops for {len(iters)} iterators")
    for lp in loops:
        if int_value(sch_get(sch, lp).min) != 0:
            raise Unsupported(f"block {block.name_hint}: loop does not start at 0")
    return loops, [int(it.iter_type) == REDUCE_ITER for it in iters]


@functools.lru_cache(maxsize=256)
def simplify_indices(func, on_chip: frozenset = frozenset()):
    """``func`` with its index expressions simplified under the block iterators' ranges: a
    legalized reshape reads ``T[((v2 // 64 + v1) // 16 + v0) % 2, (v2 // 64 + v1) % 16, ...]``,
    which is ``T[v0, v1, ...]`` when ``v2 < 64, v1 < 16, v0 < 2``; the alignment rule below would
    otherwise see divisors that are not there (and tile a fused transpose -> reshape by 2), and
    the tiled indices would stay non-affine where they are affine (``lower_kernel`` lowers this
    form). Its strided windows are compacted first (``strided``; ``on_chip``: positions of the
    parameters in the GB). Returns a copy: a schedule of a
    module that shares ``func``'s body would rewrite it in place. Cached per function object (a
    kernel is lowered for the whole LB and for a share of it)."""
    compact = compact_strided_windows(func, on_chip)
    copy = copy_func(func) if compact is func else compact
    return s_tir.transform.StmtSimplify()(tvm.IRModule({"main": copy}))["main"]


@functools.lru_cache(maxsize=256)
def anchor_info(func, simplify: bool = True) -> AnchorInfo:
    """Describe the anchor of ``func`` (raises ``Unsupported`` for kernels the DSA cannot run);
    its alignment from the indices simplified under the iterators' ranges unless ``simplify`` is
    False (the raw indices' divisors, finer for a fused transpose -> reshape). Cached per
    function object: lowering asks several times."""
    sch = s_tir.Schedule(func)
    idx, kinds = find_anchor(sch)
    anchor = leaf_blocks(sch)[idx]
    loops, is_red = _loop_roles(sch, anchor)
    extents = [int_value(sch_get(sch, lp).extent) for lp in loops]
    if any(e is None for e in extents):
        raise Unsupported("symbolic loop extents are not supported yet")
    roles = [""] * sum(1 for r in is_red if not r)
    if kinds[idx].kind == "mme":
        roles = _mme_roles(sch_get(sch, anchor), is_red)
    block = sch_get(sch, anchor)
    if simplify:  # the same block in the simplified function (its iterators are new variables)
        simple = s_tir.Schedule(simplify_indices(func))
        aligned = sch_get(simple, sch_get_sblock(simple, block.name_hint))
    else:
        aligned = block
    spatial_vars = [it.var for it, r in zip(aligned.iter_vars, is_red) if not r]
    fused = any(not any(r.source.same_as(p) for p in func.params) for r in block.reads)
    producers = sum(k.kind == "mme" for k in kinds[:idx])
    return AnchorInfo(
        block.name_hint, kinds[idx],
        tuple(e for e, r in zip(extents, is_red) if not r),
        tuple(e for e, r in zip(extents, is_red) if r), tuple(roles),
        tuple(_joint(_alignment(aligned, v), _select_bounds(aligned, v) if fused else 0) for v in spatial_vars),
        frozenset(i for i, r in enumerate(roles) if r == "N") if producers else frozenset(), producers,
    )


def _alignment(block, var) -> int:
    """The gcd of the divisors of floordiv/floormod nodes whose operand uses ``var`` in the
    block's body (a tile dividing it divides each of them); 1 when there are none."""
    out = 0

    def visit(node):
        nonlocal out
        if isinstance(node.b, tirx.IntImm):
            hit = []
            tvm_ffi.structural_walk(node.a, [(tvm.ir.Var, lambda v: hit.append(v) if v.same_as(var) else None)])
            if hit:
                out = math.gcd(out, int(node.b.value))

    tvm_ffi.structural_walk(block.body, [((tirx.FloorDiv, tirx.FloorMod), visit)])
    return out or 1


def _joint(alignment: int, bounds: int) -> int:
    """The alignment a tile must divide for both: its divisors' (1: none) and its bounds' (0: none)."""
    return math.gcd(alignment if alignment > 1 else 0, bounds) or 1


def _select_bounds(block, var) -> int:
    """The gcd of the constants ``var`` is compared with in the block's body (a concatenation's
    ``4 <= v1``: where its inputs meet), 0 when there are none. A tile that divides it lies within
    one input; one across two would compute, for each of them, the producers fused into it over
    the whole tile, reading outside their inputs."""
    out = 0

    def visit(node):
        nonlocal out
        for side, bound in ((node.a, node.b), (node.b, node.a)):
            if isinstance(bound, tirx.IntImm) and side.same_as(var):
                out = math.gcd(out, int(bound.value))

    tvm_ffi.structural_walk(block.body, [((tirx.LT, tirx.LE, tirx.GT, tirx.GE), visit)])
    return out


def _mme_roles(block, is_red) -> list[str]:
    """For each spatial iterator: "M" if only operand a uses it, "N" if only b, "B" if both."""

    a, b = contraction(block)

    def uses(load, var) -> bool:
        hit = []
        for idx in load.indices:
            tvm_ffi.structural_walk(idx, [(type(var), lambda v: hit.append(v) if v.same_as(var) else None)])
        return bool(hit)

    roles = []
    for it, red in zip(block.iter_vars, is_red):
        if red:
            continue
        ua, ub = uses(a, it.var), uses(b, it.var)
        roles.append("B" if ua and ub else "M" if ua else "N" if ub else "B")
    return roles


def tile_schedule(func, plan: TilePlan) -> s_tir.Schedule:
    """Apply ``plan`` to ``func`` (its strided windows compacted first, ``strided``); returns the
    schedule (raises ``Unsupported`` if TVM refuses)."""
    sch = s_tir.Schedule(compact_strided_windows(func))
    spatial = len(_anchor_loops(sch)[2])
    if len(plan.tiles) != spatial:
        raise ValueError(f"plan has {len(plan.tiles)} tiles for {spatial} spatial loops")

    def fixed(_sch, _loop, extent, index):
        t = plan.chunk if index is None else plan.tiles[index]
        if t is None:
            return None
        if t <= 0 or t > extent or (index is None and extent % t):
            raise ValueError(f"{'chunk' if index is None else 'tile'} {t} does not divide loop extent {extent}")
        return [-(-extent // t), t]  # a tile that does not divide: the last one clamped (``ClampTiles``)

    tile_anchor(sch, fixed)
    if plan.vector:
        annotate_vector_contraction(sch, 1)
    return sch




def annotate_double_buffer(sch: s_tir.Schedule, value) -> None:
    """Decide double buffering for the kernel: ``value`` 1 or 0 (an integer or a sampled variable).
    Two copies let the next tile's loads overlap the current tile's compute; one leaves the LB
    room for nothing else but makes every load wait for the previous tile's last reader."""
    sch_annotate(sch, sch_get_sblock(sch, "root"), DOUBLE_BUFFER, value)




def annotate_vector_contraction(sch: s_tir.Schedule, value) -> None:
    """Decide which unit runs the kernel's contraction: ``value`` 1 (an integer or a sampled
    variable) the core's vector units, as products then a sum reduction (``LowerToDSA``), 0 the
    MME. A contraction without an N loop (a depthwise convolution) leaves all but one of the PE
    array's columns idle, and the VME's lanes can do its work in fewer cycles."""
    idx, kinds = find_anchor(sch)
    if kinds[idx].kind != "mme":
        raise Unsupported("the kernel has no contraction to place on a unit")
    sch_annotate(sch, leaf_blocks(sch)[idx], VECTOR_CONTRACTION, value)


def unit_choice(info: AnchorInfo, hw) -> bool:
    """Whether a kernel's contraction may run on the vector units as well as on chip ``hw``'s MME:
    it has no N loop, so the MME would use one PE column (a depthwise convolution), and the MME
    accumulates in floating point as the vector units do (an integer MME's exact int32 sums are
    not a float32 reduction's). With an N loop the MME wins even where it leaves columns idle:
    full-size MobileNetV2's 1x1 convolutions to 16 and 24 channels took 3.5 and 4.7 times its
    cycles on stcp920's vector units."""
    n = math.prod(e for e, r in zip(info.spatial, info.roles) if r == "N")
    return info.kind.kind == "mme" and n == 1 and hw.mme.accum_dtype.startswith("float")


def on_vector_units(func) -> bool:
    """Whether a lowered kernel runs its anchor's contraction (its last) on the vector units
    (``annotate_vector_contraction``); a contraction fused before it on them does not count."""
    found = []
    tvm_ffi.structural_walk(func.body, [(SBlock, lambda b: found.append(int(b.annotations.get(VECTOR_CONTRACTION, 0)))
                                         if contraction(b) is not None else None)])
    return bool(found) and bool(found[-1])


def _anchor_loops(sch: s_tir.Schedule):
    """(root blocks, anchor index, anchor's spatial loops, its reduction loops)."""
    idx, _ = find_anchor(sch)
    blocks = leaf_blocks(sch)
    loops, is_red = _loop_roles(sch, blocks[idx])
    return blocks, idx, [lp for lp, r in zip(loops, is_red) if not r], [lp for lp, r in zip(loops, is_red) if r]


def tile_anchor(sch: s_tir.Schedule, factors, order: tuple[int, ...] | None = None) -> None:
    """Tile ``sch``'s anchor in place.

    ``factors(sch, loop, extent, index)`` gives the [tile count, tile size] split of spatial loop
    ``index`` (or of the first reduction loop when ``index`` is None; None there: no chunk loop):
    plain integers for a fixed plan, sampled variables for a tuning space (``tvm_dsa.tuning``).
    A tile that does not divide its loop's extent marks the tile loop for ``ClampTiles``."""
    blocks, idx, spatial, reduction = _anchor_loops(sch)
    if not spatial:
        raise Unsupported("a 0-d output (a scalar): the DSA tiles a kernel along its output's dims")
    outer, inner = [], []
    for i, lp in enumerate(spatial):
        extent = int_value(sch_get(sch, lp).extent)
        split = factors(sch, lp, extent, i)
        o, n = sch_split(sch, lp, split)
        if isinstance(split[1], int) and extent % split[1]:
            sch_annotate(sch, o, CLAMP, [split[1], extent])
        outer.append(o)
        inner.append(n)
    if order is not None:
        if sorted(order) != list(range(len(outer))):
            raise ValueError(f"tile loop order {order} is not a permutation of {len(outer)} loops")
        outer = [outer[i] for i in order]
    chunk_loops = []
    red_inner = list(reduction)
    split = factors(sch, reduction[0], int_value(sch_get(sch, reduction[0]).extent), None) if reduction else None
    if split is not None:
        ro, ri = sch_split(sch, reduction[0], split)
        chunk_loops = [ro]
        red_inner = [ri] + reduction[1:]
    sch_reorder(sch, *outer, *chunk_loops, *inner, *red_inner)
    for lp in outer:
        sch_annotate(sch, lp, "dsa.loop", "tile")
    for lp in chunk_loops:
        sch_annotate(sch, lp, "dsa.loop", "chunk")
    tile_loop = outer[-1]
    try:
        for b in blocks[idx + 1:]:
            sch_reverse_compute_at(sch, b, tile_loop, preserve_unit_loops=True)
        for b in reversed(blocks[:idx]):
            if chunk_loops:
                try:
                    sch_compute_at(sch, b, chunk_loops[0], preserve_unit_loops=True)
                    continue
                except Exception:  # noqa: BLE001 - TVM raises ScheduleError subclasses
                    pass
            sch_compute_at(sch, b, tile_loop, preserve_unit_loops=True)
    except Exception as err:  # noqa: BLE001
        raise Unsupported(f"cannot place stages under the tile loop: {str(err).splitlines()[0]}") from None


def _aligns(info: AnchorInfo) -> tuple[int, ...]:
    return info.align or (1,) * len(info.spatial)


def clampable(info: AnchorInfo, mme_rows: int) -> frozenset[int]:
    """Spatial loops (not the first, which deals the batch) whose tiles may overlap
    (``ClampTiles``): a contraction's M loops and other anchors' loops, unaligned, of a prime
    extent at least two PE-array heights long (ViT's 197 tokens), which divisors would tile whole
    or by one."""
    roles = info.roles or ("",) * len(info.spatial)
    return frozenset(i for i, (e, a, r) in enumerate(zip(info.spatial, _aligns(info), roles))
                     if i and r in ("M", "") and a == 1 and e >= 2 * mme_rows and divisor_below(e, e) == 1)


def smaller_tile(extent: int, tile: int, halve: bool = False) -> int:
    """The tile after ``tile`` in a clamped loop of ``extent``: the largest ⌈extent / parts⌉ below
    it, the last tile clamped (197: 99, 66, 50, ...), or with ``halve`` that of twice the parts
    (197: 99, 50, 25, ...)."""
    parts = -(-extent // tile) * 2 if halve else -(-extent // tile) + 1
    while -(-extent // parts) >= tile:
        parts += 1
    return -(-extent // parts)


def divisor_below(n: int, t: int) -> int:
    """Largest divisor of ``n`` smaller than ``t`` (1 if none). Shrinking a tile to a divisor of
    itself keeps it a divisor of the extent and of any alignment it already divides."""
    for d in range(t - 1, 0, -1):
        if n % d == 0:
            return d
    return 1


def _intensity(m: int, n: int, rows: int, cols: int) -> float:
    """MACs per operand element a contraction tile of ``m`` x ``n`` outputs gets over its whole
    reduction (``m * n / (m + n)``: every reduction step loads m + n elements for m * n MACs),
    times the share of the PE array its blocks fill."""
    fill = (m / (rows * math.ceil(m / rows))) * (n / (cols * math.ceil(n / cols)))
    return fill * m * n / (m + n)


def candidate_plans(info: AnchorInfo, mme_rows: int, mme_cols: int, reuse: bool = False, keep_n: bool = False,
                    clamp: bool = True, caps: tuple[int, ...] = (), chunk: int | None = None):
    """Tile plans from the whole output downwards, shrinking one loop at a time.

    Order of sacrifice: batch-like loops first (with ``reuse`` the first loop too: it deals the
    batch over clusters and instances), then a long reduction chunk (> 256; with ``reuse``, a
    contraction's chunk down to the PE array's columns), then for a contraction the outer loop
    (inner loops stay long: contiguous DMA rows) of M (rows of the PE array) or N (its columns): the
    one further above its array size, or with ``reuse`` the one whose shrinking keeps more operand
    reuse (``_intensity``); then the chunk. Other anchors shrink their outer loops first and their
    reduction chunk last, each loop's tile through the divisors of its first tile (DenseNet's batch
    norms over 416 channels: ... 26, 16, 13, 8, where 13's own divisors gave tiles of one channel,
    each with four 2-byte loads of its parameters); a contraction's through those of its current
    tile (the tiles ``lower_timed`` combines and ranks). The two contraction orders suit different
    layers (a chunk that is the whole reduction keeps a weight tile in the LB from one tile to the
    next; a short one leaves room for tiles that reuse each operand more): ``lower_kernel`` keeps
    the plan that loads less. A third order, ``keep_n`` (the ``reuse`` order but M shrunk down to
    the array's rows before N), keeps a contraction's N (a convolution's output channels) whole as
    long as it can: each element of the other operand is then loaded once, the weights once per tile
    — for a layer whose weights come from the GB and its input from DDR (a stitched kernel's first
    layer: ResNet-50's 1 x 1 convolution 512 -> 128 at 28 x 28 read its input four times in tiles of
    32 output channels, 258 µs on core 0 where the MME needs 28). A ``clampable`` loop (a prime
    extent) shrinks through tiles that need not divide it, unless ``clamp`` is False — a
    contraction's through every ⌈E / k⌉, another anchor's by halves: its first tile that fits is far
    down (ViT's layer norms: 4 of 197 rows, after 9 lowerings of 20-40 ms each from a working-set
    floor of 0; 6 of ViT-B/16's 106 lowerings fewer, the same cycles). With ``caps`` no plan's tile
    of the leading loops is larger than the cap, and on a loop that clamps (a prime extent, which
    the cap need not divide) the tiles step through the cap's divisors, meeting at each multiple of
    it: a stitched kernel's micro-batch of samples or an instance's share of a sample's rows, a SET
    layer's intra-layer partition. With ``chunk`` (a divisor of the first reduction loop) every plan
    takes that chunk: only tiles shrink. Where contractions are fused before the anchor
    (``info.producers``) N stays whole, the chunk shrinks first, down to the array's rows (each
    chunk's producers are computed in the LB), and M loops through every divisor of their extent (a
    depthwise convolution's rows: 56, 28, 14, 8, 7, 4, 2, 1, where halving 7 gives 1 and triples the
    halo read per row)."""
    tiles = [math.gcd(e, a) if a > 1 else e for e, a in zip(info.spatial, _aligns(info))]
    clamp = clampable(info, mme_rows) if clamp else frozenset()
    tiles[:len(caps)] = [min(t, c) if i in clamp else math.gcd(t, c) for i, (t, c) in enumerate(zip(tiles, caps))]
    start = tuple(tiles)
    fixed = chunk is not None
    chunk = chunk if fixed else info.reduction[0] if info.reduction else None
    roles = list(info.roles) if info.roles else [""] * len(tiles)
    contraction = "N" in roles
    yield TilePlan(tuple(tiles), chunk)

    def product(ts, role):
        n = 1
        for t, r in zip(ts, roles):
            if r == role:
                n *= t
        return n

    def outermost(role_set):
        for i, (t, r) in enumerate(zip(tiles, roles)):
            if t > 1 and r in role_set and i not in info.whole:
                return i
        return None

    capped = {i: c for i, c in enumerate(caps) if i in clamp and c < info.spatial[i]}

    def shrunk(i):
        ts = list(tiles)
        if i in capped:  # through the cap's divisors: the tiles meet at each multiple of the cap
            ts[i] = divisor_below(capped[i], ts[i])
        elif i in clamp:
            ts[i] = smaller_tile(info.spatial[i], ts[i], not contraction)
        elif info.producers:
            ts[i] = divisor_below(info.spatial[i], ts[i])
        else:  # another anchor through the first tile's divisors (416: ... 26, 16, 13, 8), not 13's (1)
            ts[i] = divisor_below(ts[i] if contraction else start[i], ts[i])
        return ts

    def m_or_n():
        outer = [i for i in (outermost({"M"}), outermost({"N"})) if i is not None]
        if keep_n:
            m = outermost({"M"})
            return m if m is not None and product(tiles, "M") > mme_rows else outermost({"N"})
        if reuse:
            return max(outer, key=lambda i: _intensity(product(shrunk(i), "M"), product(shrunk(i), "N"),
                                                       mme_rows, mme_cols), default=None)
        m, n = product(tiles, "M") / mme_rows, product(tiles, "N") / mme_cols
        first, second = ("M", "N") if m >= n else ("N", "M")
        if max(m, n) > 1:
            return outermost({first}) if outermost({first}) is not None else outermost({second})
        return None

    reuse = reuse or keep_n
    while True:
        pick = outermost({"B"})
        if pick is None and reuse and tiles[0] > 1:
            pick = 0  # the first tile loop deals the batch over the clusters and instances (§2.1)
        if pick is None and not fixed and chunk is not None and \
                chunk > (mme_rows if info.producers else mme_cols if reuse and contraction else 256):
            pick = "chunk"
        if pick is None:
            pick = m_or_n() if contraction else outermost({""})
        if pick is None and not fixed and chunk is not None and chunk > 1:
            pick = "chunk"
        if pick is None:
            pick = outermost({"M", "N", ""})
        if pick is None:
            return
        if pick == "chunk":
            chunk = divisor_below(info.reduction[0], chunk)
        else:
            tiles = shrunk(pick)
        yield TilePlan(tuple(tiles), chunk)


def working_set_floor(info: AnchorInfo, plan: TilePlan, storage_bytes: int, accum_bytes: int) -> int:
    """LB bytes a contraction's tile needs at the least, whatever else the kernel holds: its
    accumulator (B·M·N in the accumulation type) and the boxes its operands cover at the least
    (B·M and B·N, each by the chunk). 0 for other anchors. A plan above the LB by this bound is
    ruled out without lowering it."""
    if plan.chunk is None or not {"M", "N"} <= set(info.roles):
        return 0
    size = {"M": 1, "N": 1, "B": 1}
    for t, r in zip(plan.tiles, info.roles):
        if r in size:
            size[r] *= t
    b, m, n = size["B"], size["M"], size["N"]
    return accum_bytes * b * m * n + storage_bytes * b * (m + n) * plan.chunk


def parallel_plans(info: AnchorInfo, start: TilePlan, mme_rows: int, mme_cols: int):
    """From a plan that fits, plans with more tiles for more cores: spatial loops only (a smaller
    chunk adds no tiles), outer loops first, and never a contraction's M or N product below the
    PE array's rows or columns nor another anchor's innermost loop below 64 elements (smaller
    tiles would cost more in per-tile overhead than the extra cores return). A loop's tile steps
    through the divisors of ``start``'s tile (832: ... 13, 8, 4), not of the current one (13, 1)."""
    tiles = list(start.tiles)
    roles = list(info.roles) if info.roles else [""] * len(tiles)
    floor = {"M": mme_rows, "N": mme_cols}
    while True:
        pick = None
        for i, (t, r) in enumerate(zip(tiles, roles)):
            if t == 1 or i in info.whole:
                continue
            smaller = divisor_below(start.tiles[i], t)
            if r in floor:
                others = 1
                for j, (u, q) in enumerate(zip(tiles, roles)):
                    if q == r and j != i:
                        others *= u
                if others * smaller < floor[r]:
                    continue
            elif r == "" and i == len(tiles) - 1 and smaller < 64:
                continue
            pick = i
            break
        if pick is None:
            return
        tiles[pick] = divisor_below(start.tiles[pick], tiles[pick])
        yield TilePlan(tuple(tiles), start.chunk)
