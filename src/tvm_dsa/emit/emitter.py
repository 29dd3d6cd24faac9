"""Emission: lowered kernels (TIR after TileForLB, AssignScopes, LowerToDSA) -> DSA instructions.

A ``KernelEmitter`` emits one kernel made of layers (``placement.Layer``: lowered PrimFuncs read
into the kernel IR). The caller deals each layer's tiles to cores and says where each tensor
lives (a ``placement.Region``: DDR, a cluster's GB or a core's LB, possibly a box of the tensor);
``build_program`` is the one-layer case (every tensor in DDR, the first tile loop's index picks
the cluster, tiles round-robin over its cores), ``stitch.emit_stitched`` the multi-layer one.
Chunk loops are iterated in place. Every stage becomes instructions whose box is the stage's loop
extents; inner loop coefficients give an operand's strides, outer ones its base.

Tile buffers are placed by ``plan_lb``: each holds the region its first writer produces in one
iteration (its origin moves with the tile), double-buffered when the LB has room, plus a scratch
area for vector temporaries. The emitter walks the IR and makes the instructions; two concerns
it leaves to modules of their own, each with one interface: the dependency tokens, derived from
the memory objects each instruction touches (``deps``), and the compression of what repeats —
layer calls, rounds of tiles, chunks — into copies of earlier instructions (``compress``: its
``Compressor`` decides what is emitted, and the emitter reports to it what it pushes and which
tile-buffer state it reads and writes).
"""

from __future__ import annotations

import bisect
import collections
import itertools
import math
from dataclasses import replace

from tvm_dsa import isa
from tvm_dsa.emit.compress import ALIAS, CONTENT, PLACE, Compressor
from tvm_dsa.emit.deps import MemoryObjects
from tvm_dsa.emit.placement import Layer, Pieces, Region, row_major
from tvm_dsa.hardware import Hardware
from tvm_dsa.kernel.ir import (
    ALIGN, Access, CodegenError, Const, KernelIR, Loop, Op, Read, Select, Stage, align, stages_of
)

PROMOTE = "promote"  # layer mark of whole-tensor copies between memories (weight promotion)
FANOUT = 4  # copies a core sends of a box it holds before a copy of it is asked to (``_holder``)


