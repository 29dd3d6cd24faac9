"""The tiling search: the plan ``lower_with_plan`` lowers a kernel with, chosen for a chip.

``lower_kernel`` tries the largest tilings whose working set fits the LB and gives the cluster's
cores a tile each, ranks them by estimated load and compute cycles (``loads``, ``chunk_cycles``,
``strip_cycles``) and, where two alignments of the tiles are close, by a timing simulation of
their programs.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import tvm
import tvm_ffi

from tvm_dsa.emit.emitter import build_program, deal
from tvm_dsa.emit.placement import Layer
from tvm_dsa.kernel.analysis import Unsupported, classify
from tvm_dsa.kernel.attrs import GB_SCOPE, LB_SCOPE, STRIP
from tvm_dsa.runtime import timing_cycles
from tvm_dsa.tir_passes import lower_with_plan, plan_of
from tvm_dsa.tir_passes.tile import (
    TilePlan, anchor_info, candidate_plans, divisor_below, parallel_plans, simplify_indices,
    unit_choice, working_set_floor
)
from tvm_dsa import isa
from tvm_dsa.kernel.ir import (
    CodegenError, Loop, accumulators, align, chunk_loops, plan_lb, read_kernel, stages_of, tile_bytes
)
from tvm_dsa.emit.footprint import footprints
from tvm_dsa.runtime.cost import ddr_effective_bytes, mme_cycles


def lower_kernel(func, hw, lb_bytes: int | None = None, parallel: bool = True, simplify: bool = True,
                 whole_rows: bool = False, vector: bool = False, overlap: bool = False, on_chip=frozenset(),
                 clamp: bool = True, caps: tuple[int, ...] = ()):
    """Lower ``func`` with the largest tiling whose working set fits ``hw``'s LB (its first
    ``lb_bytes`` if given) and — unless ``parallel`` is False — that gives the cluster's cores a
    tile each where the kernel has that many. Returns (lowered, plan). With ``whole_rows`` no
    tile splits the anchor's last spatial loop (a row of the output: a kernel whose output
    overwrites an input it reads by rows, ``relax_passes.inplace.row_inputs``).

    With ``simplify`` (the default) the kernel is lowered with its indices simplified under the
    iterators' ranges (``tile.simplify_indices``: a legalized reshape's index chains become
    affine in more tilings). Tiles are aligned to the divisors of the kernel's indices; where the
    simplified indices allow other tiles than the raw ones (a fused transpose -> reshape), both
    alignments are lowered and the one with fewer cycles in a timing simulation is kept (coarser
    tiles are not always faster), unless one has ``TIMED_TILES_RATIO`` times the other's tiles or
    more (it is then not simulated: ViT-B/16's head merge at batch 8 has 1.2M one-element tiles
    under the raw alignment, 48 under the other). The contraction runs on the MME, or with
    ``vector`` on the vector units where it may (``tile.unit_choice``: a depthwise convolution;
    a tuning record's choice: timing both units in every compile cost Conformer's batch-8 build
    3.5 s of 9.4 s). With ``overlap`` a contraction whose chunk loads leave no room for their
    second copy takes a smaller chunk that does, where that is faster (``_loads_overlapped``):
    for the layers of stitched kernels, which load from the GB; from DDR the narrower rows of a
    smaller chunk waste bursts (ViT's fc2 alone at batch 8: 3.30M cycles with chunks of 32, 5.49M
    with 16, double-buffered). ``on_chip``: positions of the parameters a stitched kernel's layer
    reads from the GB (``load_cycles``), which also tries ``candidate_plans``' ``keep_n`` order.
    With ``clamp`` (the default) a prime extent may be tiled in parts whose last overlaps the one
    before (``ClampTiles``: ViT's 197 tokens); SET's layers keep tiles that divide
    (``clamp=False``). ``caps`` bound the tiles of the leading loops (``candidate_plans``)."""
    info = anchor_info(func, simplify)
    alignments = (False, True) if simplify and info.align != anchor_info(func, False).align else (None,)
    if vector and not unit_choice(info, hw):
        raise Unsupported(f"{info.name}: its contraction cannot run on the vector units of {hw.name}")
    lowerings, error = [], None
    for aligned in alignments:
        try:
            lowerings.append(_lower_aligned(func, hw, lb_bytes, parallel, simplify, aligned, vector, whole_rows,
                                            overlap, on_chip, clamp, caps))
        except Unsupported as err:
            error = err
    if not lowerings:
        raise error
    fewest = min(_tiles(info, plan) for _, plan in lowerings)
    lowerings = [lp for lp in lowerings if _tiles(info, lp[1]) < TIMED_TILES_RATIO * fewest]
    if len(lowerings) == 1:
        return lowerings[0]
    return min(lowerings, key=lambda lp: timing_cycles(build_program(lp[0], hw, "kernel")))


TIMED_TILES_RATIO = 16


def _tiles(info, plan: TilePlan) -> int:
    n = 1
    for extent, tile in zip(info.spatial, plan.tiles):
        n *= -(-extent // tile)
    return n


def _lower_aligned(func, hw, lb_bytes: int | None, parallel: bool, simplify: bool, aligned: bool | None = None,
                   vector: bool = False, whole_rows: bool = False, overlap: bool = False, on_chip=frozenset(),
                   clamp: bool = True, caps: tuple[int, ...] = ()):
    """``lower_kernel`` with one alignment: of the simplified indices or of the indices as they are
    (``aligned``, by default ``simplify``); the simplified kernel is lowered if ``simplify``; the
    contraction on the vector units if ``vector``.

    Candidate plans shrink monotonically, so both conditions are found by search (the first plan
    that fits from the first within ``working_set_floor`` of the LB, probing forwards). A
    contraction tries both orders of ``candidate_plans`` (and ``keep_n`` where some of its inputs
    are ``on_chip``) and keeps the plan whose tiles take fewer DMA cycles to load
    (``load_cycles``); a kernel with contractions fused before its anchor only the ``reuse``
    order (its chunk first: ``candidate_plans``)."""
    info = anchor_info(func, simplify if aligned is None else aligned)
    if simplify:
        func = simplify_indices(func, on_chip)
    if info.producers:
        orders = ((True, False),)
    elif "N" in info.roles:
        orders = ((False, False), (True, False)) + (((True, True),) if on_chip else ())
    else:
        orders = ((False, False),)
    chosen = []
    for reuse, keep_n in orders:
        try:
            plans = [replace(p, vector=vector)
                     for p in candidate_plans(info, hw.mme.rows, hw.mme.cols, reuse, keep_n, clamp, caps)]
            chosen.append(_fitting(func, info, _rows_whole(info, plans) if whole_rows else plans, hw, lb_bytes,
                                   parallel, whole_rows))
        except Unsupported:
            if (reuse, keep_n) == orders[-1] and not chosen:
                raise
    lowered, plan = chosen[0] if len(chosen) == 1 else \
        min(chosen, key=lambda c: load_cycles(c[0], hw, lb_bytes, on_chip))
    return _loads_overlapped(func, info, plan, lowered, hw, lb_bytes) if overlap else (lowered, plan)


def lower_timed(func, hw, lb_bytes: int | None, gb: frozenset, baseline, caps: tuple[int, ...] = (),
                plans: bool = True, spread: int = 1):
    """A stitched kernel's contraction tiled for its place: ``baseline`` (``lower_kernel``'s
    lowering for it) or one of the ``TIMED_PLANS`` plans (``TIMED_PLANS_SPREAD`` with ``spread``,
    and the ``TIMED_PLANS_SHARE`` it ranks first for a cluster's share of the tiles, each of those
    also with the boxes a round of tiles shares counted once, on chips with ``multicast_dma``)
    of ``_grid`` ``_estimate`` ranks first that fit ``lb_bytes`` of the LB, whichever
    ``timed_cycles`` finds fastest with the parameters at positions ``gb`` in the GB. The search's
    first fitting plan is the largest tile, which leaves no room to load the next chunk during
    the product, and the estimate alone misranks plans by up to 4x (epilogues, stores, strided
    rows): timing settles it. ResNet-50's 1 x 1
    convolution 256 -> 512 at 28 x 28 (batch 8): tiles of 512 channels x 1 row and the whole
    reduction, 1.57M cycles on a cluster; 256 channels x 1 row in chunks of 16, 0.53M. A layer
    whose anchor is off the MME (a pooling, a normalisation) is timed as ``baseline`` tiles it and
    with tiles whose loads fit twice (``_loads_twice``); a contraction with no N loop (a depthwise
    convolution) is timed on the MME (one PE column) and on the vector units instead, and runs on
    the faster (``_faster_unit``). Without ``plans`` only those are done. The contraction's
    fastest plan is then also timed with its epilogue in strips that make room for a second
    accumulator (``_strips_for_two_accumulators``), with its N tile rounded up to whole passes of
    the PE array's columns (``_full_columns``) and with the weights its tiles read alike held in
    the LB (``_resident``), each kept where faster. ``spread``: the clusters the layer's tiles are
    shared out over (fewer samples than clusters: a sample's rows, or a kernel's channels, split
    over them): each plan is timed with its share
    of the tiles on a cluster (``timed_cycles``)."""
    try:
        info = anchor_info(func)
    except Unsupported:
        return baseline
    if unit_choice(info, hw):
        return _faster_unit(func, hw, lb_bytes, gb, baseline, caps, spread)
    if "N" not in info.roles:
        return _loads_twice(func, hw, lb_bytes, gb, baseline, caps, spread)
    if not plans or not info.reduction:
        return baseline
    best = (timed_cycles(baseline, hw, lb_bytes, gb, spread), baseline, None)
    first = -(-info.spatial[0] // read_kernel(baseline).tile_loops()[0].extent)
    caps = (min((first, *caps[:1])), *caps[1:])  # the first loop splits the batch over instances: no coarser
    simplified = simplify_indices(func, gb)
    capacity = hw.lb_bytes if lb_bytes is None else lb_bytes
    grid = list(_grid(info, hw, capacity, caps))
    rankings = [(sorted(grid, key=lambda p: _estimate(info, p, hw, capacity)),
                 TIMED_PLANS if spread == 1 else TIMED_PLANS_SPREAD)]
    if spread > 1:
        rankings.append((sorted(grid, key=lambda p: _estimate(info, p, hw, capacity, spread)), TIMED_PLANS_SHARE))
        if hw.multicast_dma:
            rankings.append((sorted(grid, key=lambda p: _estimate(info, p, hw, capacity, spread, shared=True)),
                             TIMED_PLANS_SHARE))
    lowers: dict = {}  # plan -> whether it lowers and fits (then it is timed)
    for ranking, limit in rankings:
        timed = 0
        for plan in ranking:
            if timed == limit:
                break
            if plan in lowers:  # tried in a ranking before
                timed += lowers[plan]
                continue
            lowers[plan] = False
            try:
                lowered = lower_with_plan(simplified, plan)
                plan_lb(read_kernel(lowered), hw, lb_bytes)
                timed += 1
                lowers[plan] = True
                cycles = timed_cycles(lowered, hw, lb_bytes, gb, spread)
            except (Unsupported, CodegenError):  # not affine, too big, or a tile the emitter cannot place
                continue
            if cycles < best[0]:
                best = (cycles, lowered, plan)
    if best[2] is None:  # the baseline is fastest: only its weights may move
        plan = plan_of(best[1])
        if plan is None:
            return best[1]
        best = (best[0], best[1], plan)
    else:
        if not _two_accumulators(read_kernel(best[1]), hw, lb_bytes):
            strips = _strips_for_two_accumulators(simplified, best[2], hw, lb_bytes)
            if strips is not None:
                best = _if_faster(simplified, strips, best, hw, lb_bytes, gb, spread)
        wide = _full_columns(simplified, info, best[2], hw, lb_bytes)
        if wide is not None:
            best = _if_faster(simplified, wide, best, hw, lb_bytes, gb, spread)
    resident = _resident(simplified, best, hw, lb_bytes)
    return (best if resident is None else _if_faster(simplified, resident, best, hw, lb_bytes, gb, spread))[1]


def _if_faster(func, plan: TilePlan, best: tuple, hw, lb_bytes: int | None, gb: frozenset,
               spread: int = 1) -> tuple:
    """(cycles, lowered, plan) of ``plan`` where ``timed_cycles`` finds it faster than ``best`` (a
    tuple alike), else ``best``."""
    lowered = lower_with_plan(func, plan)
    cycles = timed_cycles(lowered, hw, lb_bytes, gb, spread)
    return (cycles, lowered, plan) if cycles < best[0] else best


def _full_columns(func, info, plan: TilePlan, hw, lb_bytes: int | None) -> TilePlan | None:
    """``plan`` with its N tile rounded up to whole passes of the PE array's columns, where that
    divides N's extent, in the fewest epilogue strips that fit (``_in_strips``); None where the
    tile is whole passes already or the wider one does not fit. A product of 48 columns takes two
    passes of 32, one half full: ViT-B/16's fc1 + GELU (batch 8) ran 66 x 48 tiles, the search's
    N tiles halving from 3,072 (... 96, 48), and the GELU's float32 temporaries of a 66 x 64 tile
    left it 10 KiB over the LB; in 2 strips it fits, 1,505,152 -> 1,371,504 cycles on a cluster."""
    n = [i for i, r in enumerate(info.roles) if r == "N" and i not in info.whole]
    if len(n) != 1:
        return None
    i, cols = n[0], hw.mme.cols
    tile, extent = plan.tiles[i], info.spatial[i]
    wide = -(-tile // cols) * cols
    if wide == tile or extent % wide:
        return None
    try:
        return _in_strips(func, replace(plan, tiles=plan.tiles[:i] + (wide,) + plan.tiles[i + 1:], strips=1),
                          hw, lb_bytes)
    except (Unsupported, CodegenError):
        return None


def _in_strips(func, plan: TilePlan, hw, lb_bytes: int | None) -> TilePlan:
    """``plan`` with its epilogue in the fewest strips (``StripEpilogue``) whose lowering fits
    ``lb_bytes`` of the LB; raises as the last lowering tried did where none does."""
    error = None
    for strips in STRIPS:
        try:
            stripped = replace(plan, strips=strips)
            plan_lb(read_kernel(lower_with_plan(func, stripped)), hw, lb_bytes)
            return stripped
        except (Unsupported, CodegenError) as err:  # too big, no epilogue to strip, strips that do not divide it
            error = err
    raise error


def _resident(func, best: tuple, hw, lb_bytes: int | None) -> TilePlan | None:
    """``best``'s plan (of (cycles, lowered, plan)) with the weights its tiles read alike held in
    the LB (``TilePlan.resident``), where that lowers to another kernel that fits; None else.
    MobileNetV2's depthwise + pointwise blocks (tiles of rows, every output channel) load a
    chunk's depthwise weights, bias and pointwise weights, a few hundred bytes each, for every
    chunk of every tile: each a DMA set-up of 64 cycles in the queue the chunk's input waits in."""
    if best[2].chunk is None:
        return None
    plan = replace(best[2], resident=True)
    try:
        lowered = lower_with_plan(func, plan)
        plan_lb(read_kernel(lowered), hw, lb_bytes)
    except (Unsupported, CodegenError):  # the whole weights do not fit beside the tiles
        return None
    return None if tvm_ffi.structural_equal(lowered.body, best[1].body) else plan  # else nothing moved


