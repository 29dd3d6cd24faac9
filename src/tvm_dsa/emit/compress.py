"""Compression of a kernel's instruction stream: what is earlier instructions moved is not emitted
again.

The next block of a transformer, the next instance of a sub-graph on the cluster's other cores,
a layer's later rounds of tiles, a tile's later chunks: each is an earlier run of instructions
translated. Emitting them all makes compile time and the program grow with the model's size.
The ``Compressor`` records what its emitter (``KernelEmitter``) emits for a layer call, a round
of tiles or a chunk (a ``Record``: the unit of each instruction pushed, the dependency tracker's
entries for every memory object touched, the tile buffers' state read and written) and, for a
later one that is a recorded run translated, either

- records it as a copy (``isa.Replica``): the run's stream positions run again with cores and
  regions moved, each dependency where emission would put it (``remap``), in time independent
  of the run's size; or
- replays it (a layer call placed exactly like the earlier one but for its regions' bases): the
  earlier instructions pushed again, moved, their dependencies worked out anew by the tracker,
  without walking the kernel IR.

It also copies one cluster's part of a kernel to the other clusters (``replicate``).

The invariant: the compressed program with its replicas written out (``isa.Program.expanded``)
is the program emitting every layer gives (``KernelEmitter(..., replay=False)``), instruction
for instruction, every dependency emission's or a later instruction of its unit (a copy of a
cluster's part drops the dependencies emission adds between clusters' disjoint pieces of one
DDR tensor). ``Compressor.reused`` lists what was replayed or copied.

The compressor works on its emitter's state: the stream (``instructions``, ``size``, ``units``,
``marks``), the memory objects and their tracker (``memory``: ``deps.MemoryObjects``) and the
tile buffers' state per (core, buffer). The emitter hands each layer call to ``layer``, deals a
recorded call's tiles through ``rounds`` and its tiles' chunks through ``chunks``, and tells the
current ``Record`` (``rec``) what it pushes and which tile-buffer state it reads and writes.
"""

from __future__ import annotations

import bisect
import collections
import functools
import itertools
from dataclasses import dataclass, field

import numpy as np

from tvm_dsa import isa
from tvm_dsa.emit.deps import PIECE, Deps
from tvm_dsa.emit.placement import Layer, Pieces, row_major
from tvm_dsa.kernel.ir import chunk_loops

COPY_SOURCES = 4  # the most recent calls like a layer that it may be a copy of (each try costs)
PERIOD = 8  # the most rounds after which a layer's deal of tiles to cores may repeat (``rounds``)

# a tile buffer's state in three parts, each read or written whole: (slot, origin) — set when a
# lifetime starts, read by the buffer's operands —, content (what it was loaded with, read by
# the load that would skip itself), alias (the LB region it reads in place)
PLACE, CONTENT, ALIAS = 1, 2, 3


@dataclass(frozen=True)
class Reuse:
    """A layer call, a run of rounds of a call's tiles or a run of chunks of a tile made of
    earlier instructions (``Compressor.reused``). ``kind``: "replay" (a call's instructions
    pushed again, moved), "call", "rounds" or "chunks" (recorded as a copy, ``isa.Replica``).
    ``source`` names the layer of the run it copies, ``layer`` its own; ``call`` is the index of
    the emitter's ``layer`` call it belongs to (from 0); ``source_tile`` and ``tile`` are the
    first tiles of the two, (loop values, core), a chunk's values the tile loops' then the chunk
    loop's; ``runs`` counts the rounds or chunks copied (1 for a call); ``swapped``: the two
    copies of double-buffered tile buffers trade places in the copy; ``instructions``: the
    stream positions the copy fills (0 for a replay, whose instructions are the kernel's own)."""

    kind: str
    source: str
    layer: str
    call: int
    source_tile: tuple
    tile: tuple
    runs: int
    swapped: bool
    instructions: int


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
class _Recording:
    """What a call's rounds and chunks are copied with while its tiles are emitted and recorded:
    where the layer's tensors are, the objects owning them, the runs of rounds and chunks copied
    so far, and per core the record of the last run of chunks of its last tile (``chunks``'
    span)."""

    placed: dict
    owners: dict | None
    copies: int = 0
    tiles: dict = field(default_factory=dict)