class KernelEmitter:
    """Emits one kernel: layers, each over a list of (tile, core), with the regions of its tensors.

    The caller decides which tiles run where and where tensors live (``layer``), and moves whole
    tensors between memories (``move``). Dependency tokens follow from the memory every
    instruction touches, including memory reused by a later tensor or another layer's buffers
    (``memory``: ``deps.MemoryObjects``). A layer call like an earlier one, or a round or chunk
    like an earlier one of its call, is not emitted again but copied or replayed (``compression``:
    ``compress.Compressor``; ``replay=False`` emits everything, for tests); the stream then holds
    the copies' positions too (``size``, ``units``). A tile's trailing stores wait behind its
    core's next tile's leading loads (``store_split``; ``hold_stores=False``: they do not, for
    tests). On chips whose cores have a second DMA queue (``prefetch_dma``) the stores out of an
    LB take it (``store_queue``; False where the caller loads weights ahead on it, ``_dma``).
    ``gb_multicasts=False``: the tiles' loads from a GB are plain DMAs; ``ddr_multicasts``: their
    loads from DDR into the LBs may be multicasts on a chip without a mesh too;
    ``steady_multicasts``: in a clamped layer, so are its boxes that do not move with the clamped
    loop (``_dma``); ``unstick``: none of its multicasts waits for ever (``_unstick_multicasts``);
    ``queued_reads``: the tensors whose tiles' loads take the second queue too (``_dma``)."""

    def __init__(self, hw: Hardware, name: str, replay: bool = True, hold_stores: bool = True,
                 store_queue: bool = True, gb_multicasts: bool = True, ddr_multicasts: bool = False,
                 steady_multicasts: bool = False, unstick: bool = False, queued_reads: frozenset = frozenset()):
        self.hw, self.name, self.hold_stores = hw, name, hold_stores
        self.queued_reads = queued_reads if hw.prefetch_dma else frozenset()  # loads on the second queue
        self.unstick = unstick  # multicasts whose transfer would never start made plain (``kernel``)
        self.gb_multicasts = gb_multicasts  # loads from a GB may be multicasts (``_dma``)
        self.steady_multicasts = steady_multicasts  # and in a clamped layer those not moving with it
        self.ddr_multicasts = ddr_multicasts  # and loads from DDR, on a bus
        self.store_queue = store_queue and hw.prefetch_dma
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
        self.scratch_top = 0
        self.compression = Compressor(self, replay)
        self.calls = 0  # layer calls emitted
        self.tile_round: tuple | None = None  # (layer call, the core's tile in it) being emitted
        self.rounds: dict[int, tuple] = {}  # stream position of a multicast from an LB -> its tile_round
        self.join_floor = 0  # stream positions below it are not extended (``_joined``)
        # (memory object, tile loop values -> slabs its box touches, per slab {unit: its last write}):
        # the writes of a kept output recorded slab by slab (``layer``'s ``slabs``)
        self.watched: tuple | None = None
        self.mirrors: dict = {}  # output tensor -> other places (``Pieces``) its stores also write (``layer``)

    def kernel(self) -> isa.Kernel:
        if self.hw.interconnect == "mesh":
            self._group_multicasts()
        if self.unstick:
            self._unstick_multicasts()
        return isa.Kernel(self.name, tuple(sorted(self.cores_used)), tuple(self.instructions), tuple(self.marks),
                          tuple(self.compression.replicas))

    def _group_multicasts(self) -> None:
        """Name the transfer of each multicast DMA from another core's LB (``isa.Dma.group``): the
        loads of one box (since its bytes were last written) to one place, by the cores' tiles of
        one round of one layer call, which run at once. A load no other core's joins moves alone.
        Inferred instead (the n-th load of the box into each core, ``isa.multicast_groups``), a
        core that loaded the box in another round, or in another layer reading the same feature
        map into the same place, paired with the wrong round and held up its queue: a
        two-convolution SET tree on set-edge16-fp16 took 196,159 cycles so, 138,526 with no
        multicasts (docs/set.md); the chains that mixed rounds were then moved alone. Loads from
        DDR keep the inferred pairing: across rounds they read DDR once (ResNet-50 on
        set-cloud144: 26.5 MB of DDR reads, 28.8 MB grouped by round). On a mesh the stream is
        the instructions (no copies)."""
        chains = isa.multicast_chains(self.instructions)
        transfers: dict[tuple, list[int]] = {}
        for i, chain in chains.items():
            if self.instructions[i].src.mem == "lb":
                transfers.setdefault((chain, self.rounds.get(i)), []).append(i)
        for members in transfers.values():
            cores = {self.instructions[i].dst.index for i in members}
            for i in members:
                ins = self.instructions[i]
                self.instructions[i] = (isa.replaced(ins, group=members[0] + 1) if len(cores) == len(members) > 1
                                        else isa.replaced(ins, multicast=False))

    def _unstick_multicasts(self) -> None:
        """Multicast DMAs whose transfer would never start made plain (``unstuck``), and every
        copy the replicas make of them. Only where asked (``unstick``): over a written-out stream
        it costs about 2 us an instruction, half of BERT-128's batch-8 build, whose kernels had
        none."""
        self.instructions[:] = unstuck(self.instructions, self.hw.cores_per_cluster, self.compression.replicas)

    def mark(self, name: str, shape) -> None:
        """The instructions from here on compute layer ``name`` (for reports and traces)."""
        first = self.size
        if self.marks and self.marks[-1].first == first:
            self.marks.pop()  # the previous mark got no instructions
        if not self.marks or self.marks[-1].name != name:
            self.marks.append(isa.LayerMark(first, name, tuple(shape)))

    def claim(self, region: Region, key, ssa: bool = True, pieces: tuple[int, int] | None = None) -> None:
        """``key`` (a tensor's region) now owns its bytes (``MemoryObjects.claim``; ``pieces``
        (dim, width): its slices along ``dim`` are objects of their own, each written by its own
        transfer, ``move``)."""
        self.memory.claim(region, key, ssa, pieces)

    def enter(self, layer: Layer, core: int, lb_base: int) -> None:
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

    def move(self, src: Region, dst: Region, core: int, prefetch: bool = False, box=None,
             copies: bool = False, after: set | None = None) -> None:
        """Copy ``box`` ((origin, extents); by default ``dst``'s box, which ``src``'s holds) from
        ``src`` to ``dst`` in another memory, e.g. a weight promotion DDR -> GB, or a kernel output
        kept in a GB written out to DDR; one transfer per piece, in order, where ``dst`` was
        claimed in pieces; with ``prefetch`` on ``core``'s prefetch queue (``isa.Dma.prefetch``).
        A promotion DDR -> GB on a chip with ``multicast_dma`` is a multicast (``isa.Dma.multicast``):
        the clusters that promote the same box to the same place read DDR for it once; so are
        ``copies`` into LBs (a weight piece SET pins on each core reading it, at one place).
        ``after``: the writes of ``src`` the copy waits for, instead of every unit's last
        (``layer``'s ``slabs``)."""
        self.cores_used.add(core)
        self.mark(PROMOTE, ())
        boxes = [box or (dst.origin, dst.extents)]
        key = self.memory.spaces[(dst.mem, dst.index)].whole_owner(dst.base, dst.base + dst.nbytes)
        if key in self.memory.pieced:
            dim, width = self.memory.pieced[key][:2]
            boxes = [(tuple(o + (j if d == dim else 0) for d, o in enumerate(dst.origin)),
                      tuple(min(width, e - j) if d == dim else e for d, e in enumerate(dst.extents)))
                     for j in range(0, dst.extents[dim], width)]
        multicast = self.hw.multicast_dma and src.mem == "ddr" and (dst.mem == "gb" or copies)
        for origin, extents in boxes:
            self.push(isa.Dma(core, extents, _whole_operand(dst, origin), _whole_operand(src, origin),
                              prefetch=prefetch, multicast=multicast), core, after=after)

    def replicate(self, start: int, stop: int, cores: int, cluster: int, ddr_shift: dict) -> bool:
        """Record that stream positions [start, stop) — one cluster's part of a kernel — run again
        for the cluster ``cluster`` whose part is the same translated: cores moved by ``cores``,
        its own GB, each DDR object (keyed as when claimed) moved by ``ddr_shift[key]`` bytes
        (``isa.Replica``, at the end of the stream; ``Compressor.replicate``). False (nothing
        recorded) when the part depends on instructions outside it, touches DDR objects
        ``ddr_shift`` does not name, or objects whose DDR ranges overlap. What the copy runs is
        what emitting the cluster would give, without the false dependencies emission adds
        between clusters' disjoint pieces of one DDR tensor."""
        return self.compression.replicate(start, stop, cores, cluster, ddr_shift)

    def layer(self, layer: Layer, work, regions: dict, lb_base: int = 0, slabs: dict | None = None,
              mirrors: tuple[Region, ...] = ()) -> list | None:
        """Emit ``layer``'s tiles: ``work`` is a list of (tile loop values, core); ``regions``
        maps each parameter's tensor to where it lives for these tiles. With ``slabs`` (tile loop
        values -> the slabs of the output the tile's box touches) the call is emitted as it
        comes (no copy of recorded instructions: each write is seen) and returns, per slab, the
        writes that finish it ({unit: position}), for copies of the slabs that wait for their
        own tiles only (``move``'s ``after``). ``mirrors``: other places of the output (boxes of
        it in other GBs, which the bus reaches): each tile's store also writes there the part of
        its box they hold (a stitched kernel's halo rows, stored straight into the neighbours'
        GBs); the call is emitted as it comes too."""
        self.mark(layer.name, layer.ir.params[-1][1])
        out = layer.args.get(layer.ir.params[-1][0])
        target = regions.get(out)
        if layer.ir.clamped:
            self._written_twice(target)
            for m in mirrors:
                self._written_twice(m)
        if slabs is None and not mirrors:
            self.compression.layer(layer, work, regions, lb_base)
            return None
        writers = [{} for _ in range(1 + max(j for touched in slabs.values() for j in touched))] if slabs else []
        self.watched = (self.memory.owner(target), slabs, writers) if slabs else None
        self.mirrors = {out: [_within(m, layer.ir.params[-1][1]) for m in mirrors]} if mirrors else {}
        try:
            self.emit(layer, work, regions, lb_base)
        finally:
            self.watched, self.mirrors = None, {}
        return writers if slabs else None

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

    def emit(self, layer: Layer, work, regions: dict, lb_base: int) -> None:
        """Emit ``layer``'s tiles ``work`` (``layer``'s arguments). A tile's trailing stores wait
        in the core's DMA queue behind its next tile's leading loads (``store_split``): the
        loads then run while the tile's product and epilogue do, not after its stores. While the
        compressor records the call (``Compressor.recording``), the tiles come round by round
        from it (``Compressor.rounds``), less the rounds it copies, and so do the chunks of each
        tile's chunk loop (``_chunk_loop``)."""
        self.cur, self.regions, self.lb_base = layer, regions, lb_base
        self.views: dict = {}  # (id(access), aliased region) -> _view
        self.aliasable = _aliasable(layer.ir)
        self.lb_strides = {n: row_major(b.extents) for n, b in layer.plan.buffers.items()}
        self.env = [0] * layer.ir.slots
        tile_loops = layer.ir.tile_loops()
        body = tile_loops[-1].body
        split = store_split(body, layer.plan) if self.hold_stores else None
        self.held: dict = {}  # core -> loop values of its last tile, whose stores are held back
        self.calls += 1
        tiles: dict[int, int] = {}  # core -> its tiles so far in this call
        if self.compression.recording is not None:
            parts = self.compression.rounds(layer, work, lb_base, split is not None)
        else:
            for _, core in work:
                self.cores_used.add(core)
                self.enter(layer, core, lb_base)
            parts = [work]
        for part in parts:
            for values, core in part:
                tiles[core] = tiles.get(core, 0) + 1
                self.tile_round = (self.calls, tiles[core])
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
        if split:
            for core in list(self.held):
                self._release(core, tile_loops, body[split[2]:])
        self.tile_round = None

    def _chunk_loop(self, loop: Loop, first: int, core: int) -> None:
        """Emit the chunks ``first``.. of the current tile's chunk loop on ``core``; while the
        layer's call is recorded, those the compressor does not copy (``Compressor.chunks``)."""
        chunks = range(first, loop.extent)
        if self.compression.recording is not None:
            values = tuple(self.env[lp.slot] for lp in self.cur.ir.tile_loops())
            chunks = self.compression.chunks(self.cur, values, loop, first, core)
        for v in chunks:
            self.env[loop.slot] = v
            self._nodes(loop.body, core)

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
        rec = self.compression.rec
        if acc.lb and piece is None and rec is not None:
            key = (core, acc.buffer)
            rec.reads(key, ALIAS, alias)
            if alias is None:
                rec.reads(key, PLACE, (self.slot.get(key), self.origin.get(key)))
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
            bus = mem == "gb" and piece is not None and self.hw.interconnect == "bus"
            if stage.op == "dma" and (mem == "lb" or bus):
                index = region.index  # another core's LB over the NoC, another cluster's GB over the bus
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
        if self.compression.rec is not None:
            self.compression.rec.writes(key, PLACE)

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
    def push(self, ins, core: int, unit=None, after: set | None = None) -> None:
        """Append ``ins`` (an instruction of ``core``'s tile) to the kernel on ``unit`` (default: the
        unit that runs it), waiting for what the memory objects it touches imply (``deps``), or
        for what it reads, only for ``after`` (positions)."""
        srcs, dst = isa.operands(ins)
        unit = unit or isa.unit_of(ins, self.hw.cores_per_cluster)
        memory = self.memory
        reads = [memory.key(o, ins) for o in srcs]
        writes = [memory.key(dst, ins)]
        idx = self.size
        deps = memory.deps.deps(reads if after is None else [], writes, unit)
        deps = tuple(sorted(deps if after is None else deps | after))
        if self.watched is not None and writes[0] == self.watched[0]:
            values = tuple(self.env[lp.slot] for lp in self.cur.ir.tile_loops())
            for j in self.watched[1].get(values, range(len(self.watched[2]))):  # not a tile's: every slab's
                self.watched[2][j][unit] = idx
        joined = self._joined(ins, unit, deps)
        if joined is not None:  # the unit's last transfer extended by this one's box
            object.__setattr__(joined, "deps", self.instructions[-1].deps)
            self.instructions[-1] = joined
            memory.deps.record(idx - 1, reads, writes, unit)
            if self.watched is not None and writes[0] == self.watched[0]:
                for w in self.watched[2]:  # the extended transfer is the unit's write, where its parts were
                    if w.get(unit) == idx:
                        w[unit] = idx - 1
            return
        if self.compression.rec is not None:
            self.compression.rec.pushed(unit, reads, writes, deps, memory.deps)
            self.join_floor = idx + 1  # a recorded run is copied as it was: never extended
        # the instruction was made here and nothing else holds it yet: its deps are set in place
        # (``dataclasses.replace`` cost more than the rest of the emission)
        object.__setattr__(ins, "deps", deps)
        self.instructions.append(ins)
        self.literal_at.append(idx)
        self.units.append(unit)
        self.size += 1
        memory.deps.record(idx, reads, writes, unit)

    def _joined(self, ins, unit, deps: tuple):
        """The stream's last instruction and ``ins`` (waiting for ``deps``) as one DMA, where both
        are plain transfers on ``unit`` whose boxes continue each other along one dim in source and
        destination alike (a concatenation's channel tiles copied between two LBs, or within DDR
        by several cores of a cluster, whose ``cdma`` queue runs them all), and ``ins`` waits for
        nothing the last does not (the joined transfer starts no later): one set-up instead of
        two (GoogLeNet's SET tree on set-cloud144 copied a concatenation's 40 kB within DDR in
        208 transfers of 196 B, 13 k cycles of its critical path). None where they do not join,
        or a copy run is being recorded (its record counts the instructions pushed), or the last
        instruction belongs to a recorded run (a later copy of the run would copy the extended
        box)."""
        if (type(ins) is not isa.Dma or ins.multicast or ins.prefetch or not self.instructions
                or self.literal_at[-1] != self.size - 1 or self.units[-1] != unit
                or self.compression.rec is not None or self.size - 1 < self.join_floor):
            return None
        last = self.instructions[-1]
        if (type(last) is not isa.Dma or last.multicast or last.prefetch
                or last.core != ins.core and unit[0] != "cdma" or not set(deps) <= set(last.deps)):
            return None
        a, b = (last.src, last.dst), (ins.src, ins.dst)
        if any((x.mem, x.index, x.dtype, x.strides) != (y.mem, y.index, y.dtype, y.strides) for x, y in zip(a, b)):
            return None
        differ = [d for d, (m, n) in enumerate(zip(last.shape, ins.shape)) if m != n]
        for d in differ or range(len(ins.shape)):
            if [m for i, m in enumerate(last.shape) if i != d] != [n for i, n in enumerate(ins.shape) if i != d]:
                continue
            if all(y.offset - x.offset == last.shape[d] * x.strides[d] * x.itemsize != 0
                   and x.strides[d] > sum((n - 1) * abs(t) for i, (n, t) in enumerate(zip(last.shape, x.strides)) if i != d)
                   for x, y in zip(a, b)):  # the slices along d do not overlap
                shape = tuple(m + n if i == d else m for i, (m, n) in enumerate(zip(last.shape, ins.shape)))
                return isa.Dma(last.core, shape, last.dst, last.src)
        return None

    def _stage(self, stage: Stage, core: int) -> None:
        self.scratch_top = 0
        whole = [0] * len(stage.shape), list(stage.shape)
        if stage.name in self.aliasable:
            tensor = self.cur.args.get(stage.value.access.buffer)
            source = self.regions.get(tensor)
            if isinstance(source, Pieces):
                parts = tuple(dict.fromkeys(r for *_, r in source.split(stage.value.access, self.env, *whole, core)))
                source = parts[0] if len(parts) == 1 else parts
            key = (core, stage.dst.buffer)
            rec = self.compression.rec
            if rec is not None:
                rec.writes(key, ALIAS)
            if isinstance(source, Region) and (source.mem, source.index) == ("lb", core) and \
                    source.dtype == self.cur.plan.buffers[stage.dst.buffer].dtype:
                self.alias[key] = source  # stitched in this core's LB: read in place, no copy
                self.content.pop(key, None)
                if rec is not None:
                    rec.writes(key, CONTENT)
                return
            self.alias.pop(key, None)
            content = (stage.value.access.buffer, source, tuple(stage.value.access.point(self.env)))
            hit = self.content.get(key) == content
            if rec is not None:
                rec.loads(key, content, hit)
            if hit:
                return  # the buffer still holds this box (e.g. the weights of the previous tile)
            self.content[key] = content
            if rec is not None:
                rec.writes(key, CONTENT)
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
                self.push(isa.Dma(core, stage.shape, dst, src), core)
            else:
                self._copy(stage, stage.value, dst, core, [0] * len(stage.shape), list(stage.shape))
            for mirror in () if stage.dst.lb else self.mirrors.get(self.cur.args.get(stage.dst.buffer), ()):
                for s, e, place in mirror.split(stage.dst, self.env, *whole):
                    if place is not None:  # the part of the box the mirror holds, written there too
                        there = self._operand(stage, stage.dst, core, s, e, place)
                        self._copy(stage, stage.value, there, core, s, e, s)
        elif stage.op == "mme":
            a, b = (self._operand(stage, r.access, core) for r in stage.value)
            mask = tuple(s == 0 for s in dst.strides)
            self.push(isa.Mme(core, stage.shape, mask, dst, a, b, self._adds(stage)), core)
        elif stage.op == "reduce":
            mask = tuple(s == 0 for s in dst.strides)
            reduced = stage.point_sums()
            if reduced:
                self._point_sums(stage, reduced, dst, core)
                return
            src = self._expr(stage, stage.value, core, None)
            self.push(isa.Reduce(core, "vme", stage.reduce_op, stage.shape, mask, dst, src, self._adds(stage)), core)
        else:
            self._expr(stage, stage.value, core, dst)

    def _point_sums(self, stage: Stage, reduced: tuple[int, ...], dst: isa.Operand, core: int) -> None:
        """A sum of products (``Stage.point_sums``) one point of its ``reduced`` loops at a time:
        that point's products multiply-accumulated into ``dst`` (``mac``; the first point's
        written with ``mul`` where the stage does not add, ``_adds``)."""
        kids = [self._operand(stage, k.access, core) if isinstance(k, Read) else k.value for k in stage.value.kids]
        box = tuple(1 if i in reduced else n for i, n in enumerate(stage.shape))
        adds = self._adds(stage)
        for point in itertools.product(*(range(stage.shape[i]) for i in reduced)):
            start = [0] * len(stage.shape)
            for i, x in zip(reduced, point):
                start[i] = x
            args = tuple(_sub_operand(k, start) if isinstance(k, isa.Operand) else k for k in kids)
            self.push(isa.Vector(core, "vme", "mac", box, dst, (*args, dst)) if adds
                      else isa.Vector(core, "vme", "mul", box, dst, args), core)
            adds = True

    def _holder(self, stage: Stage, core: int, dst: isa.Operand) -> isa.Operand | None:
        """On a mesh, where another core's buffer holds the box this copy loads (the same layer's
        tile of the same tensor), the operand to copy it from over the NoC instead of loading it
        from its source again: seed 002's tiles share weights and ifmaps by multicast, DRAM read
        once. The copies form a tree of fan-out ``FANOUT``, as shallow as the holders allow (a copy
        waits for its holder's, so depth is latency; one source serving all would be a star on
        its links). A box whose source is kept in LBs (a SET tree's pieces) is loaded from there:
        the pieces spread the reads over their cores' links where a holder's would carry them
        all (ResNet-50's SET tree on set-edge16: 3.00 M cycles with the tree, 2.90 M without). A
        mesh with ``multicast_dma`` needs no tree: the cores' loads of the box are one multicast
        (``_dma``)."""
        if self.hw.interconnect != "mesh" or self.hw.multicast_dma:
            return None
        buf = stage.dst.buffer
        content = self.content[(core, buf)]
        source = content[1] if isinstance(content[1], tuple) else (content[1],)
        if all(isinstance(r, Region) and r.mem == "lb" for r in source):
            return None
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
            self.push(isa.Vector(core, "vme", "copy", stage.shape, dst, (src,)), core)
            return dst
        if not isinstance(v, Op):
            raise CodegenError(f"stage {stage.name}: conditional values are not supported in compute")
        computed: dict = {}  # a kid the op reads twice is computed once (a square: (x - m) * (x - m))
        for k in v.kids:
            if k not in computed:
                computed[k] = self._expr(stage, k, core, None)
        kids = tuple(computed[k] for k in v.kids)
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
        self.push(isa.Vector(core, unit, v.name, shape, out, args), core)
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
        moving = isinstance(v, Read) and bool(self.cur.ir.clamped and self.cur.ir.clamped & v.access.slots)
        if isinstance(source, Pieces):
            for s, e, piece in source.split(v.access, self.env, start, extent, core):
                src = self._operand(stage, v.access, core, s, e, piece)
                self._dma(core, tuple(e), _sub_operand(dst, [a - b for a, b in zip(s, at)]), src, moving)
            return
        if isinstance(v, Read):
            src = self._operand(stage, v.access, core, start, extent)
            if src.dtype == sub_dst.dtype:
                queued = self.cur.args.get(v.access.buffer) in self.queued_reads
                self._dma(core, shape, sub_dst, src, moving, queued)
            else:  # converted in this core's LB: the temporaries are free again after (tokens order reuse)
                top, box = self.scratch_top, set(range(len(shape)))
                if (src.mem, src.index) != ("lb", core):  # moved here first (a wide tensor to an fp16 MME operand)
                    tmp = self._scratch(box, stage, core, src.dtype)
                    self._dma(core, shape, tmp, src)
                    src = tmp
                if (sub_dst.mem, sub_dst.index) == ("lb", core):
                    self.push(isa.Vector(core, "vme", "copy", shape, sub_dst, (src,)), core)
                else:  # then moved (an fp16 tensor concatenated into a wide one in DDR: both)
                    cast = self._scratch(box, stage, core, sub_dst.dtype)
                    self.push(isa.Vector(core, "vme", "copy", shape, cast, (src,)), core)
                    self._dma(core, shape, sub_dst, cast)
                self.scratch_top = top
        elif isinstance(v, Const) and sub_dst.mem == "lb":
            self.push(isa.Fill(core, shape, sub_dst, v.value), core)
        else:
            raise CodegenError(f"stage {stage.name}: cannot copy {type(v).__name__} to {sub_dst.mem}")

    def _dma(self, core: int, shape, dst: isa.Operand, src: isa.Operand, moving: bool = True,
             queued: bool = False) -> None:
        """A DMA for ``core``'s tile; issued by the core whose LB it touches when that is not
        ``core``'s (a copy between tensors kept in other cores' LBs, or between one and DDR). A
        load from a GB is a multicast on chips with ``multicast_dma`` (``isa.Dma.multicast``):
        the cluster's cores loading the same box to the same place, the n-th load of each (the
        tiles of one round that share a weight chunk), read the GB once. Not in a layer whose
        tiles overlap (``ClampTiles``): its last tile along the clamped loop loads boxes of its
        own, the cores' n-th loads stop lining up after it, and paired loads of different rounds
        made the cores wait on each other (ViT-B/16 at batch 8: 25.76M cycles, 14.78M without;
        pairing there only the boxes that do not move with the clamped loop, its weights, 16.23M
        against 12.74M). With ``steady_multicasts`` those boxes (not ``moving``) pair all the same:
        with a sample's tokens split over the clusters, a cluster's tiles of them load every weight
        chunk alike, round by round (ViT-B/16 at batch 1: 3,482,132 -> 2,858,927 cycles). Not
        where the caller says (``gb_multicasts``: the n-th loads of a box by the cores can be of
        different rounds anywhere, and whether the GB reads saved pay for the waits depends on the
        kernel, ``kernelgen.stitched``). In a stitched kernel (``ddr_multicasts``) a load
        from DDR into an LB is one too: cores loading one weight box that the kernel keeps in DDR
        (for their own rows, or samples) read DDR once (ResNet-50 at batch 1: 1,080,994 ->
        1,077,426 cycles; BERT-128 2,814,795 -> 2,759,499; at batch 8 ResNet-50 2,538,417 ->
        2,530,577, MobileNetV2 442,661 -> 437,701). Not in a layer's own kernel: its plans and
        tuning records were chosen for loads that each read DDR (ViT's 197 x 768 x 768 projection
        in tiles of all 197 rows, every core loading the rows of its sample, 185,092 -> 49,943
        cycles paired, against 156,608 for the plan the search picks). On
        a mesh, where tiles load their boxes from DDR (no GB) or from pieces kept in other cores'
        LBs (a SET tree's feature maps), those loads are the multicasts. A store out of the core's
        LB to a GB or DDR goes on the core's second DMA queue (``store_queue``,
        ``isa.Dma.prefetch``): waiting for its tile's epilogue, it holds back none of the next
        tile's loads (Conformer at batch 8, graphturbo: 165,948 -> 155,687 cycles). So does a
        load the caller ``queued`` into its LB (a weight's, ``queued_reads``): it moves beside the
        activations' loads, not behind them (``kernelgen.stitched._faster_loads``)."""
        issuer = core
        if (dst.mem, dst.index) != ("lb", core) and (src.mem, src.index) != ("lb", core):
            issuer = src.index if src.mem == "lb" else dst.index if dst.mem == "lb" else core
        self.cores_used.add(issuer)
        shared = ("ddr", "lb") if self.hw.interconnect == "mesh" else ("ddr", "gb") if self.ddr_multicasts else ("gb",)
        multicast = (self.hw.multicast_dma and (dst.mem, dst.index) == ("lb", issuer) and src.mem in shared
                     and (src.mem, src.index) != ("lb", issuer)
                     and not (self.cur.ir.clamped and (moving or not self.steady_multicasts))
                     and (self.gb_multicasts or src.mem != "gb"))
        if multicast and src.mem == "lb":
            self.rounds[self.size] = self.tile_round
        store = self.store_queue and (src.mem, src.index) == ("lb", issuer) and dst.mem != "lb"
        second = store or queued and (dst.mem, dst.index) == ("lb", issuer)  # ``queued_reads`` only on such chips
        self.push(isa.Dma(issuer, shape, dst, src, prefetch=second, multicast=multicast), issuer)

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


