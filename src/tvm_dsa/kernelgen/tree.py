"""SET kernels (``TreePlan``): a SET schedule lowered to one DSA program (seed 002 §3.3: tile
groups become cores); ``TreeKernels`` is the generator.

``build_tree_program`` emits every layer invocation of a resource allocation tree — layer ``v``
on the samples ``[q * b_v, (q + 1) * b_v)`` — with the ``KernelEmitter`` the other schedules use,
in the tree's invocation order (``schedule.set.tree.invocation_order``: each cut runs
sub-batch k of all its children before sub-batch k + 1). A layer's tiles run on the cores of its
tile group that its intra-layer partition uses (stripe ids mapped to mesh positions), dealt
round-robin; the layer is tiled as that partition splits it where this runs faster
(``_in_parts``). The emitter's dependency tokens then let S-cut children on disjoint cores overlap
as a pipeline, and make T-cut children follow one another on shared cores.

Which invocation computes a tile: the one holding the last sample the tile writes, postponed
while a producer invocation it reads from comes later in the order (a tile may span several
samples when the lowering tiled the batch coarsely). Samples are found from the leading dimension
of every activation, which must carry the batch (checked).

Data kept on chip, as the tree says (§3.3.1). The part of every core's LB above the largest
layer's tile buffers is an arena (``_Arena``) for:

- feature maps consumed at once: a producer invocation's output chunk (its samples) whose every
  consumer reads it at once (the schedule's chunks all go over the NoC) is spread over the LBs
  of its consumers' cores, in pieces along the chunk's samples and one more dim (``_grid``: the
  one that splits the producer's and consumers' tile boxes into the fewest pieces), each on the
  core its readers' elements reach in fewest mesh hops, spread (``_Kept.homes``); producer
  tiles write their pieces there
  and consumer tiles read them, over the NoC where they are on another core. The pieces are
  freed after the last tile reading them;
- pinned weights: a layer the schedule pins loads its weights once per root sub-batch round
  (once under a root S-cut). On chips with multicast DMAs they are cut where its tiles' boxes
  start and end (``_tile_cuts``), and every core whose tiles read a piece holds a copy of it at
  one LB offset, filled by one multicast from DDR (while the cores keep ``COPIES_KEEP`` of their
  arena free, else the piece is one, placed as a feature map's): a tile reads its weights
  in place. Without multicasts the pieces are cut along the output dim over its cores;
- weights loaded ahead: a layer the schedule does not pin reads its weights once per invocation;
  where the mesh gathers them faster than DDR reads them (``_ahead``) they load into the same
  pieces on the prefetch queues up to ``WEIGHTS_AHEAD`` invocations early, for that invocation;

and whatever does not fit the arena when it is placed goes through DDR as before. A chunk read
later, across root T-cut children, through a reshape, or returned stays in DDR.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import tvm_ffi

from tvm_dsa import isa
from tvm_dsa.hardware import Hardware
from tvm_dsa.schedule.set.alloc import stripe_order
from tvm_dsa.schedule.set.analysis import Schedule, Slot
from tvm_dsa.schedule.set.tree import invocation_order
from tvm_dsa.emit.emitter import KernelEmitter, build_program, place_arguments
from tvm_dsa.emit.placement import Layer, Pieces, Region, stored_dtypes
from tvm_dsa.kernel.analysis import Unsupported
from tvm_dsa.kernel.ir import ALIGN, CodegenError, align
from tvm_dsa.kernelgen.rewrite import DSACall
from tvm_dsa.emit.footprint import footprints
from tvm_dsa.runtime import simulate, timing_cycles
from tvm_dsa.runtime.timing import simulate_program
from tvm_dsa.tiling import lower_in_parts, lower_kernel
from tvm_dsa.tir_passes.tile import anchor_info


@dataclass(frozen=True)
class TreeKernel:
    """What kernel generation needs for a SET schedule: ``layers[i]`` is the ``emit.Layer`` of
    layer ``i`` of the schedule's layer graph (its parameters named by tensors); ``views`` maps a
    reshaped tensor to the tensor whose bytes it reinterprets; ``inputs`` / ``outputs`` are the
    program's arguments in order; ``tensors`` gives every tensor's (shape, host dtype), ``stored``
    the type the program places it in (``emit.placement.stored_dtypes``)."""

    name: str
    layers: tuple
    views: dict
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    tensors: dict
    schedule: Schedule
    stored: dict
    weights: frozenset = frozenset()  # the inputs that are constants (weights a layer may pin)

    def itemsize(self, tensor: str) -> int:
        """Bytes of one element of ``tensor`` where the program places it."""
        return isa.DTYPES[self.stored[tensor]]


@dataclass(frozen=True)
class Span:
    """Instructions ``[first, last)`` of the program's kernel compute invocation ``invocation`` of
    ``layer`` on ``cores``."""

    layer: int
    invocation: int
    first: int
    last: int
    cores: tuple[int, ...]


def core_of_stripe(hw) -> list[int]:
    """Core index of each stripe id (cores are numbered row by row on the mesh, like
    ``runtime.cost.mesh_hops``)."""
    width, height = hw.mesh
    return [y * width + x for x, y in stripe_order(width, height)]


def _samples(box_lo: int, box_hi: int, dim0: int, batch: int) -> tuple[int, int]:
    """Samples [first, last] a box spanning rows [box_lo, box_hi) of a leading dimension holds."""
    return box_lo * batch // dim0, (box_hi * batch - 1) // dim0


def _assign(k: TreeKernel, batch: int, fps: list) -> tuple[dict, dict]:
    """(layer, invocation) -> tile-loop values of the tiles it computes (none of a tile whose output
    box is empty); and (layer, sample) -> position in the invocation order of the last invocation
    whose tiles read that sample of the layer's output."""
    sched, layers = k.schedule, k.layers
    plans = sched.leaves
    position = {key: n for n, key in enumerate(invocation_order(sched.tree))}
    produced = {L.args[L.ir.params[-1][0]]: i for i, L in enumerate(layers)}

    def root(t: str) -> str:
        while t in k.views:
            t = k.views[t]
        return t

    def dim0(t: str) -> int:
        shape = k.tensors[t][0]
        if not shape or shape[0] % batch:
            raise CodegenError(f"SET lowering: tensor {t} of shape {list(shape)} does not carry the batch "
                               f"{batch} in its leading dimension")
        return shape[0]

    work: dict = {}
    last_read: dict = {}
    ready: list = []  # per layer, per sample: position of the invocation completing it
    for v, L in enumerate(layers):
        fp = fps[v]
        out = L.args[L.ir.params[-1][0]]
        bv, n = plans[v].batch, plans[v].invocations
        reads = [(fp.reads[p], produced[root(L.args[p])], dim0(L.args[p])) for p in fp.reads
                 if root(L.args[p]) in produced]
        done = [-1] * batch
        for row, tile in enumerate(fp.tiles):
            if fp.write[1][row][0] <= fp.write[0][row][0]:
                continue  # a tile that writes nothing (a transposed convolution's guarded rows past the output)
            first, last = _samples(int(fp.write[0][row][0]), int(fp.write[1][row][0]), dim0(out), batch)
            need = max((max(ready[u][a:b + 1]) for (lo, hi), u, d in reads if lo[row][0] < hi[row][0]
                        for a, b in [_samples(int(lo[row][0]), int(hi[row][0]), d, batch)]), default=-1)
            q = last // bv
            while q < n and position[(v, q)] < need:
                q += 1
            if q == n:
                raise CodegenError(f"SET lowering: a tile of {L.name} reads samples its producers compute "
                                   "after its last invocation")
            work.setdefault((v, q), []).append(tile)
            done[first:last + 1] = [max(x, position[(v, q)]) for x in done[first:last + 1]]
            for (lo, hi), u, d in reads:
                if lo[row][0] >= hi[row][0]:
                    continue  # a stage the tile skips (``Stage.guard``)
                a, b = _samples(int(lo[row][0]), int(hi[row][0]), d, batch)
                for sample in range(a, b + 1):
                    last_read[(u, sample)] = max(last_read.get((u, sample), -1), position[(v, q)])
        ready.append(done)
    return work, last_read


