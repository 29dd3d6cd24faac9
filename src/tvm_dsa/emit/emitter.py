"""Codegen: lowered kernels (TIR after TileForLB, AssignScopes, LowerToDSA) -> DSA instructions.

A ``KernelEmitter`` emits one kernel made of layers (lowered PrimFuncs read into ``kernel_ir``).
The caller deals each layer's tiles to cores and says where each tensor lives (a ``Region``: DDR,
a cluster's GB or a core's LB, possibly a box of the tensor); ``build_program`` is the one-layer
case (every tensor in DDR, the first tile loop's index picks the cluster, tiles round-robin over
its cores), ``stitch.emit_stitched`` the multi-layer one. Chunk loops are iterated in place (from
the second chunk on, mostly as copies of earlier chunks: ``KernelEmitter._chunk_loop``). Every
stage becomes instructions whose box is the stage's loop extents; inner loop coefficients give an
operand's strides, outer ones its base.

Tile buffers are placed by ``plan_lb``: each holds the region its first writer produces in one
iteration (its origin moves with the tile), double-buffered when the LB has room, plus a scratch
area for vector temporaries. Dependency tokens are derived from the memory objects each
instruction touches, including memory a later object reuses, so they are what the data flow
implies.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from dataclasses import dataclass, field, replace

import numpy as np

from tvm_dsa import isa
from tvm_dsa.hardware import Hardware
from tvm_dsa.emit.deps import PIECE, MemoryObjects
from tvm_dsa.emit.placement import Layer, Pieces, Region, row_major
from tvm_dsa.kernel.ir import (
    ALIGN, Access, CodegenError, Const, KernelIR, Loop, Op, Read, Select, Stage, align, chunk_loops, stages_of
)


COPY_SOURCES = 4  # the most recent calls like a layer that it may be a copy of (each try costs)
PERIOD = 8  # the most rounds after which a layer's deal of tiles to cores may repeat (``_emit``)
PROMOTE = "promote"  # layer mark of whole-tensor copies between memories (weight promotion)
FANOUT = 4  # copies a core sends of a box it holds before a copy of it is asked to (``_holder``)


@dataclass(frozen=True)
class _Call:
    """A layer as emitted: where its tensors were and which memory object owned each region, its
    stream positions [start, stop), where its instructions begin among the kernel's own
    (``literal``; None for a recorded copy) and their units, the state of the dependency tracker
    for each object it touched when it first touched it (``before``: writers, readers, ssa) and at
    its end (``after``), its lowest dependency, its cores, its tiles, the exact placement
    (``exact``: a replay needs the same) and the objects it read and wrote."""

    layer: Layer
    placed: dict  # parameter -> Region (None: not placed, an LB-only buffer)
    owners: dict | None  # parameter -> key of the object owning the whole region (None: not one)
    start: int
    stop: int
    literal: int | None
    log: list | None
    before: dict
    after: dict
    low: int
    cores: frozenset
    work: list
    exact: tuple
    read: frozenset  # the objects it read
    written: frozenset  # the objects it wrote

    @functools.cached_property
    def shape(self) -> tuple:
        """Its tiles and cores relative to its first (``_relative``)."""
        return _relative(self.work)


# a tile buffer's state in three parts, each read or written whole: (slot, origin) — set when a
# lifetime starts, read by the buffer's operands —, content (what it was loaded with, read by
# the load that would skip itself), alias (the LB region it reads in place)
_PLACE, _CONTENT, _ALIAS = 1, 2, 3


class _Free:
    """In a run's tile state before it: a part the run does not read before it writes it; after
    it: a part the run does not write."""

    def __repr__(self) -> str:
        return "FREE"


_FREE = _Free()


@dataclass(frozen=True)
class _Miss:
    """A content the run's first load of a buffer found was not ``content``: it loaded."""

    content: tuple


@dataclass
class _Chunking:
    """What ``KernelEmitter._chunk_loop`` copies chunks with while a layer's tiles are recorded:
    where the layer's tensors are, the objects owning them, the runs of chunks copied so far, and
    per core the record of the last run of chunks of its last tile (``_chunk_loop``'s span)."""

    placed: dict
    owners: dict | None
    copies: int = 0
    tiles: dict = field(default_factory=dict)


@dataclass
class _Record:
    """What the emitter notes while a call (or a round of one) is recorded: the unit of each
    instruction pushed, the tracker's state of each object when first touched (writers,
    readers, ssa), the objects read and written, the lowest dependency; and per (core, tile
    buffer, part of its state, ``_PLACE``...) the value the run read before writing it
    (``need``) and the parts it wrote (``wrote``)."""

    low: int
    log: list = field(default_factory=list)
    seen: dict = field(default_factory=dict)
    read: set = field(default_factory=set)
    written: set = field(default_factory=set)
    need: dict = field(default_factory=dict)
    wrote: set = field(default_factory=set)

    def add(self, other: "_Record") -> None:
        """Take in the record of the run that follows."""
        self.log += other.log
        for k, v in other.seen.items():
            self.seen.setdefault(k, v)
        self.read |= other.read
        self.written |= other.written
        self.low = min(self.low, other.low)
        for k, v in other.need.items():
            if k not in self.wrote:
                self.need.setdefault(k, v)
        self.wrote |= other.wrote

    def reads(self, key: tuple, value) -> None:
        """The run reads tile-buffer state ``key`` (core, buffer, part) as ``value``."""
        if key not in self.wrote and key not in self.need:
            self.need[key] = value