def unstuck(instructions, cores_per_cluster: int, replicas=()) -> list:
    """A kernel's ``instructions`` (``replicas`` writing out its stream) with the multicast DMAs
    whose transfer would never start (``isa.stuck_multicasts``) made plain, and so every copy the
    replicas make of them, until no transfer is stuck. The n-th loads of a box by a cluster's
    cores are one transfer, and a core's load in its first tile can pair with another core's in
    its second, whose queue waits on the first core's: DenseNet-121's dense blocks at batch 1 (a
    sample's rows over the clusters, 12 tiles on 8 cores) had such cycles, which the simulator
    breaks only when nothing else can run (a machine would hang). The loads from a GB or an LB
    go plain first, and one from DDR only where no other is stuck: a DDR box each core reads
    again costs the chip's DDR (ResNet-50's last 3 x 3 convolution at batch 1, its weights' DDR
    multicasts made plain, took 265,455 cycles against 48,596 with plain GB loads; the model
    799,947 -> 779,851 once they stayed)."""
    out = list(instructions)
    if not any(type(ins) is isa.Dma and ins.multicast for ins in out):
        return out
    while True:
        stream, origins = isa.expanded_stream(out, replicas)
        stuck = isa.stuck_multicasts(stream, cores_per_cluster)
        if not stuck:
            return out
        on_chip = {j for j in stuck if stream[j].src.mem != "ddr"}
        for i in {origins[j] for j in on_chip or stuck}:
            out[i] = isa.replaced(out[i], multicast=False, group=0)


