"""Stitched kernels (seed 000 §4.2-4.3): one kernel runs a sub-graph's layers instance by instance,
the tensors between its layers kept on chip instead of going through DDR.

The algorithms the passes of ``kernelgen.stitch_passes`` apply (over the tiles' boxes of
``emit.footprint``), each a function of its own:

- ``plan_instances``: the sub-graph's output layer's tiles grouped into instances; each instance's
  tiles of every other layer found backwards from what its consumers read (a 3x3 window reads a
  halo: those tiles are computed by both neighbouring instances — the recomputation). Instances
  are made coarser while recomputation costs more than ``RECOMPUTE_LIMIT`` of the work.
- ``allocate``: an offline placement plan at a level, and when the live tensors do not fit,
  spilling by a policy: the tensor with the longest lifetime first (the seed's rule) or the
  largest first (prior work's), to the next level down.

and the sub-graph module they annotate (``subgraph_module``, read back by ``read_*``), and
``emit_stitched``, which turns an annotated module into a DSA program.
"""

from __future__ import annotations

import functools
import itertools
import math
import threading
from dataclasses import dataclass, field

import numpy as np
import tvm

from tvm_dsa.emit.emitter import KernelEmitter, place_arguments
from tvm_dsa.emit.placement import Layer, Region, stored_dtypes
from tvm_dsa import isa, memory_plan
from tvm_dsa.emit.footprint import Boxes, Footprint, footprints
from tvm_dsa.kernel.ir import ALIGN, align
from tvm_dsa.schedule.plan import RECOMPUTE_LIMIT
from tvm_dsa.tir_passes.tile import on_vector_units

@dataclass(frozen=True)
class Instances:
    """``rows[i][layer]``: the tiles instance ``i`` computes, as rows of the layer's footprint
    (``Footprint.tiles`` gives their tile-loop values); ``boxes[i][tensor]``: the box of each
    intermediate it produces (what it writes, so consumers' reads fall inside)."""

    rows: list
    boxes: list
    recompute: float  # work of all instances / work of the sub-graph
    written: list = field(default_factory=list)  # per instance, the box it writes of each exchanged tensor

    @classmethod
    def of(cls, layers, prints: dict, outputs, rows: list, recompute: float, hw=None,
           exchange: frozenset = frozenset()) -> "Instances":
        """The instances computing ``rows``: the boxes they write. An output of the sub-graph gets
        boxes only where layers of it read it and each instance's reads fall inside its own box
        (``_reads_inside``): the instance keeps it on chip for them and copies it out, where its
        consumers' tiles would each load it from DDR again (ResNet-50's block outputs at batch 1,
        read by the next block's first convolution, once per output-channel tile); or where, on
        ``hw``, its tiles would write it to DDR in runs whose bursts move much more than its
        instances' boxes would (``_stored_short``). A tensor the instances ``exchange`` gets a box
        holding what the instance writes and reads of it (``written``: what it writes): the rows
        of its halo the instances that write them copy out to DDR, and it copies them in."""
        boxes = [{} for _ in rows]
        written = [{} for _ in rows]
        for L in reversed(layers):  # the order lifetimes are listed in (it breaks placement ties)
            out = L.args[L.ir.params[-1][0]]
            which = [k for k, chosen in enumerate(rows) if len(chosen[L.name])]
            if not which:
                continue
            picked = [rows[k][L.name] for k in which]
            starts = np.cumsum([0] + [len(r) for r in picked[:-1]])
            at = np.concatenate(picked)
            write = prints[L.name].write
            low = np.minimum.reduceat(write[0][at], starts, axis=0).tolist()
            high = np.maximum.reduceat(write[1][at], starts, axis=0).tolist()
            for k, lo, hi in zip(which, low, high):
                boxes[k][out] = (tuple(lo), tuple(hi))
            if out in exchange:
                for k, (lo, hi) in _read_hulls(layers, prints, rows, out).items():
                    if out in boxes[k]:
                        written[k][out] = boxes[k][out]
                        lo, hi = np.minimum(lo, boxes[k][out][0]), np.maximum(hi, boxes[k][out][1])
                    boxes[k][out] = (tuple(lo.tolist()), tuple(hi.tolist()))
                continue
            if out in outputs and not (_reads_inside(layers, prints, rows, boxes, out)
                                       or _stored_short(L, write, boxes, out, hw)):
                for b in boxes:
                    b.pop(out, None)
        return cls(rows, boxes, recompute, written)

    @property
    def count(self) -> int:
        return len(self.rows)


def _contiguous(low: np.ndarray, high: np.ndarray, shape) -> np.ndarray:
    """Per box (one row each of ``low`` and ``high``, high exclusive) of a row-major tensor of
    ``shape``: the elements of each of its contiguous runs."""
    run = np.ones(len(low), dtype=np.int64)
    whole = np.ones(len(low), dtype=bool)  # the dims after this one span the tensor
    for d in reversed(range(len(shape))):
        extent = high[:, d] - low[:, d]
        run = np.where(whole, run * extent, run)
        whole &= extent == shape[d]
    return run


STAGE_GAIN = 1.5  # assumed: DDR bytes saved to pay for a copy through the GB


