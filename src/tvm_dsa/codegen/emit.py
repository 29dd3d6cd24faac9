"""Codegen: a lowered kernel (TIR after TileForLB, AssignScopes, LowerToDSA) -> DSA instructions.

The codegen walks the loop nest. Tile loops are iterated and their tiles dealt to cores (the first
tile loop's index picks the cluster, the batch split; tiles go round-robin over the cluster's
cores); chunk loops are iterated in place; every stage (a ``dsa.op`` block and the loops under it)
becomes instructions whose box is the stage's loop extents and whose operands come from the
block's affine index expressions: inner loop variables give strides, outer ones the base address.

Local buffers are placed by ``plan_lb``: each LB buffer holds the region its first writer produces
in one iteration (its origin moves with the tile), double-buffered when the LB has room, plus a
scratch area for vector temporaries. Dependency tokens are derived from the memory each instruction
touches (last writer; readers since the last write), so the tokens are exactly what the data flow
implies.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import tvm
from tvm import tirx

from .. import isa
from ..hardware import Hardware
from ..tir_passes.analysis import (
    BINARY_CALLS,
    BINARY_NODES,
    UNARY_CALLS,
    Call,
    Load,
    Unsupported,
    call_name,
    linear_form,
    strip_cast,
)
from ..tir_passes.scopes import LB_SCOPE

Sblock_realize = tvm.s_tir.stmt.SBlockRealize
ALIGN = 64


class CodegenError(Unsupported):
    """The lowered kernel cannot be turned into instructions (e.g. it does not fit the LB)."""


# --------------------------------------------------------------------------------------------
# structure of a lowered kernel
@dataclass
class Stage:
    name: str
    op: str  # dma | mme | vector | reduce
    block: object
    loops: list  # [(var, extent)] inner loops, outermost first
    bindings: dict  # block iter var -> (coeffs over loop vars, const)
    reduce_op: str = ""

    def form(self, index) -> tuple[dict, int]:
        """Linear form of a block-level index expression over loop variables."""
        coeffs, const = linear_form(index, set(self.bindings) | set(self._loop_vars))
        out: dict = {}
        for v, c in coeffs.items():
            if v in self.bindings:
                bc, bk = self.bindings[v]
                const += c * bk
                for lv, lc in bc.items():
                    out[lv] = out.get(lv, 0) + c * lc
            else:
                out[v] = out.get(v, 0) + c
        return {v: c for v, c in out.items() if c}, const

    @property
    def _loop_vars(self):
        return [v for v, _ in self.loops]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(e for _, e in self.loops) or (1,)


@dataclass
class Loop:
    var: object
    extent: int
    kind: str  # tile | chunk
    body: list


def _extent(e) -> int:
    if not isinstance(e, tirx.IntImm):
        raise CodegenError(f"loop extent {e} is not a constant")
    return int(e.value)


def _collect(stmt, outer_vars: list) -> list:
    """Tree of Loop / Stage nodes under ``stmt``."""
    if isinstance(stmt, tirx.SeqStmt):
        return [n for s in stmt.seq for n in _collect(s, outer_vars)]
    if isinstance(stmt, tirx.For) and "dsa.loop" in stmt.annotations:
        if int(stmt.min.value) != 0:
            raise CodegenError("tile loop does not start at 0")
        kind = str(stmt.annotations["dsa.loop"])
        return [Loop(stmt.loop_var, _extent(stmt.extent), kind,
                     _collect(stmt.body, outer_vars + [stmt.loop_var]))]
    loops = []
    while isinstance(stmt, tirx.For):
        if "dsa.loop" in stmt.annotations:
            raise CodegenError("tile loop inside a stage")
        loops.append((stmt.loop_var, _extent(stmt.extent)))
        stmt = stmt.body
    if not isinstance(stmt, Sblock_realize):
        raise CodegenError(f"expected a stage block, found {type(stmt).__name__}")
    block = stmt.block
    if "dsa.op" not in block.annotations:
        raise CodegenError(f"block {block.name_hint} was not lowered (no dsa.op)")
    variables = set(outer_vars) | {v for v, _ in loops}
    bindings = {it.var: linear_form(val, variables) for it, val in zip(block.iter_vars, stmt.iter_values)}
    return [Stage(block.name_hint, str(block.annotations["dsa.op"]), block, loops, bindings,
                  str(block.annotations.get("dsa.reduce", "")))]


def stages_of(node_list) -> list[Stage]:
    out = []
    for n in node_list:
        out.extend(stages_of(n.body) if isinstance(n, Loop) else [n])
    return out


def kernel_tree(func) -> Loop:
    """The outermost tile loop of a lowered kernel."""
    body = func.body.block.body if isinstance(func.body, Sblock_realize) else func.body
    nodes = _collect(body, [])
    if len(nodes) != 1 or not isinstance(nodes[0], Loop) or nodes[0].kind != "tile":
        raise CodegenError("a lowered kernel is one nest of tile loops")
    return nodes[0]


# --------------------------------------------------------------------------------------------
# local-buffer plan
@dataclass(frozen=True)
class LBBuffer:
    name: str
    dtype: str
    extents: tuple[int, ...]
    writer: str  # stage whose execution starts a new lifetime (moves the origin)
    slots: tuple[int, ...] = ()  # byte offsets of its copies

    @property
    def nbytes(self) -> int:
        n = isa.DTYPES[self.dtype]
        for e in self.extents:
            n *= e
        return n


@dataclass(frozen=True)
class LBPlan:
    buffers: dict  # buffer name -> LBBuffer
    scratch_offset: int
    scratch_bytes: int
    total_bytes: int


def _stage_accesses(stage: Stage):
    """(buffer, index list, is_write) of every access of a stage."""
    store = stage.block.body
    loads = []
    import tvm_ffi

    tvm_ffi.structural_walk(store.value, [(Load, loads.append)])
    return [(store.buffer, list(store.indices), True)] + [(ld.source, list(ld.indices), False) for ld in loads]


def _region_extents(stage: Stage, indices) -> tuple[int, ...]:
    exts = dict(stage.loops)
    out = []
    for idx in indices:
        coeffs, _ = stage.form(idx)
        out.append(1 + sum(abs(c) * (exts[v] - 1) for v, c in coeffs.items() if v in exts))
    return tuple(out)


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def lb_dtypes(stages: list[Stage], hw: Hardware) -> dict[str, str]:
    """Element type of each LB buffer: MME accumulators in the accumulation type; what the MME
    reads or what crosses DDR in the storage type; other intermediates in float32."""
    storage, accum = hw.storage_dtype, hw.mme.accum_dtype
    out: dict[str, str] = {}
    for st in stages:
        for buf, _, is_write in _stage_accesses(st):
            if buf.scope() != LB_SCOPE:
                continue
            name = str(buf.name)
            if st.op == "mme" and is_write:
                out[name] = accum
            elif (st.op == "mme" or st.op == "dma") and out.get(name) != accum:
                out[name] = storage
            else:
                out.setdefault(name, "float32")
    if not hw.is_float:
        out = {k: ("float32" if v == "float32" else v) for k, v in out.items()}
    return out


def plan_lb(func, hw: Hardware) -> LBPlan:
    """Place the kernel's LB buffers; raises ``CodegenError`` when one tile does not fit."""
    stages = stages_of([kernel_tree(func)])
    dtypes = lb_dtypes(stages, hw)
    first: dict[str, LBBuffer] = {}
    for st in stages:
        for buf, indices, is_write in _stage_accesses(st):
            name = str(buf.name)
            if buf.scope() != LB_SCOPE or name in first:
                continue
            if not is_write:
                raise CodegenError(f"LB buffer {name} is read by {st.name} before it is written")
            first[name] = LBBuffer(name, dtypes[name], _region_extents(st, indices), st.name)
    scratch = max((_scratch_bytes(st) for st in stages), default=0)
    single = sum(_align(b.nbytes) for b in first.values())
    copies = 2 if 2 * single + scratch <= hw.lb_bytes else 1
    if single + scratch > hw.lb_bytes:
        raise CodegenError(f"tile working set {single + scratch} bytes exceeds the LB ({hw.lb_bytes})")
    offset, placed = 0, {}
    for b in first.values():
        slots = []
        for _ in range(copies):
            slots.append(offset)
            offset += _align(b.nbytes)
        placed[b.name] = LBBuffer(b.name, b.dtype, b.extents, b.writer, tuple(slots))
    return LBPlan(placed, offset, scratch, offset + scratch)