@dataclass
class Record:
    """What the compressor notes while a call (or a round or chunk of one) is emitted: the unit
    of each instruction pushed, the tracker's state of each object when first touched (writers,
    readers, ssa), the objects read and written, the lowest dependency; and per (core, tile
    buffer, part of its state: ``PLACE``...) the value the run read before writing it (``need``)
    and the parts it wrote (``wrote``). The emitter reports to it (``pushed``, ``reads``,
    ``loads``, ``writes``)."""

    low: int
    log: list = field(default_factory=list)
    seen: dict = field(default_factory=dict)
    read: set = field(default_factory=set)
    written: set = field(default_factory=set)
    need: dict = field(default_factory=dict)
    wrote: set = field(default_factory=set)

    def add(self, other: "Record") -> None:
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

    def pushed(self, unit, reads: list, writes: list, deps: tuple, tracker: Deps) -> None:
        """An instruction on ``unit`` reading the objects ``reads``, writing ``writes``, waiting
        for ``deps`` (sorted), with ``tracker`` as it was before it."""
        self.log.append(unit)
        self.read.update(reads)
        self.written.add(writes[0])
        for key in (*reads, *writes):
            if key not in self.seen:
                self.seen[key] = (dict(tracker.writers.get(key) or {}), dict(tracker.readers.get(key) or {}),
                                  key in tracker.ssa)
        if deps:
            self.low = min(self.low, deps[0])

    def reads(self, key: tuple, part: int, value) -> None:
        """The run reads part ``part`` of the state of tile buffer ``key`` (core, buffer) as
        ``value``."""
        key = (*key, part)
        if key not in self.wrote and key not in self.need:
            self.need[key] = value

    def loads(self, key: tuple, content: tuple, hit: bool) -> None:
        """The run's load of tile buffer ``key`` (core, buffer) found it held ``content`` (``hit``:
        it skipped itself) or not."""
        self.reads(key, CONTENT, content if hit else _Miss(content))

    def writes(self, key: tuple, part: int) -> None:
        """The run writes part ``part`` of the state of tile buffer ``key`` (core, buffer)."""
        self.wrote.add((*key, part))