@dataclass(frozen=True)
class TreeProgram:
    """A lowered SET schedule: the program (one kernel) and every invocation's instructions."""

    program: isa.Program
    spans: tuple[Span, ...]
    schedule: Schedule
    residency: dict  # counts of what was kept in the LBs (``_Residency.stats``)

    def timeline(self, check_hazards: bool = False) -> tuple[Slot, ...]:
        """The S-T graph's rectangles as the simulator runs the program (timing only): each
        invocation from its first instruction's start to its last one's end, in cycles from the
        kernel's start."""

        hw = Hardware.from_dict(self.program.hardware)
        kt = simulate_program(self.program, hw, check_hazards).kernels[0]
        out = []
        for s in self.spans:
            if s.first == s.last:
                continue
            plan = self.schedule.leaves[s.layer]
            idx = range(s.first, s.last)
            out.append(Slot(s.layer, s.invocation, plan.batch, plan.used,
                            min(kt.start[i] for i in idx), max(kt.end[i] for i in idx)))
        return tuple(out)


WEIGHTS_AHEAD = 2  # invocations whose unpinned weights load while one computes (``_ahead``)
PREFETCH_AHEAD = 3  # invocations whose pins load while one computes (where the arena has room)
PIN_RUN_BURSTS = 4  # pinned weights are cut into pieces whose DDR rows span at least so many bursts
COPIES_KEEP = 0.5  # weights are copied to each core reading them only while it keeps so much of its arena free
PIECE_SETUPS = 2  # a piece is at least what a mesh link moves in so many DMA set-ups (``_min_piece``)


def _min_piece(hw) -> int:
    """Bytes below which a tensor is not cut into pieces: what a mesh link moves in
    ``PIECE_SETUPS`` DMA set-ups. Every piece a tile box touches is a DMA of its own, so smaller
    pieces pay more set-ups, larger ones spread the traffic over fewer cores' links. On the SET
    presets 4 KiB, which beat 2, 3, 6 and 8 KiB on GoogLeNet's SET tree and ResNet-50's LS tree
    on `set-cloud144` at batch 1 (docs/set.md)."""
    return PIECE_SETUPS * hw.dma_latency_cycles * int(hw.noc_link_bytes_per_cycle)


