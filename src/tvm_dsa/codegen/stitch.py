"""Stitched kernels (seed 000 §4.2-4.3): one kernel runs a sub-graph's layers instance by instance,
the tensors between its layers kept on chip instead of going through DDR.

Three steps, each a function of its own:

- ``footprints``: per tile of a lowered layer, the box of every tensor it reads and writes
  (from the kernel IR's integer access patterns, over the tile's chunk loops).
- ``plan_instances``: the sub-graph's output layer's tiles grouped into instances; each instance's
  tiles of every other layer found backwards from what its consumers read (a 3x3 window reads a
  halo: those tiles are computed by both neighbouring instances — the recomputation). Instances
  are made coarser while recomputation costs more than ``RECOMPUTE_LIMIT`` of the work.
- ``allocate``: liveness over the kernel's steps, an offline placement plan at a level, and when
  the live tensors do not fit, spilling by a policy: the tensor with the longest lifetime first (the
  seed's rule) or the largest first (prior work's), to the next level down.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from .emit import Layer
from ..relax_passes import memory_plan
from .kernel_ir import Loop, align

RECOMPUTE_LIMIT = 1.25  # assumed (the seed gives no number): at most 25 % of the work computed twice

Box = tuple[tuple[int, ...], tuple[int, ...]]  # (low corner, high corner exclusive)
Boxes = tuple[np.ndarray, np.ndarray]  # low and high corners, one row per tile


def _hull(boxes: Boxes, rows: np.ndarray) -> Box | None:
    """The smallest box holding the ``rows`` of ``boxes``."""
    if not len(rows):
        return None
    return tuple(boxes[0][rows].min(0).tolist()), tuple(boxes[1][rows].max(0).tolist())


def _union(a: Box | None, b: Box | None) -> Box | None:
    if a is None or b is None:
        return a or b
    return tuple(map(min, a[0], b[0])), tuple(map(max, a[1], b[1]))


def _meeting(boxes: Boxes, box: Box) -> np.ndarray:
    """Rows of ``boxes`` that overlap ``box``."""
    lo, hi = np.asarray(box[0]), np.asarray(box[1])
    return np.flatnonzero(np.all((boxes[0] < hi) & (lo < boxes[1]), axis=1))


def _inside(a: Box, b: Box) -> bool:
    return all(lo2 <= lo1 and hi1 <= hi2 for lo1, hi1, lo2, hi2 in zip(a[0], a[1], b[0], b[1]))


@dataclass(frozen=True)
class Footprint:
    """Per tile (``tiles``: tile-loop values, row order of the arrays): the box of the output it
    writes, the box of every parameter it reads, and the tile's work (loop iterations of its
    stages)."""

    tiles: list[tuple[int, ...]]
    write: Boxes
    reads: dict  # param -> Boxes
    work: int  # per tile


def footprints(layer: Layer) -> Footprint:
    """Evaluated for all tiles at once: the access patterns are integer expressions of the loop
    slots, so they apply to arrays of slot values as well as to single values."""
    ir = layer.ir
    shapes = {name: shape for name, shape, _ in ir.params}
    out = ir.params[-1][0]
    tile_loops = ir.tile_loops()
    accesses, work = [], 0  # (param, access, is_write, stage shape, enclosing chunk loops)

    def walk(nodes, chunks):
        nonlocal work
        for n in nodes:
            if isinstance(n, Loop):
                walk(n.body, chunks + [(n.slot, n.extent)])
                continue
            work += math.prod(n.shape) * math.prod(e for _, e in chunks)
            for acc, w in [(n.dst, True)] + [(a, False) for a in n.reads()]:
                if not acc.lb and (acc.buffer == out or not w):
                    accesses.append((acc.buffer, acc, w, n.shape, chunks))

    walk(tile_loops[-1].body, [])
    grid = np.indices([lp.extent for lp in tile_loops]).reshape(len(tile_loops), -1)
    count = grid.shape[1]
    env: list = [0] * ir.slots
    for lp, values in zip(tile_loops, grid):
        env[lp.slot] = values
    boxes: dict = {}  # (param, is_write) -> Boxes
    for name, acc, is_write, shape, chunks in accesses:
        ext = np.asarray(acc.extents(shape), dtype=np.int64)
        for corner in itertools.product(*((0, e - 1) for _, e in chunks)):
            for (slot, _), v in zip(chunks, corner):
                env[slot] = v
            low = np.array([np.broadcast_to(x, (count,)) for x in acc.low_corner(env, shape)],
                           dtype=np.int64).reshape(len(acc.const), count)
            high = np.minimum(low + ext.reshape(-1, 1), np.asarray(shapes[name], dtype=np.int64).reshape(-1, 1))
            box = (np.maximum(low, 0).T, high.T)
            old = boxes.get((name, is_write))
            boxes[(name, is_write)] = box if old is None else (np.minimum(old[0], box[0]), np.maximum(old[1], box[1]))
    tiles = [tuple(t) for t in grid.T.tolist()]
    return Footprint(tiles, boxes[(out, True)], {n: b for (n, w), b in boxes.items() if not w}, work)


@dataclass(frozen=True)
class Instances:
    """``tiles[i][layer]``: the tiles instance ``i`` computes; ``boxes[i][tensor]``: the box of
    each intermediate it produces (what it writes, so consumers' reads fall inside)."""

    tiles: list
    boxes: list
    recompute: float  # work of all instances / work of the sub-graph

    @property
    def count(self) -> int:
        return len(self.tiles)


def plan_instances(layers: list[Layer], prints: dict, outputs: list[str], loop: int, groups: int) -> Instances:
    """Instances of a sub-graph (``layers`` in topological order, ``prints`` their footprints,
    ``outputs`` the tensors leaving it): the tiles of the last output layer grouped by their tile-loop
    values up to ``loop``, loop ``loop`` itself cut into at most ``groups`` ranges. Coarsened (fewer
    groups, then fewer loops) until the recomputation is within ``RECOMPUTE_LIMIT`` and the output
    layers' tiles are split between instances exactly; one instance at worst."""
    primary = [L for L in layers if L.args[L.ir.params[-1][0]] in outputs][-1]
    grid = np.asarray(prints[primary.name].tiles).reshape(len(prints[primary.name].tiles), -1)
    tried = set()
    for loop in range(min(loop, grid.shape[1] - 1), -1, -1):
        extent = int(grid[:, loop].max()) + 1
        groups = min(groups, extent)
        while groups > 1:
            size = -(-extent // groups)
            groups = (groups + 1) // 2
            if (loop, size) in tried:
                continue
            tried.add((loop, size))
            _, seed_of = np.unique(np.column_stack([grid[:, :loop], grid[:, loop] // size]), axis=0,
                                   return_inverse=True)
            seeds = [np.flatnonzero(seed_of.ravel() == k) for k in range(int(seed_of.max()) + 1)]
            inst = _propagate(layers, prints, outputs, primary, seeds)
            if inst is not None and inst.recompute <= RECOMPUTE_LIMIT:
                return inst
        groups = 1 << 30
    return _propagate(layers, prints, outputs, primary, [np.arange(len(grid))])


def _propagate(layers, prints, outputs, primary, seeds) -> Instances | None:
    """Instances from the ``seeds`` (rows of ``primary``'s tiles): every other layer's tiles whose
    output meets what the instance's later layers read; None where an instance would read past
    what it computes or a second output would be split."""
    out_of = {L.args[L.ir.params[-1][0]]: L for L in layers}
    total = sum(len(prints[L.name].tiles) * prints[L.name].work for L in layers)
    all_tiles, all_boxes, work = [], [], 0
    for seed in seeds:
        chosen = {primary.name: seed}
        need: dict = {}  # tensor -> box read by this instance's chosen tiles
        boxes: dict = {}
        for L in reversed(layers):
            fp = prints[L.name]
            out = L.args[L.ir.params[-1][0]]
            if L.name not in chosen:
                if out in outputs and len(seeds) > 1:
                    return None  # a second output: the instances could not split it exactly
                box = need.get(out)
                chosen[L.name] = (np.arange(len(fp.tiles)) if out in outputs else
                                  _meeting(fp.write, box) if box else np.arange(0))
            rows = chosen[L.name]
            if out not in outputs:
                boxes[out] = _union(boxes.get(out), _hull(fp.write, rows))
            for param, reads in fp.reads.items():
                tensor = L.args[param]
                if tensor in out_of:
                    need[tensor] = _union(need.get(tensor), _hull(reads, rows))
            work += len(rows) * fp.work
        if any(not _inside(need[t], boxes[t]) for t in need if boxes.get(t) and need[t]):
            return None
        all_tiles.append({name: [prints[name].tiles[r] for r in rows.tolist()] for name, rows in chosen.items()})
        all_boxes.append({t: b for t, b in boxes.items() if b is not None})
    return Instances(all_tiles, all_boxes, work / max(total, 1))


# --------------------------------------------------------------------------------------------
# allocation and reuse (§4.3)
@dataclass(frozen=True)
class Lifetime:
    key: object
    nbytes: int
    first: int  # step that writes it
    last: int  # last step that reads it


SPILL_POLICIES = ("longest", "largest")


def allocate(lives: list[Lifetime], capacity: int, policy: str = "longest") -> tuple[dict, list]:
    """(offset per kept key, spilled keys) at one level of ``capacity`` bytes. The lifetimes are
    known before the kernel runs, so the placement is planned offline (``memory_plan.peak_first``,
    SoD2's planner: the tensors live at the peak first, then outwards), each tensor's space free
    for reuse after its last read. When the plan does not fit, the first step whose live tensors
    overflow (or, with enough bytes but no fitting gap, the first step of a tensor placed past the
    end) gives up one of its live tensors, chosen by ``policy``, to the next level, and planning
    restarts without it."""
    if policy not in SPILL_POLICIES:
        raise ValueError(f"unknown spill policy {policy!r}; known: {SPILL_POLICIES}")
    spilled: set = set()
    while True:
        kept = [x for x in lives if x.key not in spilled]
        spans = [memory_plan.Lifetime(align(x.nbytes), x.first, x.last) for x in kept]
        plan = memory_plan.peak_first(spans)
        if plan.peak <= capacity:
            return ({x.key: o for x, o in zip(kept, plan.offsets)},
                    [x.key for x in lives if x.key in spilled])
        live = memory_plan.live_bytes(spans)
        at = next((s for s, n in enumerate(live) if n > capacity), None)
        if at is None:
            at = min(x.first for x, o, t in zip(kept, plan.offsets, spans) if o + t.size > capacity)
        candidates = [x for x in kept if x.first <= at <= x.last]
        if policy == "longest":  # the seed: the tensor that stays longest (remaining lifetime)
            victim = max(candidates, key=lambda y: (y.last - at, y.nbytes))
        else:  # prior work: the largest tensor
            victim = max(candidates, key=lambda y: (y.nbytes, y.last - at))
        spilled.add(victim.key)


# --------------------------------------------------------------------------------------------
# the stitched program
ORDERS = ("dfs", "bfs")


@dataclass(frozen=True)
class SubGraphKernel:
    """What the scheduler hands kernel generation for one sub-graph."""

    name: str
    layers: tuple  # Layer, topological order; Layer.name is unique (the call site)
    inputs: tuple[str, ...]  # tensors read from outside, in argument order
    outputs: tuple[str, ...]
    tensors: dict  # tensor -> (shape, host dtype)
    weights: frozenset  # inputs to promote DDR -> GB (learned parameters)
    split_loop: int = 0  # tile loop the instances split (Algorithm 1's best split)
    groups: int = 1 << 30  # at most this many ranges of that loop


@dataclass(frozen=True)
class StitchInfo:
    """What kernel generation decided for a sub-graph (for reports and tests)."""

    instances: int
    recompute: float
    cores_per_instance: int
    order: str
    gb_peak: int  # bytes of the GB allocation (intermediates and promoted weights) per cluster
    spilled: tuple  # intermediates and weights kept in DDR instead of the GB
    lb_kept: int = 0  # instance intermediates kept in their core's LB
    lb_bytes: int = 0  # bytes of each core's LB set aside for them (the rest holds the layers' tiles)


@dataclass(frozen=True)
class _ClusterPlan:
    """One cluster's part of a stitched kernel for an instance order: its instances, their round
    on their cores, the step of (round, layer), the lifetimes and where they were placed."""

    members: list  # instance indices
    rnd: dict  # instance -> round on its cores
    step: object  # (round, layer index) -> step
    lives: list  # Lifetime of every intermediate and promoted weight
    offsets: dict  # key -> GB offset
    spilled: list  # keys in DDR
    gb_peak: int
    kept: dict  # key -> (core, LB offset)


def _binding(n: int, hw) -> list[tuple[int, ...]]:
    """Cores of each instance (Algorithm 4's factors): instances dealt over the clusters (the batch
    split), one core each when a cluster has at least as many instances as cores, otherwise the
    largest of 8, 4, 2, 1 cores each that keeps them balanced."""
    clusters, cpc = min(n, hw.clusters), hw.cores_per_cluster
    per = [list(range(c, n, clusters)) for c in range(clusters)]
    cores = [()] * n
    for c, members in enumerate(per):
        share = max([f for f in (8, 4, 2, 1) if f * len(members) <= cpc and f <= cpc] or [1])
        for j, i in enumerate(members):
            first = (j * share) % cpc
            cores[i] = tuple(c * cpc + first + k for k in range(share))
    return cores


def sg_instances(sg: SubGraphKernel) -> tuple[Instances, dict]:
    """The instances of a sub-graph, split as its scheduler decided (``plan_instances``), and the
    footprints of its layers."""
    prints = {L.name: footprints(L) for L in sg.layers}
    return plan_instances(list(sg.layers), prints, list(sg.outputs), sg.split_loop, sg.groups), prints


def instance_cores(sg: SubGraphKernel, hw) -> list[tuple[int, ...]]:
    """The cores each instance of ``sg`` is bound to (Algorithm 4's factors)."""
    return _binding(sg_instances(sg)[0].count, hw)


def _translation(sg: SubGraphKernel, prints: dict, inst: Instances, pairs) -> dict | None:
    """Per tensor, how many elements along its first (batch) dimension the second instance of
    each pair in ``pairs`` is moved from the first: when every layer's tiles of the second read and
    write exactly the first's boxes moved that way (weights not moved), tile for tile. None when
    the instances are not translates of each other."""
    delta: dict = {}

    def agree(tensor, a: Boxes, b: Boxes) -> bool:
        d = b[0] - a[0]
        if not len(d) or (d != b[1] - a[1]).any() or d[:, 1:].any() or (d[:, 0] != d[0, 0]).any():
            return not len(d)
        return delta.setdefault(tensor, int(d[0, 0])) == int(d[0, 0]) and not (tensor in sg.weights and d[0, 0])

    for i, j in pairs:
        for L in sg.layers:
            fp = prints[L.name]
            a, b = inst.tiles[i][L.name], inst.tiles[j][L.name]
            if len(a) != len(b):
                return None
            if not a:
                continue
            row = {t: r for r, t in enumerate(fp.tiles)}
            ra, rb = [row[t] for t in a], [row[t] for t in b]
            out = L.args[L.ir.params[-1][0]]
            if not agree(out, (fp.write[0][ra], fp.write[1][ra]), (fp.write[0][rb], fp.write[1][rb])):
                return None
            for param, boxes in fp.reads.items():
                if not agree(L.args[param], (boxes[0][ra], boxes[1][ra]), (boxes[0][rb], boxes[1][rb])):
                    return None
    return delta


def _cluster_shift(sg, prints, inst, cores, cpc, reference, other, regions, esize) -> dict | None:
    """Bytes each DDR object moves between the reference cluster's part of a stitched kernel and
    ``other``'s, when ``other``'s part is the reference's translated (same rounds on cores moved by
    whole clusters, instances moved along the batch, tensors placed alike); None otherwise."""
    (c0, cp0, place0, _), (c, cp, place) = reference, other
    if len(cp0.members) != len(cp.members):
        return None
    pairs = list(zip(cp0.members, cp.members))
    moved = (c - c0) * cpc
    if any(cp0.rnd[i] != cp.rnd[j] or cores[j] != tuple(k + moved for k in cores[i]) for i, j in pairs):
        return None
    delta = _translation(sg, prints, inst, pairs)
    if delta is None:
        return None
    twin = {i: j for i, j in pairs}
    lives = {x.key: x for x in cp.lives}
    shift = {("ddr", t): delta.get(t, 0) * math.prod(r.extents[1:]) * esize for t, r in regions.items()}
    for x in cp0.lives:
        key = (x.key[0], x.key[1], twin[x.key[2]] if x.key[0] == "t" else c)
        y = lives.get(key)
        if y is None or (y.first, y.last, y.nbytes) != (x.first, x.last, x.nbytes):
            return None
        a, b = place0.get(x.key), place.get(key)
        if (a is None) != (b is None):
            return None
        if a is None:
            continue
        if a.mem != b.mem or a.extents != b.extents or (a.mem != "ddr" and a.base != b.base):
            return None
        if a.mem == "ddr":
            shift[x.key] = b.base - a.base
    return shift


def build_stitched(sg: SubGraphKernel, hw, order: str = "best", spill: str = "longest",
                   gb: bool = True, prefetch: int = 2, lb: bool = False, replicate: bool = True):
    """(Program, StitchInfo) of one sub-graph: its instances, each layer's tiles of an instance on
    the instance's cores, intermediates in the GB (``gb=False``: in DDR, the layerwise placement),
    weights promoted to the GB once per cluster; ``order`` dfs (instance by instance), bfs (layer by
    layer) or best (the smaller GB peak, Algorithm 3's choice).

    With ``lb`` an instance bound to one core keeps its intermediates in that core's LB, below the
    layers' tile buffers (which then sit at the top of the LB); what does not fit spills to the GB,
    and from there to DDR (Fig. 12). An instance on several cores keeps them in the GB: its
    producers' and consumers' tiles run on different cores (Algorithm 4's scope rule).

    Cross-layer scheduling (§4.4): a weight's promotion is issued ``prefetch`` steps before the
    step that first reads it, so the cluster DMA moves it while earlier layers compute (its GB
    space is held from then on), or fewer steps where holding the weights that long would spill
    more to DDR; with 0 every layer waits for its own weights.

    A cluster whose instances are the first cluster's moved along the batch, placed alike, gets a
    copy of its instructions (``replicate``; False emits every cluster, for tests)."""
    from .. import isa
    from .emit import KernelEmitter, Region, place_arguments
    from .kernel_ir import ALIGN

    inst, prints = sg_instances(sg)
    cores = _binding(inst.count, hw)
    lb_base = hw.lb_bytes - max(L.plan.total_bytes for L in sg.layers) if lb else 0
    lb_base -= lb_base % ALIGN
    cpc = hw.cores_per_cluster
    esize = isa.DTYPES[hw.storage_dtype]

    def nbytes(box):
        return esize * math.prod(h - l for l, h in zip(*box))

    # DDR: arguments, then scratch for what the GB does not keep
    regions, args, offset = place_arguments(sg.inputs, sg.outputs, sg.tensors, hw)

    index = {L.name: k for k, L in enumerate(sg.layers)}
    readers: dict = {}
    for L in sg.layers:
        for p, t in L.args.items():
            if p != L.ir.params[-1][0]:
                readers.setdefault(t, []).append(index[L.name])
    produced = {L.args[L.ir.params[-1][0]]: index[L.name] for L in sg.layers}

    def plan(order_name):
        """Steps (round, layer) per cluster in program order, lifetimes, allocation per cluster."""
        nl = len(sg.layers)
        per_cluster: dict = {}
        for i, cs in enumerate(cores):
            per_cluster.setdefault(cs[0] // cpc, []).append(i)
        result = {}
        for c, members in per_cluster.items():
            per_core: dict = {}
            for i in members:
                per_core.setdefault(cores[i], []).append(i)
            rnd = {i: k for group in per_core.values() for k, i in enumerate(group)}
            rounds = max(rnd.values()) + 1

            def step(r, k):
                return r * nl + k if order_name == "dfs" else k * rounds + r

            lives, lb_lives = [], {}
            for i in members:
                for t, box in inst.boxes[i].items():
                    x = Lifetime(("t", t, i), nbytes(box), step(rnd[i], produced[t]),
                                 max(step(rnd[i], k) for k in readers[t]))
                    (lb_lives.setdefault(cores[i][0], []) if lb and len(cores[i]) == 1 else lives).append(x)
            kept = {}  # key -> (core, LB offset)
            for core, xs in lb_lives.items():
                offsets, spilled = allocate(xs, lb_base, spill)
                kept.update({k: (core, o) for k, o in offsets.items()})
                lives += [x for x in xs if x.key in spilled]  # on to the GB
            used = {t for i in members for k in range(nl) if inst.tiles[i][sg.layers[k].name]
                    for t in sg.layers[k].args.values()}
            uses = {w: [step(rnd[i], k) for i in members for k in readers[w] if inst.tiles[i][sg.layers[k].name]]
                    for w in sg.weights & used}
            capacity = hw.gb_bytes if gb else 0

            def placed(ahead):
                """Allocation with every promotion issued ``ahead`` steps before first use."""
                weights = [Lifetime(("w", w, c), nbytes(((0,) * len(sg.tensors[w][0]), sg.tensors[w][0])),
                                    max(0, min(u) - ahead), max(u)) for w, u in uses.items()]
                return lives + weights, *allocate(lives + weights, capacity, spill)

            # promotions as early as ``prefetch`` allows without pushing more to DDR than none
            # early: a spilled weight is read from DDR by every tile, costing far more than the wait
            fallback = placed(0)
            lives, offsets, spilled = next((t for t in map(placed, range(prefetch, 0, -1))
                                            if len(t[2]) <= len(fallback[2])), fallback)
            peak = max((offsets[x.key] + align(x.nbytes) for x in lives if x.key in offsets), default=0)
            lives += [x for xs in lb_lives.values() for x in xs if x.key in kept]
            result[c] = _ClusterPlan(members, rnd, step, lives, offsets, spilled, peak, kept)
        return result

    if order == "best":
        plans = {o: plan(o) for o in ORDERS}
        # Algorithm 3 keeps the order that uses the LB better: fewer spills to DDR, more
        # intermediates kept in the LBs, then the smaller GB peak
        order = min(ORDERS, key=lambda o: (sum(len(p.spilled) for p in plans[o].values()),
                                           -sum(len(p.kept) for p in plans[o].values()),
                                           max(p.gb_peak for p in plans[o].values())))
        chosen = plans[order]
    elif order in ORDERS:
        chosen = plan(order)
    else:
        raise ValueError(f"unknown instance order {order!r}; known: {ORDERS + ('best',)}")

    emitter = KernelEmitter(hw, sg.name)
    for t, r in regions.items():
        emitter.claim(r, ("ddr", t))
    scratch_top = offset
    spilled_all = []
    lb_kept = 0
    reference = None  # (cluster, its plan, placement, [first, end) of its instructions): the others copy it
    for c, cp in sorted(chosen.items()):
        members, rnd, step, lives, offsets, spilled, kept = (cp.members, cp.rnd, cp.step, cp.lives, cp.offsets,
                                                             cp.spilled, cp.kept)
        spilled_all += spilled
        # where each instance's intermediates and the cluster's weights live
        place: dict = {}
        ddr_lives = [x for x in lives if x.key in spilled and x.key[0] == "t"]
        ddr_offsets, _ = allocate(ddr_lives, 1 << 62, spill)
        for x in lives:
            kind, t = x.key[0], x.key[1]
            shape = sg.tensors[t][0]
            box = inst.boxes[x.key[2]][t] if kind == "t" else ((0,) * len(shape), tuple(shape))
            extents = tuple(h - l for l, h in zip(*box))
            if x.key in kept:
                place[x.key] = Region("lb", kept[x.key][0], kept[x.key][1], box[0], extents, hw.storage_dtype)
            elif x.key in offsets:
                place[x.key] = Region("gb", c, offsets[x.key], box[0], extents, hw.storage_dtype)
            elif kind == "t":
                place[x.key] = Region("ddr", 0, scratch_top + ddr_offsets[x.key], box[0], extents, hw.storage_dtype)
        lb_kept += len(kept)
        if ddr_lives:
            scratch_top += max(ddr_offsets[x.key] + align(x.nbytes) for x in ddr_lives)
        if reference is None:
            reference = (c, cp, place, [len(emitter.instructions), None])
        elif replicate:
            shift = _cluster_shift(sg, prints, inst, cores, cpc, reference, (c, cp, place), regions, esize)
            c0, _, _, (start, stop) = reference
            if shift is not None and emitter.replicate(start, stop, (c - c0) * cpc, c, shift):
                continue
        starts: dict = {}
        for x in lives:
            if x.key in place:
                starts.setdefault(x.first, []).append(x)
        steps = sorted({step(rnd[i], k) for i in members for k in range(len(sg.layers))} | set(starts))
        for s in steps:
            for x in starts.get(s, []):
                emitter.claim(place[x.key], x.key)
                if x.key[0] == "w":
                    emitter.move(regions[x.key[1]], place[x.key], c * cpc)
            for i in members:
                for k, L in enumerate(sg.layers):
                    if step(rnd[i], k) != s or not inst.tiles[i][L.name]:
                        continue
                    local = dict(regions)
                    for t in L.args.values():
                        key = ("t", t, i) if t in produced and t not in sg.outputs else ("w", t, c)
                        if key in place:
                            local[t] = place[key]
                    tiles = inst.tiles[i][L.name]
                    work = [(t, cores[i][n % len(cores[i])]) for n, t in enumerate(tiles)]
                    emitter.layer(L, work, local, lb_base)
        if reference[0] == c:
            reference[3][1] = len(emitter.instructions)
    gb_peak = max(p.gb_peak for p in chosen.values())
    program = isa.Program(hw.to_dict(), max(scratch_top, ALIGN), tuple(args), (emitter.kernel(),), sg.name)
    info = StitchInfo(inst.count, inst.recompute, len(cores[0]), order, gb_peak, tuple(spilled_all),
                      lb_kept, lb_base)
    return program, info