class Compressor:
    """The compression of one ``KernelEmitter``'s stream (the module's docstring).

    A layer emitted like an earlier one is not emitted again (``replay``; False emits every
    layer, for tests). Like means the same kernel IR and LB plan over the earlier one's tiles
    and cores translated (``_signature``: the next block of a transformer, the next instance of
    a sub-graph on the cluster's other cores), its tensors' regions of the same shapes wherever
    they are, and nothing in the IR that would tell the translated tiles apart
    (``KernelIR.moves``). Where the dependency tracker's entries for the objects the layer touches
    correspond to the earlier layer's, unit for unit (``remap``), the layer is recorded as a
    copy (``isa.Replica``): the earlier instructions moved, each dependency where emission would
    put it, in time independent of the layer's size. Otherwise a layer placed exactly like the
    earlier one but for the regions' bases is replayed: the earlier instructions pushed again,
    moved, their dependencies worked out anew, without walking the IR.

    What it did, for reports and tests: ``reused`` (a ``Reuse`` per replay or copy) and
    ``recorded_chunk_loops`` ((layer call, core) -> the tiles whose chunk loop the core emitted
    while the call was recorded)."""

    def __init__(self, emitter, replay: bool = True):
        self.emitter, self.replay = emitter, replay
        self.replicas: list = []  # isa.Replica: parts of the stream run again, moved
        self.rec: Record | None = None  # while a call is recorded
        self.recording: _Recording | None = None  # while a call's tiles are emitted and recorded
        self.reused: list[Reuse] = []
        self.recorded_chunk_loops: collections.Counter = collections.Counter()
        self.layers = 0  # the emitter's ``layer`` calls so far
        self._copies: list = []  # _Call of each run recorded as a copy
        self._parts: dict = {}  # (start, stop) -> ``_part`` of a cluster's part
        # signature (``_signature``) -> records of calls to copy or replay: (_Call, tile state
        # before, after (None: not kept), 1 call)
        self._calls: dict = {}

    def layer(self, layer: Layer, work, regions: dict, lb_base: int) -> None:
        """Emit a call of ``layer`` (``KernelEmitter.layer``): as a copy of one of the last few
        calls like it (``_copy_run``), else as a replay of the last one placed alike, else by the
        emitter, recorded (its rounds and chunks compressed: ``rounds``, ``chunks``); a call like
        no other possible one (``_signature``) by the emitter alone."""
        e = self.emitter
        self.layers += 1
        sig = self._signature(layer, work, regions, lb_base)
        if sig is None:
            return e.emit(layer, work, regions, lb_base)
        sig, exact = sig
        placed = {p: regions.get(layer.args.get(p)) for p, *_ in layer.ir.params}
        owners = self._owners(placed)
        held = any(e.on_core.get(core) == (layer.name, lb_base) for _, core in work)
        for _, core in work:
            e.cores_used.add(core)
            e.enter(layer, core, lb_base)
        earlier = [r for r in self._calls.get(sig, ()) if (r[0].layer.ir, r[0].layer.plan) == (layer.ir, layer.plan)]
        for record in earlier[:-1 - COPY_SOURCES:-1]:
            copied = self._copy_run(record, layer, work, placed, owners, exact, "call")
            if copied:
                self._calls[sig].append((*copied, 1))
                return
        start, literal, copies = e.size, len(e.instructions), len(self._copies)
        first, state = literal, self._tile_state(layer, work)
        rec = self.rec = Record(start)
        source = None if held else next((r[0] for r in reversed(earlier) if r[0].literal is not None
                                         and r[0].exact == exact), None)
        if source is not None:  # the tile buffers' state is left behind: a later call re-enters
            self._replay(source, layer, work, regions, lb_base)
        else:
            self.recording = _Recording(placed, owners)
            e.emit(layer, work, regions, lb_base)
            if self.recording.copies:
                literal = None  # some rounds or chunks are copies: nothing to replay from
            self.recording = None
        cores = frozenset(ins.core for ins in e.instructions[first:]).union(
            *(copy.cores for copy in self._copies[copies:]))
        call = self._recorded(rec, layer, placed, owners, start, literal, cores, work, exact)
        # a replay reads no tile state and leaves none behind: it holds for the state it began with
        self._calls.setdefault(sig, []).append((call, state, None, 1) if source
                                               else (call, *self._run_states(rec, state), 1))
        self.rec = None

    def rounds(self, layer: Layer, work, lb_base: int, holds: bool):
        """The rounds (``_rounds``) of the recorded call's tiles ``work`` that the emitter is to
        emit, one by one; each recorded. Rounds whose tiles are earlier rounds' of the call
        translated, the tile buffers in the same state translated and the same stores held back
        (``holds``: the emitter holds back each tile's trailing stores, ``_held``), are recorded
        as a copy of them (``_copy_run``) where the dependencies allow: of one of the last two
        rounds, of the whole run of rounds since the last emitted one (so a regular layer takes a
        number of copies logarithmic in its rounds), or of the last few rounds emitted since the
        last copy, up to ``PERIOD`` (tiles dealt in turn repeat every few rounds: ViT-B/16's
        attention scores, 5 token tiles a head on 4 cores, every 5)."""
        e, recording = self.emitter, self.recording
        placed, owners = recording.placed, recording.owners
        held_of: dict = {}  # id(a record's _Call) -> ``_held`` of its run when it began
        parts = _rounds(work)
        # records of rounds so far: (_Call, tile state before, after, rounds); the last run of
        # them as one (``span``: copied whole, it doubles), the latest copy of each length (the
        # rest of a layer too short for the span), the last two single rounds, and the emitted
        # rounds since the last copy (``emitted``: the last few of them, joined, repeat with a
        # period of that many rounds)
        span, runs, singles, emitted = None, {}, [], []
        i = 0

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
                + singles[::-1]
            for part in parts[i:i + max((r[3] for r in sources), default=1)]:
                for _, core in part:
                    e.cores_used.add(core)
                    e.enter(layer, core, lb_base)
            copy = None
            for record in sources:
                n = record[3]
                run = [x for part in parts[i:i + n] for x in part]
                if i + n <= len(parts) and record[2] is not None and \
                        _relative_held(held_of[id(record[0])], record[0].work) == \
                        _relative_held(_held(e.held, run), run):
                    copy = self._copy_run(record, layer, run, placed, owners, (), "rounds")
                    if copy:
                        break
            if copy:
                copy = (*copy, n)
                recording.copies += 1
                held_of[id(copy[0])] = _held(e.held, run)
                if holds:  # the copy held back the stores of each core's last tile in it
                    e.held.update((core, values) for values, core in run)
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
                i, emitted = i + n, []
                continue
            outer, self.rec = self.rec, Record(e.size)
            start, first, state = e.size, len(e.instructions), self._tile_state(layer, parts[i])
            held = _held(e.held, parts[i])
            yield parts[i]
            cores = frozenset(ins.core for ins in e.instructions[first:])
            span = (self._recorded(self.rec, layer, placed, owners, start, first, cores, parts[i], ()),
                    *self._run_states(self.rec, state), 1)
            held_of[id(span[0])] = held
            singles = singles[-1:] + [span]
            emitted.append(span)
            outer.add(self.rec)
            self.rec = outer
            i += 1

    def chunks(self, layer: Layer, values: tuple, loop, first: int, core: int):
        """The chunks ``first``.. of the chunk loop ``loop`` of the tile ``values`` on ``core`` (of
        the recorded call) that the emitter is to emit, one by one; each recorded. A run of chunks
        from the second on that is an earlier run of them moved — along the reduction, or to this
        tile — is recorded as a copy of it (``_copy_run``: the loads' boxes moved, the same LB
        places or the two copies of each double-buffered one traded): of the last run of the
        core's previous tile (as many chunks as are left), else of the whole run since the last
        emitted chunk, which then doubles, else of the latest copy of each length (the rest of
        the loop too short for the run), else of the last emitted chunk. The pass that folds the
        zero-init is like no other: never a source or a copy. ViT-B/16's FFN2 tile has 96 chunks
        of three instructions: all were emitted; now they are one copy, or 11 on a core's first
        tile."""
        e, recording = self.emitter, self.recording
        self.recorded_chunk_loops[(self.layers - 1, core)] += 1
        if first == 0:  # the pass that folds the zero-init: like no other
            yield 0
            first = 1
        # records (``_copy_run``'s) of the run since the last emitted chunk, of the latest copy of
        # each length, of the last emitted chunk, and of the core's previous tile's last run
        span, runs, last = None, {}, None
        previous = recording.tiles.get(core)
        v = first
        while v < loop.extent:
            copy = None
            for record in ([previous] if previous and v + previous[3] == loop.extent else []) \
                    + ([span] if span and span[3] > 1 else []) \
                    + [runs[n] for n in sorted(runs, reverse=True)] + ([last] if last else []):
                n = record[3]
                if v + n <= loop.extent:
                    copy = self._copy_run(record, layer, [(values + (v + j,), core) for j in range(n)],
                                          recording.placed, recording.owners, (), "chunks")
                    if copy:
                        break
            if copy:
                copy = (*copy, n)
                recording.copies += 1
                runs[n] = copy
                span = _joined(span, copy) if span and span[0].stop == copy[0].start else copy
                v += n
                continue
            work = [(values + (v,), core)]
            outer, self.rec = self.rec, Record(e.size)
            start, literal, state = e.size, len(e.instructions), self._tile_state(layer, work)
            yield v
            last = span = (self._recorded(self.rec, layer, recording.placed, recording.owners, start, literal,
                                          frozenset({core}), work, ()), *self._run_states(self.rec, state), 1)
            outer.add(self.rec)
            self.rec = outer
            v += 1
        if span:
            recording.tiles[core] = span

    def replicate(self, start: int, stop: int, cores: int, cluster: int, ddr_shift: dict) -> bool:
        """``KernelEmitter.replicate``: record that stream positions [start, stop) run again for
        the cluster ``cluster`` (``isa.Replica``, at the end of the stream), or return False."""
        e = self.emitter
        part = self._parts.get((start, stop))
        if part is None:  # worked out once per part
            part = self._parts[(start, stop)] = self._part(start, stop)
        low, keys, places, cores_of = part
        if low < start or not keys <= set(ddr_shift):
            return False
        ddr = sorted((*e.memory.claimed[key][2:], key) for key in keys)
        if any(b[0] < a[1] for a, b in itertools.pairwise(ddr)):
            return False
        moves = [(mem, index, 0, e.hw.gb_bytes, cluster, 0) for mem, index in sorted(places) if mem == "gb"]
        moves += [("ddr", 0, lo, hi, 0, ddr_shift[key]) for lo, hi, key in ddr]
        at = e.size
        self.replicas.append(isa.Replica(start, stop, at, cores, tuple(moves)))
        # the copy's layer marks, each where its run begins in the copy (``mark`` puts it at ``size``)
        for m in [m for m in e.marks if m.first <= start][-1:] + [m for m in e.marks if start < m.first < stop]:
            e.size = at + max(m.first, start) - start
            e.mark(m.name, m.shape)
        e.size = at + stop - start
        e.units += [None] * (stop - start)
        e.cores_used.update(c + cores for c in cores_of)
        return True

    def _part(self, start: int, stop: int) -> tuple:
        """(lowest dependency, DDR objects touched, (mem, index) touched, cores) of stream
        positions [start, stop)."""
        e = self.emitter
        low, keys, places, cores = stop, set(), set(), set()
        ddr = e.memory.spaces.get(("ddr", 0))
        lo, hi = bisect.bisect_left(e.literal_at, start), bisect.bisect_left(e.literal_at, stop)
        for ins in e.instructions[lo:hi]:
            if ins.deps:
                low = min(low, ins.deps[0])  # deps are sorted
            srcs, dst = isa.operands(ins)
            for o in (dst, *srcs):
                if isinstance(o, isa.Operand):
                    places.add((o.mem, o.index))
                    if o.mem == "ddr":
                        keys.add(ddr.owner(o.offset))
            cores.add(ins.core)
        for call in self._copies:
            if start <= call.start and call.stop <= stop:
                low = min(low, call.low)
                for key in call.before:
                    key = key[1] if key[0] == PIECE else key
                    mem, index = e.memory.claimed[key][:2]
                    places.add((mem, index))
                    if mem == "ddr":
                        keys.add(key)
                cores |= call.cores
        return low, keys, places, cores

    def _signature(self, layer: Layer, work, regions: dict, lb_base: int):
        """(what emitting ``layer`` depends on up to translating its tiles and cores and moving its
        tensors' regions, but for what its cores' tile buffers hold (``_tile_state``); the tiles,
        cores and regions' places and origins themselves). None where it depends on more, which
        a copy or replay would not reproduce: a tensor in pieces, a mesh's multicast of tiles
        between cores."""
        if not self.replay or self.emitter.hw.interconnect == "mesh":
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
                found = self.emitter.memory.owner(r)
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
        and the tracker's entries for them correspond (``remap``). The tracker then takes
        ``call``'s end state, moved. None if not."""
        if owners is None or call.owners is None:
            return None
        moved = self._translation(call, layer, work, placed, swap)
        if moved is None:
            return None
        e = self.emitter
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
        clusters = (call.work[0][1] + cores) // e.hw.cores_per_cluster - call.work[0][1] // e.hw.cores_per_cluster

        def unit(u):
            return u and (u[0], u[1] + (clusters if u[0] == "cdma" else cores))

        if not cores and not clusters:
            unit = _same
        shift = e.size - call.start
        moved_deps = remap(call, keys, unit, shift, e.memory.deps, e.units)
        if moved_deps is None:
            return None
        writers, readers = e.memory.deps.writers, e.memory.deps.readers
        self.replicas.append(isa.Replica(call.start, call.stop, e.size, cores, tuple(
            (mem, index, lo, hi, to, by) for (mem, index), ranges in sorted(moves.items())
            for lo, hi, to, by in ranges if by or (to != index and mem != "lb") or (mem == "lb" and to != index + cores)),
            tuple(sorted((q, p) for q, p in moved_deps.items() if p != q + shift))))
        # the tracker as the copy's instructions see it, before and after them: entries moved as
        # their dependencies were (remapped, or shifted inside the copy); the readers of an object
        # the copy only reads are the tracker's, with the copy's reads
        before, after = {}, {}
        for key, (w, r, is_ssa) in call.before.items():
            k, waits = keys[key], _waits(call, key, is_ssa)
            b, a = [], []
            for table, old, end in ((writers, w, call.after[key][0]), (readers, r, call.after[key][1])):
                if waits[0] <= len(b) < waits[1]:  # waited for: as the copy's dependencies moved
                    b.append({unit(u): moved_deps[i] for u, i in old.items()})
                    a.append({unit(u): i + shift if i >= call.start else moved_deps[i] for u, i in end.items()})
                else:  # not waited for: the tracker's, with what the copy adds
                    b.append(dict(table.get(k) or {}))
                    a.append({**b[-1], **{unit(u): i + shift for u, i in end.items() if i >= call.start}})
            before[k], after[k] = (*b, is_ssa), a
        for k, (w, r) in after.items():
            writers[k], readers[k] = dict(w), dict(r)
        copy = _Call(layer, placed, owners, e.size, call.stop + shift, None, None, before, after,
                     min(moved_deps.values(), default=e.size), frozenset(c + cores for c in call.cores), work, exact,
                     frozenset(keys[k] for k in call.read), frozenset(keys[k] for k in call.written))
        self._copies.append(copy)
        units = e.units[call.start:call.stop]
        if unit is not _same:  # a few distinct units, many instructions: map each unit once
            units = map({u: unit(u) for u in set(units)}.__getitem__, units)
        e.units += units
        e.size = copy.stop
        e.cores_used |= copy.cores
        return copy

    def _moved_piece(self, call: _Call, key, keys: dict, shifts: dict):
        """The piece of the object ``keys`` maps ``key``'s object to that a copy of ``call`` touches
        instead of the piece ``key`` (the accesses moved by ``shifts`` along the pieces' dim, by
        whole pieces); None where there is no such piece."""
        memory = self.emitter.memory
        _, obj, j = key
        target = keys.get(obj)
        params = [p for p, k in call.owners.items() if k == obj]
        if not params or target not in memory.pieced or memory.pieced[target][:2] != memory.pieced.get(obj, ())[:2]:
            return None
        dim, width = memory.pieced[obj][:2]
        moved, rest = divmod(shifts[params[0]][dim], width)
        n = len(memory.objects(target))
        return (PIECE, target, j + moved) if not rest and 0 <= j + moved < n else None

    def _translation(self, call: _Call, layer: Layer, work, placed: dict, swap: dict | None = None):
        """(cores moved, (mem, index) -> sorted [(lo, hi, to_index, shift)]: where each byte range
        of ``call``'s regions goes, param -> how far its accesses move in its region, per dim)
        taking ``call``'s instructions to ``layer``'s over ``work``, the same tiles and cores
        translated (``_signature``): each region in the memory of the moved cores, the offset of
        an access in it moved by how far the access moves (``KernelIR.moves``) less how far the
        region's box does; each tile buffer copy at an offset ``swap`` lists to the offset it
        gives (after the LB base of the layer the emitter emitted last). (That the moved tiles
        stay in their regions is what planning the regions made sure of.) None where that does
        not hold or two ranges in one place would move differently."""
        e = self.emitter
        cores, accesses = _moved(layer, call.work, work)
        cpc = e.hw.cores_per_cluster
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
                moves.setdefault(("lb", c), []).append((e.lb_base + s, e.lb_base + s + abs(t - s), c + cores, t - s))
        for place, ranges in moves.items():
            ranges.sort()
            if any(y[0] < x[1] and y[2:] != x[2:] for x, y in itertools.pairwise(ranges)):
                return None
            moves[place] = _merged(ranges)
        return cores, moves, shifts

    def _replay(self, call: _Call, layer: Layer, work, regions: dict, lb_base: int) -> None:
        """Emit ``layer`` as ``call``'s instructions, each operand in one of ``call``'s tensor
        regions moved to the same place in ``layer``'s, the rest (tile buffers, scratch) kept."""
        e = self.emitter
        moved = self._translation(call, layer, work, {p: regions.get(layer.args.get(p)) for p in call.placed})
        if moved is None:
            return e.emit(layer, work, regions, lb_base)  # two tensors at once in one place
        moves = moved[1]

        def move(o):
            if not isinstance(o, isa.Operand):
                return o
            for lo, hi, _, shift in moves.get((o.mem, o.index), ()):
                if lo <= o.offset < hi:
                    return isa.replaced(o, offset=o.offset + shift) if shift else o
            return o

        for _, core in work:
            e.cores_used.add(core)
            e.enter(layer, core, lb_base)
        n = call.stop - call.start
        for ins, unit in zip(e.instructions[call.literal:call.literal + n], call.log):
            e.cores_used.add(ins.core)
            e.push(isa.moved(ins, move), ins.core, unit)
        for _, core in work:
            e.on_core[core] = None  # a later call of this layer re-enters: nothing carried over
        self.reused.append(Reuse("replay", call.layer.name, layer.name, self.layers - 1, call.work[0], work[0], 1,
                                 False, 0))

    def _recorded(self, rec: Record, layer: Layer, placed, owners, start: int, literal, cores, work, exact) -> _Call:
        """The ``_Call`` of the run recorded in ``rec`` from stream position ``start`` to here."""
        e = self.emitter
        writers, readers = e.memory.deps.writers, e.memory.deps.readers
        after = {k: (dict(writers.get(k) or {}), dict(readers.get(k) or {})) for k in rec.seen}
        return _Call(layer, placed, owners, start, e.size, literal, rec.log if literal is not None else None,
                     rec.seen, after, rec.low, cores, work, exact, frozenset(rec.read), frozenset(rec.written))

    def _tile_state(self, layer: Layer, work) -> dict:
        """Per (core, tile buffer of ``layer``) of the cores in ``work``: (lifetimes started,
        (slot, origin), content, alias) — what emitting a tile reads besides the tile itself."""
        return {key: self._state_of(key) for key in itertools.product(dict.fromkeys(c for _, c in work),
                                                                      layer.plan.buffers)}

    def _state_of(self, key: tuple) -> tuple:
        e = self.emitter
        return (e.count.get(key, 0), (e.slot.get(key), e.origin.get(key)), e.content.get(key), e.alias.get(key))

    def _run_states(self, rec: Record, start: dict) -> tuple[dict, dict]:
        """The tile state a recorded run (``rec``) needs before it, and the state it leaves: its
        state when it began (``start``) with the parts it did not read before writing them
        ``_FREE`` (a first load that missed needs only a miss, ``_Miss``), and the state now with
        the parts it did not write ``_FREE``. Lifetime counts are kept whole: the slots follow
        them."""
        before, after = {}, {}
        for key, state in start.items():
            now = self._state_of(key)
            before[key] = (state[0], *(rec.need.get((*key, part), _FREE) for part in (PLACE, CONTENT, ALIAS)))
            after[key] = (now[0], *(now[part] if (*key, part) in rec.wrote else _FREE
                                    for part in (PLACE, CONTENT, ALIAS)))
        return before, after

    def _copy_run(self, record, layer: Layer, work, placed: dict, owners, exact, kind: str):
        """Record ``layer``'s tiles ``work`` (a call of it, or rounds or chunks of one: ``kind``,
        ``Reuse``) as a copy of an earlier run of it (``record``: its ``_Call``, tile state
        before and after, rounds) when the tiles and cores are the run's translated, the tile
        buffers now in the run's state before it translated alike (the same slots, or the other
        copy of each double-buffered place where lifetimes started an odd number of times since:
        the copy trades the two copies' places, so a layer's rounds are copies from the fourth
        on, not the fifth; contents and aliases in the regions that took the run's regions'
        place) and ``_as_copy`` agrees. The tile buffers then take the run's state after it,
        translated (or, after a replayed run, whose state was not kept, are entered anew by the
        next call), and (the copy's ``_Call``, tile state before and after) is returned. None if
        not."""
        e = self.emitter
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
            if part == PLACE:
                slot, origin = value
                return swap.get(slot, slot), origin if origin is None else _plus(origin, moved.get(buffer))
            if part == ALIAS:
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
            for part in (PLACE, CONTENT, ALIAS):
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
                e.on_core[core] = None
        else:
            moved_after = {}
            for (core, b), state in after.items():
                key = (core + cores, b)
                end = [now[key][0] + state[0] - before[(core, b)][0], _FREE, _FREE, _FREE]
                e.count[key] = end[0]
                for part, tables in ((PLACE, (e.slot, e.origin)), (CONTENT, (e.content,)), (ALIAS, (e.alias,))):
                    if state[part] is _FREE:
                        continue
                    value = end[part] = translated(b, part, state[part])
                    for table, v in zip(tables, value if part == PLACE else (value,)):
                        if v is None:
                            table.pop(key, None)
                        else:
                            table[key] = v
                moved_after[key] = tuple(end)
        if self.rec is not None:  # a run of rounds inside a recorded call
            self.rec.add(Record(copy.low, [None] * (copy.stop - copy.start), copy.before, set(copy.read),
                                set(copy.written),
                                {(*k, part): v for k, st in moved_before.items() for part, v in enumerate(st) if part
                                 and v is not _FREE},
                                {(*k, part) for k, st in (moved_after or moved_before).items()
                                 for part, v in enumerate(st) if part and (moved_after is None or v is not _FREE)}))
        self.reused.append(Reuse(kind, call.layer.name, layer.name, self.layers - 1, call.work[0], work[0], record[3],
                                 bool(swap), copy.stop - copy.start))
        return copy, moved_before, moved_after