def _depends(e, loop_vars, stage) -> set:
    import tvm_ffi

    loads = []
    tvm_ffi.structural_walk(e, [(Load, loads.append)])
    dims = set()
    for ld in loads:
        for idx in ld.indices:
            dims |= {v for v in stage.form(idx)[0] if v in loop_vars}
    return dims


def _scratch_bytes(stage: Stage) -> int:
    """Bytes of float32 temporaries the stage's expression needs (worst case, no reuse)."""
    if stage.op not in ("vector", "reduce"):
        return _align(4 * _box(stage)) if stage.op == "dma" else 0
    loop_vars = dict(stage.loops)
    value = strip_cast(stage.block.body.value)
    if stage.op == "reduce":
        value = _reduce_update(stage)
    total = 0

    def walk(e, root):
        nonlocal total
        e = strip_cast(e)
        kids = _children(e)
        for k in kids:
            walk(k, False)
        if kids and not root:
            n = 1
            for v in _depends(e, loop_vars, stage):
                n *= loop_vars[v]
            total += _align(4 * n)

    walk(value, stage.op == "vector")
    if stage.op == "reduce" and not isinstance(value, Load):
        total += _align(4 * _box(stage))
    return total


def _box(stage: Stage) -> int:
    n = 1
    for e in stage.shape:
        n *= e
    return n