def _loads_twice(func, hw, lb_bytes: int | None, gb: frozenset, baseline, caps: tuple[int, ...], spread: int = 1):
    """A layer off the MME (a pooling, a normalisation, an element-wise chain) as ``baseline``
    tiles it or, where its loads have one copy, with the largest tiles that fit half the LB
    (each tile's loads then run while the tile before computes), whichever ``timed_cycles``
    finds faster in place."""
    if plan_lb(read_kernel(baseline), hw, lb_bytes).double_buffered:
        return baseline
    try:
        half = lower_kernel(func, hw, (hw.lb_bytes if lb_bytes is None else lb_bytes) // 2, caps=caps)[0]
    except Unsupported:
        return baseline
    return min((baseline, half), key=lambda low: timed_cycles(low, hw, lb_bytes, gb, spread))


def _two_accumulators(kernel, hw, lb_bytes: int | None) -> bool:
    """Whether ``plan_lb`` gives the kernel's accumulators two places (the next tile's products
    then run while this tile's epilogue drains the other)."""
    plan, names = plan_lb(kernel, hw, lb_bytes), accumulators(kernel)
    return bool(names) and all(len(plan.buffers[a].slots) == 2 for a in names)


def _strips_for_two_accumulators(func, plan: TilePlan, hw, lb_bytes: int | None):
    """``plan``'s tiles with the epilogue in the fewest strips (``StripEpilogue``) whose smaller
    temporaries leave room for a second accumulator; None where no strip count does.
    Conformer's feed-forward tiles (128 x 32, a swish on the 16-lane vector core: 408 cycles of
    epilogue after 2,416 of products) kept the MME waiting for their epilogue a seventh of
    the layer."""
    for strips in STRIPS[1:]:
        try:
            stripped = replace(plan, strips=strips)
            if _two_accumulators(read_kernel(lower_with_plan(func, stripped)), hw, lb_bytes):
                return stripped
        except (Unsupported, CodegenError):  # no epilogue to strip, or strips that do not divide it
            return None
    return None


def _faster_unit(func, hw, lb_bytes: int | None, gb: frozenset, baseline, caps: tuple[int, ...], spread: int = 1):
    """A contraction with no N loop (a depthwise convolution) on the MME (``baseline``: one PE
    column of the array) or on the vector units, whichever ``timed_cycles`` finds faster in
    place. MobileNetV2 at batch 8: 8 of its 10 kinds of depthwise layers run on the vector units
    (with ``timed_cycles`` leaving the launch out, 1,011,100 -> 785,326 cycles)."""
    try:
        vector = lower_kernel(func, hw, lb_bytes, vector=True, caps=caps)[0]
    except Unsupported:
        return baseline
    return min((baseline, vector), key=lambda low: timed_cycles(low, hw, lb_bytes, gb, spread))


TIMED_PLANS = 6  # plans ``lower_timed`` lowers and times besides the baseline (16 doubled compile times for little)
# and where the tiles are spread over the clusters (fewer samples than clusters: a sample's rows or a kernel's channels
# dealt over them), whose cluster's share the estimate ranks worse: Conformer's 256 x 256 products after its 31-tap depthwise convolution found their fastest plan eighth
# (51,414 -> 48,527 cycles); nine everywhere took DenseNet-121 at batch 8 from 236.9 to 318.9 s, 1.2 % slower
TIMED_PLANS_SPREAD = 9
# and there, those the estimate ranks first for a cluster's share of the tiles: ranked for the whole layer,
# DenseNet-121's 3 x 3 convolutions at 14 x 14 (batch 1, 4 of the 14 rows a cluster) took tiles of 2 rows x 16
# channels, 4 on a cluster's 8 cores; of a row, all 8 (timed 2,524 -> 1,405 cycles). Ranked so alone, ResNet-50 lost
# 2 % at batch 1. Counting the boxes a round of tiles shares once (their loads multicast), four more: DenseNet-121's
# 3 x 3 convolutions at 14 x 14 took tiles of all 32 channels over 7 pixels (batch 1, 393,413 -> 385,304 cycles);
# ranked so instead of a box a core, MobileNetV2 lost 10 % (its other layers moved to plans timed slower in place).
TIMED_PLANS_SHARE = 4
TIMED_TILES = 24  # tiles a timing runs: three rounds of a cluster's eight cores


def timed_cycles(lowered, hw, lb_bytes: int | None, gb: frozenset, spread: int = 1) -> float:
    """Cycles of a lowered layer on one cluster, its parameters at positions ``gb`` (and its
    output) in the GB, the rest in DDR: its first ``TIMED_TILES`` tiles round-robin over the
    cluster's cores, scaled to all of them, less the kernel's launch (paid once, not per tile:
    scaled with the tiles, it made a plan of many small tiles look slower than it runs, a
    depthwise convolution's on the vector units 2.5x). The GB is taken as large as the tensors
    need: a stitched kernel holds only its instances' part of them in each cluster's. With the
    tiles ``spread`` over so many clusters, a cluster's share of them: timed as all of them on
    one, Conformer's 256-column products over 128 tokens at batch 1 took tiles of 128 columns,
    two for each cluster's 32 tokens, and six of its eight cores idled."""
    kernel = read_kernel(lowered)
    tiles = -(-math.prod(lp.extent for lp in kernel.tile_loops()) // spread)
    gb = gb | {len(kernel.params) - 1}
    need = sum(align(math.prod(kernel.params[i][1]) * hw.storage_bytes) for i in gb)
    program = build_program(lowered, replace(hw, gb_bytes=max(hw.gb_bytes, need)), "timed", lb_bytes=lb_bytes,
                            cores=tuple(range(hw.cores_per_cluster)), gb=gb, tiles=min(tiles, TIMED_TILES),
                            replay=False)
    return (timing_cycles(program) - hw.kernel_launch_cycles) * tiles / min(tiles, TIMED_TILES)


def _grid(info, hw, capacity: int, caps: tuple[int, ...]):
    """Contraction plans whose least working set fits: every combination of the tiles
    ``candidate_plans`` gives each loop in its three orders, with every chunk of the first
    reduction loop from half the PE array's rows up, within ``capacity`` bytes of the LB."""
    seen = [set() for _ in info.spatial]
    for reuse, keep_n in ((False, False), (True, False), (True, True)):
        for plan in candidate_plans(info, hw.mme.rows, hw.mme.cols, reuse, keep_n, caps=caps):
            for i, t in enumerate(plan.tiles):
                seen[i].add(t)
    depth = info.reduction[0]
    chunks = [c for c in range(1, depth + 1) if depth % c == 0 and c >= min(depth, hw.mme.rows // 2)]
    for tiles in itertools.product(*map(sorted, seen)):
        for chunk in chunks:
            plan = TilePlan(tiles, chunk)
            if working_set_floor(info, plan, hw.storage_bytes, hw.accum_bytes) <= capacity:
                yield plan


def _estimate(info, plan: TilePlan, hw, capacity: int, spread: int = 1, shared: bool = False) -> float:
    """Rough cycles of a contraction plan on a cluster loading from the GB, to rank plans for
    timing: per tile, each chunk's operand boxes (B·M and N rows by the chunk, the weights by the
    rest of the reduction too) at a core's share of the GB and the MME's product, overlapped
    where two copies of the boxes and the accumulator fit ``capacity`` bytes, then the epilogue's
    pass and store; tiles dealt over the cluster's cores (with ``spread``, the cluster's share of
    the tiles dealt over so many clusters). With ``shared``, a round of tiles (one a core, dealt
    in loop order) moves each box its tiles share once through the GB's port, as their multicast
    loads do: ranked a box a core, DenseNet-121's 3 x 3 convolutions 128 -> 32 at 14 x 14 (batch
    1) took tiles of 16 channels, half the PE array's columns, where tiles of all 32 over half the
    pixels, their weights multicast, time 2.2x faster."""
    size = {"M": 1, "N": 1, "B": 1, "": 1}
    for t, r in zip(plan.tiles, info.roles):
        size[r] *= t
    m, n, rest = size["M"] * size["B"], size["N"], math.prod(info.reduction[1:])
    counts = [-(-e // t) for e, t in zip(info.spatial, plan.tiles)]
    tiles = -(-math.prod(counts) // spread)  # a cluster's
    boxes = (m + n * rest) * plan.chunk * hw.storage_bytes
    share = hw.gb_bytes_per_cycle / hw.cores_per_cluster
    port = boxes / share  # cycles a chunk's boxes take at a core's share of the port
    cores = hw.cores_per_cluster  # the tiles whose stores share the port
    if shared:
        cores = min(tiles, hw.cores_per_cluster)
        ones = [np.unravel_index(i, counts) for i in range(cores)]  # a round's tiles, in loop order
        rows = len({tuple(c for c, r in zip(t, info.roles) if r != "N") for t in ones})
        columns = len({tuple(c for c, r in zip(t, info.roles) if r == "N") for t in ones})
        port = (rows * m + columns * n * rest) * plan.chunk * hw.storage_bytes / hw.gb_bytes_per_cycle
    load = port + 2 * hw.dma_latency_cycles
    product = mme_cycles(1, m, n, plan.chunk * rest, hw)
    chunks = info.reduction[0] // plan.chunk
    doubled = 2 * boxes + m * n * hw.accum_bytes <= capacity
    body = chunks * max(load, product) + load if doubled else chunks * (load + product)
    epilogue = m * n / hw.vme_lanes + cores * m * n * hw.storage_bytes / hw.gb_bytes_per_cycle + hw.dma_latency_cycles
    return -(-tiles // hw.cores_per_cluster) * (body + epilogue)


def lower_in_parts(func, hw, lb_bytes: int | None, parts: dict[str, int], cores: int):
    """(lowered, plan): ``func`` tiled for ``cores`` cores as a partition asks: the spatial loops
    of each role split into about ``parts[role]`` tiles (roles as ``AnchorInfo.roles``: a SET
    layer's intra-layer partition, ``B``/``M``/``N`` parts of a contraction, ``""`` of another
    anchor; a role not given stays whole; ``_part_tiles``), smaller tiles only where those do
    not fit ``lb_bytes`` of the LB (``lower_kernel`` with these ``caps``, tiles dividing their
    loops)."""
    return lower_kernel(func, hw, lb_bytes, parallel=False, clamp=False,
                        caps=_part_tiles(anchor_info(func), parts, cores, hw))


PARTS_SLACK = 1.15


def _tile_loads(size: dict[str, int], reduction: tuple[int, ...]) -> int:
    """Elements a tile of ``size`` (its extent per role) loads: a contraction's M rows by the
    first reduction loop (a convolution's input channels; its window overlaps) and N columns by
    the whole reduction (the weights), per B; another anchor's elements by its reduction."""
    b, depth = size.get("B", 1), math.prod(reduction)
    if "M" in size or "N" in size:
        return b * (size.get("M", 1) * (reduction[0] if reduction else 1) + size.get("N", 1) * depth)
    return b * size.get("", 1) * depth


def _part_tiles(info, parts: dict[str, int], cores: int, hw) -> tuple[int, ...]:
    """Tiles near ``parts`` of each role, dealt round-robin over ``cores``. Candidates: tiles that
    divide their loops (and, where a loop's index sits inside a reshape's division, that
    divisor), splitting a role's loops into at most twice its parts (a loop of a role not given,
    or with no such tile, keeps its largest). Of those whose busiest core's time is within
    ``PARTS_SLACK`` of the least, the fewest tiles (less per-tile overhead: DMA set-ups, short
    rows), then the outer loops split first (inner rows stay long, contiguous DMA). The busiest
    core runs ⌈P / cores⌉ tiles, each taking the longer of its MME time (M and N padded to the
    PE array) and its loads (``_tile_loads``) at one link's (or its GB share's) rate."""
    roles = info.roles or ("",) * len(info.spatial)
    aligns = info.align or (1,) * len(info.spatial)
    unit = {"M": hw.mme.rows, "N": hw.mme.cols}
    depth = math.prod(info.reduction)
    rate = (hw.noc_link_bytes_per_cycle or hw.gb_bytes_per_cycle / hw.cores_per_cluster) / hw.storage_bytes
    options = []
    for i, (e, a, r) in enumerate(zip(info.spatial, aligns, roles)):
        divisors = [t for t in range(e, 0, -1) if e % t == 0 and (a <= 1 or a % t == 0)]
        options.append(([t for t in divisors if e // t <= 2 * parts[r]] or divisors[:1]) if r in parts else divisors[:1])
    scored = []
    for choice in itertools.product(*options):
        p = math.prod(e // t for e, t in zip(info.spatial, choice))
        size = {}
        for t, r in zip(choice, roles):
            size[r] = size.get(r, 1) * t
        mme = depth * math.prod(-(-t // unit.get(r, 1)) * unit.get(r, 1) for r, t in size.items()) \
            // (hw.mme.rows * hw.mme.cols)
        work = max(mme, _tile_loads(size, info.reduction) / rate)
        scored.append((-(-p // cores) * work, p, tuple(-t for t in reversed(choice)), choice))
    least = min(s[0] for s in scored)
    return min((s for s in scored if s[0] <= PARTS_SLACK * least), key=lambda s: s[1:3])[3]


def loads(lowered, hw, lb_bytes: int | None = None, on_chip=frozenset()) -> tuple[int, int, int]:
    """DDR bytes, transfers and GB bytes of a lowered kernel's reads from outside the LB, its
    inputs in DDR (as layerwise has them) but those at the positions ``on_chip``, in the GB:
    every load of every tile (one per chunk), from DDR in whole bursts of its contiguous runs
    (``runtime.cost.ddr_effective_bytes``), except where the tile before it on the same core
    (tiles dealt as ``emit.emitter.deal`` deals them) read the same box and the kernel has no
    chunk loop, so the LB still holds it (a weight tile)."""
    layer = Layer.of(lowered, hw, "estimate", None, lb_bytes)
    fp = footprints(layer)
    shapes = {name: shape for name, shape, _ in layer.ir.params}
    tiles = len(fp.tiles)
    chunked = any(lp.extent > 1 for lp in chunk_loops(layer.ir))
    kept = dict.fromkeys(fp.reads, 0)  # param -> tiles whose box the LB still holds
    if not chunked:
        # each tile after the one before it on its core
        cores = np.asarray(deal([lp.extent for lp in layer.ir.tile_loops()], hw))
        order = np.argsort(cores, kind="stable")
        after = cores[order][1:] == cores[order][:-1]
        for name, (lo, hi) in fp.reads.items():
            lo, hi = lo[order], hi[order]
            kept[name] = int((after & np.all(lo[1:] == lo[:-1], axis=1) & np.all(hi[1:] == hi[:-1], axis=1)).sum())
    position = {name: i for i, (name, *_) in enumerate(layer.ir.params)}
    nbytes = transfers = gb = 0
    for name, shape, count in fp.loads:
        strides = tuple(math.prod(shapes[name][d + 1:]) for d in range(len(shapes[name])))
        n = (tiles - kept[name]) * count
        if position[name] in on_chip:
            gb += n * math.prod(shape) * hw.storage_bytes
        else:
            nbytes += n * ddr_effective_bytes(isa.Operand("ddr", 0, 0, hw.storage_dtype, strides), shape, hw)
        transfers += n
    return nbytes, transfers, gb


def load_cycles(lowered, hw, lb_bytes: int | None = None, on_chip=frozenset()) -> float:
    """Cycles of a lowered kernel's ``loads``, all cores loading at once: the DDR's time for
    their DDR bytes and the clusters' GBs' for their GB bytes (``on_chip``), plus each core's
    transfer set-ups. Whole bursts make a strided box costly (a
    column of a row-major tensor, a burst per element) and set-ups make one-deep reduction
    chunks costly: ViT's probs x V (a reduction of 197, prime) had tiles of 197 rows and chunks
    of one, 26 times the cycles of rows of one beside the whole reduction."""
    nbytes, transfers, gb = loads(lowered, hw, lb_bytes, on_chip)
    cores = hw.clusters * hw.cores_per_cluster
    return (nbytes / hw.ddr_bytes_per_cycle + gb / (hw.gb_bytes_per_cycle * hw.clusters)
            + transfers * hw.dma_latency_cycles / cores)


def _rows_whole(info, plans: list[TilePlan]) -> list[TilePlan]:
    """``plans`` with the last spatial loop never split (its tile the whole extent) and no tiles
    that overlap (a row rewritten in place is read once), repeats dropped."""
    out = []
    for plan in plans:
        if any(e % t for e, t in zip(info.spatial, plan.tiles)):
            continue
        whole = replace(plan, tiles=(*plan.tiles[:-1], info.spatial[-1]))
        if not out or out[-1] != whole:
            out.append(whole)
    return out


def _fitting(func, info, plans, hw, lb_bytes, parallel, whole_rows=False):
    """The first of ``plans`` that lowers within the LB, made parallel (``lower_kernel``; with
    ``whole_rows`` no tile splits the last spatial loop)."""

    tried: dict[int, object] = {}
    too_big: dict[int, int] = {}  # plan index -> LB bytes its tile needs, for those that do not fit
    reasons: list[str] = []

    def lowered_if_fits(i):
        if i not in tried:
            tried[i] = None
            try:
                lowered = lower_with_plan(func, plans[i])
                kernel = read_kernel(lowered)
            except Unsupported as err:  # indices not affine in this tiling
                reasons.append(str(err))
                return None
            try:
                plan_lb(kernel, hw, lb_bytes)
                tried[i] = lowered
            except Unsupported as err:  # too big for the LB
                too_big[i] = tile_bytes(kernel, hw)
                reasons.append(str(err))
        return tried[i]

    def spread(plan):
        """Every cluster the first loop can feed gets a value of the first tile loop (it picks the
        cluster: the batch split) and each of its cores a tile."""
        clusters = min(info.spatial[0], hw.clusters)
        return (info.spatial[0] // plan.tiles[0] >= clusters
                and _tiles(info, plan) >= clusters * hw.cores_per_cluster)

    # plans above the LB by the tile's least working set need no lowering; the first plan that
    # fits is usually within a few of the first that passes that bound
    capacity = hw.lb_bytes if lb_bytes is None else lb_bytes
    floor = _bisect(len(plans), lambda i: working_set_floor(info, plans[i], hw.storage_bytes,
                                                            hw.accum_bytes) <= capacity)
    first = _predicted(floor, plans, capacity, lambda i: lowered_if_fits(i) is not None, too_big)
    # fitting is monotone along the plans, affine indices are not (a reshape wants tiles that
    # divide its factors): when the bisection lands on a failure, scan on for a plan that lowers
    while first < len(plans) and lowered_if_fits(first) is None:
        first += 1
    if first == len(plans):
        raise Unsupported(f"no tiling of {info.name} fits the {lb_bytes or hw.lb_bytes}-byte LB "
                          f"with affine accesses (last: {reasons[-1] if reasons else '?'})")
    if not parallel or spread(plans[first]):
        return lowered_if_fits(first), plans[first]
    more = [replace(p, vector=plans[first].vector) for p in parallel_plans(info, plans[first], hw.mme.rows, hw.mme.cols)]
    if whole_rows:
        more = [p for p in _rows_whole(info, more) if p != plans[first]]
    if not more:
        return lowered_if_fits(first), plans[first]
    best = min(_bisect(len(more), lambda i: spread(more[i])), len(more) - 1)
    try:
        lowered = lower_with_plan(func, more[best])
        read_kernel(lowered)  # a consumer of the anchor may not take a partial tile
    except Unsupported:  # this split breaks an index's affinity: keep the plan that fits
        return lowered_if_fits(first), plans[first]
    return lowered, more[best]


def _loads_overlapped(func, info, plan: TilePlan, lowered, hw, lb_bytes):
    """(lowered, plan): ``plan``, or where it leaves no room for a second copy of what a chunk
    loads, the same tiles with the largest chunk that does — a divisor of the chunk, not below
    the PE array's rows, the epilogue in as few strips as that takes (``StripEpilogue``: 1, 2, 4
    or 8) — if ``chunk_cycles`` finds its tile faster, the strips' set-ups counted
    (``strip_cycles``): one copy makes every chunk's loads wait for the MME to finish the chunk
    before (ViT's 197-row matmul tiles: load and compute take turns); more chunks cost a transfer
    set-up and an MME pass each (BERT's FFN tiles of 64 x 96 had chunks of 16 and a GELU's two
    float32 tile-sized temporaries; in 4 strips they take chunks of 32). A divisor keeps the
    boxes aligned as the chunk's were."""

    # a chunk of the whole reduction keeps its weight tile in the LB from one tile to the next
    whole = plan.chunk is None or plan.chunk == info.reduction[0]
    if whole or plan.vector or "N" not in info.roles:
        return lowered, plan
    kernel = read_kernel(lowered)
    if plan_lb(kernel, hw, lb_bytes).double_buffered or chunk_cycles(kernel, hw, overlapped=False) is None:
        return lowered, plan
    chunk = plan.chunk
    while chunk >= hw.mme.rows:
        for strips in STRIPS:
            if (chunk, strips) == (plan.chunk, 1):
                continue
            other_plan = replace(plan, chunk=chunk, strips=strips)
            try:
                low = lower_with_plan(func, other_plan)
            except Unsupported:  # indices not affine in this chunk, or no epilogue to strip
                if strips == 1:
                    return lowered, plan
                break
            other = read_kernel(low)
            try:
                doubled = plan_lb(other, hw, lb_bytes).double_buffered
            except Unsupported:  # a deeper chunk that does not fit even once: more strips may
                continue
            if doubled:
                cycles = chunk_cycles(other, hw, overlapped=True) + strip_cycles(other, hw)
                faster = cycles < chunk_cycles(kernel, hw, overlapped=False)
                return (low, other_plan) if faster else (lowered, plan)
        chunk = divisor_below(plan.chunk, chunk)
    return lowered, plan


STRIPS = (1, 2, 4, 8)  # the epilogue strips ``_loads_overlapped`` tries, fewest first


def strip_cycles(kernel, hw) -> int:
    """What running a kernel's epilogue in strips adds per tile: the set-up of each of its stages
    (a transfer's or a vector instruction's) once more per strip after the first."""

    loops = [n for n in kernel.tile_loops()[-1].body if isinstance(n, Loop) and n.kind == STRIP]
    return sum((lp.extent - 1) * sum(hw.dma_latency_cycles if st.op == "dma" else hw.vector_latency_cycles
                                     for st in stages_of(lp.body)) for lp in loops)


def chunk_cycles(kernel, hw, overlapped: bool) -> float | None:
    """Estimated cycles of one tile's chunk loop on a core loading from the GB: per chunk, each
    load's set-up plus its bytes at the core's share of the GB's bandwidth, and the MME's product
    (``runtime.cost.mme_cycles``); loads and product one after the other, or ``overlapped`` (two
    copies of the loads) the longer of the two, plus the first chunk's loads. None without a
    chunk loop or where it computes more than the loads and the product (producers moved under
    it), which the estimate leaves out."""

    chunks = chunk_loops(kernel)
    if not chunks or any(st.op not in ("dma", "mme") for st in stages_of(chunks[0].body)):
        return None
    loop = chunks[0]
    esize = tvm.runtime.DataType(hw.storage_dtype).bits // 8
    per_core = hw.gb_bytes_per_cycle / hw.cores_per_cluster
    load = product = 0.0
    for st in stages_of(loop.body):
        if st.op == "dma" and st.dst.lb:
            load += hw.dma_latency_cycles + math.prod(st.shape) * esize / per_core
        elif st.op == "mme":
            a, b = (r.access for r in st.value)
            dims = {"k": 1, "m": 1, "n": 1, "batch": 1}
            for i, e in enumerate(st.shape):
                in_a, in_b = any(row[i] for row in a.inner), any(row[i] for row in b.inner)
                role = ("k" if not any(row[i] for row in st.dst.inner) else
                        "m" if in_a and not in_b else "n" if in_b and not in_a else "batch")
                dims[role] *= e
            product += mme_cycles(dims["batch"], dims["m"], dims["n"], dims["k"], hw)
    if overlapped:
        return loop.extent * max(load, product) + load
    return loop.extent * (load + product)


def _bisect(n: int, pred, lo: int = 0) -> int:
    """Smallest i in [lo, n) with pred(i) for a monotone pred; n if none."""
    hi = n
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _predicted(floor: int, plans: list[TilePlan], capacity: int, fits, too_big: dict[int, int]) -> int:
    """The first of ``plans`` from ``floor`` that ``fits`` (monotone), found with few lowerings:
    a plan too big for the LB predicts the first that fits, its tile's bytes (``too_big``) shrunk
    in proportion to each later plan's box (``_box_ratio``); the prediction is lowered, and if too
    big too, predicts again. A box mostly shrinks by no more than its tiles (by less for a window
    wider than its stride, or a weight tile that rows do not cut), so predictions mostly come
    early; where one fits, the plan before it is checked, which keeps the answer exact where one
    comes late (a stride wider than its window, buffers sharing LB places in one tiling and not
    in another). A plan whose indices are not affine predicts nothing: from it the search
    gallops. ViT-B/16's layer norms and softmax: 3 lowerings of 20-40 ms each instead of 7."""
    n, last, probe = len(plans), None, floor
    while probe < n and not fits(probe) and probe in too_big:
        last, need, ref = probe, too_big[probe], plans[probe]
        probe = _bisect(n, lambda i: need * _box_ratio(ref, plans[i]) <= capacity, probe + 1)
    if probe == n or not fits(probe):
        return _gallop(probe, n, fits)
    if last is not None and probe - 1 > last and fits(probe - 1):  # a prediction came late
        return _bisect(probe - 1, fits, last + 1)
    return probe


def _box_ratio(ref: TilePlan, plan: TilePlan) -> float:
    """How much smaller ``plan``'s tile is than ``ref``'s: the product of its tiles' and chunk's
    ratios (``plan`` comes after ``ref`` in ``candidate_plans``: no loop larger)."""
    ratio = 1.0
    for a, b in zip(ref.tiles, plan.tiles):
        ratio *= b / a
    if ref.chunk and plan.chunk:
        ratio *= plan.chunk / ref.chunk
    return ratio


def _gallop(lo: int, n: int, pred) -> int:
    """``_bisect`` for an answer likely near ``lo``: probes lo, lo + 2, lo + 6, ... (steps doubling),
    then bisects the last step."""
    step = 1
    while lo < n:
        hi = min(lo + step, n)
        if pred(hi - 1):
            return _bisect(hi - 1, pred, lo)
        lo, step = hi, 2 * step
    return n


__all__ = [
    "Unsupported", "classify", "TilePlan", "anchor_info", "candidate_plans", "tile_schedule",
    "assign_scopes", "strip_epilogue", "lower_to_dsa", "lower_with_plan", "lower_kernel", "lower_in_parts", "lower_timed", "loads", "load_cycles", "chunk_cycles",
    "working_set_floor", "TileForLB", "AssignScopes", "StripEpilogue", "LowerToDSA", "ClampTiles", "LB_SCOPE",
    "GB_SCOPE",
]