def remap(call, keys: dict, unit, shift: int, tracker: Deps, units: list) -> dict | None:
    """Where each dependency of ``call`` (a ``_Call``: its ``before``, ``read``, ``written``) on
    an instruction before it goes in a copy ``shift`` positions on (old position -> new): to what
    emission would wait for instead, read off ``tracker``'s entries for the objects ``keys`` maps
    ``call``'s to, unit by unit (``unit`` maps ``call``'s units to the copy's) — the latest of
    them where one instruction stands for several (waiting for the later instruction of a unit
    waits for the earlier); else ``shift`` on when that position runs on the mapped unit
    (``units``: the unit of each stream position). Only the entries ``call``'s instructions wait
    for count (``_waits``). None where the entries differ in their units, an object's ssa-ness
    differs, or a dependency has no place."""
    writers, readers, ssa = tracker.writers, tracker.readers, tracker.ssa
    need: dict = {}  # old position -> latest position emission waits for instead
    mapped_units: dict = {}  # old position -> the copy's unit for it
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
                mapped_units[i] = u
                if u in now:
                    need[i] = max(need.get(i, -1), now[u])
    out, n = {}, len(units)
    for i, u in mapped_units.items():
        p = need.get(i)
        if p is None:
            p = i + shift
            if p >= n or units[p] != u:
                return None
        out[i] = p
    return out


