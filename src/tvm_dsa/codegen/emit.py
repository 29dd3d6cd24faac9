"""Codegen: a lowered kernel (TIR after TileForLB, AssignScopes, LowerToDSA) -> DSA instructions.

The emitter walks the kernel's loops (``kernel_ir``). Tile loops are iterated and their tiles dealt
to cores: the first tile loop's index picks the cluster (the batch split), tiles go round-robin over
the cluster's cores. Chunk loops are iterated in place. Every stage becomes instructions whose box
is the stage's loop extents; inner loop coefficients give an operand's strides, outer ones its base.

Local buffers are placed by ``plan_lb``: each LB buffer holds the region its first writer produces
in one iteration (its origin moves with the tile), double-buffered when the LB has room, plus a
scratch area for vector temporaries. Dependency tokens are derived from the memory each
instruction touches (last writer; readers since the last write, per unit), so they are exactly
what the data flow implies.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field, replace

from .. import isa
from ..hardware import Hardware
from .kernel_ir import (
    ALIGN,
    Access,
    CodegenError,
    Const,
    KernelIR,
    Loop,
    Op,
    Read,
    Select,
    Stage,
    align,
    plan_lb,
    read_kernel,
)


@dataclass
class _Tracker:
    """Last writer and readers since, per memory object, to derive dependency tokens."""

    writer: dict = field(default_factory=dict)
    readers: dict = field(default_factory=dict)

    def deps(self, reads, writes, unit) -> set:
        out = set()
        for key in reads:
            w = self.writer.get(key)
            if w is not None and w[1] != unit:
                out.add(w[0])
        for key in writes:
            w = self.writer.get(key)
            if w is not None and w[1] != unit:
                out.add(w[0])
            for u, idx in self.readers.get(key, {}).items():
                if u != unit:
                    out.add(idx)
        return out

    def record(self, idx, reads, writes, unit) -> None:
        for key in reads:
            self.readers.setdefault(key, {})[unit] = idx
        for key in writes:
            self.writer[key] = (idx, unit)
            self.readers[key] = {}


def _prod(shape) -> int:
    n = 1
    for e in shape:
        n *= int(e)
    return n


def _row_major(shape) -> list[int]:
    strides, n = [], 1
    for e in reversed(list(shape)):
        strides.append(n)
        n *= int(e)
    return strides[::-1]


class KernelEmitter:
    """Emits one kernel; DDR tensors are given as {buffer name: (byte offset, shape)}."""

    def __init__(self, kernel: KernelIR, hw: Hardware, ddr: dict[str, tuple[int, tuple[int, ...]]], name: str):
        self.kernel, self.hw, self.ddr, self.name = kernel, hw, ddr, name
        self.plan = plan_lb(kernel, hw)
        self.ddr_strides = {n: _row_major(shape) for n, (_, shape) in ddr.items()}
        self.lb_strides = {n: _row_major(b.extents) for n, b in self.plan.buffers.items()}
        self.lb_ranges = sorted((s, s + align(b.nbytes), ("lb", b.name, s))
                                for b in self.plan.buffers.values() for s in b.slots)
        self.ddr_ranges = sorted((base, base + hw.storage_bytes * _prod(shape), ("ddr", n))
                                 for n, (base, shape) in ddr.items())
        self.instructions: list = []
        self.trackers: dict[int, _Tracker] = {}
        self.env = [0] * kernel.slots
        self.origin: dict = {}  # (core, buffer) -> origin indices
        self.slot: dict = {}  # (core, buffer) -> byte offset of the current copy
        self.count: dict = {}  # (core, buffer) -> lifetimes started
        self.scratch_top = 0
        self.cores_used: set[int] = set()

    def emit(self) -> isa.Kernel:
        tile_loops = self.kernel.tile_loops()
        body = tile_loops[-1].body
        cpc = self.hw.cores_per_cluster
        clusters = min(tile_loops[0].extent, self.hw.clusters)
        dealt = [0] * clusters
        for values in itertools.product(*(range(lp.extent) for lp in tile_loops)):
            cluster = values[0] % clusters
            core = cluster * cpc + dealt[cluster] % cpc
            dealt[cluster] += 1
            self.cores_used.add(core)
            for lp, v in zip(tile_loops, values):
                self.env[lp.slot] = v
            self._nodes(body, core)
        return isa.Kernel(self.name, tuple(sorted(self.cores_used)), tuple(self.instructions))

    def _nodes(self, nodes, core) -> None:
        for n in nodes:
            if isinstance(n, Loop):
                for v in range(n.extent):
                    self.env[n.slot] = v
                    self._nodes(n.body, core)
            else:
                self._stage(n, core)

    # -- operands --------------------------------------------------------------------------------
    def _operand(self, stage: Stage, acc: Access, core: int, start=None) -> isa.Operand:
        """Operand of ``acc`` over the stage's box, or over the sub-box starting at ``start``."""
        point = acc.point(self.env, start)
        if acc.lb:
            b = self.plan.buffers[acc.buffer]
            origin = self.origin[(core, acc.buffer)]
            estrides = self.lb_strides[acc.buffer]
            point = [p - o for p, o in zip(point, origin)]
            for d, (p, n) in enumerate(zip(point, b.extents)):
                span = sum(abs(c) * (e - 1) for c, e in zip(acc.inner[d], stage.shape))
                if p < 0 or p + span > n - 1:
                    raise CodegenError(f"stage {stage.name}: access to {acc.buffer} leaves its tile region")
            dtype, mem, index, base = b.dtype, "lb", core, self.slot[(core, acc.buffer)]
        else:
            if acc.buffer not in self.ddr:
                raise CodegenError(f"buffer {acc.buffer} is neither in the LB nor a kernel argument")
            base, shape = self.ddr[acc.buffer]
            estrides = self.ddr_strides[acc.buffer]
            if any(p < 0 or p >= n for p, n in zip(point, shape)):
                raise CodegenError(f"stage {stage.name}: access to {acc.buffer} at {point} is out of bounds")
            dtype, mem, index = self.hw.storage_dtype, "ddr", 0
        offset = base + isa.DTYPES[dtype] * sum(p * s for p, s in zip(point, estrides))
        strides = tuple(sum(row[i] * s for row, s in zip(acc.inner, estrides)) for i in range(len(stage.shape)))
        return isa.Operand(mem, index, offset, dtype, strides)

    def _start_lifetime(self, stage: Stage, core: int) -> None:
        acc = stage.dst
        b = self.plan.buffers[acc.buffer]
        if b.writer != stage.name:
            return
        key = (core, acc.buffer)
        n = self.count.get(key, 0)
        self.count[key] = n + 1
        self.origin[key] = acc.low_corner(self.env, stage.shape)
        self.slot[key] = b.slots[n % len(b.slots)]

    def _scratch(self, dims, stage: Stage, core: int, dtype="float32") -> isa.Operand:
        """A fresh contiguous temporary over the stage's box restricted to loops ``dims``."""
        strides, n = [0] * len(stage.shape), 1
        for i in reversed(range(len(stage.shape))):
            if i in dims:
                strides[i] = n
                n *= stage.shape[i]
        size = align(isa.DTYPES[dtype] * n)
        if self.scratch_top + size > self.plan.scratch_bytes:
            raise CodegenError(f"stage {stage.name}: scratch overflow")
        op = isa.Operand("lb", core, self.plan.scratch_offset + self.scratch_top, dtype, tuple(strides))
        self.scratch_top += size
        return op

    # -- instructions ----------------------------------------------------------------------------
    def _push(self, ins, core: int) -> None:
        tracker = self.trackers.setdefault(core, _Tracker())
        srcs, dst = isa.operands(ins)
        unit = isa.unit_of(ins, self.hw.cores_per_cluster)
        reads = [self._key(o) for o in srcs]
        writes = [self._key(dst)]
        idx = len(self.instructions)
        self.instructions.append(replace(ins, deps=tuple(sorted(tracker.deps(reads, writes, unit)))))
        tracker.record(idx, reads, writes, unit)

    def _key(self, o: isa.Operand):
        """The memory object an operand touches: a DDR tensor, an LB buffer copy, or scratch."""
        if o.mem == "lb" and o.offset >= self.plan.scratch_offset:
            return ("scratch",)
        ranges = self.ddr_ranges if o.mem == "ddr" else self.lb_ranges
        i = bisect.bisect_right(ranges, (o.offset, float("inf"))) - 1
        if i >= 0 and ranges[i][0] <= o.offset < ranges[i][1]:
            return ranges[i][2]
        raise CodegenError(f"{o.mem} offset {o.offset} belongs to no buffer")

    def _stage(self, stage: Stage, core: int) -> None:
        self.scratch_top = 0
        if stage.dst.lb:
            self._start_lifetime(stage, core)
        dst = self._operand(stage, stage.dst, core)
        if stage.op == "dma":
            self._copy(stage, stage.value, dst, core, [0] * len(stage.shape), list(stage.shape))
        elif stage.op == "mme":
            a, b = (self._operand(stage, r.access, core) for r in stage.value)
            mask = tuple(s == 0 for s in dst.strides)
            self._push(isa.Mme(core, stage.shape, mask, dst, a, b, True), core)
        elif stage.op == "reduce":
            src = self._expr(stage, stage.value, core, None)
            mask = tuple(s == 0 for s in dst.strides)
            self._push(isa.Reduce(core, "vme", stage.reduce_op, stage.shape, mask, dst, src, True), core)
        else:
            self._expr(stage, stage.value, core, dst)

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

    def _copy(self, stage: Stage, v, dst: isa.Operand, core: int, start, extent) -> None:
        """DMA / fill over the sub-box [start, start + extent), splitting ``Select`` on index
        bounds into the boxes where each branch holds."""
        if any(n <= 0 for n in extent):
            return
        if isinstance(v, Select):
            inside = self._bounds_box(v.bounds, start, extent)
            if inside is None:
                return self._copy(stage, v.other, dst, core, start, extent)
            for s, e, holds in _split_box(start, extent, *inside):
                self._copy(stage, v.then if holds else v.other, dst, core, s, e)
            return
        sub_dst = _sub_operand(dst, start)
        shape = tuple(extent)
        if isinstance(v, Read):
            src = self._operand(stage, v.access, core, start)
            if src.dtype != sub_dst.dtype:
                tmp = self._scratch(set(range(len(shape))), stage, core, sub_dst.dtype)
                self._push(isa.Vector(core, "vme", "copy", shape, tmp, (src,)), core)
                src = tmp
            self._push(isa.Dma(core, shape, sub_dst, src), core)
        elif isinstance(v, Const) and sub_dst.mem == "lb":
            self._push(isa.Fill(core, shape, sub_dst, v.value), core)
        else:
            raise CodegenError(f"stage {stage.name}: cannot copy {type(v).__name__} to {sub_dst.mem}")

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


def _restrict(o, keep: list[int]):
    """The operand over the box dims ``keep`` only (scalars pass through)."""
    if not isinstance(o, isa.Operand):
        return o
    return replace(o, strides=tuple(o.strides[i] for i in keep))


def _sub_operand(o: isa.Operand, start) -> isa.Operand:
    off = o.offset + o.itemsize * sum(s * st for s, st in zip(start, o.strides))
    return replace(o, offset=off)


def build_program(func, hw: Hardware, name: str, num_outputs: int = 1) -> isa.Program:
    """One-kernel program for a lowered PrimFunc whose last ``num_outputs`` params are outputs."""
    kernel = read_kernel(func)
    ddr, args, offset = {}, [], 0
    for i, (pname, shape, dtype) in enumerate(kernel.params):
        role = "output" if i >= len(kernel.params) - num_outputs else "input"
        ddr[pname] = (offset, shape)
        args.append(isa.TensorArg(pname, role, shape, hw.storage_dtype, dtype, offset))
        offset = align(offset + args[-1].nbytes)
    k = KernelEmitter(kernel, hw, ddr, name).emit()
    return isa.Program(hw.to_dict(), max(offset, ALIGN), tuple(args), (k,), name)