def _children(e) -> list:
    if type(e) in BINARY_NODES:
        return [e.a, e.b]
    if isinstance(e, Call) and (call_name(e) in UNARY_CALLS or call_name(e) in BINARY_CALLS):
        return list(e.args)
    return []


def _reduce_update(stage: Stage):
    """The expression a reduction stage folds into its accumulator."""
    value = strip_cast(stage.block.body.value)
    acc = stage.block.body.buffer

    def is_acc(x):
        x = strip_cast(x)
        return isinstance(x, Load) and x.source.same_as(acc)

    return strip_cast(value.b if is_acc(value.a) else value.a)


# --------------------------------------------------------------------------------------------
# emission
@dataclass
class _Tracker:
    """Last writer and readers since, per memory object, to derive dependency tokens."""

    writer: dict = field(default_factory=dict)
    readers: dict = field(default_factory=dict)

    def deps(self, reads, writes, unit) -> tuple[int, ...]:
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
        return tuple(sorted(out))

    def record(self, idx, reads, writes, unit) -> None:
        for key in reads:
            self.readers.setdefault(key, {})[unit] = idx
        for key in writes:
            self.writer[key] = (idx, unit)
            self.readers[key] = {}


class KernelEmitter:
    """Emits one kernel's instructions; DDR tensors are given as {buffer name: (offset, shape)}."""

    def __init__(self, func, hw: Hardware, ddr: dict[str, tuple[int, tuple[int, ...]]], name: str):
        self.hw, self.ddr, self.name = hw, ddr, name
        self.tree = kernel_tree(func)
        self.plan = plan_lb(func, hw)
        self.instructions: list = []
        self.trackers: dict[int, _Tracker] = {}
        self.env: dict = {}  # loop var -> current value
        self.origin: dict = {}  # (core, buffer) -> origin indices
        self.slot: dict = {}  # (core, buffer) -> slot offset
        self.count: dict = {}  # (core, buffer) -> lifetimes started
        self.scratch_top = 0
        self.cores_used: set[int] = set()

    # -- tile distribution ---------------------------------------------------------------------
    def emit(self) -> isa.Kernel:
        tile_loops, node = [], self.tree
        while True:
            tile_loops.append(node)
            inner = [n for n in node.body if isinstance(n, Loop) and n.kind == "tile"]
            if len(node.body) == 1 and inner:
                node = inner[0]
            else:
                break
        body = tile_loops[-1].body
        cpc = self.hw.cores_per_cluster
        clusters = min(tile_loops[0].extent, self.hw.clusters)
        next_core = [0] * clusters
        for values in itertools.product(*(range(lp.extent) for lp in tile_loops)):
            cluster = values[0] % clusters
            core = cluster * cpc + next_core[cluster] % cpc
            next_core[cluster] += 1
            self.cores_used.add(core)
            for lp, v in zip(tile_loops, values):
                self.env[lp.var] = v
            self._emit_nodes(body, core)
        return isa.Kernel(self.name, tuple(sorted(self.cores_used)), tuple(self.instructions))

    def _emit_nodes(self, nodes, core) -> None:
        for n in nodes:
            if isinstance(n, Loop):
                for v in range(n.extent):
                    self.env[n.var] = v
                    self._emit_nodes(n.body, core)
            else:
                self._emit_stage(n, core)

    # -- operands --------------------------------------------------------------------------------
    def _operand(self, stage: Stage, buf, indices, core, start=None) -> isa.Operand:
        """The operand for ``buf[indices]`` over the stage's box (optionally starting at ``start``,
        per-inner-loop offsets for a sub-box)."""
        name = str(buf.name)
        inner = [v for v, _ in stage.loops]
        forms = [stage.form(i) for i in indices]
        point = []
        for coeffs, const in forms:
            p = const
            for v, c in coeffs.items():
                if v in self.env and v not in inner:
                    p += c * self.env[v]
                elif v not in inner:
                    raise CodegenError(f"stage {stage.name}: index uses unknown variable {v}")
            if start is not None:
                p += sum(c * start[inner.index(v)] for v, c in coeffs.items() if v in inner)
            point.append(p)
        if buf.scope() == LB_SCOPE:
            b = self.plan.buffers[name]
            origin = self.origin[(core, name)]
            estrides = _row_major(b.extents)
            local = [p - o for p, o in zip(point, origin)]
            for d, (lo, n) in enumerate(zip(local, b.extents)):
                span = sum(abs(c) * (e - 1) for v, c in forms[d][0].items() for vv, e in stage.loops if vv is v)
                if lo < 0 or lo + span > n - 1:
                    raise CodegenError(f"stage {stage.name}: access to {name} leaves its tile region")
            dtype, mem, index = b.dtype, "lb", core
            base = self.slot[(core, name)]
        else:
            if name not in self.ddr:
                raise CodegenError(f"buffer {name} is neither in the LB nor a kernel argument")
            base, shape = self.ddr[name]
            estrides = _row_major(shape)
            local = point
            dtype, mem, index = self.hw.storage_dtype, "ddr", 0
            if any(p < 0 or p >= n for p, n in zip(point, shape)):
                raise CodegenError(f"stage {stage.name}: access to {name} at {point} is out of bounds")
        item = isa.DTYPES[dtype]
        offset = base + item * sum(p * s for p, s in zip(local, estrides))
        strides = []
        for v in inner:
            strides.append(sum(forms[d][0].get(v, 0) * estrides[d] for d in range(len(forms))))
        if not inner:
            strides = [0]
        return isa.Operand(mem, index, offset, dtype, tuple(strides))

    def _start_lifetime(self, stage: Stage, buf, indices, core) -> None:
        name = str(buf.name)
        b = self.plan.buffers[name]
        if b.writer != stage.name:
            return
        inner = {v: e for v, e in stage.loops}
        origin = []
        for idx in indices:
            coeffs, const = stage.form(idx)
            p = const
            for v, c in coeffs.items():
                if v in inner:
                    p += min(0, c) * (inner[v] - 1)
                else:
                    p += c * self.env[v]
            origin.append(p)
        key = (core, name)
        n = self.count.get(key, 0)
        self.count[key] = n + 1
        self.origin[key] = origin
        self.slot[key] = b.slots[n % len(b.slots)]

    # -- instruction emission --------------------------------------------------------------------
    def _push(self, ins, core) -> None:
        tracker = self.trackers.setdefault(core, _Tracker())
        srcs, dst = isa.operands(ins)
        unit = isa.unit_of(ins, self.hw.cores_per_cluster)
        reads = [self._key(o, core) for o in srcs]
        writes = [self._key(dst, core)]
        idx = len(self.instructions)
        deps = tracker.deps(reads, writes, unit)
        self.instructions.append(type(ins)(**{**ins.__dict__, "deps": deps}))
        tracker.record(idx, reads, writes, unit)

    def _key(self, o: isa.Operand, core):
        if o.mem == "ddr":
            for name, (base, _) in self.ddr.items():
                if base <= o.offset < base + self._ddr_bytes(name):
                    return ("ddr", name)
            return ("ddr", o.offset)
        if o.offset >= self.plan.scratch_offset:
            return ("scratch",)
        for b in self.plan.buffers.values():
            for s in b.slots:
                if s <= o.offset < s + _align(b.nbytes):
                    return ("lb", b.name, s)
        return ("lb", o.offset)

    def _ddr_bytes(self, name) -> int:
        n = self.hw.storage_bytes
        for e in self.ddr[name][1]:
            n *= e
        return n

    def _scratch(self, shape_dims, stage: Stage, core: int, dtype="float32") -> isa.Operand:
        """A fresh contiguous temporary over the stage's box restricted to ``shape_dims``."""
        inner = [v for v, _ in stage.loops]
        exts = dict(stage.loops)
        strides, n = [0] * max(len(inner), 1), 1
        for i in reversed(range(len(inner))):
            if inner[i] in shape_dims:
                strides[i] = n
                n *= exts[inner[i]]
        size = _align(isa.DTYPES[dtype] * n)
        if self.scratch_top + size > self.plan.scratch_bytes:
            raise CodegenError(f"stage {stage.name}: scratch overflow")
        op = isa.Operand("lb", core, self.plan.scratch_offset + self.scratch_top, dtype, tuple(strides))
        self.scratch_top += size
        return op

    def _emit_stage(self, stage: Stage, core) -> None:
        self.scratch_top = 0
        store = stage.block.body
        if store.buffer.scope() == LB_SCOPE:
            self._start_lifetime(stage, store.buffer, list(store.indices), core)
        dst = self._operand(stage, store.buffer, list(store.indices), core)
        if stage.op == "dma":
            self._emit_copy(stage, strip_cast(store.value), dst, core, [0] * len(stage.loops), list(stage.shape))
        elif stage.op == "mme":
            upd = _reduce_update(stage)
            a, b = strip_cast(upd.a), strip_cast(upd.b)
            self._push(isa.Mme(core, stage.shape, self._reduce_mask(dst), dst,
                               self._load(stage, a, core), self._load(stage, b, core), True), core)
        elif stage.op == "reduce":
            upd = _reduce_update(stage)
            src = self._expr(stage, upd, core, None)
            self._push(isa.Reduce(core, "vme", stage.reduce_op, stage.shape, self._reduce_mask(dst),
                                  dst, src, True), core)
        else:
            self._expr(stage, strip_cast(store.value), core, dst)

    def _reduce_mask(self, dst: isa.Operand) -> tuple[bool, ...]:
        return tuple(s == 0 for s in dst.strides)

    def _load(self, stage, ld, core, start=None) -> isa.Operand:
        return self._operand(stage, ld.source, list(ld.indices), core, start)

    def _expr(self, stage: Stage, e, core, dst):
        """Emit vector instructions computing ``e`` over the box; returns its operand/scalar.
        With ``dst`` the root result is written there."""
        e = strip_cast(e)
        if isinstance(e, Load):
            op = self._load(stage, e, core)
            if dst is None:
                return op
            self._push(isa.Vector(core, "vme", "copy", stage.shape, dst, (op,)), core)
            return dst
        if isinstance(e, (tirx.FloatImm, tirx.IntImm)) or not _children(e):
            value = _constant(e, stage)
            if dst is None:
                return value
            self._push(isa.Vector(core, "vme", "copy", stage.shape, dst, (value,)), core)
            return dst
        kids = [self._expr(stage, k, core, None) for k in _children(e)]
        op = BINARY_NODES.get(type(e)) or UNARY_CALLS.get(call_name(e)) or BINARY_CALLS.get(call_name(e))
        if op == "max" and any(isinstance(k, float) and k == 0.0 for k in kids):
            kids = [k for k in kids if not (isinstance(k, float) and k == 0.0)] or [0.0]
            op = "relu" if isinstance(kids[0], isa.Operand) else op
            if op == "max":
                kids = kids + [0.0]
        if dst is None:
            dims = set()
            inner = [v for v, _ in stage.loops]
            for k in kids:
                if isinstance(k, isa.Operand):
                    dims |= {inner[i] for i, s in enumerate(k.strides) if s and i < len(inner)}
            dst = self._scratch(dims, stage, core)
        unit = "vme" if op in isa.VME_OPS else "vec"
        self._push(isa.Vector(core, unit, op, stage.shape, dst, tuple(kids)), core)
        return dst

    def _emit_copy(self, stage, value, dst, core, start, extent) -> None:
        """DMA / fill over the sub-box [start, start + extent) of the stage, splitting
        ``if_then_else`` on index conditions into the boxes where each branch holds."""
        sub_dst = _sub_operand(dst, start)
        shape = tuple(extent) or (1,)
        if any(n <= 0 for n in shape):
            return
        if isinstance(value, Call) and call_name(value) == "if_then_else":
            inside = self._condition_box(stage, value.args[0], start, extent)
            if inside is None:
                return self._emit_copy(stage, strip_cast(value.args[2]), dst, core, start, extent)
            lo, hi = inside
            for piece_start, piece_ext, holds in _split_box(start, extent, lo, hi):
                branch = value.args[1] if holds else value.args[2]
                self._emit_copy(stage, strip_cast(branch), dst, core, piece_start, piece_ext)
            return
        if isinstance(value, Load):
            src = self._operand(stage, value.source, list(value.indices), core, start)
            if src.dtype != sub_dst.dtype:
                tmp = self._scratch({v for v, _ in stage.loops}, stage, core, sub_dst.dtype)
                self._push(isa.Vector(core, "vme", "copy", shape, tmp, (src,)), core)
                src = tmp
            self._push(isa.Dma(core, shape, sub_dst, src), core)
            return
        fill_value = _constant(value, stage)
        if sub_dst.mem == "lb":
            self._push(isa.Fill(core, shape, sub_dst, fill_value), core)
        else:
            raise CodegenError(f"stage {stage.name}: constant written straight to DDR")

    def _condition_box(self, stage, cond, start, extent):
        """Per inner loop, the [lo, hi) range where ``cond`` holds inside the box, or None if it
        never holds; raises for conditions that are not boxes."""
        inner = [v for v, _ in stage.loops]
        lo = list(start)
        hi = [s + e for s, e in zip(start, extent)]
        for c in _conjuncts(cond):
            if not isinstance(c, (tirx.LE, tirx.LT, tirx.GE, tirx.GT)):
                raise CodegenError(f"stage {stage.name}: condition {c} is not a bound")
            coeffs, const = stage.form(c.a - c.b)  # condition on (a - b)
            fixed = const + sum(k * self.env[v] for v, k in coeffs.items() if v not in inner)
            free = [(v, k) for v, k in coeffs.items() if v in inner]
            op = type(c)
            if not free:
                val = fixed
                holds = {tirx.LE: val <= 0, tirx.LT: val < 0, tirx.GE: val >= 0, tirx.GT: val > 0}[op]
                if not holds:
                    return None
                continue
            if len(free) != 1 or abs(free[0][1]) != 1:
                raise CodegenError(f"stage {stage.name}: condition {c} is not a box bound")
            v, k = free[0]
            i = inner.index(v)
            # k*x + fixed (op) 0  ->  bound on x
            if k < 0:
                op = {tirx.LE: tirx.GE, tirx.LT: tirx.GT, tirx.GE: tirx.LE, tirx.GT: tirx.LT}[op]
                fixed = -fixed
            if op is tirx.LE:
                hi[i] = min(hi[i], -fixed + 1)
            elif op is tirx.LT:
                hi[i] = min(hi[i], -fixed)
            elif op is tirx.GE:
                lo[i] = max(lo[i], -fixed)
            else:
                lo[i] = max(lo[i], -fixed + 1)
        if any(a >= b for a, b in zip(lo, hi)):
            return None
        return lo, hi