def _waits(call: _Call, key, ssa: bool) -> tuple[int, int]:
    """Which of an object's tracker entries (writers, readers) ``call``'s instructions waited
    for, as a slice of the two: reading waits for writers, writing for readers, and, unless the
    object is a tensor written once in pieces (ssa), for writers too."""
    written = key in call.written
    return (0 if key in call.read or (written and not ssa) else 1), (2 if written else 1)


def _joined(a: tuple, b: tuple) -> tuple:
    """Two records of consecutive runs of rounds (``Compressor.rounds``) as one: the tile
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


def _held(held: dict, run) -> dict:
    """Per core of ``run`` (tiles, cores), in order of first appearance: the loop values of
    the tile whose stores it holds back as the run begins (``held``: the emitter's, core -> tile
    loop values), less those of its first tile in the run (None: it holds none). A copy of a run
    holds back and releases what the run did only where these agree."""
    out: dict = {}
    for values, core in run:
        if core not in out:
            h = held.get(core)
            out[core] = None if h is None else tuple(a - b for a, b in zip(h, values))
    return out


def _relative_held(held: dict, work) -> dict:
    """``_held`` of a run, its cores counted from the run's first."""
    return {core - work[0][1]: v for core, v in held.items()}


def _bent_values(layer: Layer, work) -> tuple:
    """The distinct values the tiles of ``work`` have on the slots of ``layer``'s non-linear
    index terms (``KernelIR.bent``), each as ((slot, value), ...): ``KernelIR.moves``' ``at``."""
    bent = [(i, lp.slot) for i, lp in enumerate(layer.ir.tile_loops()) if lp.slot in layer.ir.bent]
    return tuple(sorted({tuple((slot, values[i]) for i, slot in bent) for values, _ in work}))


def _moved(layer: Layer, before, after) -> tuple:
    """(cores moved, ``KernelIR.moves``) taking the tiles ``before`` to ``after`` (runs of
    (loop values, core) of one shape): the values are the tile loops', and for a run of chunks
    (``Compressor.chunks``) the chunk loop's after them — from the second chunk on, so
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


def _merged(ranges: list) -> list:
    """Sorted (lo, hi, to, shift) ranges with those that overlap (and so move alike) made one: a
    layer that reads one region as two parameters (a concatenation of a tensor with itself)
    moves it once (a replica's moves of one place must not overlap)."""
    out: list = []
    for r in ranges:
        if out and r[0] < out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], r[1]), *r[2:])
        else:
            out.append(r)
    return out