class KernelEmitter:
    """Emits one kernel: layers, each over a list of (tile, core), with the regions of its tensors.

    The caller decides which tiles run where and where tensors live (``layer``), and moves whole
    tensors between memories (``move``). Dependency tokens follow from the memory every
    instruction touches, including memory reused by a later tensor or another layer's buffers.

    A layer emitted like an earlier one is not emitted again (``replay``; False emits every
    layer, for tests). Like means the same kernel IR and LB plan over the earlier one's tiles
    and cores translated (``_signature``: the next block of a transformer, the next instance of
    a sub-graph on the cluster's other cores), its tensors' regions of the same shapes wherever
    they are, and nothing in the IR that would tell the translated tiles apart
    (``KernelIR.moves``). Where the dependency tracker's entries for the objects the layer touches
    correspond to the earlier layer's, unit for unit (``_remap``), the layer is recorded as a
    copy (``isa.Replica``): the earlier instructions moved, each dependency where emission would
    put it, in time independent of the layer's size. Otherwise a layer placed exactly like the
    earlier one but for the regions' bases is replayed: the earlier instructions pushed again,
    moved, their dependencies worked out anew, without walking the IR."""

    def __init__(self, hw: Hardware, name: str, replay: bool = True):
        self.hw, self.name, self.replay = hw, name, replay
        self.instructions: list = []  # the kernel's own; the stream also holds the replicas' copies
        self.size = 0  # instructions in the stream so far
        self.literal_at: list = []  # stream position of each of ``instructions``
        self.units: list = []  # the unit of each instruction in the stream (None: not known here)
        self.memory = MemoryObjects()  # the memory objects and the dependency tracker
        self.cores_used: set[int] = set()
        self.on_core: dict = {}  # core -> layer whose tile buffers occupy its LB
        self.origin: dict = {}  # (core, buffer) -> origin indices
        self.slot: dict = {}  # (core, buffer) -> byte offset of the current copy
        self.count: dict = {}  # (core, buffer) -> lifetimes started
        self.alias: dict = {}  # (core, buffer) -> Region the tile buffer reads in place
        self.content: dict = {}  # (core, buffer) -> (parameter, region, box origin) it was loaded with
        self.holders: dict = {}  # (layer, buffer, content) -> {core holding it: copies it has sent}
        self.marks: list = []  # isa.LayerMark per run of instructions of one layer
        self.replicas: list = []  # isa.Replica: parts of the stream run again, moved
        self.copies: list = []  # _Call of each layer recorded as a copy
        self._parts: dict = {}  # (start, stop) -> ``_part`` of a cluster's part
        self.scratch_top = 0
        # signature (``_signature``) -> records of calls to copy or replay: (_Call, tile state
        # before, after (None: not kept), 1 call)
        self.calls: dict = {}
        self.rec: _Record | None = None  # while a call is recorded
        self.chunking: _Chunking | None = None  # while a call's tiles are emitted and recorded (``_emit``)

    def kernel(self) -> isa.Kernel:
        return isa.Kernel(self.name, tuple(sorted(self.cores_used)), tuple(self.instructions), tuple(self.marks),
                          tuple(self.replicas))

    def _mark(self, name: str, shape) -> None:
        """The instructions from here on compute layer ``name`` (for reports and traces)."""
        first = self.size
        if self.marks and self.marks[-1].first == first:
            self.marks.pop()  # the previous mark got no instructions
        if not self.marks or self.marks[-1].name != name:
            self.marks.append(isa.LayerMark(first, name, tuple(shape)))

    # -- memory objects --------------------------------------------------------------------------
    def claim(self, region: Region, key, ssa: bool = True, pieces: tuple[int, int] | None = None) -> None:
        """``key`` (a tensor's region) now owns its bytes (``MemoryObjects.claim``; ``pieces``
        (dim, width): its slices along ``dim`` are objects of their own, each written by its own
        transfer, ``move``)."""
        self.memory.claim(region, key, ssa, pieces)

    def _enter(self, layer: Layer, core: int, lb_base: int) -> None:
        """Put ``layer``'s tile buffers and scratch into ``core``'s LB (after ``lb_base``)."""
        if self.on_core.get(core) == (layer.name, lb_base):
            return
        self.on_core[core] = (layer.name, lb_base)
        for b in layer.plan.buffers.values():
            for s in b.slots:
                self.claim(Region.whole("lb", core, lb_base + s, (b.nbytes,), "int8"),
                           ("lb", core, layer.name, b.name, s), ssa=False)
        if layer.plan.scratch_bytes:
            self.claim(Region.whole("lb", core, lb_base + layer.plan.scratch_offset,
                                    (layer.plan.scratch_bytes,), "int8"), ("scratch", core, layer.name), ssa=False)
        for b in layer.plan.buffers:
            for table in (self.count, self.slot, self.origin):
                table.pop((core, b), None)
        self.alias = {k: r for k, r in self.alias.items() if k[0] != core}
        self.content = {k: c for k, c in self.content.items() if k[0] != core}

    def move(self, src: Region, dst: Region, core: int) -> None:
        """Copy the box of ``dst`` from ``src`` (the same box or one holding it) to another memory,
        e.g. a weight promotion DDR -> GB; one transfer per piece, in order, where ``dst`` was
        claimed in pieces."""
        self.cores_used.add(core)
        self._mark(PROMOTE, ())
        boxes = [(dst.origin, dst.extents)]
        key = self.memory.spaces[(dst.mem, dst.index)].whole_owner(dst.base, dst.base + dst.nbytes)
        if key in self.memory.pieced:
            dim, width = self.memory.pieced[key][:2]
            boxes = [(tuple(o + (j if d == dim else 0) for d, o in enumerate(dst.origin)),
                      tuple(min(width, e - j) if d == dim else e for d, e in enumerate(dst.extents)))
                     for j in range(0, dst.extents[dim], width)]
        for origin, extents in boxes:
            self._push(isa.Dma(core, extents, _whole_operand(dst, origin), _whole_operand(src, origin)), core)

    def replicate(self, start: int, stop: int, cores: int, cluster: int, ddr_shift: dict) -> bool:
        """Record that stream positions [start, stop) — one cluster's part of a kernel — run again
        for the cluster ``cluster`` whose part is the same translated: cores moved by ``cores``,
        its own GB, each DDR object (keyed as when claimed) moved by ``ddr_shift[key]`` bytes
        (``isa.Replica``, at the end of the stream). False (nothing recorded) when the part
        depends on instructions outside it, touches DDR objects ``ddr_shift`` does not name, or
        objects whose DDR ranges overlap. What the copy runs is what emitting the cluster would
        give, without the false dependencies emission adds between clusters' disjoint pieces of
        one DDR tensor."""
        part = self._parts.get((start, stop))
        if part is None:  # worked out once per part
            part = self._parts[(start, stop)] = self._part(start, stop)
        low, keys, places, cores_of = part
        if low < start or not keys <= set(ddr_shift):
            return False
        ddr = sorted((*self.memory.claimed[key][2:], key) for key in keys)
        if any(b[0] < a[1] for a, b in itertools.pairwise(ddr)):
            return False
        moves = [(mem, index, 0, self.hw.gb_bytes, cluster, 0) for mem, index in sorted(places) if mem == "gb"]
        moves += [("ddr", 0, lo, hi, 0, ddr_shift[key]) for lo, hi, key in ddr]
        at = self.size
        self.replicas.append(isa.Replica(start, stop, at, cores, tuple(moves)))
        # the copy's layer marks, each where its run begins in the copy (``_mark`` puts it at ``size``)
        for m in [m for m in self.marks if m.first <= start][-1:] + [m for m in self.marks if start < m.first < stop]:
            self.size = at + max(m.first, start) - start
            self._mark(m.name, m.shape)
        self.size = at + stop - start
        self.units += [None] * (stop - start)
        self.cores_used.update(c + cores for c in cores_of)
        return True

    def _part(self, start: int, stop: int) -> tuple:
        """(lowest dependency, DDR objects touched, (mem, index) touched, cores) of stream
        positions [start, stop)."""
        low, keys, places, cores = stop, set(), set(), set()
        ddr = self.memory.spaces.get(("ddr", 0))
        lo, hi = bisect.bisect_left(self.literal_at, start), bisect.bisect_left(self.literal_at, stop)
        for ins in self.instructions[lo:hi]:
            if ins.deps:
                low = min(low, ins.deps[0])  # deps are sorted
            srcs, dst = isa.operands(ins)
            for o in (dst, *srcs):
                if isinstance(o, isa.Operand):
                    places.add((o.mem, o.index))
                    if o.mem == "ddr":
                        keys.add(ddr.owner(o.offset))
            cores.add(ins.core)
        for call in self.copies:
            if start <= call.start and call.stop <= stop:
                low = min(low, call.low)
                for key in call.before:
                    key = key[1] if key[0] == PIECE else key
                    mem, index = self.memory.claimed[key][:2]
                    places.add((mem, index))
                    if mem == "ddr":
                        keys.add(key)
                cores |= call.cores
        return low, keys, places, cores

    def layer(self, layer: Layer, work, regions: dict, lb_base: int = 0) -> None:
        """Emit ``layer``'s tiles: ``work`` is a list of (tile loop values, core); ``regions``
        maps each parameter's tensor to where it lives for these tiles."""
        self._mark(layer.name, layer.ir.params[-1][1])
        if layer.ir.clamped:
            self._written_twice(regions.get(layer.args.get(layer.ir.params[-1][0])))
        sig = self._signature(layer, work, regions, lb_base)
        if sig is None:
            return self._emit(layer, work, regions, lb_base)
        sig, exact = sig
        placed = {p: regions.get(layer.args.get(p)) for p, *_ in layer.ir.params}
        owners = self._owners(placed)
        held = any(self.on_core.get(core) == (layer.name, lb_base) for _, core in work)
        for _, core in work:
            self.cores_used.add(core)
            self._enter(layer, core, lb_base)
        earlier = [r for r in self.calls.get(sig, ()) if (r[0].layer.ir, r[0].layer.plan) == (layer.ir, layer.plan)]
        for record in earlier[:-1 - COPY_SOURCES:-1]:
            copied = self._copy_run(record, layer, work, placed, owners, exact)
            if copied:
                self.calls[sig].append((*copied, 1))
                return
        start, literal, copies = self.size, len(self.instructions), len(self.copies)
        first, state = literal, self._tile_state(layer, work)
        rec = self.rec = _Record(start)
        source = None if held else next((r[0] for r in reversed(earlier) if r[0].literal is not None
                                         and r[0].exact == exact), None)
        if source is not None:  # the tile buffers' state is left behind: a later call re-enters
            self._replay(source, layer, work, regions, lb_base)
        elif not self._emit(layer, work, regions, lb_base, placed, owners):
            literal = None  # some rounds are copies: nothing to replay from
        cores = frozenset(ins.core for ins in self.instructions[first:]).union(
            *(copy.cores for copy in self.copies[copies:]))
        call = self._recorded(rec, layer, placed, owners, start, literal, cores, work, exact)
        # a replay reads no tile state and leaves none behind: it holds for the state it began with
        self.calls.setdefault(sig, []).append((call, state, None, 1) if source else (call, *self._run_states(rec, state), 1))
        self.rec = None

    def _written_twice(self, target) -> None:
        """The objects holding ``target``, the output of a layer whose tiles overlap
        (``ClampTiles``), are no longer written once per element: a write of them waits for the
        other units' writes (the overlapping rows hold the same values; the order is for the
        dependency checks). Where the tiles that share rows run on one core its in-order queue
        would do, but the tokens cost nothing and the stores they order finish one after another
        rather than sharing the bandwidth: graphturbo ViT-B/16's first two blocks at batch 8 took
        3,878,332 cycles so, 4,137,478 with those outputs written once."""
        regions = target.cells.values() if isinstance(target, Pieces) else [target] if target else []
        for r in regions:
            key = self.memory.owner(r)
            if key is None:
                raise CodegenError(f"{r.mem}[{r.index}] offset {r.base}: the output of overlapping tiles "
                                   "is not one object")
            self.memory.written_again(key)

    def _signature(self, layer: Layer, work, regions: dict, lb_base: int):
        """(what emitting ``layer`` depends on up to translating its tiles and cores and moving its
        tensors' regions, but for what its cores' tile buffers hold (``_tile_state``); the tiles,
        cores and regions' places and origins themselves). None where it depends on more, which
        a copy or replay would not reproduce: a tensor in pieces, a mesh's multicast of tiles
        between cores."""
        if not self.replay or self.hw.interconnect == "mesh":
            return None
        shapes, places, first = [], [], {}
        for p, *_ in layer.ir.params:
            tensor = layer.args.get(p)
            r = regions.get(tensor)
            if isinstance(r, Pieces):
                return None
            shapes.append((first.setdefault(tensor, len(first)), r and (r.mem, r.extents, r.dtype)))
            places.append(r and (r.index, r.origin))
        return (lb_base, _relative(work), tuple(shapes)), (tuple((tuple(v), core) for v, core in work), tuple(places))

    def _owners(self, placed: dict) -> dict | None:
        """The key of the object owning each placed region whole; None if one is not owned so."""
        out = {}
        for p, r in placed.items():
            if r is not None:
                found = self.memory.owner(r)
                if found is None:
                    return None
                out[p] = found
        return out

    def _as_copy(self, call: _Call, layer: Layer, work, placed: dict, owners: dict | None, exact,
                 swap: dict | None = None) -> _Call | None:
        """Record ``layer`` as a copy of ``call`` (``isa.Replica``) if the copy waits for all
        that emitting the layer would wait for: ``call``'s tiles translate to ``layer``'s
        (``_translation``); every object ``call`` touched maps to one the layer touches (its
        tensors' objects, its own tile buffers and scratch on the cores moved alike), one to one;
        and the tracker's entries for them correspond (``_remap``). The tracker then takes
        ``call``'s end state, moved. None if not."""
        if owners is None or call.owners is None:
            return None
        moved = self._translation(call, layer, work, placed, swap)
        if moved is None:
            return None
        cores, moves, shifts = moved
        swap = swap or {}
        keys: dict = {}
        for p, key in call.owners.items():
            if keys.setdefault(key, owners[p]) != owners[p]:
                return None
        old, new = call.layer.name, layer.name
        for key in call.before:
            if key not in keys:
                if key[0] == PIECE:
                    keys[key] = self._moved_piece(call, key, keys, shifts)
                    if keys[key] is None:
                        return None
                    continue
                if key[0] not in ("lb", "scratch") or key[2] != old:
                    return None
                keys[key] = (key[0], key[1] + cores, new, *key[3:-1], swap.get(key[-1], key[-1])) \
                    if key[0] == "lb" else (key[0], key[1] + cores, new)
        if len(set(keys.values())) != len(keys):
            return None
        clusters = (call.work[0][1] + cores) // self.hw.cores_per_cluster - call.work[0][1] // self.hw.cores_per_cluster

        def unit(u):
            return u and (u[0], u[1] + (clusters if u[0] == "cdma" else cores))

        if not cores and not clusters:
            unit = _same
        shift = self.size - call.start
        remap = self._remap(call, keys, unit, shift)
        if remap is None:
            return None
        writers, readers = self.memory.deps.writers, self.memory.deps.readers
        self.replicas.append(isa.Replica(call.start, call.stop, self.size, cores, tuple(
            (mem, index, lo, hi, to, by) for (mem, index), ranges in sorted(moves.items())
            for lo, hi, to, by in ranges if by or (to != index and mem != "lb") or (mem == "lb" and to != index + cores)),
            tuple(sorted((q, p) for q, p in remap.items() if p != q + shift))))
        # the tracker as the copy's instructions see it, before and after them: entries moved as
        # their dependencies were (remapped, or shifted inside the copy); the readers of an object
        # the copy only reads are the tracker's, with the copy's reads
        before, after = {}, {}
        for key, (w, r, is_ssa) in call.before.items():
            k, waits = keys[key], _waits(call, key, is_ssa)
            b, a = [], []
            for table, old, end in ((writers, w, call.after[key][0]), (readers, r, call.after[key][1])):
                if waits[0] <= len(b) < waits[1]:  # waited for: as the copy's dependencies moved
                    b.append({unit(u): remap[i] for u, i in old.items()})
                    a.append({unit(u): i + shift if i >= call.start else remap[i] for u, i in end.items()})
                else:  # not waited for: the tracker's, with what the copy adds
                    b.append(dict(table.get(k) or {}))
                    a.append({**b[-1], **{unit(u): i + shift for u, i in end.items() if i >= call.start}})
            before[k], after[k] = (*b, is_ssa), a
        for k, (w, r) in after.items():
            writers[k], readers[k] = dict(w), dict(r)
        copy = _Call(layer, placed, owners, self.size, call.stop + shift, None, None, before, after,
                     min(remap.values(), default=self.size), frozenset(c + cores for c in call.cores), work, exact,
                     frozenset(keys[k] for k in call.read), frozenset(keys[k] for k in call.written))
        self.copies.append(copy)
        units = self.units[call.start:call.stop]
        if unit is not _same:  # a few distinct units, many instructions: map each unit once
            units = map({u: unit(u) for u in set(units)}.__getitem__, units)
        self.units += units
        self.size = copy.stop
        self.cores_used |= copy.cores
        return copy

    def _moved_piece(self, call: _Call, key, keys: dict, shifts: dict):
        """The piece of the object ``keys`` maps ``key``'s object to that a copy of ``call`` touches
        instead of the piece ``key`` (the accesses moved by ``shifts`` along the pieces' dim, by
        whole pieces); None where there is no such piece."""
        _, obj, j = key
        target = keys.get(obj)
        params = [p for p, k in call.owners.items() if k == obj]
        if not params or target not in self.memory.pieced or self.memory.pieced[target][:2] != self.memory.pieced.get(obj, ())[:2]:
            return None
        dim, width = self.memory.pieced[obj][:2]
        moved, rest = divmod(shifts[params[0]][dim], width)
        n = len(self.memory.objects(target))
        return (PIECE, target, j + moved) if not rest and 0 <= j + moved < n else None

    def _translation(self, call: _Call, layer: Layer, work, placed: dict, swap: dict | None = None):
        """(cores moved, (mem, index) -> sorted [(lo, hi, to_index, shift)]: where each byte range
        of ``call``'s regions goes, param -> how far its accesses move in its region, per dim)
        taking ``call``'s instructions to ``layer``'s over ``work``, the same tiles and cores
        translated (``_signature``): each region in the memory of the moved cores, the offset of
        an access in it moved by how far the access moves (``KernelIR.moves``) less how far the
        region's box does; each tile buffer copy at an offset ``swap`` lists to the offset it
        gives. (That the moved tiles stay in their regions is what planning the regions made
        sure of.) None where that does not hold or two ranges in one place would move
        differently."""
        cores, accesses = _moved(layer, call.work, work)
        cpc = self.hw.cores_per_cluster
        clusters = {(c + cores) // cpc - c // cpc for _, c in call.work}
        if len(clusters) != 1 or accesses is None:
            return None
        clusters = clusters.pop()
        moves: dict = {}
        shifts: dict = {}
        for p, a in call.placed.items():
            if a is None:
                continue
            b = placed[p]
            to = a.index + (cores if a.mem == "lb" else clusters if a.mem == "gb" else 0)
            moved = accesses.get(p, (0,) * len(a.origin))
            box = tuple(y - x for x, y in zip(a.origin, b.origin))
            shifts[p] = tuple(m - o for m, o in zip(moved, box))
            if b.index != to:
                return None
            by = b.base - a.base + isa.DTYPES[a.dtype] * sum(
                (m - o) * st for m, o, st in zip(moved, box, row_major(a.extents)))
            moves.setdefault((a.mem, a.index), []).append((a.base, a.base + a.nbytes, to, by))
        for c in dict.fromkeys(c for _, c in call.work) if swap else ():
            for s, t in swap.items():  # the two copies of a double-buffered place trade places
                moves.setdefault(("lb", c), []).append((self.lb_base + s, self.lb_base + s + abs(t - s), c + cores, t - s))
        for ranges in moves.values():
            ranges.sort()
            if any(y[0] < x[1] and y[2:] != x[2:] for x, y in itertools.pairwise(ranges)):
                return None
        return cores, moves, shifts

    def _remap(self, call: _Call, keys: dict, unit, shift: int) -> dict | None:
        """Where each dependency of ``call`` on an instruction before it goes in a copy ``shift``
        positions on (old position -> new): to what emission would wait for instead, read off
        the tracker's entries for the objects ``keys`` maps ``call``'s to, unit by unit (``unit``
        maps ``call``'s units to the copy's) — the latest of them where one instruction stands
        for several (waiting for the later instruction of a unit waits for the earlier); else
        ``shift`` on when that position runs on the mapped unit. Only the entries ``call``'s
        instructions wait for count (``_waits``). None where the entries differ in their units,
        an object's ssa-ness differs, or a dependency has no place."""
        writers, readers, ssa = self.memory.deps.writers, self.memory.deps.readers, self.memory.deps.ssa
        need: dict = {}  # old position -> latest position emission waits for instead
        units: dict = {}  # old position -> the copy's unit for it
        for key, (w, r, is_ssa) in call.before.items():
            k = keys[key]
            if (k in ssa) != is_ssa:
                return None
            waits = _waits(call, key, is_ssa)
            for old, now in [(w, writers.get(k) or {}), (r, readers.get(k) or {})][slice(*waits)]:
                mapped = old if unit is _same else {unit(u): i for u, i in old.items()}
                if any(u not in mapped for u in now):
                    return None  # emission would wait for a unit the copy does not
                for u, i in mapped.items():
                    units[i] = u
                    if u in now:
                        need[i] = max(need.get(i, -1), now[u])
        out, n = {}, len(self.units)
        for i, u in units.items():
            p = need.get(i)
            if p is None:
                p = i + shift
                if p >= n or self.units[p] != u:
                    return None
            out[i] = p
        return out

    def _replay(self, call: _Call, layer: Layer, work, regions: dict, lb_base: int) -> None:
        """Emit ``layer`` as ``call``'s instructions, each operand in one of ``call``'s tensor
        regions moved to the same place in ``layer``'s, the rest (tile buffers, scratch) kept."""
        moved = self._translation(call, layer, work, {p: regions.get(layer.args.get(p)) for p in call.placed})
        if moved is None:
            return self._emit(layer, work, regions, lb_base)  # two tensors at once in one place
        moves = moved[1]

        def move(o):
            if not isinstance(o, isa.Operand):
                return o
            for lo, hi, _, shift in moves.get((o.mem, o.index), ()):
                if lo <= o.offset < hi:
                    return isa.replaced(o, offset=o.offset + shift) if shift else o
            return o

        for _, core in work:
            self.cores_used.add(core)
            self._enter(layer, core, lb_base)
        n = call.stop - call.start
        for ins, unit in zip(self.instructions[call.literal:call.literal + n], call.log):
            self.cores_used.add(ins.core)
            self._push(isa.moved(ins, move), ins.core, unit)
        for _, core in work:
            self.on_core[core] = None  # a later call of this layer re-enters: nothing carried over

    def _emit(self, layer: Layer, work, regions: dict, lb_base: int, placed=None, owners=None) -> bool:
        """Emit ``layer``'s tiles, round by round (``_rounds``). A tile's trailing stores wait in
        the core's DMA queue behind its next tile's leading loads (``_store_split``): the loads
        then run while the tile's product and epilogue do, not after its stores. While the layer
        is recorded (a call of ``layer``: ``placed``, ``owners``), rounds whose tiles are earlier
        rounds' of the call translated, the tile buffers in the same state translated and the
        same stores held back (``_held``), are recorded as a copy of them (``_copy_run``) where
        the dependencies allow: of one of the last two rounds, of the whole run of rounds
        since the last emitted one (so a regular layer takes a number of copies logarithmic in
        its rounds), or of the last few rounds emitted since the last copy, up to ``PERIOD``
        (tiles dealt in turn repeat every few rounds: ViT-B/16's attention scores, 5 token
        tiles a head on 4 cores, every 5). False if a round or a chunk was copied."""
        self.cur, self.regions, self.lb_base = layer, regions, lb_base
        self.views: dict = {}  # (id(access), aliased region) -> _view
        self.aliasable = _aliasable(layer.ir)
        self.lb_strides = {n: row_major(b.extents) for n, b in layer.plan.buffers.items()}
        self.env = [0] * layer.ir.slots
        tile_loops = layer.ir.tile_loops()
        body = tile_loops[-1].body
        split = _store_split(body, layer.plan)
        self.held: dict = {}  # core -> loop values of its last tile, whose stores are held back
        held_of: dict = {}  # id(a record's _Call) -> ``_held`` of its run when it began
        recorded = self.rec is not None and placed is not None
        self.chunking = _Chunking(placed, owners) if recorded else None
        parts = _rounds(work) if recorded else [work]
        # records of rounds so far: (_Call, tile state before, after, rounds); the last run of
        # them as one (``span``: copied whole, it doubles), the latest copy of each length (the
        # rest of a layer too short for the span), the last two single rounds, and the emitted
        # rounds since the last copy (``emitted``: the last few of them, joined, repeat with a
        # period of that many rounds)
        span, runs, singles, emitted = None, {}, [], []
        literal, i = True, 0

        def repeats(n):
            """Whether the next ``n`` rounds are the last ``n`` emitted ones translated."""
            return i + n <= len(parts) and \
                _relative([x for r in emitted[-n:] for x in r[0].work]) == _relative(sum(parts[i:i + n], []))

        def run_of(records):
            """Consecutive records as one; the held stores of each core's first tile in them."""
            out = functools.reduce(_joined, records)
            held_of[id(out[0])] = {c: h for r in reversed(records) for c, h in held_of[id(r[0])].items()}
            return out

        while i < len(parts):
            sources = ([span] if span and span[3] > 1 else []) + [runs[n] for n in sorted(runs, reverse=True)] \
                + [run_of(emitted[-n:]) for n in range(min(len(emitted), PERIOD), 1, -1) if repeats(n)] \
                + singles[::-1] if recorded else []
            for part in parts[i:i + max((r[3] for r in sources), default=1)]:
                for _, core in part:
                    self.cores_used.add(core)
                    self._enter(layer, core, lb_base)
            if recorded:
                copy = None
                for record in sources:
                    n = record[3]
                    run = [x for part in parts[i:i + n] for x in part]
                    if i + n <= len(parts) and record[2] is not None and \
                            _relative_held(held_of[id(record[0])], record[0].work) == \
                            _relative_held(self._held(run), run):
                        copy = self._copy_run(record, layer, run, placed, owners, ())
                        if copy:
                            break
                if copy:
                    copy = (*copy, n)
                    held_of[id(copy[0])] = self._held(run)
                    if split:  # the copy held back the stores of each core's last tile in it
                        self.held.update((core, values) for values, core in run)
                    if n == 1:
                        singles = singles[-1:] + [copy]
                    else:
                        runs[n] = copy
                    if span and span[0].stop == copy[0].start:
                        joined = _joined(span, copy)
                        held_of[id(joined[0])] = {**held_of[id(copy[0])], **held_of[id(span[0])]}
                        span = joined
                    else:
                        span = copy
                    literal, i, emitted = False, i + n, []
                    continue
                outer, self.rec = self.rec, _Record(self.size)
                start, first, state = self.size, len(self.instructions), self._tile_state(layer, parts[i])
                held = self._held(parts[i])
            for values, core in parts[i]:
                for lp, v in zip(tile_loops, values):
                    self.env[lp.slot] = v
                if split is None:
                    self._nodes(body, core)
                    continue
                chunks, k, j = split
                if chunks is None:
                    self._nodes(body[:k], core)
                    self._release(core, tile_loops, body[j:])
                    self._nodes(body[k:j], core)
                else:  # the first chunk's loads lead
                    self.env[chunks.slot] = 0
                    self._nodes(chunks.body[:k], core)
                    self._release(core, tile_loops, body[j:])
                    self._nodes(chunks.body[k:], core)
                    self._chunk_loop(chunks, 1, core)
                    self._nodes(body[1:j], core)
                self.held[core] = values
            if recorded:
                cores = frozenset(ins.core for ins in self.instructions[first:])
                span = (self._recorded(self.rec, layer, placed, owners, start, first, cores, parts[i], ()),
                        *self._run_states(self.rec, state), 1)
                held_of[id(span[0])] = held
                singles = singles[-1:] + [span]
                emitted.append(span)
                outer.add(self.rec)
                self.rec = outer
            i += 1
        if split:
            for core in list(self.held):
                self._release(core, tile_loops, body[split[2]:])
        return literal and not (recorded and self.chunking.copies)

    def _chunk_loop(self, loop: Loop, first: int, core: int) -> None:
        """Emit the chunks ``first``.. of the current tile's chunk loop on ``core``. While the
        layer's tiles are recorded (``_emit``), a run of chunks from the second on that is an
        earlier run of them moved — along the reduction, or to this tile — is recorded as a copy
        of it (``_copy_run``: the loads' boxes moved, the same LB places or the two copies of each
        double-buffered one traded): of the last run of the core's previous tile (as many chunks
        as are left), else of the whole run since the last emitted chunk, which then doubles,
        else of the latest copy of each length (the rest of the loop too short for the run), else
        of the last emitted chunk. The pass that folds the zero-init is like no other: never a
        source or a copy. ViT-B/16's FFN2 tile has 96 chunks of three instructions: all were
        emitted; now they are one copy, or 11 on a core's first tile."""
        chunking = self.chunking
        if chunking is None:
            for v in range(first, loop.extent):
                self.env[loop.slot] = v
                self._nodes(loop.body, core)
            return
        layer = self.cur
        values = tuple(self.env[lp.slot] for lp in layer.ir.tile_loops())
        if first == 0:  # the pass that folds the zero-init: like no other
            self.env[loop.slot] = 0
            self._nodes(loop.body, core)
            first = 1
        # records (``_copy_run``'s) of the run since the last emitted chunk, of the latest copy of
        # each length, of the last emitted chunk, and of the core's previous tile's last run
        span, runs, last = None, {}, None
        previous = chunking.tiles.get(core)
        v = first
        while v < loop.extent:
            copy = None
            for record in ([previous] if previous and v + previous[3] == loop.extent else []) \
                    + ([span] if span and span[3] > 1 else []) \
                    + [runs[n] for n in sorted(runs, reverse=True)] + ([last] if last else []):
                n = record[3]
                if v + n <= loop.extent:
                    copy = self._copy_run(record, layer, [(values + (v + j,), core) for j in range(n)],
                                          chunking.placed, chunking.owners, ())
                    if copy:
                        break
            if copy:
                copy = (*copy, n)
                chunking.copies += 1
                runs[n] = copy
                span = _joined(span, copy) if span and span[0].stop == copy[0].start else copy
                v += n
                continue
            work = [(values + (v,), core)]
            self.env[loop.slot] = v
            outer, self.rec = self.rec, _Record(self.size)
            start, literal, state = self.size, len(self.instructions), self._tile_state(layer, work)
            self._nodes(loop.body, core)
            last = span = (self._recorded(self.rec, layer, chunking.placed, chunking.owners, start, literal,
                                          frozenset({core}), work, ()), *self._run_states(self.rec, state), 1)
            outer.add(self.rec)
            self.rec = outer
            v += 1
        if span:
            chunking.tiles[core] = span

    def _release(self, core: int, tile_loops, stores) -> None:
        """Emit the ``stores`` held back from ``core``'s last tile, if any."""
        values = self.held.pop(core, None)
        if values is None:
            return
        now = [self.env[lp.slot] for lp in tile_loops]
        for lp, v in zip(tile_loops, values):
            self.env[lp.slot] = v
        self._nodes(stores, core)
        for lp, v in zip(tile_loops, now):
            self.env[lp.slot] = v

    def _held(self, run) -> dict:
        """Per core of ``run`` (tiles, cores), in order of first appearance: the loop values of
        the tile whose stores it holds back as the run begins, less those of its first tile in
        the run (None: it holds none). A copy of a run holds back and releases what the run did
        only where these agree."""
        out: dict = {}
        for values, core in run:
            if core not in out:
                h = self.held.get(core)
                out[core] = None if h is None else tuple(a - b for a, b in zip(h, values))
        return out

    def _recorded(self, rec: _Record, layer: Layer, placed, owners, start: int, literal, cores, work, exact) -> _Call:
        """The ``_Call`` of the run recorded in ``rec`` from stream position ``start`` to here."""
        writers, readers = self.memory.deps.writers, self.memory.deps.readers
        after = {k: (dict(writers.get(k) or {}), dict(readers.get(k) or {})) for k in rec.seen}
        return _Call(layer, placed, owners, start, self.size, literal, rec.log if literal is not None else None,
                     rec.seen, after, rec.low, cores, work, exact, frozenset(rec.read), frozenset(rec.written))

    def _tile_state(self, layer: Layer, work) -> dict:
        """Per (core, tile buffer of ``layer``) of the cores in ``work``: (lifetimes started,
        (slot, origin), content, alias) — what emitting a tile reads besides the tile itself."""
        return {key: self._state_of(key) for key in itertools.product(dict.fromkeys(c for _, c in work),
                                                                      layer.plan.buffers)}

    def _state_of(self, key: tuple) -> tuple:
        return (self.count.get(key, 0), (self.slot.get(key), self.origin.get(key)), self.content.get(key),
                self.alias.get(key))

    def _run_states(self, rec: _Record, start: dict) -> tuple[dict, dict]:
        """The tile state a recorded run (``rec``) needs before it, and the state it leaves: its
        state when it began (``start``) with the parts it did not read before writing them
        ``_FREE`` (a first load that missed needs only a miss, ``_Miss``), and the state now with
        the parts it did not write ``_FREE``. Lifetime counts are kept whole: the slots follow
        them."""
        before, after = {}, {}
        for key, state in start.items():
            now = self._state_of(key)
            before[key] = (state[0], *(rec.need.get((*key, part), _FREE) for part in (_PLACE, _CONTENT, _ALIAS)))
            after[key] = (now[0], *(now[part] if (*key, part) in rec.wrote else _FREE
                                    for part in (_PLACE, _CONTENT, _ALIAS)))
        return before, after

    def _copy_run(self, record, layer: Layer, work, placed: dict, owners, exact):
        """Record ``layer``'s tiles ``work`` (a call of it, or rounds of one) as a copy of an
        earlier run of it (``record``: its ``_Call``, tile state before and after, rounds) when
        the tiles and cores are the run's translated, the tile buffers now in the run's state
        before it translated alike (the same slots, or the other copy of each double-buffered
        place where lifetimes started an odd number of times since: the copy trades the two
        copies' places, so a layer's rounds are copies from the fourth on, not the fifth;
        contents and aliases in the regions that took the run's regions' place) and
        ``_as_copy`` agrees. The tile buffers then take the run's state after it, translated
        (or, after a replayed run, whose state was not kept, are entered anew by the next
        call), and (the copy's ``_Call``, tile state before and after) is returned. None if
        not."""
        call, before, after, _ = record
        if len(call.work) != len(work) or call.shape != _relative(work):
            return None
        cores, moved = _moved(layer, call.work, work)
        if moved is None:
            return None
        regions = {a: placed[p] for p, a in call.placed.items() if a is not None}

        def translated(buffer, part, value):
            if value is _FREE or value is None:
                return value
            if part == _PLACE:
                slot, origin = value
                return swap.get(slot, slot), origin if origin is None else _plus(origin, moved.get(buffer))
            if part == _ALIAS:
                return regions.get(value, value)
            if isinstance(value, _Miss):
                return _Miss(translated(buffer, part, value.content))
            return value[0], regions.get(value[1], value[1]), tuple(_plus(value[2], moved.get(value[0])))

        now = self._tile_state(layer, work)
        swap: dict = {}  # offset of a tile buffer's copy in the run -> of the one it is now
        for (core, b), state in before.items():
            slots = layer.plan.buffers[b].slots
            odd = (now[(core + cores, b)][0] - state[0]) % len(slots)  # lifetimes started since
            for s, t in zip(slots, slots[::-1] if odd else slots):
                if swap.setdefault(s, t) != t:
                    return None  # buffers sharing a place, out of step
        swap = {s: t for s, t in swap.items() if s != t}
        moved_before = {}
        for (core, b), state in before.items():
            key = (core + cores, b)
            cur = now[key]
            need = [cur[0], _FREE, _FREE, _FREE]
            for part in (_PLACE, _CONTENT, _ALIAS):
                if state[part] is not _FREE:
                    value = need[part] = translated(b, part, state[part])
                    if (cur[part] == value.content) if isinstance(value, _Miss) else cur[part] != value:
                        return None
            moved_before[key] = tuple(need)
        copy = self._as_copy(call, layer, work, placed, owners, exact, swap)
        if copy is None:
            return None
        moved_after = None
        if after is None:
            for _, core in work:
                self.on_core[core] = None
        else:
            moved_after = {}
            for (core, b), state in after.items():
                key = (core + cores, b)
                end = [now[key][0] + state[0] - before[(core, b)][0], _FREE, _FREE, _FREE]
                self.count[key] = end[0]
                for part, tables in ((_PLACE, (self.slot, self.origin)), (_CONTENT, (self.content,)),
                                     (_ALIAS, (self.alias,))):
                    if state[part] is _FREE:
                        continue
                    value = end[part] = translated(b, part, state[part])
                    for table, v in zip(tables, value if part == _PLACE else (value,)):
                        if v is None:
                            table.pop(key, None)
                        else:
                            table[key] = v
                moved_after[key] = tuple(end)
        if self.rec is not None:  # a run of rounds inside a recorded call
            self.rec.add(_Record(copy.low, [None] * (copy.stop - copy.start), copy.before, set(copy.read),
                                 set(copy.written),
                                 {(*k, part): v for k, st in moved_before.items() for part, v in enumerate(st) if part
                                  and v is not _FREE},
                                 {(*k, part) for k, st in (moved_after or moved_before).items()
                                  for part, v in enumerate(st) if part and (moved_after is None or v is not _FREE)}))
        return copy, moved_before, moved_after

    def _nodes(self, nodes, core) -> None:
        for n in nodes:
            if isinstance(n, Loop) and n.kind == "chunk":
                self._chunk_loop(n, 0, core)
            elif isinstance(n, Loop):
                for v in range(n.extent):
                    self.env[n.slot] = v
                    self._nodes(n.body, core)
            elif all(b.holds(self.env) for b in n.guard):
                self._stage(n, core)

    # -- operands --------------------------------------------------------------------------------
    def _operand(self, stage: Stage, acc: Access, core: int, start=None, extent=None,
                 piece: Region | None = None) -> isa.Operand:
        """Operand of ``acc`` over the stage's box, or over the sub-box [start, start + extent);
        ``piece``: the region of a ``Pieces`` tensor the sub-box lies in (a DMA may reach another
        core's LB over the NoC)."""
        point = acc.point(self.env, start)
        alias = piece if piece is not None else self.alias.get((core, acc.buffer)) if acc.lb else None
        if acc.lb and piece is None and self.rec is not None:
            self.rec.reads((core, acc.buffer, _ALIAS), alias)
            if alias is None:
                key = (core, acc.buffer)
                self.rec.reads((*key, _PLACE), (self.slot.get(key), self.origin.get(key)))
        view = self.views.get((id(acc), alias))
        if view is None:
            view = self.views[(id(acc), alias)] = self._view(stage, acc, alias)
        mem, dtype, itemsize, extents, estrides, strides, last, region = view
        if acc.lb and alias is None:
            origin = self.origin[(core, acc.buffer)]
            index, base = core, self.lb_base + self.slot[(core, acc.buffer)]
        else:
            origin, base = region.origin, region.base
            index = core if mem == "lb" else core // self.hw.cores_per_cluster if mem == "gb" else 0
            if mem == "lb" and stage.op == "dma":
                index = region.index
            if index != region.index:
                raise CodegenError(f"core {core} cannot reach {self.cur.args.get(acc.buffer)} "
                                   f"in {region.mem}[{region.index}]")
        if extent is not None and tuple(extent) != stage.shape:
            last = _last_points(acc, extents, extent)
        offset = 0
        for p, o, top, st in zip(point, origin, last, estrides):
            p -= o
            if p < 0 or p > top:
                raise CodegenError(f"stage {stage.name}: access to {acc.buffer} leaves its region")
            offset += p * st
        return isa.Operand(mem, index, base + itemsize * offset, dtype, strides)

    def _view(self, stage: Stage, acc: Access, alias: Region | None) -> tuple:
        """What an access's operands share while a layer is emitted: memory, element strides of
        the region or buffer, operand strides, spans over the stage's box."""
        region = alias
        if acc.lb and alias is None:
            b = self.cur.plan.buffers[acc.buffer]
            mem, dtype, extents, estrides = "lb", b.dtype, b.extents, self.lb_strides[acc.buffer]
        else:
            region = region or self.regions.get(self.cur.args.get(acc.buffer))
            if region is None:
                raise CodegenError(f"buffer {acc.buffer} is neither in the LB nor placed in a memory")
            mem, dtype, extents, estrides = region.mem, region.dtype, region.extents, row_major(region.extents)
        strides = tuple(sum(row[i] * s for row, s in zip(acc.inner, estrides)) for i in range(len(stage.shape)))
        backwards = [i for i, (st, n) in enumerate(zip(strides, stage.shape)) if st < 0 and n > 1]
        if backwards:  # e.g. a flip: the ISA has no negative strides (a box is walked forwards)
            raise CodegenError(f"stage {stage.name}: {acc.buffer} is walked backwards along loop {backwards[0]} "
                               f"(stride {strides[backwards[0]]}); DSA operands have no negative strides")
        strides = tuple(max(st, 0) if n == 1 else st for st, n in zip(strides, stage.shape))  # one step: no walk
        return mem, dtype, isa.DTYPES[dtype], extents, estrides, strides, _last_points(acc, extents, stage.shape), region

    def _adds(self, stage: Stage) -> bool:
        """Whether a contraction adds to its destination this time (not its folded first pass)."""
        return stage.overwrite is None or any(self.env[s] for s in stage.overwrite)

    def _start_lifetime(self, stage: Stage, core: int) -> None:
        acc = stage.dst
        b = self.cur.plan.buffers[acc.buffer]
        if b.writer != stage.name or (stage.overwrite is not None and self._adds(stage)):
            return
        key = (core, acc.buffer)
        n = self.count.get(key, 0)
        self.count[key] = n + 1
        self.origin[key] = acc.low_corner(self.env, stage.shape)
        self.slot[key] = b.slots[n % len(b.slots)]
        if self.rec is not None:
            self.rec.wrote.add((*key, _PLACE))

    def _scratch(self, dims, stage: Stage, core: int, dtype="float32") -> isa.Operand:
        """A fresh contiguous temporary over the stage's box restricted to loops ``dims``."""
        strides, n = [0] * len(stage.shape), 1
        for i in reversed(range(len(stage.shape))):
            if i in dims:
                strides[i] = n
                n *= stage.shape[i]
        size = align(isa.DTYPES[dtype] * n)
        if self.scratch_top + size > self.cur.plan.scratch_bytes:
            raise CodegenError(f"stage {stage.name}: scratch overflow")
        offset = self.lb_base + self.cur.plan.scratch_offset + self.scratch_top
        self.scratch_top += size
        return isa.Operand("lb", core, offset, dtype, tuple(strides))

    # -- instructions ----------------------------------------------------------------------------
    def _push(self, ins, core: int, unit=None) -> None:
        srcs, dst = isa.operands(ins)
        unit = unit or isa.unit_of(ins, self.hw.cores_per_cluster)
        memory = self.memory
        reads = [memory.key(o, ins) for o in srcs]
        writes = [memory.key(dst, ins)]
        idx = self.size
        rec = self.rec
        if rec is not None:
            rec.log.append(unit)
            rec.read.update(reads)
            rec.written.add(writes[0])
            for key in (*reads, *writes):
                if key not in rec.seen:
                    rec.seen[key] = (dict(memory.deps.writers.get(key) or {}),
                                     dict(memory.deps.readers.get(key) or {}), key in memory.deps.ssa)
        deps = tuple(sorted(memory.deps.deps(reads, writes, unit)))
        if deps and rec is not None:
            rec.low = min(rec.low, deps[0])
        # the instruction was made here and nothing else holds it yet: its deps are set in place
        # (``dataclasses.replace`` cost more than the rest of the emission)
        object.__setattr__(ins, "deps", deps)
        self.instructions.append(ins)
        self.literal_at.append(idx)
        self.units.append(unit)
        self.size += 1
        memory.deps.record(idx, reads, writes, unit)

    def _stage(self, stage: Stage, core: int) -> None:
        self.scratch_top = 0
        whole = [0] * len(stage.shape), list(stage.shape)
        if stage.name in self.aliasable:
            tensor = self.cur.args.get(stage.value.access.buffer)
            source = self.regions.get(tensor)
            if isinstance(source, Pieces):
                parts = tuple(dict.fromkeys(r for *_, r in source.split(stage.value.access, self.env, *whole)))
                source = parts[0] if len(parts) == 1 else parts
            key = (core, stage.dst.buffer)
            rec = self.rec
            if rec is not None:
                rec.wrote.add((*key, _ALIAS))
            if isinstance(source, Region) and (source.mem, source.index) == ("lb", core) and \
                    source.dtype == self.cur.plan.buffers[stage.dst.buffer].dtype:
                self.alias[key] = source  # stitched in this core's LB: read in place, no copy
                self.content.pop(key, None)
                if rec is not None:
                    rec.wrote.add((*key, _CONTENT))
                return
            self.alias.pop(key, None)
            content = (stage.value.access.buffer, source, tuple(stage.value.access.point(self.env)))
            hit = self.content.get(key) == content
            if rec is not None:
                rec.reads((*key, _CONTENT), content if hit else _Miss(content))
            if hit:
                return  # the buffer still holds this box (e.g. the weights of the previous tile)
            self.content[key] = content
            if rec is not None:
                rec.wrote.add((*key, _CONTENT))
        if stage.dst.lb:
            self._start_lifetime(stage, core)
        else:
            target = self.regions.get(self.cur.args.get(stage.dst.buffer))
            if isinstance(target, Pieces):  # written piece by piece (into LBs over the NoC)
                for s, e, piece in target.split(stage.dst, self.env, *whole):
                    self.scratch_top = 0  # each piece's conversion reuses the scratch (tokens order them)
                    self._copy(stage, stage.value, self._operand(stage, stage.dst, core, s, e, piece), core, s, e, s)
                return
        dst = self._operand(stage, stage.dst, core)
        if stage.op == "dma":
            src = self._holder(stage, core, dst) if stage.name in self.aliasable else None
            if src is not None:
                self._push(isa.Dma(core, stage.shape, dst, src), core)
            else:
                self._copy(stage, stage.value, dst, core, [0] * len(stage.shape), list(stage.shape))
        elif stage.op == "mme":
            a, b = (self._operand(stage, r.access, core) for r in stage.value)
            mask = tuple(s == 0 for s in dst.strides)
            self._push(isa.Mme(core, stage.shape, mask, dst, a, b, self._adds(stage)), core)
        elif stage.op == "reduce":
            src = self._expr(stage, stage.value, core, None)
            mask = tuple(s == 0 for s in dst.strides)
            self._push(isa.Reduce(core, "vme", stage.reduce_op, stage.shape, mask, dst, src, self._adds(stage)), core)
        else:
            self._expr(stage, stage.value, core, dst)

    def _holder(self, stage: Stage, core: int, dst: isa.Operand) -> isa.Operand | None:
        """On a mesh, where another core's buffer holds the box this copy loads (the same layer's
        tile of the same tensor), the operand to copy it from over the NoC instead of loading it
        from its source again: seed 002's tiles share weights and ifmaps by multicast, DRAM read
        once. The copies form a tree of fan-out ``FANOUT``, as shallow as the holders allow (a copy
        waits for its holder's, so depth is latency; one source serving all would be a star on
        its links)."""
        if self.hw.interconnect != "mesh":
            return None
        buf = stage.dst.buffer
        content = self.content[(core, buf)]
        sent = self.holders.setdefault((self.cur.name, buf, content), {})  # core -> [copies sent, depth]
        live = [c for c in sent if c != core and self.content.get((c, buf)) == content
                and self.on_core.get(c) == self.on_core[core]]
        if not live:
            sent[core] = [0, 0]
            return None
        holder = min(live, key=lambda c: (sent[c][0] >= FANOUT, sent[c][1], sent[c][0], c))
        sent[holder][0] += 1
        sent[core] = [0, sent[holder][1] + 1]
        return replace(dst, index=holder, offset=dst.offset + self.slot[(holder, buf)] - self.slot[(core, buf)])

    def _expr(self, stage: Stage, v, core: int, dst):
        """Vector instructions computing ``v`` over the box; returns its operand (or scalar).
        With ``dst`` the result is written there."""
        if isinstance(v, (Read, Const)):
            src = self._operand(stage, v.access, core) if isinstance(v, Read) else v.value
            if dst is None:
                return src
            self._push(isa.Vector(core, "vme", "copy", stage.shape, dst, (src,)), core)
            return dst
        if not isinstance(v, Op):
            raise CodegenError(f"stage {stage.name}: conditional values are not supported in compute")
        kids = tuple(self._expr(stage, k, core, None) for k in v.kids)
        if dst is None:
            dst = self._scratch(v.dims, stage, core)
            # a temporary varies with fewer loops than the box: compute it once per point of them
            keep = sorted(v.dims) or [0]
            shape = tuple(stage.shape[i] for i in keep) if v.dims else (1,)
            args = tuple(_restrict(k, keep) for k in kids)
            out = _restrict(dst, keep)
        else:
            shape, args, out = stage.shape, kids, dst
        unit = "vme" if v.name in isa.VME_OPS else "vec"
        self._push(isa.Vector(core, unit, v.name, shape, out, args), core)
        return dst

    def _copy(self, stage: Stage, v, dst: isa.Operand, core: int, start, extent, at=None) -> None:
        """DMA / fill over the sub-box [start, start + extent), splitting ``Select`` on index
        bounds into the boxes where each branch holds, and reads of a ``Pieces`` tensor into its
        pieces. ``dst`` is the destination at box point ``at`` (the box's origin by default)."""
        if any(n <= 0 for n in extent):
            return
        at = at or [0] * len(extent)
        if isinstance(v, Select):
            inside = self._bounds_box(v.bounds, start, extent)
            if inside is None:
                return self._copy(stage, v.other, dst, core, start, extent, at)
            for s, e, holds in _split_box(start, extent, *inside):
                self._copy(stage, v.then if holds else v.other, dst, core, s, e, at)
            return
        sub_dst = _sub_operand(dst, [a - b for a, b in zip(start, at)])
        shape = tuple(extent)
        source = None if not isinstance(v, Read) or v.access.lb else self.regions.get(self.cur.args.get(v.access.buffer))
        if isinstance(source, Pieces):
            for s, e, piece in source.split(v.access, self.env, start, extent):
                src = self._operand(stage, v.access, core, s, e, piece)
                self._dma(core, tuple(e), _sub_operand(dst, [a - b for a, b in zip(s, at)]), src)
            return
        if isinstance(v, Read):
            src = self._operand(stage, v.access, core, start, extent)
            if src.dtype == sub_dst.dtype:
                self._dma(core, shape, sub_dst, src)
            elif (src.mem, src.index) == ("lb", core):  # converted here, then moved
                tmp = self._scratch(set(range(len(shape))), stage, core, sub_dst.dtype)
                self._push(isa.Vector(core, "vme", "copy", shape, tmp, (src,)), core)
                self._dma(core, shape, sub_dst, tmp)
            else:  # moved here (a wide tensor to an fp16 MME operand), then converted
                tmp = self._scratch(set(range(len(shape))), stage, core, src.dtype)
                self._dma(core, shape, tmp, src)
                self._push(isa.Vector(core, "vme", "copy", shape, sub_dst, (tmp,)), core)
        elif isinstance(v, Const) and sub_dst.mem == "lb":
            self._push(isa.Fill(core, shape, sub_dst, v.value), core)
        else:
            raise CodegenError(f"stage {stage.name}: cannot copy {type(v).__name__} to {sub_dst.mem}")

    def _dma(self, core: int, shape, dst: isa.Operand, src: isa.Operand) -> None:
        """A DMA for ``core``'s tile; issued by the core whose LB it touches when that is not
        ``core``'s (a copy between tensors kept in other cores' LBs, or between one and DDR)."""
        issuer = core
        if (dst.mem, dst.index) != ("lb", core) and (src.mem, src.index) != ("lb", core):
            issuer = src.index if src.mem == "lb" else dst.index if dst.mem == "lb" else core
        self.cores_used.add(issuer)
        self._push(isa.Dma(issuer, shape, dst, src), issuer)

    def _bounds_box(self, bounds, start, extent):
        """Per stage loop, the [lo, hi) range where all ``bounds`` hold inside the box, or None."""
        lo = list(start)
        hi = [s + e for s, e in zip(start, extent)]
        for b in bounds:
            fixed = b.const + sum(c * self.env[slot] for slot, c in b.outer)
            free = [(i, c) for i, c in enumerate(b.inner) if c]
            op = b.op
            if not free:
                if not {"le": fixed <= 0, "lt": fixed < 0, "ge": fixed >= 0, "gt": fixed > 0}[op]:
                    return None
                continue
            if len(free) != 1 or abs(free[0][1]) != 1:
                raise CodegenError(f"condition over {len(free)} loops is not a box bound")
            i, c = free[0]
            if c < 0:  # -x + fixed (op) 0  <=>  x - fixed (flipped op) 0
                op = {"le": "ge", "lt": "gt", "ge": "le", "gt": "lt"}[op]
                fixed = -fixed
            # x + fixed (op) 0
            if op == "le":
                hi[i] = min(hi[i], -fixed + 1)
            elif op == "lt":
                hi[i] = min(hi[i], -fixed)
            elif op == "ge":
                lo[i] = max(lo[i], -fixed)
            else:
                lo[i] = max(lo[i], -fixed + 1)
        if any(a >= b for a, b in zip(lo, hi)):
            return None
        return lo, hi


def _last_points(acc: Access, extents, box) -> list[int]:
    """Per dimension, the largest index an operand of ``acc`` over ``box`` may start at within
    ``extents``."""
    return [n - 1 - sum(abs(c) * (e - 1) for c, e in zip(row, box)) for row, n in zip(acc.inner, extents)]


def _aliasable(ir: KernelIR) -> frozenset[str]:
    """DMA stages that may be skipped when their source already sits in the core's LB: a plain
    copy, index for index, from a parameter into an LB buffer that no other stage writes. The
    buffer's readers then read the source region in place (seed 000 §4.2's stitching)."""
    writers: dict = {}
    for st in ir.stages():
        writers.setdefault(st.dst.buffer, []).append(st)
    out = set()
    for buffer, sts in writers.items():
        st = sts[0]
        if len(sts) != 1 or st.op != "dma" or not st.dst.lb or not isinstance(st.value, Read):
            continue
        src = st.value.access
        if not src.lb and (src.const, src.outer, src.inner, src.outer_fn) == \
                (st.dst.const, st.dst.outer, st.dst.inner, st.dst.outer_fn):
            out.add(st.name)
    return frozenset(out)


def _split_box(start, extent, lo, hi):
    """Disjoint pieces of the box: the part inside [lo, hi) (holds=True) and the rest."""
    cur_lo, cur_hi = list(start), [s + e for s, e in zip(start, extent)]
    pieces = []
    for d in range(len(start)):
        if lo[d] > cur_lo[d]:
            s, e = list(cur_lo), list(cur_hi)
            e[d] = lo[d]
            pieces.append((s, [b - a for a, b in zip(s, e)], False))
            cur_lo[d] = lo[d]
        if hi[d] < cur_hi[d]:
            s, e = list(cur_lo), list(cur_hi)
            s[d] = hi[d]
            pieces.append((s, [b - a for a, b in zip(s, e)], False))
            cur_hi[d] = hi[d]
    pieces.append((cur_lo, [b - a for a, b in zip(cur_lo, cur_hi)], True))
    return pieces


def _waits(call: _Call, key, ssa: bool) -> tuple[int, int]:
    """Which of an object's tracker entries (writers, readers) ``call``'s instructions waited
    for, as a slice of the two: reading waits for writers, writing for readers, and, unless the
    object is a tensor written once in pieces (ssa), for writers too."""
    written = key in call.written
    return (0 if key in call.read or (written and not ssa) else 1), (2 if written else 1)


def _joined(a: tuple, b: tuple) -> tuple:
    """Two records of consecutive runs of rounds (``KernelEmitter._emit``) as one: the tile
    state the second needs that the first did not write is needed before both."""
    (x, xb, xa, m), (y, yb, ya, n) = a, b
    call = _Call(x.layer, x.placed, x.owners, x.start, y.stop, None, None, {**y.before, **x.before},
                 {**x.after, **y.after}, min(x.low, y.low), x.cores | y.cores, x.work + y.work, (),
                 x.read | y.read, x.written | y.written)
    before, after = dict(xb), dict(xa)
    for key, need in yb.items():
        if key not in xb:
            before[key], after[key] = need, ya[key]
            continue
        before[key] = (xb[key][0], *(p if p is not _FREE or w is not _FREE else q
                                      for p, w, q in zip(xb[key][1:], xa[key][1:], need[1:])))
        after[key] = (ya[key][0], *(q if q is not _FREE else p for p, q in zip(xa[key][1:], ya[key][1:])))
    return call, before, after, m + n


def _plus(point, delta):
    """``point`` moved by ``delta`` (None: not moved)."""
    return list(point) if delta is None else [x + d for x, d in zip(point, delta)]


def _same(unit):
    return unit


def _relative(work) -> tuple:
    """Tiles ``(loop values, core)`` relative to the first: what two runs of a layer's tiles must
    share for one to be the other translated."""
    values = np.array([v for v, _ in work], dtype=np.int64)
    cores = np.array([c for _, c in work], dtype=np.int64)
    return values.shape, (values - values[0]).tobytes(), (cores - cores[0]).tobytes()


def _store_split(body, plan) -> tuple | None:
    """(chunks, k, j) for a tile body whose tail ``body[j:]`` may wait until the core's next tile
    has issued its leading loads — the first ``k`` stages of the body, or of its first chunk when
    it begins with a chunk loop (``chunks``, else None): a tail of stores out of the LB and strip loops that store, with
    something before it, whose LB buffers share no bytes with what those loads write (``plan``'s
    places). None for another body."""
    def load(n):
        return isinstance(n, Stage) and n.op == "dma" and n.dst.lb

    def stores(n):
        if isinstance(n, Stage):
            return n.op == "dma" and not n.dst.lb
        return n.kind == "strip" and any(st.op == "dma" and not st.dst.lb for st in stages_of(n.body))

    chunks = body[0] if body and isinstance(body[0], Loop) and body[0].kind == "chunk" else None
    first = chunks.body if chunks else body
    k = 0
    while k < len(first) and load(first[k]):
        k += 1
    j = len(body)
    while j > 1 and stores(body[j - 1]):
        j -= 1
    if not k or j == len(body) or (chunks is None and j <= k):
        return None

    def places(names):
        return [(o, o + plan.buffers[b].nbytes) for b in names for o in plan.buffers[b].slots]

    loaded = places({st.dst.buffer for st in first[:k]})
    held = places({acc.buffer for st in stages_of(body[j:]) for acc in (st.dst, *st.reads()) if acc.lb})
    if any(lo < hi2 and lo2 < hi for lo, hi in loaded for lo2, hi2 in held):
        return None
    return chunks, k, j


def _relative_held(held: dict, work) -> dict:
    """``KernelEmitter._held`` of a run, its cores counted from the run's first."""
    return {core - work[0][1]: v for core, v in held.items()}


def _bent_values(layer: Layer, work) -> tuple:
    """The distinct values the tiles of ``work`` have on the slots of ``layer``'s non-linear
    index terms (``KernelIR.bent``), each as ((slot, value), ...): ``KernelIR.moves``' ``at``."""
    bent = [(i, lp.slot) for i, lp in enumerate(layer.ir.tile_loops()) if lp.slot in layer.ir.bent]
    return tuple(sorted({tuple((slot, values[i]) for i, slot in bent) for values, _ in work}))

def _moved(layer: Layer, before, after) -> tuple:
    """(cores moved, ``KernelIR.moves``) taking the tiles ``before`` to ``after`` (runs of
    (loop values, core) of one shape): the values are the tile loops', and for a run of chunks
    (``KernelEmitter._chunk_loop``) the chunk loop's after them — from the second chunk on, so
    the contraction's zero-init folded on that loop stays unfolded in both runs."""
    (v0, c0), (v1, c1) = before[0], after[0]
    tiles = layer.ir.tile_loops()
    loops = tiles + chunk_loops(layer.ir)[:len(v0) - len(tiles)]
    shift = {lp.slot: b - a for lp, a, b in zip(loops, v0, v1) if a != b}
    if not shift:
        return c1 - c0, {}
    chunks = frozenset(lp.slot for lp in loops[len(tiles):])
    return c1 - c0, layer.ir.moves(shift, _bent_values(layer, before), chunks)


def _rounds(work) -> list:
    """``work`` cut into rounds: runs of tiles on distinct cores (a tile per core at most)."""
    out, cores = [], set()
    for item in work:
        if item[1] in cores or not out:
            out.append([])
            cores = set()
        out[-1].append(item)
        cores.add(item[1])
    return out


def _restrict(o, keep: list[int]):
    """The operand over the box dims ``keep`` only (scalars pass through)."""
    if not isinstance(o, isa.Operand):
        return o
    return replace(o, strides=tuple(o.strides[i] for i in keep))


def _sub_operand(o: isa.Operand, start) -> isa.Operand:
    off = o.offset + o.itemsize * sum(s * st for s, st in zip(start, o.strides))
    return o if off == o.offset else replace(o, offset=off)


def _whole_operand(r: Region, origin=None) -> isa.Operand:
    """The region as an operand over its box, or over a box from ``origin`` inside it."""
    strides = row_major(r.extents)
    shift = sum((o - a) * st for o, a, st in zip(origin, r.origin, strides)) if origin else 0
    return isa.Operand(r.mem, r.index, r.base + isa.DTYPES[r.dtype] * shift, r.dtype, tuple(strides))


def place_arguments(inputs, outputs, tensors: dict, hw: Hardware) -> tuple[dict, list, int]:
    """(DDR region per tensor, ``TensorArg`` list, first free offset): a kernel's inputs then its
    outputs packed in DDR from offset 0 (``tensors``: name -> (shape, host dtype))."""
    regions, args, offset = {}, [], 0
    for role, names in (("input", inputs), ("output", outputs)):
        for t in names:
            shape, dtype = tensors[t]
            regions[t] = Region.whole("ddr", 0, offset, shape, hw.storage_dtype)
            args.append(isa.TensorArg(t, role, tuple(shape), hw.storage_dtype, dtype, offset))
            offset = align(offset + args[-1].nbytes)
    return regions, args, offset


def build_program(func, hw: Hardware, name: str, num_outputs: int = 1) -> isa.Program:
    """One-kernel program for a lowered PrimFunc whose last ``num_outputs`` params are outputs:
    every tensor in DDR, the first tile loop's index picks the cluster (the batch split), tiles go
    round-robin over the cluster's cores."""
    layer = Layer.of(func, hw, name)
    regions, args, offset = {}, [], 0
    for i, (pname, shape, dtype) in enumerate(layer.ir.params):
        role = "output" if i >= len(layer.ir.params) - num_outputs else "input"
        stored = layer.ir.ddr_dtype(pname, hw)
        regions[pname] = Region.whole("ddr", 0, offset, shape, stored)
        args.append(isa.TensorArg(pname, role, shape, stored, dtype, offset))
        offset = align(offset + args[-1].nbytes)
    emitter = KernelEmitter(hw, name)
    for pname, r in regions.items():
        emitter.claim(r, ("ddr", pname))
    extents = [lp.extent for lp in layer.ir.tile_loops()]
    work = list(zip(itertools.product(*map(range, extents)), deal(extents, hw)))
    emitter.layer(layer, work, regions)
    return isa.Program(hw.to_dict(), max(offset, ALIGN), tuple(args), (emitter.kernel(),), name)


def deal(extents: list[int], hw: Hardware) -> list[int]:
    """The core of each tile of a one-layer kernel whose tile loops have ``extents``, tiles in loop
    order: the first tile loop's value picks the cluster (the batch split), a cluster's tiles go
    round-robin over its cores."""
    cpc = hw.cores_per_cluster
    clusters = min(extents[0], hw.clusters)
    dealt = [0] * clusters
    cores = []
    for first in range(extents[0]):
        cluster = first % clusters
        for _ in range(math.prod(extents[1:])):
            cores.append(cluster * cpc + dealt[cluster] % cpc)
            dealt[cluster] += 1
    return cores