def _conjuncts(cond) -> list:
    if isinstance(cond, tirx.And):
        return _conjuncts(cond.a) + _conjuncts(cond.b)
    return [cond]


def _split_box(start, extent, lo, hi):
    """Disjoint pieces of the box: the part inside [lo, hi) (holds=True) and the rest."""
    start, end = list(start), [s + e for s, e in zip(start, extent)]
    cur_lo, cur_hi = list(start), list(end)
    pieces = []
    for d in range(len(start)):
        if lo[d] > cur_lo[d]:
            s = list(cur_lo); e = list(cur_hi); e[d] = lo[d]
            pieces.append((s, [b - a for a, b in zip(s, e)], False))
            cur_lo[d] = lo[d]
        if hi[d] < cur_hi[d]:
            s = list(cur_lo); e = list(cur_hi); s[d] = hi[d]
            pieces.append((s, [b - a for a, b in zip(s, e)], False))
            cur_hi[d] = hi[d]
    pieces.append((cur_lo, [b - a for a, b in zip(cur_lo, cur_hi)], True))
    return pieces


def _sub_operand(o: isa.Operand, start) -> isa.Operand:
    if not start:
        return o
    off = o.offset + o.itemsize * sum(s * st for s, st in zip(start, o.strides))
    return isa.Operand(o.mem, o.index, off, o.dtype, o.strides)