class _Arena:
    """Free byte ranges of each core's LB above the layers' tile buffers (first fit)."""

    def __init__(self, lo: int, hi: int):
        self.lo, self.hi = align(lo), hi
        self.free: dict = {}  # core -> sorted [lo, hi) ranges

    def take(self, core: int, nbytes: int) -> int | None:
        free = self.free.setdefault(core, [(self.lo, self.hi)] if self.hi > self.lo else [])
        n = align(nbytes)
        for i, (a, b) in enumerate(free):
            if b - a >= n:
                free[i:i + 1] = [(a + n, b)] if b - a > n else []
                return a
        return None

    def take_common(self, cores, nbytes: int, keep: int = 0) -> int | None:
        """The lowest base free for ``nbytes`` on every one of ``cores`` (taken on each) where
        each keeps ``keep`` bytes free besides, or None."""
        n = align(nbytes)
        free = [self.free.setdefault(c, [(self.lo, self.hi)] if self.hi > self.lo else []) for c in cores]
        if any(sum(hi - lo for lo, hi in ranges) < n + keep for ranges in free):
            return None
        for a in sorted({a for ranges in free for a, _ in ranges}):
            if all(any(lo <= a and a + n <= hi for lo, hi in ranges) for ranges in free):
                for c, ranges in zip(cores, free):
                    i = next(i for i, (lo, hi) in enumerate(ranges) if lo <= a and a + n <= hi)
                    lo, hi = ranges[i]
                    ranges[i:i + 1] = [r for r in ((lo, a), (a + n, hi)) if r[1] > r[0]]
                return a
        return None

    def give(self, core: int, base: int, nbytes: int) -> None:
        free = self.free[core]
        free.append((base, base + align(nbytes)))
        free.sort()
        merged = [free[0]]
        for a, b in free[1:]:
            if a == merged[-1][1]:
                merged[-1] = (merged[-1][0], b)
            else:
                merged.append((a, b))
        self.free[core] = merged


def _splittable(layer, param: str, d: int) -> bool:
    """Every access of ``layer`` to its parameter ``param`` is a DMA indexing dim ``d`` by loops
    with positive coefficients, or does not vary along it (what ``Pieces.split`` needs)."""
    for st in layer.ir.stages():
        for acc in [st.dst] + st.reads():
            if acc.buffer == param and not acc.lb:
                loops = [c for c in acc.inner[d] if c]
                if loops and (st.op != "dma" or min(loops) < 1):
                    return False
    return True