def _stored_short(L: Layer, write: Boxes, boxes: list, tensor: str, hw) -> bool:
    """Whether ``L``'s tiles would write ``tensor`` (their boxes ``write``) to DDR in runs so short
    that their whole bursts move ``STAGE_GAIN`` times the bytes the instances' boxes of it
    (``boxes``) move in theirs: kept in the GB, it is copied out in those. ResNet-50's stage-2
    blocks at batch 1 stored the next block's first product in tiles of 7 × 7 pixels, 14-byte
    rows in 64-byte bursts (4.6× the bytes), at the end of each kernel."""
    mine = [b[tensor] for b in boxes if tensor in b]
    if hw is None or not mine:
        return False
    name, shape, _ = L.ir.params[-1]
    itemsize = np.dtype(L.ir.ddr_dtype(name, hw)).itemsize

    def moved(run: int) -> float:  # DDR bytes per byte of a run of ``run`` elements
        return -(-run * itemsize // hw.ddr_burst_bytes) * hw.ddr_burst_bytes / (run * itemsize)

    tiles = moved(int(_contiguous(*write, shape).min()))
    instances = moved(int(_contiguous(*(np.array(c, dtype=np.int64) for c in zip(*mine)), shape).min()))
    return tiles >= STAGE_GAIN * instances


def _read_hulls(layers, prints: dict, rows: list, tensor: str) -> dict:
    """Per instance reading ``tensor``, the hull of its tiles' reads of it (low, high corners)."""
    out: dict = {}
    for L in layers:
        for param, t in L.args.items():
            if t != tensor or param == L.ir.params[-1][0] or param not in prints[L.name].reads:
                continue
            lo, hi = prints[L.name].reads[param]
            for k, chosen in enumerate(rows):
                at = chosen[L.name]
                if len(at):
                    low, high = lo[at].min(axis=0), hi[at].max(axis=0)
                    if k in out:
                        low, high = np.minimum(low, out[k][0]), np.maximum(high, out[k][1])
                    out[k] = (low, high)
    return out


def _reads_inside(layers, prints: dict, rows: list, boxes: list, tensor: str) -> bool:
    """Whether layers read ``tensor`` and every instance's reads of it (the hull of its tiles'
    boxes) fall inside the box it writes of it (``boxes[k][tensor]``)."""
    hulls = _read_hulls(layers, prints, rows, tensor)
    return bool(hulls) and all(tensor in boxes[k] and (lo >= boxes[k][tensor][0]).all()
                               and (hi <= boxes[k][tensor][1]).all() for k, (lo, hi) in hulls.items())


def plan_instances(layers: list[Layer], prints: dict, outputs: list[str], loop: int, groups: int,
                   hw=None, exchange: frozenset = frozenset()) -> Instances:
    """Instances of a sub-graph (``layers`` in topological order, ``prints`` their footprints,
    ``outputs`` the tensors leaving it): the tiles of the last output layer grouped by their tile-loop
    values up to ``loop``, loop ``loop`` itself cut into at most ``groups`` ranges. Coarsened (fewer
    groups, then fewer loops) until the recomputation is within ``RECOMPUTE_LIMIT`` and the output
    layers' tiles are split between instances exactly; one instance at worst. Given the chip
    (``hw``), the coarsening goes on past the first such split while the busiest core's work
    (``makespan``, instances bound by ``binding``) is above an even share of the sub-graph's, on to
    the batch with one inner loop cut alone (a single sample's rows, where the scheduler's loop is
    its channels: ResNet-50's first sub-graph at batch 1 ran on one cluster, now on two), and the
    split with the least is kept: ViT-B/16's MLP in overlapping 40- and 66-token tiles split
    into 3 token ranges a sample kept 24 of 32 cores busy and computed 34 % of its FFN1 twice,
    where a split by samples, 4 cores each, does neither. With fewer tiles along the first loop
    (the samples) than clusters, of the splits whose busiest cores do alike (or no more than an
    even share) the one of fewest instances on every cluster: ResNet-50's last stage at batch 1
    split its 7 rows into 7 instances, writing its output out in rows of 7 values, where 4 of two
    rows balance the clusters alike (a rule for all splits kept samples together on fewer cores
    at batch 8: ResNet-50 2.4x the cycles).

    Every coarser split's seeds are unions of a finer one's, so their instances' work is no less:
    once ``_hopeless`` has sampled a split's work per seed, a coarser split with so many seeds that
    they would do over twice ``RECOMPUTE_LIMIT`` at that rate is ruled out unsampled (ViT-B/16's
    attention: six of the eight sampled splits, each 0.05 s). The tensors instances ``exchange`` (among
    ``outputs``) are computed by one instance each and read by the others from DDR: the tiles that
    read them need no more of their producers."""
    primary = [L for L in layers if L.args[L.ir.params[-1][0]] in outputs][-1]
    grid = np.asarray(prints[primary.name].tiles).reshape(len(prints[primary.name].tiles), -1)
    tried = set()
    per_seed = 0.0  # the largest work per seed sampled, a share of the sub-graph's
    best = None  # (rank, instances) of the best split within the limit
    even = sum(len(prints[L.name].tiles) * prints[L.name].work for L in layers) / hw.cores if hw else math.inf
    # fewer tiles along the first loop (the samples, where the layer has a batch) than clusters:
    # a sample's rows are split over them
    few = hw is not None and int(grid[:, 0].max()) + 1 < hw.clusters
    last = grid.shape[1] - 1
    # (the loops kept whole, the loop cut): the scheduler's loop and those outside it, then, given
    # the chip, the batch with one inner loop cut alone: the rows (the second-to-last loop: a
    # sequence's tokens, an image's rows) and those after the second (not an image's channels: a
    # channel split makes every instance compute all its producers' channels), and a 2-d output's
    # columns (a classifier at batch 1, one row: MobileNetV2's read its 2.56 MB of weights on one
    # cluster, through one GB's port)
    cuts = [(tuple(range(lp)), lp) for lp in range(min(loop, last), -1, -1)]
    if hw is not None:
        cuts += [((0,), lp) for lp in sorted({last - 1, last, *range(2, last)}) if lp > 0 and ((0,), lp) not in cuts]
    start = groups
    for whole, loop in cuts:
        extent = int(grid[:, loop].max()) + 1
        groups = min(start if whole == tuple(range(loop)) else hw.clusters * hw.cores_per_cluster, extent)
        tries = []  # the groups tried: halved each time, and with a sample's rows split, one a cluster
        while groups > 1:
            tries.append(groups)
            groups = (groups + 1) // 2
        if few and tries and tries[0] > hw.clusters:
            tries = sorted({*tries, hw.clusters}, reverse=True)
        for groups in tries:
            size = -(-extent // groups)
            if (whole, loop, size) in tried:
                continue
            tried.add((whole, loop, size))
            cols = np.column_stack([grid[:, list(whole)], grid[:, loop] // size])
            # the rows' groups in lexicographic order (np.unique(axis=0), of one integer per row)
            _, seed_of, counts = np.unique(np.ravel_multi_index(cols.T, cols.max(axis=0) + 1),
                                           return_inverse=True, return_counts=True)
            order, starts = np.argsort(seed_of, kind="stable"), np.cumsum(counts) - counts
            if len(counts) > 2 * SAMPLE_SEEDS and len(counts) * per_seed > 2 * RECOMPUTE_LIMIT:
                continue
            hopeless, sampled = _hopeless(layers, prints, outputs, primary, order, starts, counts, exchange)
            per_seed = max(per_seed, sampled)
            if hopeless:
                continue
            inst = _propagate(layers, prints, outputs, primary, np.split(order, starts[1:]), RECOMPUTE_LIMIT,
                              exchange=exchange)
            if inst is not None and inst.recompute <= RECOMPUTE_LIMIT:
                if hw is None:
                    return inst
                span = makespan(layers, prints, inst, binding(inst.count, hw))
                # with a sample's rows split over the clusters, splits whose busiest cores do alike
                # (or no more than an even share) tie, and of those on every cluster the fewest
                # instances win: larger boxes compute fewer halo rows again and write longer runs
                on_all = inst.count if inst.count >= hw.clusters else math.inf
                rank = (max(span, even), on_all) if few else (span, 0)
                if best is None or rank < best[0]:
                    best = (rank, inst)
                if span <= even and not few:
                    return inst
        start = 1 << 30
    return best[1] if best else _propagate(layers, prints, outputs, primary, [np.arange(len(grid))],
                                           exchange=exchange)


def makespan(layers, prints: dict, inst: Instances, cores: list) -> int:
    """The most work (footprint work of the tiles it runs) any core does when instance ``i``
    runs on ``cores[i]``, each layer's tiles of an instance dealt over its cores in turn."""
    load: dict = {}
    for rows, cs in zip(inst.rows, cores):
        work = sum(-(-len(rows[L.name]) // len(cs)) * prints[L.name].work for L in layers)
        for c in cs:
            load[c] = load.get(c, 0) + work
    return max(load.values(), default=0)


SAMPLE_SEEDS = 64  # instances ``_hopeless`` propagates to judge a split into many more


def _hopeless(layers, prints, outputs, primary, order, starts, counts, exchange) -> tuple[bool, float]:
    """Whether evenly spaced ``SAMPLE_SEEDS`` of the seeds (``order[starts[i]:][:counts[i]]``:
    rows of ``primary``'s tiles) already rule the split out: one of
    them reads past what it computes (so would the whole split), or their work, scaled to all the
    seeds, is over twice ``RECOMPUTE_LIMIT`` (instances that translate one another do alike work;
    twice leaves room for the boundary ones). Splitting ViT-B/16's attention into its 18,912
    output tiles first, every instance recomputing the whole softmax, took 10 s to rule out.
    With the sample's work per seed (0 when it is not sampled or reads past what it computes)."""
    if len(counts) <= 2 * SAMPLE_SEEDS:
        return False, 0.0
    sample = [order[starts[i]:starts[i] + counts[i]]
              for i in np.linspace(0, len(counts) - 1, SAMPLE_SEEDS).round().astype(int)]
    inst = _propagate(layers, prints, outputs, primary, sample, owned=False, exchange=exchange)
    if inst is None:
        return True, 0.0
    per_seed = inst.recompute / len(sample)
    return per_seed * len(counts) > 2 * RECOMPUTE_LIMIT, per_seed


PROPAGATE_ELEMENTS = 1 << 22  # instances x tiles x dims of the arrays ``_propagate`` works on at once
FIRST_SEEDS = 8  # instances ``_propagate`` works out first under a recomputation limit


def _propagate(layers, prints, outputs, primary, seeds, limit: float = math.inf,
               owned: bool = True, exchange: frozenset = frozenset()) -> Instances | None:
    """Instances from the ``seeds`` (rows of ``primary``'s tiles): every other layer's tiles whose
    output meets what the instance's later layers read, and each tile of the sub-graph's other
    outputs computed by one instance (``_owners``; without ``owned``, only the tiles instances
    read: a lower bound of the work, for sampling); None where an instance would read past what
    it computes or two would write one tile of an output. Instances in batches, each at once.
    Under a ``limit`` of recomputation, a split over it is only worked out until it exceeds it:
    the recomputation it reports is then a lower bound, and it has no rows or boxes (a split that
    would read past what it computes may be reported so too: either way it is not taken)."""
    others = [L for L in layers if L is not primary and L.args[L.ir.params[-1][0]] in outputs]
    widest = max(len(fp.tiles) * max(b[0].shape[1] for b in (fp.write, *fp.reads.values()))
                 for fp in (prints[L.name] for L in layers))
    batch = max(1, PROPAGATE_ELEMENTS // widest)
    total = max(sum(len(prints[L.name].tiles) * prints[L.name].work for L in layers), 1)
    fixed = {L.name: np.zeros((len(seeds), len(prints[L.name].tiles)), dtype=bool) for L in others}
    if len(seeds) == 1:
        fixed = {name: ~mask for name, mask in fixed.items()}  # one instance computes them all
    elif others and owned:
        fixed = _owners(layers, prints, outputs, primary, seeds, fixed, batch, exchange)
        if fixed is None:
            return None
    # under a limit, a few instances first: their work alone often exceeds it (BERT's encoder
    # split into 128 is ruled out by 8 of them)
    cuts = sorted({0, *range(min(batch, FIRST_SEEDS) if limit < math.inf else batch, len(seeds), batch), len(seeds)})
    parts, work = [], 0
    writers = {name: 0 for name in fixed}  # instances computing each tile of the other outputs
    for lo, hi in itertools.pairwise(cuts):
        part = _chosen(layers, prints, outputs, primary, seeds[lo:hi], {k: m[lo:hi] for k, m in fixed.items()},
                       exchange)
        if part is None:
            return None
        parts.append(part[0])
        work += part[1]
        for name in writers:
            writers[name] = writers[name] + part[0][name].sum(axis=0)
        if work > limit * total:
            return Instances([], [], work / total)  # at least this much recomputation
    if owned and any(np.any(count != 1) for count in writers.values()):
        return None  # an output tile two instances compute (or none): the split is not exact
    recompute = work / total
    rows = [{name: np.flatnonzero(m[k]) for name, m in chosen.items()}
            for chosen in parts for k in range(len(next(iter(chosen.values()))))]
    return Instances.of(layers, prints, outputs, rows, recompute, exchange=exchange)


OWNED_ELEMENTS = 1 << 24  # instances x tiles of a sub-graph's layers ``_owners`` holds at once


def _owners(layers, prints, outputs, primary, seeds, unread: dict, batch: int, exchange) -> dict | None:
    """Which instance computes each tile of the sub-graph's outputs other than ``primary``'s, as a
    (seed x tile) mask per layer: the tiles its instances read where they read them (``unread``:
    none fixed), each other tile by the instance that computes most of the tiles it reads of
    the sub-graph's layers (ViT's query, key and value beside the residual stream they are
    computed from: the instance of those tokens), or, reading none, by its place in the layer's
    tiles (the n-th of k instances the n-th k-th). A tile of a tensor the instances ``exchange``
    goes by its rows: the k-th share of them to the k-th instance, whose window reads them and
    its neighbours' halo rows (a vote by what it reads gave a row split's first instances the
    whole of DenseNet-121's first blocks). None where the masks would be too large."""
    n = len(seeds)
    if n * sum(len(prints[L.name].tiles) for L in layers) > OWNED_ELEMENTS:
        return None
    read = {}  # layer name -> (seed x tile) tiles the instances compute, from the outputs they read
    for lo in range(0, n, batch):
        part = _chosen(layers, prints, outputs, primary, seeds[lo:lo + batch],
                       {k: m[lo:lo + batch] for k, m in unread.items()}, exchange)
        if part is None:
            return None
        for name, mask in part[0].items():
            read[name] = np.concatenate([read[name], mask]) if name in read else mask
    out_of = {L.args[L.ir.params[-1][0]]: L for L in layers}
    owner: dict = {}  # layer name -> instance computing each tile (-1: none; the first where several)
    for L in layers:
        fp, mask = prints[L.name], read[L.name]
        shape = L.ir.params[-1][1]
        if L.args[L.ir.params[-1][0]] in exchange and len(shape) >= 2 and shape[-2] >= n:
            # exchanged: the k-th instance computes the k-th share of its rows (``stitched._row_shares``)
            owner[L.name] = np.minimum(fp.write[0][:, -2] // -(-shape[-2] // n), n - 1)
            continue
        own = np.where(mask.any(axis=0), mask.argmax(axis=0), -1)
        free = np.flatnonzero(own < 0)
        if len(free):
            votes = np.zeros((len(free), n))
            for param, (r_lo, r_hi) in fp.reads.items():
                P = out_of.get(L.args[param])
                if P is None:
                    continue
                w_lo, w_hi = prints[P.name].write
                for start in range(0, len(free), 256):  # (free tile x producer tile) at a time
                    u = free[start:start + 256]
                    meets = np.ones((len(u), len(w_lo)), dtype=bool)
                    for d in range(r_lo.shape[1]):
                        meets &= (w_lo[None, :, d] < r_hi[u, None, d]) & (r_lo[u, None, d] < w_hi[None, :, d])
                    theirs = owner[P.name]
                    for k in range(n):
                        votes[start:start + len(u), k] += (meets & (theirs == k)[None]).sum(axis=1)
            placed = free * n // len(fp.tiles)
            own[free] = np.where(votes.any(axis=1), votes.argmax(axis=1), placed)
        owner[L.name] = own
    return {name: read[name] | (owner[name][None] == np.arange(n)[:, None]) for name in unread}


def _chosen(layers, prints, outputs, primary, seeds, fixed: dict, exchange=frozenset()):
    """(each layer's tiles per seed, their work) for ``_propagate``, all seeds at once: a boolean
    matrix (seed x tile) per layer, boxes as (seed x dim) corners; the tiles of the other
    outputs ``fixed`` (seed x tile masks) and those the instances read; None where an instance
    would read past what it computes."""
    out_of = {L.args[L.ir.params[-1][0]]: L for L in layers}
    n = len(seeds)
    seed = np.zeros((n, len(prints[primary.name].tiles)), dtype=bool)
    for k, rows in enumerate(seeds):
        seed[k, rows] = True
    chosen = {primary.name: seed}
    need: dict = {}  # tensor -> corners read by each instance's chosen tiles (``_hulls``)
    boxes: dict = {}  # tensor -> corners each instance writes
    work = 0
    for L in reversed(layers):
        fp = prints[L.name]
        out = L.args[L.ir.params[-1][0]]
        if L.name not in chosen:
            tiles = len(fp.tiles)
            mask = fixed.get(L.name, np.zeros((n, tiles), dtype=bool))
            if out in need:
                lo, hi, some = need[out]
                # a dimension at a time: (seed x tile x dim) temporaries were 14x slower on
                # ViT-B/16's 18,912-tile layers
                meets = np.repeat(some[:, None], tiles, axis=1)
                for d, (w_lo, w_hi) in enumerate(zip(fp.write[0].T, fp.write[1].T)):
                    meets &= w_lo[None] < hi[:, d, None]
                    meets &= lo[:, d, None] < w_hi[None]
                mask = mask | meets
            chosen[L.name] = mask
        mask = chosen[L.name]
        if out not in outputs:
            boxes[out] = _hulls(fp.write, mask, boxes.get(out))
        for param, reads in fp.reads.items():
            tensor = L.args[param]
            if tensor in out_of and tensor not in exchange:
                need[tensor] = _hulls(reads, mask, need.get(tensor))
        work += int(mask.sum()) * fp.work
    for t, (lo, hi, some) in need.items():
        if t in boxes:
            blo, bhi, bsome = boxes[t]
            if (some & bsome & ((lo < blo) | (hi > bhi)).any(axis=1)).any():
                return None
    return chosen, work


_BIG = np.iinfo(np.int64).max


def _hulls(corners: Boxes, mask: np.ndarray, old=None):
    """(low corners, high corners, non-empty) of the rows of ``corners`` each row of ``mask``
    picks, united with ``old``'s."""
    n, dims = mask.shape[0], corners[0].shape[1]
    lo, hi = np.full((n, dims), _BIG, dtype=np.int64), np.full((n, dims), -_BIG, dtype=np.int64)
    some = np.zeros(n, dtype=bool)
    rows, picked = np.divmod(np.flatnonzero(mask), mask.shape[1])  # by row (11x np.nonzero's speed)
    if len(rows):
        starts = np.concatenate(([0], np.flatnonzero(rows[1:] != rows[:-1]) + 1))
        which = rows[starts]
        lo[which] = np.minimum.reduceat(corners[0][picked], starts, axis=0)
        hi[which] = np.maximum.reduceat(corners[1][picked], starts, axis=0)
        some[which] = True
    if old is not None:
        lo, hi, some = np.minimum(lo, old[0]), np.maximum(hi, old[1]), some | old[2]
    return lo, hi, some


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
        at = next((s for s, n in enumerate(memory_plan.live_bytes(spans)) if n > capacity), None)
        if at is None:  # no step has more live bytes than fit: plan, unless no plan fits either
            plan = memory_plan.peak_first(spans)
            if plan.peak <= capacity:
                return ({x.key: o for x, o in zip(kept, plan.offsets)},
                        [x.key for x in lives if x.key in spilled])
            at = min(x.first for x, o, t in zip(kept, plan.offsets, spans) if o + t.size > capacity)
        candidates = [x for x in kept if x.first <= at <= x.last]
        if policy == "longest":  # the seed: the tensor that stays longest (remaining lifetime)
            victim = max(candidates, key=lambda y: (y.last - at, y.nbytes))
        else:  # prior work: the largest tensor
            victim = max(candidates, key=lambda y: (y.nbytes, y.last - at))
        spilled.add(victim.key)


# --------------------------------------------------------------------------------------------
# the sub-graph module: what the scheduler hands kernel generation, and the passes' decisions
# dfs: round by round (on a set of cores), each weight promoted once for all rounds; bfs: layer
# by layer; rounds: as dfs, each round promoting the weights it reads (a micro-batch's)
ORDERS = ("dfs", "bfs", "rounds")


@dataclass(frozen=True)
class SubGraphKernel:
    """A sub-graph module's layers and boundary, read back (``read_subgraph``)."""

    name: str
    layers: tuple  # Layer, topological order; Layer.name is unique (the call site)
    inputs: tuple[str, ...]  # tensors read from outside, in argument order
    outputs: tuple[str, ...]
    tensors: dict  # tensor -> (shape, host dtype)
    weights: frozenset  # inputs to promote DDR -> GB (learned parameters)
    split_loop: int = 0  # tile loop the instances split (Algorithm 1's best split)
    groups: int = 1 << 30  # at most this many ranges of that loop
    stored: dict = field(default_factory=dict)  # tensor -> the type it is placed in (``stored_dtypes``)
    exchange: tuple[str, ...] = ()  # intermediates the instances pass each other through DDR (``StitchPlan``)

    def itemsize(self, tensor: str) -> int:
        """Bytes of one element of ``tensor`` where the kernel places it."""
        return isa.DTYPES[self.stored[tensor]]


def subgraph_module(name: str, layers, inputs, outputs, tensors: dict, weights, split_loop: int = 0,
                    groups: int = 1 << 30, exchange=()) -> tvm.IRModule:
    """The module kernel generation's passes (``kernelgen.stitch_passes``) transform: one lowered PrimFunc
    per layer (``layers``: (call-site name, PrimFunc, tensor of each parameter, LB budget it was
    tiled to or None), topological order), the tensors behind its parameters in ``dsa.args``, and
    the sub-graph's boundary in the module attribute ``dsa.subgraph``."""
    funcs = {}
    for position, (call, func, args, budget) in enumerate(layers):
        funcs[call] = func.with_attrs({"dsa.args": list(args), "dsa.lb_budget": budget or 0,
                                       "dsa.position": position, "global_symbol": call})
    return tvm.IRModule(funcs).with_attr("dsa.subgraph", {
        "name": name, "inputs": list(inputs), "outputs": list(outputs), "weights": sorted(weights),
        "tensors": {t: [list(shape), dtype] for t, (shape, dtype) in tensors.items()},
        "split_loop": split_loop, "groups": groups, "exchange": list(exchange)})


@functools.lru_cache(maxsize=4096)
def _layer(func, hw, name: str):
    """(Layer, Footprint) of one annotated PrimFunc: read once, whichever pass asks first."""
    layer = Layer.of(func, hw, name, tuple(func.attrs["dsa.args"]), int(func.attrs["dsa.lb_budget"]) or None)
    return layer, footprints(layer)


def read_subgraph(mod: tvm.IRModule, hw) -> tuple[SubGraphKernel, dict]:
    """(the sub-graph, footprint per layer) of a sub-graph module."""
    attrs = mod.attrs["dsa.subgraph"]
    funcs = sorted(((int(f.attrs["dsa.position"]), gv.name_hint, f) for gv, f in mod.functions.items()))
    read = [_layer(f, hw, name) for _, name, f in funcs]
    layers = tuple(L for L, _ in read)
    sg = SubGraphKernel(str(attrs["name"]), layers, tuple(attrs["inputs"]), tuple(attrs["outputs"]),
                        {str(t): (tuple(v[0]), str(v[1])) for t, v in attrs["tensors"].items()},
                        frozenset(attrs["weights"]), int(attrs["split_loop"]), int(attrs["groups"]),
                        stored_dtypes([(L.name, L.ir, L.args) for L in layers], hw),
                        tuple(str(t) for t in attrs.get("exchange", ())))
    return sg, {L.name: fp for L, fp in read}


def instances_attr(inst: Instances) -> dict:
    """``dsa.instances``: each instance's rows of every layer's tiles, and the recomputation."""
    return {"rows": [{name: _runs(rows) for name, rows in chosen.items()} for chosen in inst.rows],
            "recompute": float(inst.recompute)}


def _runs(rows: np.ndarray) -> list[int]:
    """Tile rows as their runs of consecutive rows, [start, stop) pairs flattened: a few numbers
    where an instance has thousands of tiles (read back through TVM's containers element by
    element, ViT's took 0.1 s a build)."""
    if not len(rows):
        return []
    cut = np.flatnonzero(np.diff(rows) != 1) + 1
    return np.stack([rows[np.r_[0, cut]], rows[np.r_[cut - 1, len(rows) - 1]] + 1], axis=1).ravel().tolist()


def read_rows(runs) -> np.ndarray:
    """The tile rows of an instance's layer in ``dsa.instances`` (``_runs``)."""
    pairs = np.asarray(list(runs), dtype=np.int64).reshape(-1, 2)
    return np.concatenate([np.arange(a, b) for a, b in pairs.tolist()]) if len(pairs) else np.zeros(0, np.int64)


_READ: dict = {}  # (dsa.instances, layer PrimFuncs, chip) -> Instances, for the passes that read them in turn
_READ_LOCK = threading.Lock()  # compilations may run in several threads


def read_instances(mod: tvm.IRModule, sg: SubGraphKernel, prints: dict, hw) -> Instances:
    attr = mod.attrs["dsa.instances"]
    key = (attr, tuple(mod.functions.values()), hw, sg.exchange)  # all immutable
    with _READ_LOCK:
        if key not in _READ:
            if len(_READ) >= 64:
                _READ.pop(next(iter(_READ)))
            rows = [{str(name): read_rows(r) for name, r in chosen.items()}
                    for chosen in attr["rows"]]
            _READ[key] = Instances.of(sg.layers, prints, sg.outputs + sg.exchange, rows, float(attr["recompute"]),
                                      hw, frozenset(sg.exchange))
        return _READ[key]


def read_cores(mod: tvm.IRModule) -> list[tuple[int, ...]]:
    return [tuple(int(k) for k in cs) for cs in mod.attrs["dsa.cores"]]


@dataclass(frozen=True)
class Buffer:
    """A buffer of a stitched kernel: an instance's intermediate (``kind`` "t", ``owner`` the
    instance) or a cluster's promoted weight ("w", owner the cluster; in the ``rounds`` order
    ``weight_owner``'s, one per round), live from step ``first`` to
    ``last``, placed at ``level`` lb (``unit`` a core), gb (unit a cluster) or ddr (``offset`` into
    the kernel's scratch; -1 for a weight read where it is)."""

    cluster: int
    kind: str
    tensor: str
    owner: int
    first: int
    last: int
    nbytes: int
    level: str
    unit: int
    offset: int

    @property
    def key(self) -> tuple:
        return self.kind, self.tensor, self.owner


def weight_owner(order: str, cluster: int, rnd: int, clusters: int) -> int:
    """``Buffer.owner`` of a weight cluster ``cluster`` promotes for its instances of round
    ``rnd``: the cluster, or in the ``rounds`` order one owner per round (cluster + clusters x
    round), so each round's promotion is a buffer of its own."""
    return cluster + clusters * rnd if order == "rounds" else cluster


def read_allocation(mod: tvm.IRModule) -> list[Buffer]:
    return [Buffer(int(b[0]), str(b[1]), str(b[2]), *(int(v) for v in b[3:7]), str(b[7]), int(b[8]), int(b[9]))
            for b in mod.attrs["dsa.allocation"]]


def allocation_attr(buffers: list[Buffer]) -> list:
    return [[b.cluster, b.kind, b.tensor, b.owner, b.first, b.last, b.nbytes, b.level, b.unit, b.offset]
            for b in buffers]


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
    on_vector: tuple = ()  # layers whose contraction runs on the vector units (``tiling.lower_timed``)


def binding(n: int, hw, rounds: int = 1) -> list[tuple[int, ...]]:
    """Cores of each instance (Algorithm 4's factors): instances dealt over the clusters in
    consecutive blocks (the batch split: instances run in batch order, so a cluster gets whole
    samples, and its part of the kernel is the first cluster's moved along the batch even when
    instances split a sample, as ViT's attention does by heads), one core each when a cluster has
    at least as many instances as cores, otherwise the largest of 8, 4, 2, 1 cores each that keeps
    them balanced — or with ``rounds`` > 1, that keeps a ``rounds``-th of them balanced: the
    others run after them on the same cores (micro-batches, ``cluster_rounds``)."""
    clusters, cpc = min(n, hw.clusters), hw.cores_per_cluster
    per = [list(range(c * n // clusters, (c + 1) * n // clusters)) for c in range(clusters)]
    cores = [()] * n
    for c, members in enumerate(per):
        at_once = -(-len(members) // rounds)
        share = max([f for f in (8, 4, 2, 1) if f * at_once <= cpc and f <= cpc] or [1])
        for j, i in enumerate(members):
            first = (j * share) % cpc
            cores[i] = tuple(c * cpc + first + k for k in range(share))
    return cores


@dataclass(frozen=True)
class ClusterRounds:
    """A cluster's instances and the round each runs in on its cores."""

    members: list
    rnd: dict  # instance -> round

    @property
    def rounds(self) -> int:
        return max(self.rnd.values()) + 1

    def step(self, order: str, layers: int):
        """(round, layer index) -> step of the cluster's program in instance order ``order``:
        dfs (and rounds) runs instance by instance, bfs layer by layer."""
        rounds = self.rounds
        if order in ("dfs", "rounds"):
            return lambda r, k: r * layers + k
        return lambda r, k: k * rounds + r


def cluster_rounds(cores: list, cpc: int) -> dict[int, ClusterRounds]:
    per_cluster: dict = {}
    for i, cs in enumerate(cores):
        per_cluster.setdefault(cs[0] // cpc, []).append(i)
    out = {}
    for c, members in per_cluster.items():
        per_core: dict = {}
        for i in members:
            per_core.setdefault(cores[i], []).append(i)
        out[c] = ClusterRounds(members, {i: k for group in per_core.values() for k, i in enumerate(group)})
    return out


# --------------------------------------------------------------------------------------------
# the stitched program
def _translation(sg: SubGraphKernel, prints: dict, inst: Instances, pairs, fixed: frozenset) -> dict | None:
    """Per tensor, the vector of elements by which the second instance of each pair in ``pairs``
    is moved from the first (along the batch, or along rows when the clusters take turns at row
    blocks): when every layer's tiles of the second read and write exactly the first's boxes moved
    that way (the ``fixed`` tensors, weights promoted to each cluster's GB, not moved), tile for
    tile, tiles that skip an access skipping it in both, and boxes cut by the tensor's edges cut
    alike (a 3x3 window's first row tile reads rows [0, 3) with the padding above, the last
    [5, 8) with it below, translates as boxes but not as programs), and every LB operand sitting
    where it sits in the first (``Footprint.relative``: a layer norm's row tiles load the whole
    sample alike and read their rows apart). None when the instances are not translates."""
    delta: dict = {}

    def agree(tensor, a: Boxes, b: Boxes, cut_a: np.ndarray, cut_b: np.ndarray) -> bool:
        skip = (a[1] <= a[0]).any(axis=1)  # tiles that do not make the access (an empty box)
        if (skip != (b[1] <= b[0]).any(axis=1)).any() or (cut_a != cut_b).any():
            return False
        if skip.any():  # ViT's class-token row of the concatenation reads no patch
            a, b = (a[0][~skip], a[1][~skip]), (b[0][~skip], b[1][~skip])
        d = b[0] - a[0]
        if not len(d) or (d != b[1] - a[1]).any() or (d != d[0]).any():
            return not len(d)
        move = tuple(int(v) for v in d[0])
        return delta.setdefault(tensor, move) == move and not (tensor in fixed and any(move))

    for i, j in pairs:
        for L in sg.layers:
            fp = prints[L.name]
            ra, rb = inst.rows[i][L.name], inst.rows[j][L.name]
            if len(ra) != len(rb):
                return None
            if not len(ra):
                continue
            if (fp.relative[ra] != fp.relative[rb]).any():  # read apart in the LB
                return None
            param = L.ir.params[-1][0]
            if not agree(L.args[param], (fp.write[0][ra], fp.write[1][ra]), (fp.write[0][rb], fp.write[1][rb]),
                         fp.cut[param][ra], fp.cut[param][rb]):
                return None
            for param, boxes in fp.reads.items():
                if not agree(L.args[param], (boxes[0][ra], boxes[1][ra]), (boxes[0][rb], boxes[1][rb]),
                             fp.cut[param][ra], fp.cut[param][rb]):
                    return None
    return delta


@dataclass(frozen=True)
class _Part:
    """One cluster's part of a stitched kernel, as emitted: its rounds, buffers and their regions."""

    cluster: int
    rounds: ClusterRounds
    buffers: list
    place: dict  # buffer key -> Region


def _cluster_shift(sg, prints, inst, cores, cpc, ref: _Part, other: _Part, regions) -> dict | None:
    """Bytes each DDR object moves between the reference cluster's part of a stitched kernel and
    ``other``'s, when ``other``'s part is the reference's translated (same rounds on cores moved by
    whole clusters, instances moved along the batch, tensors placed alike); None otherwise."""
    if len(ref.rounds.members) != len(other.rounds.members):
        return None
    pairs = list(zip(ref.rounds.members, other.rounds.members))
    moved = (other.cluster - ref.cluster) * cpc
    if any(ref.rounds.rnd[i] != other.rounds.rnd[j] or cores[j] != tuple(k + moved for k in cores[i])
           for i, j in pairs):
        return None
    promoted = frozenset(b.tensor for b in ref.buffers if b.kind == "w" and b.level != "ddr")
    delta = _translation(sg, prints, inst, pairs, promoted)
    if delta is None:
        return None
    twin = dict(pairs)
    theirs = {b.key: b for b in other.buffers}
    shift = {("ddr", t): sg.itemsize(t) * sum(v * math.prod(r.extents[k + 1:]) for k, v in enumerate(delta.get(t, ())))
             for t, r in regions.items()}
    for x in ref.buffers:
        key = (x.kind, x.tensor, twin[x.owner] if x.kind == "t" else x.owner - ref.cluster + other.cluster)
        y = theirs.get(key)
        if y is None or (y.first, y.last, y.nbytes) != (x.first, x.last, x.nbytes):
            return None
        a, b = ref.place.get(x.key), other.place.get(key)
        if (a is None) != (b is None):
            return None
        if a is None:
            continue
        if a.mem != b.mem or a.extents != b.extents or (a.mem != "ddr" and a.base != b.base):
            return None
        if a.mem == "ddr":
            shift[x.key] = b.base - a.base
    return shift


PIECE_BYTES = 64 * 1024  # a promotion's pieces at least: a transfer's set-up is then a few % of it
SLAB_BYTES = 16 * 1024  # a kept output's slabs written out at least (``write_out_slabs``): at batch 1 ResNet-50
# took 815,171 cycles with slabs of 64 KiB, 810,749 with 16, 811,066 with 32, 811,587 with 8


def promotion_pieces(sg: SubGraphKernel, prints: dict, tensor: str, hw) -> tuple[int, int] | None:
    """(dim, width) of the pieces a weight is promoted in (``KernelEmitter.claim``), each with a
    dependency of its own, so the first tiles start when their piece is in, not the whole weight
    (BERT's FFN2 waited 146 µs per block for its 4.5 MiB): along the outermost dim its readers'
    tiles split, all into boxes of one width aligned to it, the fewest of those boxes whose
    contiguous runs in DDR are whole bursts (narrower pieces waste DDR bandwidth) and that hold
    ``PIECE_BYTES`` (Conformer's 512 KiB feed-forward weight, read in tiles of 32 columns, 16 KiB
    each, came whole); None where there is no such dim or fewer than two such pieces."""
    shape = sg.tensors[tensor][0]
    esize = sg.itemsize(tensor)
    boxes = [prints[L.name].reads[p] for L in sg.layers for p, t in L.args.items()
             if t == tensor and p != L.ir.params[-1][0]]
    for d, extent in enumerate(shape):
        widths = {int(w) for lo, hi in boxes for w in np.unique(hi[:, d] - lo[:, d])}
        if widths == {extent}:
            continue
        (tile,) = widths if len(widths) == 1 else (0,)
        if not tile or any((lo[:, d] % tile).any() for lo, _ in boxes):
            return None
        run = tile * esize * math.prod(shape[d + 1:])  # bytes of a tile's box per row, contiguous
        width = tile * hw.ddr_burst_bytes // math.gcd(run, hw.ddr_burst_bytes)
        width *= max(1, -(-PIECE_BYTES * extent // (esize * math.prod(shape) * width)))
        if extent // width >= 2:
            return d, width
        return None
    return None


def _halos_out(inst: Instances, i: int, tensor: str) -> dict[int, tuple[tuple, tuple]]:
    """Per other instance whose box of exchanged ``tensor`` holds a part of what instance ``i``
    writes, that part's (origin, extents): what ``i`` passes it."""
    lo, hi = inst.written[i][tensor]
    out = {}
    for k, boxes in enumerate(inst.boxes):
        if k != i and tensor in boxes:
            a, b = np.maximum(lo, boxes[tensor][0]), np.minimum(hi, boxes[tensor][1])
            if (a < b).all():
                out[k] = (tuple(a.tolist()), tuple((b - a).tolist()))
    return out


def _box_minus(box, part) -> list[tuple[tuple, tuple]]:
    """(origin, extents) of disjoint boxes covering ``box`` less ``part`` (both (low, high), ``part``
    inside ``box`` or None)."""
    lo, hi = list(box[0]), list(box[1])
    if part is None:
        return [(tuple(lo), tuple(h - l for l, h in zip(lo, hi)))]
    out = []
    for d, (a, b) in enumerate(zip(*part)):
        for start, stop in ((lo[d], a), (b, hi[d])):
            if start < stop:
                o, e = list(lo), [h - l for l, h in zip(lo, hi)]
                o[d], e[d] = start, stop - start
                out.append((tuple(o), tuple(e)))
        lo[d], hi[d] = a, b
    return out


def write_out_slabs(write: Boxes, origin, extents, itemsize: int) -> list[tuple[int, tuple, tuple]]:
    """(tiles, slab origin, slab extents): the slabs of an output box (``origin``, ``extents``) kept
    in a GB and written out to DDR, in the order its tiles (``write``: their boxes, in the order
    they run) finish them: the slab is written once the first ``tiles`` tiles have run. Along the
    dim whose slabs, of ``SLAB_BYTES`` at least, its tiles finish earliest, bytes weighted; one
    slab (the whole box) where no dim gives two."""
    lo, hi = write
    n = len(lo)
    step_bytes = math.prod(extents) * itemsize
    best, score = [(n, tuple(origin), tuple(extents))], 0.0
    for d, (o, e) in enumerate(zip(origin, extents)):
        cuts = sorted({int(v) for v in np.concatenate([lo[:, d], hi[:, d]]) if o < v < o + e} | {o, o + e})
        step = step_bytes // e
        slabs, start = [], o
        for b in cuts[1:]:  # consecutive cuts merged into slabs of SLAB_BYTES at least
            if (b - start) * step >= SLAB_BYTES or b == o + e:
                slabs.append([start, b])
                start = b
        if len(slabs) > 1 and (slabs[-1][1] - slabs[-1][0]) * step < SLAB_BYTES:  # a short last one joins
            slabs[-2:] = [[slabs[-2][0], slabs[-1][1]]]
        done = [int(np.nonzero((lo[:, d] < b) & (hi[:, d] > a))[0].max(initial=-1)) + 1 for a, b in slabs]
        early = sum((b - a) * step * (1 - t / n) for t, (a, b) in zip(done, slabs))
        if len(slabs) > 1 and early > score:
            score = early
            best = sorted((t, tuple(a if k == d else v for k, v in enumerate(origin)),
                           tuple(b - a if k == d else v for k, v in enumerate(extents)))
                          for t, (a, b) in zip(done, slabs))
    return best


def piece_order(layer, rows: np.ndarray, fp: Footprint, pieced: dict) -> np.ndarray:
    """``rows`` (an instance's tiles of ``layer``) in the order of the pieces they read of a weight
    promoted in pieces (``pieced``: tensor -> (dim, width) or None), stably: the cores take the
    first piece's tiles together as its promotion brings it in, and the next piece's after,
    rather than a piece each that all arrive late."""
    for p, t in layer.args.items():
        if pieced.get(t) and p != layer.ir.params[-1][0]:
            dim, width = pieced[t]
            return rows[np.argsort(fp.reads[p][0][rows, dim] // width, kind="stable")]
    return rows


def emit_stitched(mod: tvm.IRModule, hw, replicate: bool = True, replay: bool = True, gb_multicasts: bool = True,
                  steady_multicasts: bool = False, unstick: bool = False, queued_weights: bool = False,
                  halo_stores: bool = True):
    """(Program, StitchInfo) of a sub-graph module annotated by the passes of
    ``kernelgen.stitch_passes``: each cluster's steps in the chosen order, at each step the buffers that
    start there claimed (a weight's promotion DDR -> GB issued, in order of first use, one promoted
    in pieces after the others first used with it: a bias needed at the end of the first tiles
    does not wait behind the megabytes of its weight), then every layer's tiles of the step's
    instances on the instances' cores (in ``piece_order``), each tensor read and written where it
    was placed.

    A cluster whose instances are the first cluster's moved along the batch, placed alike, gets a
    copy of its instructions (``replicate``; False emits every cluster, for tests). A layer like
    an earlier one is replayed from it (``replay``, ``KernelEmitter``). The tiles' loads from DDR
    into the LBs are multicasts (``KernelEmitter(ddr_multicasts=True)``); ``gb_multicasts=False``:
    the tiles load from the GBs by plain DMAs; ``steady_multicasts``: in a clamped layer too, the
    boxes that do not move with the clamped loop; ``unstick``: no multicast left waiting for ever;
    ``queued_weights``: the tiles load the weights on the cores' second DMA queues
    (``KernelEmitter(queued_reads=...)``); ``halo_stores``: exchanged tensors pass their rows
    through the stores (below).

    A tensor the instances exchange (``SubGraphKernel.exchange``: a sample's rows split over the
    clusters, a window reading rows of its neighbours' shares) lives in each instance's box, which
    holds its own rows and its halo. With ``halo_stores``, on a bus and with every box in a GB,
    each tile that computes rows another box holds stores them there too, across the bus on its
    core's store queue (``KernelEmitter.layer``'s ``mirrors``), and the window's loads wait for
    those stores alone: the halo chain is store -> load, not store -> copy out -> copy in -> load
    (DenseNet-121 at batch 1, with the launch passes after: 385,304 -> 371,682 cycles). Every
    cluster's claims of a step are emitted before any cluster's layers of it, so a store finds
    the box it reaches claimed. Otherwise, after the step that computes it the instance copies out to
    the tensor's DDR region the rows the others' boxes hold, and before its first reader copies
    in the rest of its box from there, first in that step: ahead of the weights the step promotes
    (most of them for later layers) in the cluster's DMA queue, which is in order (behind them,
    DenseNet-121's 3 x 3 windows at batch 1 waited about a thousand cycles each for their
    halo: 577,738 -> 532,645 cycles). The clusters are then emitted step by step, not one after
    the other, and none is a copy of another: every cluster's copies out come before any copy in
    (whose dependencies wait for all of them)."""

    sg, prints = read_subgraph(mod, hw)
    inst = read_instances(mod, sg, prints, hw)
    cores = read_cores(mod)
    order = str(mod.attrs["dsa.order"])
    lb_bytes = int(mod.attrs["dsa.scopes"]["lb_bytes"])
    buffers = read_allocation(mod)
    cpc, nl = hw.cores_per_cluster, len(sg.layers)
    regions, args, scratch = place_arguments(sg.inputs, sg.outputs, sg.tensors, sg.stored)
    produced = {L.args[L.ir.params[-1][0]] for L in sg.layers}

    def region(b: Buffer):
        shape = sg.tensors[b.tensor][0]
        box = inst.boxes[b.owner][b.tensor] if b.kind == "t" else ((0,) * len(shape), tuple(shape))
        extents = tuple(h - l for l, h in zip(*box))
        base = scratch + b.offset if b.level == "ddr" else b.offset
        return Region(b.level, b.unit, base, box[0], extents, sg.stored[b.tensor])

    # exchanged tensors every instance holds in a GB, on a bus: each tile's store also writes the
    # rows of its box the other instances' boxes hold, into their GBs (``KernelEmitter.layer``'s
    # ``mirrors``), rather than the copies out to DDR and in; with one round of instances a
    # cluster, step k is layer k's on every cluster, and each box must be claimed by its producer's step
    made_at = {L.args[L.ir.params[-1][0]]: k for k, L in enumerate(sg.layers)}
    one_round = all(cr.rounds == 1 for cr in cluster_rounds(cores, cpc).values())
    stored = frozenset(t for t in sg.exchange if halo_stores and hw.interconnect == "bus" and one_round and all(
        b.level == "gb" and b.offset >= 0 and b.first <= made_at[t] for b in buffers
        if b.kind == "t" and b.tensor == t))
    boxes: dict = {}  # (exchanged tensor, instance) -> its box's place, every cluster's
    for t in sg.exchange:  # in the kernel's DDR, before its scratch: every instance writes its part
        if t not in stored:
            regions[t] = Region.whole("ddr", 0, scratch, sg.tensors[t][0], sg.stored[t])
            scratch = align(scratch + regions[t].nbytes)

    emitter = KernelEmitter(hw, sg.name, replay, gb_multicasts=gb_multicasts, ddr_multicasts=True,
                            steady_multicasts=steady_multicasts, unstick=unstick,
                            queued_reads=frozenset(sg.weights) if queued_weights else frozenset())
    for t, r in regions.items():
        emitter.claim(r, ("ddr", t))

    def steps_of(part: _Part):
        """Emit cluster ``part``'s steps, yielding each step's number before emitting it."""
        c, cr, mine = part.cluster, part.rounds, part.buffers
        step = cr.step(order, nl)
        pieced: dict = {}  # weight -> (dim, width) of its pieces, as promoted to this cluster's GB
        starts: dict = {}
        for b in mine:
            if b.key in part.place:
                starts.setdefault(b.first, []).append(b)
        steps = sorted({step(cr.rnd[i], k) for i in cr.members for k in range(nl)} | set(starts))
        use: dict = {}  # tensor -> the first step a layer reads it at
        fill_at: dict = {}  # (instance, exchanged tensor) -> the first step a layer of it reads the tensor at
        for i in cr.members:
            for k, L in enumerate(sg.layers):
                for p, t in L.args.items() if len(inst.rows[i][L.name]) else ():
                    use[t] = min(use.get(t, math.inf), step(cr.rnd[i], k))
                    if t in sg.exchange and p != L.ir.params[-1][0]:
                        fill_at[i, t] = min(fill_at.get((i, t), math.inf), step(cr.rnd[i], k))
        for s in steps:
            yield s, 0  # every cluster's claims of a step before any of its layers (a store may reach another GB)
            for i in cr.members:  # the rows of exchanged tensors others wrote, in from DDR for the first reader
                for t in sg.exchange:
                    if t not in stored and fill_at.get((i, t)) == s and ("t", t, i) in part.place:
                        dst = part.place[("t", t, i)]
                        for box in _box_minus(inst.boxes[i][t], inst.written[i].get(t)):
                            emitter.move(regions[t], dst, dst.index if dst.mem == "lb" else c * cpc, box=box)
            for b in starts.get(s, []):
                if b.kind == "w":
                    pieced[b.tensor] = promotion_pieces(sg, prints, b.tensor, hw)
            for b in sorted(starts.get(s, []),
                            key=lambda b: (b.kind == "w", use.get(b.tensor, s), bool(pieced.get(b.tensor)))):
                if b.kind == "w":
                    emitter.claim(part.place[b.key], b.key, pieces=pieced[b.tensor])
                    emitter.move(regions[b.tensor], part.place[b.key], c * cpc)
                else:
                    emitter.claim(part.place[b.key], b.key)
            yield s, 1
            pending = None  # (layer, work, regions, mirrors): calls of one layer in the same regions go as one
            copies = []  # (on-chip box, DDR region) of the outputs computed in this step
            for i in cr.members:
                for k, L in enumerate(sg.layers):
                    rows = inst.rows[i][L.name]
                    if step(cr.rnd[i], k) != s or not len(rows):
                        continue
                    local = dict(regions)
                    out = L.args[L.ir.params[-1][0]]
                    for t in L.args.values():
                        key = ("t", t, i) if t in produced else ("w", t, weight_owner(order, c, cr.rnd[i], hw.clusters))
                        if key in part.place:
                            local[t] = part.place[key]
                    kept = part.place.get(("t", out, i)) if out in sg.outputs or out in sg.exchange else None
                    mirrors = tuple(boxes[out, k] for k in _halos_out(inst, i, out)) if out in stored else ()
                    if out in sg.exchange and kept is not None:  # the rows the others read, out to DDR
                        if out not in stored:
                            copies += [(kept, regions[out], box, None) for box in _halos_out(inst, i, out).values()]
                        kept = None
                    rows = piece_order(L, rows, prints[L.name], pieced)
                    tiles = [prints[L.name].tiles[r] for r in rows.tolist()]
                    work = [(t, cores[i][k % len(cores[i])]) for k, t in enumerate(tiles)]  # in turn
                    lo, hi = prints[L.name].write
                    slabs = write_out_slabs((lo[rows], hi[rows]), kept.origin, kept.extents,
                                            sg.itemsize(out)) if kept is not None and kept.mem == "gb" else []
                    if len(slabs) > 1:  # each slab written out once its own tiles have stored it
                        if pending:
                            emitter.layer(*pending[:3], lb_bytes, mirrors=pending[3])
                            pending = None
                        touched = {tiles[k]: [j for j, (_, o, e) in enumerate(slabs)
                                              if all(a < p + q and p < b for a, b, p, q in zip(lo[r], hi[r], o, e))]
                                   for k, r in enumerate(rows.tolist())}
                        writers = emitter.layer(L, work, local, lb_bytes, slabs=touched)
                        copies += [(kept, regions[out], (o, e), set(w.values()) or None)
                                   for (_, o, e), w in zip(slabs, writers)]
                        continue
                    if kept is not None:
                        copies.append((kept, regions[out], (kept.origin, kept.extents), None))
                    if pending and pending[0] is L and pending[2] == local and pending[3] == mirrors:
                        pending[1].extend(work)
                        continue
                    if pending:
                        emitter.layer(*pending[:3], lb_bytes, mirrors=pending[3])
                    pending = (L, work, local, mirrors)
            if pending:
                emitter.layer(*pending[:3], lb_bytes, mirrors=pending[3])
            for src, dst, box, after in copies:  # outputs kept on chip for the kernel's own reads, written out
                emitter.move(src, dst, src.index if src.mem == "lb" else c * cpc, box=box, after=after)

    # each cluster's steps in turn; where the instances exchange tensors, step by step over the
    # clusters, so that every part of an exchanged tensor is written before any instance reads it
    reference, span = None, [0, 0]  # the first cluster's part, and [first, end) of its instructions
    parts = []
    for c, cr in sorted(cluster_rounds(cores, cpc).items()):
        mine = [b for b in buffers if b.cluster == c]
        part = _Part(c, cr, mine, {b.key: region(b) for b in mine if b.offset >= 0})
        if reference is None:
            reference, span[0] = part, emitter.size
        elif replicate and not sg.exchange:
            shift = _cluster_shift(sg, prints, inst, cores, cpc, reference, part, regions)
            if shift is not None and emitter.replicate(*span, (c - reference.cluster) * cpc, c, shift):
                continue
        if sg.exchange:
            parts.append(part)
            boxes.update({(t, i): r for (kind, t, i), r in part.place.items() if kind == "t" and t in stored})
            continue
        for _ in steps_of(part):
            pass
        if reference is part:
            span[1] = emitter.size
    pending = [(next(g, None), k, g) for k, g in enumerate(map(steps_of, parts))]
    while pending := [p for p in pending if p[0] is not None]:
        _, k, g = min(pending, key=lambda p: p[:2])
        pending = [(next(g, None), j, h) if j == k else (s, j, h) for s, j, h in pending]
    top = max((scratch + b.offset + align(b.nbytes) for b in buffers if b.level == "ddr" and b.offset >= 0),
              default=scratch)
    program = isa.Program(hw.to_dict(), max(top, ALIGN), tuple(args), (emitter.kernel(),), sg.name)
    gb_peak = max((b.offset + align(b.nbytes) for b in buffers if b.level == "gb"), default=0)
    info = StitchInfo(inst.count, inst.recompute, len(cores[0]), order, gb_peak,
                      tuple(b.key for b in buffers if b.level == "ddr"), sum(b.level == "lb" for b in buffers),
                      lb_bytes, tuple(gv.name_hint for gv, f in mod.functions.items() if on_vector_units(f)))
    return program, info