def _within(region: Region, shape) -> Pieces:
    """A tensor of ``shape`` as pieces cut at the edges of ``region``'s box: the box's piece is
    ``region``, every other piece None (``KernelEmitter.layer``'s ``mirrors``)."""
    lo, hi = region.origin, [o + e for o, e in zip(region.origin, region.extents)]
    cuts = tuple(tuple(x for x in (a, b) if 0 < x < n) for a, b, n in zip(lo, hi, shape))
    cells = collections.defaultdict(lambda: None)
    cells[tuple(bisect.bisect_right(c, a) for c, a in zip(cuts, lo))] = region
    return Pieces(tuple(shape), cuts, cells)


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


def store_split(body, plan) -> tuple | None:
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


def place_arguments(inputs, outputs, tensors: dict, stored: dict) -> tuple[dict, list, int]:
    """(DDR region per tensor, ``TensorArg`` list, first free offset): a kernel's inputs then its
    outputs packed in DDR from offset 0 (``tensors``: name -> (shape, host dtype); ``stored``:
    name -> the type it is stored in, ``placement.stored_dtypes``)."""
    regions, args, offset = {}, [], 0
    for role, names in (("input", inputs), ("output", outputs)):
        for t in names:
            shape, dtype = tensors[t]
            regions[t] = Region.whole("ddr", 0, offset, shape, stored[t])
            args.append(isa.TensorArg(t, role, tuple(shape), stored[t], dtype, offset))
            offset = align(offset + args[-1].nbytes)
    return regions, args, offset