def _row_major(shape) -> list[int]:
    strides, n = [], 1
    for e in reversed(list(shape)):
        strides.append(n)
        n *= int(e)
    return strides[::-1]


def _constant(e, stage: Stage) -> float:
    """A value that does not depend on loaded data, folded to a number for this stage."""
    if isinstance(e, (tirx.FloatImm, tirx.IntImm)):
        return float(e.value)
    ana = tvm.sym.Analyzer()
    for it in stage.block.iter_vars:
        ana.bind(it.var, it.dom)
    simple = ana.simplify(e)
    simple = strip_cast(simple)
    if isinstance(simple, (tirx.FloatImm, tirx.IntImm)):
        return float(simple.value)
    if isinstance(simple, tirx.Cast) and isinstance(simple.value, tirx.IntImm):
        return float(simple.value.value)
    raise CodegenError(f"stage {stage.name}: value {e} varies with the index")


def build_program(func, hw: Hardware, name: str, num_outputs: int = 1) -> isa.Program:
    """One-kernel program for a lowered PrimFunc whose last ``num_outputs`` params are outputs."""
    params = list(func.params)
    ddr, args, offset = {}, [], 0
    for i, p in enumerate(params):
        shape = tuple(int(s) for s in p.shape)
        role = "output" if i >= len(params) - num_outputs else "input"
        ddr[str(p.name)] = (offset, shape)
        args.append(isa.TensorArg(str(p.name), role, shape, hw.storage_dtype, str(p.dtype), offset))
        offset = _align(offset + args[-1].nbytes)
    kernel = KernelEmitter(func, hw, ddr, name).emit()
    return isa.Program(hw.to_dict(), max(offset, ALIGN), tuple(args), (kernel,), name)