def _grid(shape, users, cells: int, first: int, run: int = 0) -> tuple[int | None, tuple[int, ...]]:
    """(dim, interior cuts) cutting a tensor (or a chunk of it) into up to ``cells`` even pieces
    along the dim from ``first`` on that every user can split along and that cuts the users'
    tile boxes into the fewest pieces; (None, ()) when none can. ``users``: (layer, param, boxes).
    With ``run`` (elements; pieces loaded from DDR) a dim whose pieces' contiguous rows are
    shorter is taken only if every dim's are: a 1 x 1 convolution's weights cut along their 512
    input channels in 16 pieces load as 32-byte rows, each a 64-byte burst."""
    best = None
    for d in range(first, len(shape)):
        n = min(cells, shape[d])
        if n < 2 or not all(_splittable(L, param, d) for L, param, _ in users):
            continue
        cuts = tuple(shape[d] * i // n for i in range(1, n))
        pieces = sum(_crossed(cuts, d, boxes) for _, _, boxes in users)
        short = d > 0 and shape[d] // n * int(np.prod(shape[d + 1:])) < run
        if best is None or (short, pieces) < best[0]:
            best = ((short, pieces), d, cuts)
    return (best[1], best[2]) if best else (None, ())


def _crossed(cuts, d: int | None, boxes) -> int:
    """Pieces the tile boxes cross in all, the tensor cut at ``cuts`` along dim ``d`` (a piece
    each where it is not cut)."""
    lo, hi = boxes
    if d is None:
        return len(lo)
    return int(np.sum(np.searchsorted(cuts, hi[:, d] - 1, "right") - np.searchsorted(cuts, lo[:, d], "right") + 1))


def _tile_cuts(shape, layer, param: str, boxes, run: int = 0) -> tuple[int | None, tuple[int, ...]]:
    """(dim, interior cuts) cutting weights where the tiles' boxes start and end along the dim
    that has most such places (the output channels the tiles split), so that a tile reads whole
    pieces; (None, ()) where no dim can or need be cut. As in ``_grid``, a dim whose pieces' DDR
    rows are shorter than ``run`` elements is taken only if every dim's are."""
    lo, hi = boxes
    best = None
    for d in range(len(shape)):
        cuts = tuple(sorted({int(x) for x in (*lo[:, d], *hi[:, d])} - {0, shape[d]}))
        if not cuts or not _splittable(layer, param, d):
            continue
        widths = np.diff((0, *cuts, shape[d]))
        short = d > 0 and int(widths.min()) * int(np.prod(shape[d + 1:])) < run
        if best is None or (short, -len(cuts)) < best[0]:
            best = ((short, -len(cuts)), d, cuts)
    return (best[1], best[2]) if best else (None, ())


@dataclass
class _Kept:
    """A tensor some of whose pieces may live in LBs: its ``Pieces``, the dim (besides dim 0 for
    a feature map's chunks) its pieces are cut along, and the cores holding them."""

    tensor: str
    home: Region  # its DDR region (where pieces not in an LB are)
    pieces: Pieces
    dim: int | None
    cores: tuple[int, ...]
    rows: int = 0  # feature map: leading-dim rows per chunk (0: weights, one chunk)
    readers: dict = field(default_factory=dict)  # cell index -> {core: elements its tiles read} (``_readers``)
    copied: bool = False  # weights: each reading core holds its own copy of the pieces it reads

    def homes(self, index, j: int, placed: dict, width: int) -> list[int]:
        """Cores to place piece ``index`` (the ``j``-th of its chunk) on, best first: by the mesh
        hops the elements its tiles read travel from there (``width``: the mesh's; a core's own
        reads travel none), each piece of the chunk already on a core (``placed``: core -> pieces)
        counting as one hop more for all of them, so that a feature map spreads over the links
        around its readers instead of crowding those of the cores reading most of it. A piece no
        tile reads goes to the ``j``-th holder."""
        volume = self.readers.get(index, {})
        if not volume:
            return [self.cores[j % len(self.cores)]]
        cores = np.array(self.cores)
        readers = np.array(list(volume))
        elements = np.array(list(volume.values()), dtype=np.float64)
        hops = np.abs(cores[:, None] % width - readers % width) + np.abs(cores[:, None] // width - readers // width)
        cost = hops @ elements + elements.sum() * np.array([placed.get(int(c), 0) for c in cores])
        return [int(c) for c in cores[np.argsort(cost, kind="stable")]]


def _readers(kept: _Kept, chunks: int, users) -> dict:
    """Per cell of ``kept``: the elements of it each core's tiles read. ``users``: (boxes, core of
    each box's tile) of every reading layer."""
    out = {}
    for p in range(chunks):
        for index, origin, extents in _cells_of(kept, p):
            o = np.array(origin, dtype=np.int64)
            e = o + np.array(extents, dtype=np.int64)
            volume: dict = {}
            for (lo, hi), cores in users:
                inside = np.clip(np.minimum(hi, e) - np.maximum(lo, o), 0, None).prod(axis=1)
                for c, n in zip(cores, inside):
                    if n and c >= 0:  # (-1: a tile no invocation computes, ``_assign``)
                        volume[c] = volume.get(c, 0) + int(n)
            out[index] = volume
    return out


def _cells_of(kept: _Kept, chunk: int):
    """(cell index, origin, extents) of every piece of chunk ``chunk`` (a scalar, Clip's bound:
    one piece)."""
    shape, dim = kept.pieces.shape, kept.dim
    if not shape:
        yield (), (), ()
        return
    bounds = (0, *kept.pieces.cuts[dim], shape[dim]) if dim is not None else (0, shape[0])
    for j in range(len(bounds) - 1):
        index, origin, extents = [0] * len(shape), [0] * len(shape), list(shape)
        if kept.rows:
            index[0], origin[0], extents[0] = chunk, chunk * kept.rows, kept.rows
        if dim is not None:
            index[dim], origin[dim], extents[dim] = j, bounds[j], bounds[j + 1] - bounds[j]
        yield tuple(index), tuple(origin), tuple(extents)


class _Residency:
    """What the program keeps in the LBs' arena as it is emitted (module docstring): places a
    chunk's or a pinned layer's pieces (or leaves them in DDR when they do not fit) and frees them
    after their last use."""

    def __init__(self, k: TreeKernel, hw, fps: list, last_read: dict, regions: dict, emitter: KernelEmitter,
                 tile_cores: list):
        sched, layers = k.schedule, k.layers
        self.hw, self.emitter = hw, emitter
        self.arena = _Arena(max(L.plan.total_bytes for L in layers), hw.lb_bytes)
        min_piece = _min_piece(hw)
        cores = core_of_stripe(hw)
        used = [tuple(cores[i] for i in range(*p.used)) for p in sched.leaves]
        readers: dict = {}  # tensor -> [(layer, param)]
        for v, L in enumerate(layers):
            for param, *_ in L.ir.params[:-1]:
                readers.setdefault(L.args[param], []).append((v, param))
        viewed = set(k.views) | set(k.views.values())
        batch = sched.tree.batch
        self.kept: dict = {}  # layer -> _Kept of its output
        self.pinned: dict = {}  # layer -> [_Kept of each weight it pins]
        self.placed: dict = {}  # (layer, chunk or round, "out" / "w") -> [(core, base, bytes)]
        # what the arena took: output chunks consumed at once, weights pinned for a round
        self.stats = {"chunks on chip": 0, "chunks through DDR": 0, "pins": 0, "pins refused": 0,
                      "weights ahead": 0}
        self.free_at: dict = {}  # position -> keys placed whose last use it is
        on_chip = {}
        for c in sched.chunks:
            on_chip[(c.src, c.p)] = on_chip.get((c.src, c.p), True) and c.noc > 0
        for u, L in enumerate(layers):
            out = L.ir.params[-1][0]
            t = L.args[out]
            shape = k.tensors[t][0]
            users = [(layers[v], param, fps[v].reads[param]) for v, param in readers.get(t, [])]
            if t in k.outputs or t in viewed or not users or not any(on_chip.get((u, p)) for p in
                                                                   range(sched.leaves[u].invocations)):
                continue
            users.append((L, out, fps[u].write))
            chunks = sched.leaves[u].invocations
            if chunks > 1 and not all(_splittable(lay, param, 0) for lay, param, _ in users):
                continue
            rows = shape[0] // chunks
            holders = tuple(dict.fromkeys(c for v, _ in readers[t] for c in used[v]))
            chunk_bytes = k.itemsize(t) * rows * int(np.prod(shape[1:]))
            dim, cuts = _grid((rows, *shape[1:]), users, min(len(holders), -(-chunk_bytes // min_piece)), 1)
            grid = [tuple(rows * i for i in range(1, chunks))] + [()] * (len(shape) - 1)
            if dim is not None:
                grid[dim] = cuts
            self.kept[u] = _Kept(t, regions[t], Pieces(tuple(shape), tuple(grid), {}), dim, holders, rows)
            self.kept[u].readers = _readers(self.kept[u], chunks, [(fps[v].reads[param], tile_cores[v])
                                                                   for v, param in readers[t]])
            for p in range(chunks):
                for index, *_ in _cells_of(self.kept[u], p):
                    self.kept[u].pieces.cells[index] = regions[t]
            regions[t] = self.kept[u].pieces
        self.ahead: set = set()  # layers the schedule does not pin whose weights load ahead (``_ahead``)
        for v, L in enumerate(layers):
            if not sched.leaves[v].pinned:
                if not _ahead(sched.leaves[v].cost.weight_tile, L, k, hw):
                    continue
                self.ahead.add(v)
            for param, *_ in L.ir.params[:-1]:
                t = L.args[param]
                if t not in k.weights or len(readers[t]) > 1:
                    continue
                shape = k.tensors[t][0]
                size = k.itemsize(t) * int(np.prod(shape))
                copied = hw.multicast_dma
                if copied:
                    dim, cuts = _tile_cuts(shape, L, param, fps[v].reads[param],
                                           PIN_RUN_BURSTS * hw.ddr_burst_bytes // k.itemsize(t))
                else:
                    dim, cuts = _grid(shape, [(L, param, fps[v].reads[param])], min(len(used[v]), -(-size // min_piece)),
                                      0, PIN_RUN_BURSTS * hw.ddr_burst_bytes // k.itemsize(t))
                grid = [()] * len(shape)
                if dim is not None:
                    grid[dim] = cuts
                kept = _Kept(t, regions[t], Pieces(tuple(shape), tuple(grid), {}), dim, used[v], copied=copied)
                kept.readers = _readers(kept, 1, [(fps[v].reads[param], tile_cores[v])])
                for index, *_ in _cells_of(kept, 0):
                    kept.pieces.cells[index] = regions[t]
                if v not in self.ahead:  # (loaded ahead: in pieces only while placed)
                    regions[t] = kept.pieces
                self.pinned.setdefault(v, []).append(kept)
        root = sched.tree.root
        self.round = batch // root.sb if root.kind == "T" else batch
        self.last_read, self.sched, self.on_chip, self.regions = last_read, sched, on_chip, regions
        self.position = {key: n for n, key in enumerate(invocation_order(sched.tree))}

    def _place(self, key, kept: _Kept, chunk: int, pos: int, load: bool = False, prefetch: bool = False) -> bool:
        """Put the pieces of ``chunk`` of ``kept`` in the arena (claimed; loaded from DDR with
        ``load``, on the prefetch queues with ``prefetch``) to be freed after position ``pos``:
        copied weights on each core reading them where they fit so, else each piece on its first
        home with room; False (nothing placed) when a piece does not fit."""
        taken = []  # (cell index, core, base, bytes, a core's own copy)
        on_core: dict = {}  # core -> pieces of this chunk on it
        for j, (index, origin, extents) in enumerate(_cells_of(kept, chunk)):
            nbytes = isa.DTYPES[kept.home.dtype] * int(np.prod(extents))
            cores = sorted(kept.readers.get(index, {})) if kept.copied else ()
            if kept.copied and not cores:
                continue  # no tile reads this piece
            base = self.arena.take_common(cores, nbytes, COPIES_KEEP * (self.arena.hi - self.arena.lo)) \
                if len(cores) > 1 else None
            if base is not None:  # a copy on each core reading it, at one place (a multicast load)
                taken += [(index, c, base, nbytes, True) for c in cores]
                continue
            for core in kept.homes(index, j, on_core, self.hw.mesh[0]):  # else one piece, read over the mesh
                base = self.arena.take(core, nbytes)
                if base is not None:
                    taken.append((index, core, base, nbytes, False))
                    on_core[core] = on_core.get(core, 0) + 1
                    break
            if base is None:
                for _, c, b, n, _ in taken:
                    self.arena.give(c, b, n)
                return False
        cells = {index: (origin, extents) for index, origin, extents in _cells_of(kept, chunk)}
        for index, core, base, nbytes, copy in taken:
            region = Region("lb", core, base, *cells[index], kept.home.dtype)
            self.emitter.claim(region, (kept.tensor, key, index, core))
            if load:
                self.emitter.move(kept.home, region, core, prefetch, copies=copy)
            if copy:
                kept.pieces.copies[(index, core)] = region
            else:
                kept.pieces.cells[index] = region
        self.placed[key] = (kept, chunk, taken)
        self.free_at.setdefault(pos, []).append(key)
        return True

    def pins(self, v: int, q: int, prefetch: bool = False, distance: int = 0) -> None:
        """Place and load the weights invocation ``(v, q)`` pins, if it is the first of a round
        and they are not placed yet. With ``prefetch`` (``distance`` invocations ahead of it, on
        the cores' prefetch queues) pieces that do not fit yet are left to the invocation. A
        layer loading its weights ahead (``_ahead``) places them for ``(v, q)`` alone, only
        with ``prefetch`` and at most ``WEIGHTS_AHEAD`` invocations early (else its tiles read
        DDR), and its tiles read the pieces while they are placed."""
        plan = self.sched.leaves[v]
        if v in self.ahead:  # for this invocation only, where it loads ahead
            if not prefetch or distance > WEIGHTS_AHEAD:
                return
            r = q
            last = self.position[(v, q)]
        elif v not in self.pinned or (q * plan.batch) % self.round:
            return
        else:
            r = q * plan.batch // self.round
            last = self.position[(v, min(plan.invocations, (r + 1) * self.round // plan.batch) - 1)]
        for n, kept in enumerate(self.pinned.get(v, ())):
            if (v, r, "w", n) in self.placed or any(c is not kept.home for c in kept.pieces.cells.values()):
                continue  # placed for this invocation or round, or still for the one before
            placed = self._place((v, r, "w", n), kept, 0, last, load=True, prefetch=prefetch)
            if v in self.ahead:
                self.stats["weights ahead"] += placed
                if placed:
                    self.regions[kept.tensor] = kept.pieces
            elif placed or not prefetch:
                self.stats["pins" if placed else "pins refused"] += 1

    def before(self, v: int, q: int) -> None:
        """Place what invocation ``(v, q)`` starts keeping: its pinned weights at the first
        invocation of a round (``pins``), its output chunk when it is consumed at once."""
        plan = self.sched.leaves[v]
        self.pins(v, q)
        kept = self.kept.get(v)
        if kept is not None and self.on_chip.get((v, q)):
            rows = range(q * plan.batch, (q + 1) * plan.batch)
            last = max(self.last_read.get((v, s), -1) for s in rows)
            if last >= 0:
                on_chip = self._place((v, q, "out"), kept, q, last)
                self.stats["chunks on chip" if on_chip else "chunks through DDR"] += 1

    def after(self, pos: int) -> None:
        """Free what position ``pos`` used last (its cells point at DDR again)."""
        for key in self.free_at.pop(pos, ()):
            kept, chunk, taken = self.placed.pop(key)
            for index, core, base, nbytes, copy in taken:
                self.arena.give(core, base, nbytes)
                if copy:
                    del kept.pieces.copies[(index, core)]
                else:
                    kept.pieces.cells[index] = kept.home
            if key[0] in self.ahead and key[2] == "w":
                self.regions[kept.tensor] = kept.home


def _ahead(weight_tile: int, L, k: TreeKernel, hw) -> bool:
    """Whether a layer the schedule does not pin loads its weights ahead, for each invocation (on
    the prefetch queues, into pieces over its cores, while earlier invocations run), rather than
    its tiles loading them from DDR when it runs. Its tiles then read the pieces over the mesh:
    worth it where a core gathering its tiles' share (``weight_tile``) over one link takes less
    than DDR takes for all of the layer's weights, the time the direct loads cost when the layer
    runs. On set-edge16 (DDR 16 B/cycle, links 32) always; on set-cloud144 (DDR 147 B/cycle) only
    where a tile holds under a fifth of the weights."""
    if not hw.prefetch_dma or not hw.noc_link_bytes_per_cycle:
        return False
    weights = sum(int(np.prod(k.tensors[L.args[p]][0])) for p, *_ in L.ir.params[:-1] if L.args[p] in k.weights)
    return weight_tile * hw.ddr_bytes_per_cycle < weights * hw.noc_link_bytes_per_cycle


def build_tree_program(k: TreeKernel, hw) -> TreeProgram:
    """The program of a SET schedule (one kernel) and the instruction span of every invocation."""
    sched = k.schedule
    batch = sched.tree.batch
    regions, args, offset = place_arguments(k.inputs, k.outputs, k.tensors, k.stored)
    for L in k.layers:  # intermediates: DDR scratch after the arguments
        t = L.args[L.ir.params[-1][0]]
        if t not in regions:
            regions[t] = Region.whole("ddr", 0, offset, k.tensors[t][0], k.stored[t])
            offset = align(offset + regions[t].nbytes)
    emitter = KernelEmitter(hw, k.name, store_queue=False)  # the second queue loads weights ahead
    for t, r in regions.items():
        emitter.claim(r, ("ddr", t))
    for view in k.views:  # a reshape reads the bytes of what it reshapes (resolved in any order)
        src = view
        while src in k.views:
            src = k.views[src]
        regions[view] = Region.whole("ddr", 0, regions[src].base, k.tensors[view][0], k.stored[view])

    cores = core_of_stripe(hw)
    fps = [footprints(L) for L in k.layers]
    work, last_read = _assign(k, batch, fps)
    deal = {}  # (layer, invocation) -> (tile, core) of each tile it computes, dealt round-robin
    for (v, q), tiles in work.items():
        group = [cores[i] for i in range(*sched.leaves[v].used)]
        deal[(v, q)] = [(t, group[n % len(group)]) for n, t in enumerate(tiles)]
    on_core = [{} for _ in k.layers]
    for (v, _), pairs in deal.items():
        on_core[v].update(pairs)
    tile_cores = [[on_core[v].get(t, -1) for t in fp.tiles] for v, fp in enumerate(fps)]
    keep = _Residency(k, hw, fps, last_read, regions, emitter, tile_cores)
    spans = []
    order = invocation_order(sched.tree)
    for pos, (v, q) in enumerate(order):
        keep.before(v, q)
        if hw.prefetch_dma:  # the next invocations' pins load meanwhile
            for n, ahead in enumerate(order[pos + 1:pos + 1 + PREFETCH_AHEAD]):
                keep.pins(*ahead, prefetch=True, distance=n + 1)
        lo, hi = sched.leaves[v].used
        first = emitter.size
        if (v, q) in deal:
            emitter.layer(k.layers[v], deal[(v, q)], regions)
        spans.append(Span(v, q, first, emitter.size, tuple(cores[i] for i in range(lo, hi))))
        keep.after(pos)
    program = isa.Program(hw.to_dict(), max(offset, ALIGN), tuple(args), (emitter.kernel(),), k.name)
    return TreeProgram(program, tuple(spans), sched, keep.stats)


def _in_parts(ctx, func: str, leaf, cores: tuple[int, ...]) -> tuple:
    """(lowered, LB budget) of PrimFunc ``func`` for a layer the tree plans as ``leaf`` on
    ``cores``: tiled as its intra-layer partition splits it (``tiling.lower_in_parts``: ``pb`` x
    ``pm`` x ``pn`` parts of B, M and N per invocation, or the parts of a vector-only layer), or
    as lowering tiled it for the whole chip, whichever runs alone on those cores in fewer cycles
    (a timing simulation: on few cores, the whole chip's smaller tiles overlap one tile's loads
    with another's product where the partition's one large tile waits for its chunks). Decided
    once per function, partition and cores (a network's repeated blocks share them), and not
    simulated where the two lowerings are one."""
    key = (func, leaf.cost.partition, leaf.invocations, cores)
    if key not in ctx.parted:
        ctx.parted[key] = _lower_in_parts(ctx, func, leaf, cores)
    return ctx.parted[key]


def _lower_in_parts(ctx, func: str, leaf, cores: tuple[int, ...]) -> tuple:
    pb, pm, pn = leaf.cost.partition
    parts = {"B": pb, "M": pm * leaf.invocations, "N": pn, "": pb * pm * pn * leaf.invocations}
    default = ctx.lowered[func]
    try:
        split = lower_in_parts(ctx.funcs[func], ctx.hw, default[1], parts, pb * pm * pn)[0], default[1]
    except Unsupported:
        return default
    if tvm_ffi.structural_equal(split[0], default[0]):
        return default

    def cycles(lowered) -> int:
        return timing_cycles(build_program(lowered[0], ctx.hw, func, lb_bytes=lowered[1], cores=cores))

    try:
        faster = cycles(split) < cycles(default)
    except CodegenError:  # the partition's tiles do not emit (random graph 77: a read leaves its region)
        return default
    return split if faster else default


def _tree_kernel(spec, nodes, ctx) -> TreeKernel:
    """The ``TreeKernel`` of a SET kernel: one ``emit.Layer`` per layer of the plan's layer graph,
    tiled as the tree partitions it (``_in_parts``), the other calls (pure reshapes, not lowered)
    as views."""
    graph, lowered, hw = ctx.graph, ctx.lowered, ctx.hw
    inputs, outputs = graph.boundary(nodes)
    tensors = {t: (graph.tensors[t].shape, graph.tensors[t].dtype) for n in nodes for t in (*n.inputs, n.output)}
    layers, budgets = [], []
    stripes = core_of_stripe(hw)
    for v, lay in enumerate(spec.plan.graph.layers):
        n = graph.nodes[lay.node]
        leaf = spec.plan.schedule.leaves[v]
        func, budget = _in_parts(ctx, n.func, leaf, tuple(stripes[i] for i in range(*leaf.used)))
        layers.append(Layer.of(func, hw, n.name, (*n.inputs, n.output), budget))
        budgets.append(budget)
        why = layers[-1].ir.unplaceable()
        if why:
            raise Unsupported(f"layer {n.name} {why}")
    _neighbour_tiles(spec, layers, budgets, ctx)
    views = {n.output: n.inputs[0] for n in nodes if n.func not in lowered}
    weights = frozenset(t for t in inputs if graph.tensors[t].constant)
    return TreeKernel(spec.name, tuple(layers), views, tuple(inputs), tuple(outputs), tensors, spec.plan.schedule,
                      stored_dtypes([(L.name, L.ir, L.args) for L in layers], hw, views), weights)


NEIGHBOUR_SPLITS = 6  # channel splits tried per neighbour's tiles


def _neighbour_tiles(spec, layers: list, budgets: list, ctx) -> None:
    """Re-tile the layers off the MME over a feature map (poolings, concatenations, elementwise
    layers whose loops are their output's dims) with their neighbours' tiles in view: each, from
    the last, tries the tiles splitting the maps' rows and columns as a producer's or consumer's
    boxes split them, times a few channel splits (the samples split as alone, so that each
    invocation keeps its tiles), and takes the candidate whose estimate (its own compute and
    link time, ``_own_cycles``, and the DMA set-ups of the maps it reads and writes,
    ``_exchange_cycles``) is the lowest among those whose tiles emit alone (random graph 77: a
    pooling's candidate read outside its LB region). ``_in_parts`` chose each layer's tiles
    alone: a pooling split by channels, between convolutions split by rows, made every convolution tile
    gather dozens of small pieces (GoogLeNet's 1 x 1 convolutions read 49 pieces of the
    concatenation before them; docs/set.md). A margin (a candidate taken only where estimated
    30 % cheaper) left GoogLeNet's SET and LS programs on set-cloud144 10-14 % slower."""
    graph, hw = ctx.graph, ctx.hw
    nodes = [graph.nodes[lay.node] for lay in spec.plan.graph.layers]
    leaves = spec.plan.schedule.leaves
    stripes = core_of_stripe(hw)
    cores = [leaves[v].used[1] - leaves[v].used[0] for v in range(len(layers))]
    writer = {L.args[L.ir.params[-1][0]]: v for v, L in enumerate(layers)}
    readers: dict = {}
    for v, L in enumerate(layers):
        for param, *_ in L.ir.params[:-1]:
            readers.setdefault(L.args[param], []).append((v, param))
    fps = [footprints(L) for L in layers]

    def cost(v, L, fp) -> float:
        total = _own_cycles(fp, hw, cores[v])
        for param, *_ in L.ir.params:
            t = L.args[param]
            if t in writer and t in readers:
                w = writer[t]
                users = [(layers[w], layers[w].ir.params[-1][0], (fp if w == v else fps[w]).write, cores[w])]
                users += [(layers[u], p, (fp if u == v else fps[u]).reads[p], cores[u]) for u, p in readers[t]]
                total += _exchange_cycles(hw, tuple(graph.tensors[t].shape), users)
        return total

    for v in reversed(range(len(layers))):
        n, L = nodes[v], layers[v]
        func = ctx.funcs[n.func]
        info = anchor_info(func)
        shape = tuple(graph.tensors[n.output].shape)
        if "M" in info.roles or "N" in info.roles or tuple(info.spatial) != shape or len(shape) < 3:
            continue
        spatial = set()  # tiles of dims 2.. as a neighbour's boxes split them
        for param, *_ in L.ir.params:
            t = L.args[param]
            if len(graph.tensors[t].shape) != len(shape):
                continue
            boxes = [fps[u].reads[p] for u, p in readers.get(t, []) if u != v]
            if t in writer and writer[t] != v:
                boxes.append(fps[writer[t]].write)
            for lo, _ in boxes:
                spatial.add(tuple(max(x for x in range(1, e + 1) if e % x == 0 and x <= -(-e // len(set(lo[:, d].tolist()))))
                                  for d, e in enumerate(shape) if d >= 2))
        own = cost(v, L, fps[v])
        ranked = []  # (estimate, candidate, its footprint, its lowered function)
        samples = int((fps[v].write[1][:, 0] - fps[v].write[0][:, 0]).max())  # as alone: invocations keep their tiles
        for tiles in sorted(spatial):
            parts = int(np.prod([e // x for e, x in zip(shape[2:], tiles)]))
            splits = [x for x in range(1, shape[1] + 1) if shape[1] % x == 0 and parts * x <= 2 * cores[v]]
            for split in splits[:NEIGHBOUR_SPLITS]:
                try:
                    low = lower_kernel(func, hw, budgets[v], parallel=False, clamp=False,
                                       caps=(samples, shape[1] // split, *tiles))[0]
                    cand = Layer.of(low, hw, n.name, (*n.inputs, n.output), budgets[v])
                    if cand.ir.unplaceable():
                        continue
                    fp = footprints(cand)
                except (Unsupported, CodegenError):
                    continue
                c = cost(v, cand, fp)
                if c < own:
                    ranked.append((c, cand, fp, low))
        cores_of = tuple(stripes[i] for i in range(*leaves[v].used))
        for _, cand, fp, low in sorted(ranked, key=lambda r: r[0]):  # stable: ties keep the order tried
            try:
                build_program(low, hw, n.func, lb_bytes=budgets[v], cores=cores_of)
            except CodegenError:
                continue
            layers[v], fps[v] = cand, fp
            break


def _own_cycles(fp, hw, cores: int) -> float:
    """Rough cycles of a vector-only layer's tiles on ``cores``: each moves its boxes over one
    mesh link and runs its stages' iterations on the VME's lanes."""
    nbytes = hw.storage_bytes * sum(int(np.prod(np.maximum(hi - lo, 0), axis=1).sum())
                                    for lo, hi in (fp.write, *fp.reads.values()))
    tiles = len(fp.tiles)
    return -(-tiles // cores) * (fp.work / hw.vme_lanes + nbytes / tiles / hw.noc_link_bytes_per_cycle)


def _exchange_cycles(hw, shape, users) -> float:
    """Cycles of DMA set-ups one feature map's exchange costs the cores of its writer and readers:
    the pieces each one's tile boxes cross (cut by ``_grid`` as ``_Residency`` cuts it, the most
    cores of any user standing for its holders), a DMA each, over its cores. ``users``: (layer,
    param, boxes, cores) of each."""
    size = hw.storage_bytes * int(np.prod(shape))
    holders = max(c for *_, c in users)
    dim, cuts = _grid(shape, [u[:3] for u in users], min(holders, -(-size // _min_piece(hw))), 1)
    return hw.dma_latency_cycles * sum(_crossed(cuts, dim, boxes) / c for _, _, boxes, c in users)


@dataclass(frozen=True)
class Measured:
    """A finalist of a SET kernel simulated in time: the scheme whose search found its tree, the
    evaluator's latency for it, the kernel's simulated cycles (with its launch), DDR bytes and
    joules; ``error``: why it did not lower (then no figures)."""

    scheme: str
    evaluated: float
    cycles: int = 0
    ddr_bytes: int = 0
    joules: float = 0.0
    error: str = ""


class TreeKernels:
    """The generator of ``TreePlan`` kernels over a ``Lowered`` module: all of a SET program's
    layers in one program. Where the plan has rivals, each of its schedules is lowered and
    simulated in time, and the program of least ``E^n * D^m`` is kept (the evaluator ranks trees
    within its error, up to 17 % on ResNet-50's and GoogLeNet's, docs/set.md; the simulator ranks
    the programs themselves); ``OffloadResult.finalists`` records the figures."""

    def __init__(self, ctx):
        self.ctx = ctx

    def __call__(self, spec) -> DSACall:
        ctx, plan = self.ctx, spec.plan
        if not plan.rivals:
            kernel, lowered = self._lower(spec)
        else:
            own = plan.search.finalists[0]
            candidates = [(spec, own.scheme, own.evaluation.latency)] + [
                (replace(spec, plan=replace(plan, schedule=r.schedule, rivals=())), r.scheme, r.latency)
                for r in plan.rivals]
            n, m = plan.objective
            measured, least = [], math.inf
            for candidate, scheme, latency in candidates:
                try:
                    k, low = self._lower(candidate)
                except (Unsupported, CodegenError) as e:
                    if scheme == own.scheme:  # the search's own tree: as without rivals
                        raise
                    measured.append(Measured(scheme, latency, error=str(e)))
                    continue
                measured.append(self._measure(scheme, latency, low))
                cost = measured[-1].joules ** n * measured[-1].cycles ** m
                if cost < least:
                    (spec, kernel, lowered), least = (candidate, k, low), cost
            ctx.result.finalists[spec.name] = tuple(measured)
        ctx.result.dsa.append(spec.name)
        ctx.result.trees[spec.name] = (spec.plan, lowered)
        return DSACall(spec, lowered.program.serialize(), kernel.inputs, kernel.outputs)

    def _lower(self, spec) -> tuple[TreeKernel, TreeProgram]:
        kernel = _tree_kernel(spec, self.ctx.nodes(spec), self.ctx)
        return kernel, build_tree_program(kernel, self.ctx.hw)

    @staticmethod
    def _measure(scheme: str, evaluated: float, lowered: TreeProgram) -> Measured:
        report = simulate(lowered.program, None, mode="timing", check_hazards=False).report
        return Measured(scheme, evaluated, report.cycles, report.ddr_read + report.ddr_write, report.energy_total)