def build_program(func, hw: Hardware, name: str, num_outputs: int = 1, hold_stores: bool = True,
                  lb_bytes: int | None = None, cores: tuple[int, ...] = (), gb: frozenset = frozenset(),
                  tiles: int | None = None, replay: bool = True) -> isa.Program:
    """One-kernel program for a lowered PrimFunc whose last ``num_outputs`` params are outputs:
    every tensor in DDR, the first tile loop's index picks the cluster (the batch split), tiles go
    round-robin over the cluster's cores, or over ``cores`` where given (``hold_stores``:
    ``KernelEmitter``'s); its buffers in the first ``lb_bytes`` of the LB (all of it by default).
    For timing a layer as a stitched kernel runs it (``tiling.lower_timed``): the parameters at
    positions ``gb`` in cluster 0's GB instead (their values are not loaded, and ``hw`` may be a
    chip with a GB that holds them: the program is for timing), and only the first ``tiles``.
    ``replay``: ``KernelEmitter``'s (a program of a few tiles is emitted faster whole)."""
    layer = Layer.of(func, hw, name, lb_bytes=lb_bytes)
    regions, args, offset, top = {}, [], 0, 0
    for i, (pname, shape, dtype) in enumerate(layer.ir.params):
        role = "output" if i >= len(layer.ir.params) - num_outputs else "input"
        stored = layer.ir.ddr_dtype(pname, hw)
        if i in gb and stored == hw.storage_dtype:
            regions[pname] = Region.whole("gb", 0, top, shape, stored)
            top = align(top + regions[pname].nbytes)
            continue
        regions[pname] = Region.whole("ddr", 0, offset, shape, stored)
        args.append(isa.TensorArg(pname, role, shape, stored, dtype, offset))
        offset = align(offset + args[-1].nbytes)
    emitter = KernelEmitter(hw, name, replay, hold_stores)
    for pname, r in regions.items():
        emitter.claim(r, (r.mem, pname))
    extents = [lp.extent for lp in layer.ir.tile_loops()]
    every = list(itertools.product(*map(range, extents)))
    work = list(zip(every, [cores[n % len(cores)] for n in range(len(every))] if cores else deal(extents, hw)))
    emitter.layer(layer, work[:tiles], regions)
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
