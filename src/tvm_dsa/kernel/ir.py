"""The lowered kernel as the codegen sees it: loops and stages with integer access patterns.

Reading TVM expressions is slow (every comparison of two variables builds an expression), and the
codegen visits each stage once per tile. So a lowered PrimFunc is read once into this small IR:
tile/chunk loops get integer slots, and every buffer access becomes an ``Access`` — per buffer
dimension a constant, coefficients of outer loop slots and coefficients of the stage's own loops.
Emitting a tile is then integer arithmetic only.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass, replace

import numpy as np  # noqa: F401 - generated index functions call np.minimum/np.maximum
import tvm
import tvm_ffi
from tvm import tirx

from tvm_dsa.hardware import Hardware
from tvm_dsa.kernel.analysis import (
    BINARY_CALLS, BINARY_NODES, COMPARE_NODES, INT_DTYPES, UNARY_CALLS, Call, Load, Unsupported, call_name, data_select,
    is_index_expr, contraction, linear_form, reduction_update, stored_value, strip_cast, uses_var
)
from tvm_dsa.kernel.attrs import LB_SCOPE
from tvm_dsa.kernel.attrs import STRIP
from tvm_dsa.kernel.ranges import WIDE
from tvm_dsa.kernel.attrs import CLAMP, DOUBLE_BUFFER
from tvm_dsa.isa import DTYPES

SBlockRealize = tvm.s_tir.stmt.SBlockRealize
ALIGN = 64
# at most so many points of a vector contraction's reduced loops are summed one at a time: a 5 x 5
# window, a Conformer's 31 taps (a bound on the instructions a tile emits)
POINT_SUMS = 32


class CodegenError(Unsupported):
    """The lowered kernel cannot be turned into instructions (e.g. it does not fit the LB)."""


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class Access:
    """``buffer[const + sum(outer coeff * slot value) + sum(inner coeff * loop index)]``."""

    buffer: str
    lb: bool
    const: tuple[int, ...]
    outer: tuple[tuple[tuple[int, int], ...], ...]  # per dim: (slot, coeff) pairs
    inner: tuple[tuple[int, ...], ...]  # per dim: coeff per stage loop
    # per dim: None, or a ``SlotFunction`` of the slot values for an outer part that is not
    # linear (e.g. ``tile // 2`` when a reshape splits a dimension inside a tile loop)
    outer_fn: tuple = ()

    def point(self, env: list[int], start=None) -> list[int]:
        """Buffer index at the box origin (or at ``start`` inside the box)."""
        if start is None:
            return self._compiled[0](env)
        return self._compiled[1](env, start)

    @functools.cached_property
    def _compiled(self):
        """``point`` as two generated Python functions, without and with ``start``: the codegen
        evaluates it per stage and tile, hundreds of thousands of times per model."""
        base, within = [], []
        for d, k in enumerate(self.const):
            terms = [str(k)] + [f"{c} * env[{slot}]" for slot, c in self.outer[d]]
            if self.outer_fn and self.outer_fn[d] is not None:
                terms.append(f"fns[{d}](env)")
            base.append(" + ".join(terms))
            within.append(" + ".join([base[-1]] + [f"{c} * start[{i}]" for i, c in enumerate(self.inner[d]) if c]))
        scope = {"fns": self.outer_fn}
        return (eval(f"lambda env: [{', '.join(base)}]", scope),  # noqa: S307 - from the access's integers
                eval(f"lambda env, start: [{', '.join(within)}]", scope))  # noqa: S307

    def low_corner(self, env, shape) -> list[int]:
        """Smallest index per dim touched over the box (coefficients may be negative)."""
        shift = self._shifts.get(shape)
        if shift is None:
            shift = self._shifts[shape] = [sum(min(0, c) * (n - 1) for c, n in zip(row, shape)) for row in self.inner]
        return [p + s for p, s in zip(self.point(env), shift)]

    @functools.cached_property
    def _shifts(self) -> dict:
        """Box shape -> per dim, the low corner's offset from the origin point."""
        return {}

    def extents(self, shape) -> tuple[int, ...]:
        return tuple(1 + sum(abs(c) * (n - 1) for c, n in zip(row, shape)) for row in self.inner)

    @functools.cached_property
    def slots(self) -> frozenset[int]:
        """Loop slots the box's origin moves with (its linear terms and non-linear ones)."""
        out = {slot for row in self.outer for slot, c in row if c}
        for fn in self.outer_fn:
            if fn is not None:
                out |= fn.slots
        return frozenset(out)

    def dims(self) -> frozenset[int]:
        """Stage loops this access varies with."""
        return frozenset(i for row in self.inner for i, c in enumerate(row) if c)


# value trees of stages
@dataclass(frozen=True)
class Const:
    value: float


@dataclass(frozen=True)
class Read:
    access: Access


@dataclass(frozen=True)
class Op:
    name: str  # ISA vector op
    kids: tuple
    dims: frozenset  # stage loops the result varies with


@dataclass(frozen=True)
class Bound:
    """``expr (op) 0`` with expr = const + outer + inner, op one of le lt ge gt."""

    op: str
    const: int
    outer: tuple[tuple[int, int], ...]
    inner: tuple[int, ...]

    def holds(self, env):
        """Whether a bound on the tile loops alone (no ``inner`` terms) holds at slot values
        ``env``; arrays of slot values (all tiles at once) give an array."""
        return _COMPARE[self.op](self.const + sum(c * env[slot] for slot, c in self.outer), 0)


_COMPARE = {"le": operator.le, "lt": operator.lt, "ge": operator.ge, "gt": operator.gt}


@dataclass(frozen=True)
class Select:
    bounds: tuple[Bound, ...]  # conjunction
    then: object
    other: object


@dataclass(frozen=True)
class Stage:
    name: str
    op: str  # dma | mme | vector | reduce
    shape: tuple[int, ...]
    dst: Access
    value: object  # value tree; for mme a (Read, Read) pair; for reduce the update tree
    reduce_op: str = ""
    # mme / sum-reduce whose zero-init was folded in (``fold_zero_init``): it overwrites its
    # destination where these loop slots are all 0 and accumulates elsewhere; None: always adds
    overwrite: tuple[int, ...] | None = None
    # the block's predicate, a conjunction of bounds on the tile loops: the stage runs only in the
    # tiles where it holds (compute_at guards a producer whose region a tile does not need, e.g.
    # a concatenation's other operand at the first row); () runs it in every tile
    guard: tuple[Bound, ...] = ()

    def point_sums(self) -> tuple[int, ...]:
        """The reduced loops of a sum of one product (a contraction on the vector units) that is
        summed one point of them at a time by the VME's multiply-accumulate (``mac``) into its
        destination, where they have at most ``POINT_SUMS`` points: a depthwise convolution's
        3 x 3 taps, a Conformer's 31. All the products at once are 9x the output box in float32 (which kept a
        depthwise tile to one channel), and a ``mul`` and a ``reduce`` over them cost twice the
        lane cycles of the nine ``mac``s. () where the stage sums its products whole."""
        v = self.value
        if self.op != "reduce" or self.reduce_op != "sum" or not isinstance(v, Op) or v.name != "mul" \
                or not all(isinstance(k, (Read, Const)) for k in v.kids):
            return ()
        reduced = tuple(i for i in range(len(self.shape)) if not any(row[i] for row in self.dst.inner))
        kept = set(range(len(self.shape))) - set(reduced)
        points = 1
        for i in reduced:
            points *= self.shape[i]
        return reduced if reduced and kept <= v.dims and points <= POINT_SUMS else ()

    def reads(self) -> list[Access]:
        out = []

        def walk(v):
            if isinstance(v, Read):
                out.append(v.access)
            elif isinstance(v, Op):
                for k in v.kids:
                    walk(k)
            elif isinstance(v, Select):
                walk(v.then), walk(v.other)
            elif isinstance(v, tuple):
                for k in v:
                    walk(k)

        walk(self.value)
        return out


@dataclass(frozen=True)
class Loop:
    slot: int
    extent: int
    kind: str  # tile | chunk | strip
    body: tuple


def stages_of(nodes) -> list[Stage]:
    """The stages of ``nodes`` (stages and loops) in program order."""
    out = []
    for n in nodes:
        out += stages_of(n.body) if isinstance(n, Loop) else [n]
    return out


@dataclass(frozen=True)
class KernelIR:
    root: Loop
    slots: int
    params: tuple  # (name, shape, dtype) of the PrimFunc parameters
    double_buffer: bool | None = None  # the schedule's decision (``dsa.double_buffer``); None: if it fits
    clamped: frozenset = frozenset()  # tile-loop slots whose last tile overlaps the one before (``ClampTiles``)
    wide: frozenset = frozenset()  # parameters stored at the accumulator's width (``kernel.ranges``)

    @property
    def integer(self) -> bool:
        """A quantized model's kernel: it reads or writes an integer tensor."""
        return any(dtype in INT_DTYPES for _, _, dtype in self.params)

    def unplaceable(self) -> str | None:
        """Why a kernel of several layers (a stitched kernel, a SET tree) cannot take this layer,
        else None. Those kernels place each tensor at the type its layers store it in
        (``emit.placement.stored_dtypes``): an integer kernel's own types take part; a float layer
        that keeps a tensor wide still runs alone (the schedulers size a float model's tensors at
        the storage type, and its stitched programs stay as measured)."""
        return "keeps a tensor wide (kernel.ranges)" if self.wide and not self.integer else None

    def ddr_dtype(self, param: str, hw: Hardware) -> str:
        """The type ``param`` is stored in outside the LB: in an integer kernel its own (int8
        values, int32 sums, a float input or output at the host's type: exact), else the chip's,
        or its wide one."""
        if self.integer:
            return next(dtype for name, _, dtype in self.params if name == param)
        return hw.wide_dtype if param in self.wide else hw.storage_dtype

    def stages(self) -> list[Stage]:
        return stages_of([self.root])

    def moves(self, shift: dict, at: tuple = (), nonzero: frozenset = frozenset()) -> dict | None:
        """Per buffer, the vector its accesses' indices move by when the tile-loop (or chunk-loop)
        slots move by ``shift`` (slot -> change): the same for every access of the buffer. A
        non-linear term (a clamped tile's origin) of a moved slot moves by the difference of its
        values from the slot values ``at`` (those of ``bent`` of each of the moved tiles,
        ``((slot, value), ...)`` each), which must be the same for all of them: tiles that do
        not reach the clamped last one move as far. None where the tiles would not be the same
        tiles moved: an access differs between its buffer's accesses, or a non-linear term of a
        moved slot has no values ``at`` or moves by different amounts from them, or a guard, a
        select's bound or a folded zero-init depends on the moved slots — but for a zero-init
        folded on the slots ``nonzero``, which the moved tiles or chunks and the ones they move
        to never have at 0 (a chunk loop from its second chunk on)."""
        memo = self._moving_terms[3]
        key = (tuple(sorted(shift.items())), at, nonzero)
        if key not in memo:
            memo[key] = self._moves(shift, at, nonzero)
        return memo[key]

    def _moves(self, shift: dict, at: tuple, nonzero: frozenset) -> dict | None:
        terms, fixed, zeroed, _ = self._moving_terms
        points = []  # (start, end) slot values of each tile ``at`` names
        for values in at:
            start = [0] * self.slots
            for slot, v in values:
                start[slot] = v
            points.append((start, [v + shift.get(slot, 0) for slot, v in enumerate(start)]))
        known = frozenset.intersection(*(frozenset(slot for slot, _ in values) for values in at)) if at else frozenset()

        def moved(form, fns):
            linear = [sum(c * shift.get(slot, 0) for slot, c in dim) for dim in form]
            for d, f in enumerate(fns):
                if f is not None and f.slots & shift.keys():
                    steps = {f(end) - f(start) for start, end in points}
                    if not f.slots <= known or len(steps) != 1:
                        return None
                    linear[d] += steps.pop()
            return tuple(linear)

        out = {}
        for buffer, forms in terms.items():
            vectors = {moved(form, fns) for form, fns in forms}
            if len(vectors) != 1 or None in vectors:
                return None
            out[buffer] = vectors.pop()
        if any(sum(c * shift.get(slot, 0) for slot, c in outer) for outer in fixed):
            return None
        if any(shift.get(slot) for slot in zeroed - nonzero):
            return None
        return out

    @functools.cached_property
    def bent(self) -> frozenset:
        """Slots the non-linear index terms read (``moves``' ``at``)."""
        return frozenset().union(*(f.slots for forms in self._moving_terms[0].values()
                                   for _, fns in forms for f in fns if f is not None))

    @functools.cached_property
    def _moving_terms(self):
        """(buffer -> set of its accesses' (outer terms, non-linear terms); the
        outer terms of every bound; the slots of every folded zero-init; a memo of ``moves``)."""
        terms: dict = {}
        fixed, zeroed = [], set()

        def note(acc: Access):
            terms.setdefault(acc.buffer, set()).add((acc.outer, acc.outer_fn))

        def walk(v):
            if isinstance(v, Select):
                fixed.extend(b.outer for b in v.bounds)
                walk(v.then), walk(v.other)
            elif isinstance(v, Op):
                for k in v.kids:
                    walk(k)
            elif isinstance(v, tuple):
                for k in v:
                    walk(k)

        for stage in self.stages():
            note(stage.dst)
            for acc in stage.reads():
                note(acc)
            walk(stage.value)
            fixed.extend(b.outer for b in stage.guard)
            zeroed.update(stage.overwrite or ())
        return terms, fixed, frozenset(zeroed), {}

    def tile_loops(self) -> list[Loop]:
        loops, node = [], self.root
        while True:
            loops.append(node)
            if len(node.body) == 1 and isinstance(node.body[0], Loop) and node.body[0].kind == "tile":
                node = node.body[0]
            else:
                return loops


# --------------------------------------------------------------------------------------------
# reading TIR
class _Reader:
    def __init__(self):
        self.slot_of: dict = {}  # loop Var -> slot
        self.extent_of: dict = {}  # loop Var -> extent
        self.clamped: set = set()  # slots of clamped tile loops
        self.names: dict = {}  # buffer -> its name in the kernel (names key a kernel's buffers)

    def loops(self, stmt) -> list:
        if isinstance(stmt, tirx.SeqStmt):
            return [n for s in stmt.seq for n in self.loops(s)]
        if isinstance(stmt, tirx.For) and "dsa.loop" in stmt.annotations:
            if _int(stmt.min) != 0:
                raise CodegenError("tile loop does not start at 0")
            slot = len(self.slot_of)
            self.slot_of[stmt.loop_var] = slot
            self.extent_of[stmt.loop_var] = _int(stmt.extent)
            if CLAMP in stmt.annotations:
                self.clamped.add(slot)
            return [Loop(slot, _int(stmt.extent), str(stmt.annotations["dsa.loop"]), tuple(self.loops(stmt.body)))]
        inner = []
        while isinstance(stmt, tirx.For):
            if "dsa.loop" in stmt.annotations:
                raise CodegenError("tile loop inside a stage")
            inner.append((stmt.loop_var, _int(stmt.extent)))
            stmt = stmt.body
        if not isinstance(stmt, SBlockRealize):
            raise CodegenError(f"expected a stage block, found {type(stmt).__name__}")
        return [self.stage(stmt, inner)]

    def name(self, buf) -> str:
        """``buf``'s name in the kernel: its own, or for a second LB buffer of that name (two
        blocks' copies of one tensor, ``AssignScopes``) the name with ``#k``; two parameters of one
        name would key one DDR region (``tir_passes.names.UniqueBufferNames``)."""
        if buf not in self.names:
            name, k = str(buf.name), 1
            while name in self.names.values():
                if buf.scope() != LB_SCOPE:
                    raise CodegenError(f"two buffers are named {buf.name} (tir_passes.names.UniqueBufferNames)")
                name, k = f"{buf.name}#{k}", k + 1
            self.names[buf] = name
        return self.names[buf]

    def stage(self, realize, inner) -> Stage:
        block = realize.block
        if "dsa.op" not in block.annotations:
            raise CodegenError(f"block {block.name_hint} was not lowered (no dsa.op)")
        op = str(block.annotations["dsa.op"])
        loop_vars = set(self.slot_of) | {v for v, _ in inner}
        position = {v: i for i, (v, _) in enumerate(inner)}
        bindings = {}  # block var -> linear form over loop vars, or None when not affine
        for it, val in zip(block.iter_vars, realize.iter_values):
            try:
                bindings[it.var] = linear_form(val, loop_vars)
            except Unsupported:
                bindings[it.var] = None
        doms = {it.var: it.dom for it in block.iter_vars}

        def form(expr):
            """(const, outer (slot, c), inner coeffs, outer function) of an index expression of
            block vars. Affine indices compose with the affine bindings directly; others are
            rewritten over the loops with their ranges (a reshape inside a tile often becomes
            affine in the stage's loops plus a non-linear function of the tile loops)."""
            try:
                coeffs, const = linear_form(expr, set(bindings) | set(position))
                if any(bindings.get(v, ()) is None for v in coeffs):
                    raise Unsupported("a block iterator is bound to a non-affine expression")
            except Unsupported:
                return _split_form(self, expr, realize, inner, position)
            total: dict = {}
            for v, c in coeffs.items():
                if v in bindings:
                    bc, bk = bindings[v]
                    const += c * bk
                    for lv, lc in bc.items():
                        total[lv] = total.get(lv, 0) + c * lc
                else:
                    total[v] = total.get(v, 0) + c
            outer = tuple((self.slot_of[v], c) for v, c in total.items() if c and v in self.slot_of)
            row = [0] * len(inner)
            for v, c in total.items():
                if v in position:
                    row[position[v]] = c
            return const, outer, tuple(row), None

        def access(buf, indices) -> Access:
            forms = [form(i) for i in indices]
            return Access(self.name(buf), buf.scope() == LB_SCOPE, tuple(f[0] for f in forms),
                          tuple(f[1] for f in forms), tuple(f[2] for f in forms),
                          tuple(f[3] for f in forms) if any(f[3] for f in forms) else ())

        def const(e) -> float:
            e = strip_cast(e)
            if isinstance(e, (tirx.FloatImm, tirx.IntImm)):
                return float(e.value)
            ana = tvm.sym.Analyzer()
            for v, dom in doms.items():
                ana.bind(v, dom)
            simple = strip_cast(ana.simplify(e))
            if isinstance(simple, tirx.Cast):
                simple = simple.value
            if isinstance(simple, (tirx.FloatImm, tirx.IntImm)):
                return float(simple.value)
            raise CodegenError(f"stage {block.name_hint}: value {e} varies with the index")

        def value(e):
            e = strip_cast(e)
            if isinstance(e, Load):
                return Read(access(e.source, list(e.indices)))
            if isinstance(e, Call) and call_name(e) == "if_then_else" and is_index_expr(e.args[0]):
                bounds = tuple(b for c in _conjuncts(e.args[0]) for b in bounds_of(c))
                return Select(bounds, value(e.args[1]), value(e.args[2]))
            kids = _children(e)
            if not kids:
                return Const(const(e))
            if isinstance(e, Call):
                name = UNARY_CALLS.get(call_name(e)) or BINARY_CALLS.get(call_name(e)) or "select"
            else:
                name = BINARY_NODES.get(type(e)) or COMPARE_NODES.get(type(e)) or "select"
            vals = tuple(value(k) for k in kids)
            if name == "max" and Const(0.0) in vals and len([v for v in vals if v != Const(0.0)]) == 1:
                name, vals = "relu", tuple(v for v in vals if v != Const(0.0))
            products = [v for v in vals if isinstance(v, Op) and v.name == "mul"]
            if name == "add" and products:  # a * b + c: one multiply-accumulate pass, not two
                name, vals = "mac", (*products[0].kids, next(v for v in vals if v is not products[0]))
            if name in ("min", "max", "relu"):  # a clamp (ReLU6): one clip pass, not two
                name, vals = _clip(name, vals)
            dims = frozenset().union(*[_dims(v) for v in vals])
            return Op(name, vals, dims)

        def bounds_of(c) -> list[Bound]:
            out = []
            for op, diff in _comparisons(c, block.name_hint):
                k, outer, row, fn = form(diff)
                if fn is not None:
                    raise CodegenError(f"stage {block.name_hint}: condition {c} is not a box bound")
                out.append(Bound(op, k, outer, row))
            return out

        store = block.body
        guard, inside = self.guard(realize, block.name_hint, loop_vars, position, store.buffer.scope() == LB_SCOPE)
        dst = access(store.buffer, list(store.indices))
        shape = tuple(e for _, e in inner) or (1,)
        if not inner:
            dst = replace(dst, inner=tuple((0,) for _ in dst.inner))
        if inside and op == "dma" and isinstance(store.value, Load) and store.value.source.scope() != LB_SCOPE:
            # a load of a parameter into a box that reaches past its edge (a producer computed on
            # a consumer's padded window): the part outside is zero, never read as data
            return Stage(block.name_hint, op, shape, dst, Select(inside, value(store.value), Const(0.0)), guard=guard)
        if op in ("mme", "reduce"):
            if op == "mme":
                val = tuple(value(ld) for ld in contraction(block))
            else:
                val = value(reduction_update(block)[1])
            return Stage(block.name_hint, op, shape, dst, val, str(block.annotations.get("dsa.reduce", "")),
                         guard=guard)
        return Stage(block.name_hint, op, shape, dst, value(stored_value(block)), guard=guard)

    def guard(self, realize, name, loop_vars, position, lb: bool) -> tuple[tuple[Bound, ...], tuple[Bound, ...]]:
        """The block predicate as (bounds on the tile loops, bounds on the stage's own loops). A
        stage guarded by the first runs only in the tiles where they hold. The second (a partial
        tile) is allowed where the stage writes an LB buffer, which then computes its whole box:
        ``compute_at`` clips a producer's region to its buffer where the consumer reads past the
        edge under a guard (a pooling's padding reads a convolution's rows -1 and H at the
        borders), and the clipped elements are never read; a load of a parameter keeps them to
        read inside it (``stage``). Elsewhere it is not supported."""
        pred = realize.predicate
        if isinstance(pred, tirx.IntImm) and pred.value:
            return (), ()
        out, inside = [], []
        for c in _conjuncts(pred):
            for op, diff in _comparisons(c, name):
                coeffs, const = linear_form(diff, loop_vars)
                outer = tuple((self.slot_of[v], k) for v, k in coeffs.items() if v not in position)
                if any(v in position for v in coeffs):
                    if not lb:
                        raise Unsupported(f"stage {name}: predicate {c} bounds the stage's own loops (a partial tile)")
                    row = [0] * len(position)
                    for v, k in coeffs.items():
                        if v in position:
                            row[position[v]] = k
                    inside.append(Bound(op, const, outer, tuple(row)))
                    continue
                out.append(Bound(op, const, outer, ()))
        return tuple(out), tuple(inside)


def _split_form(reader: _Reader, expr, realize, inner, position):
    """``expr`` (over block vars) rewritten over the loops: (0, (), inner coeffs, outer function)."""
    block = realize.block
    binding = {it.var: val for it, val in zip(block.iter_vars, realize.iter_values)}
    expr = tvm_ffi.structural_map(expr, [(tvm.ir.Var, lambda v: binding.get(v, v))])
    analyzer = tvm.sym.Analyzer()
    for v, n in list(reader.extent_of.items()) + list(inner):
        analyzer.bind(v, tvm.ir.Range(0, n))
    expr = analyzer.simplify(expr)
    row, outer = [0] * len(inner), []

    def walk(e, sign):
        if not any(uses_var(e, v) for v in position):
            outer.append((sign, e))
        elif isinstance(e, tvm.ir.Var) and e in position:
            row[position[e]] += sign
        elif isinstance(e, (tirx.Add, tirx.Sub)):
            walk(e.a, sign)
            walk(e.b, sign if isinstance(e, tirx.Add) else -sign)
        elif isinstance(e, tirx.Mul) and isinstance(e.b, tirx.IntImm):
            walk(e.a, sign * int(e.b.value))
        elif isinstance(e, tirx.Mul) and isinstance(e.a, tirx.IntImm):
            walk(e.b, sign * int(e.a.value))
        else:
            raise Unsupported(f"index {e} is not affine in the stage's loops")

    walk(expr, 1)
    source = " + ".join(f"({sign}) * ({_py(e, reader.slot_of)})" for sign, e in outer) or "0"
    slots = frozenset(reader.slot_of[v] for _, e in outer for v in reader.slot_of if uses_var(e, v))
    return 0, (), tuple(row), SlotFunction(eval(f"lambda env: {source}"), slots)  # noqa: S307 - from TIR


@dataclass(frozen=True, eq=False)
class SlotFunction:
    """A non-linear index term of the tile loops (``tile // 2`` of a reshape, a clamped tile's
    ``min(tile * T, E - T)``): ``fn(env)`` on slot values (or arrays of them), and the slots it
    reads (``KernelIR.moves``: tiles moved along other slots still translate)."""

    fn: object
    slots: frozenset

    def __call__(self, env):
        value = self.fn(env)
        return int(value) if isinstance(value, np.integer) else value  # np.minimum of two ints



def _py(e, slot_of) -> str:
    """Python source of an integer expression of tile-loop variables (``env[slot]``)."""
    if isinstance(e, tirx.IntImm):
        return str(int(e.value))
    if isinstance(e, tvm.ir.Var):
        if e not in slot_of:
            raise Unsupported(f"index uses {e}, which is not a loop variable")
        return f"env[{slot_of[e]}]"
    if isinstance(e, tirx.Cast):
        return _py(e.value, slot_of)
    ops = {tirx.Add: "+", tirx.Sub: "-", tirx.Mul: "*", tirx.FloorDiv: "//", tirx.FloorMod: "%"}
    if type(e) in ops:
        return f"({_py(e.a, slot_of)} {ops[type(e)]} {_py(e.b, slot_of)})"
    if isinstance(e, (tirx.Min, tirx.Max)):
        # numpy's, so that the function also applies to arrays of slot values (all tiles at once)
        return f"np.{'minimum' if isinstance(e, tirx.Min) else 'maximum'}({_py(e.a, slot_of)}, {_py(e.b, slot_of)})"
    raise Unsupported(f"index {e} is not an integer expression of the tile loops")


def _int(e) -> int:
    if not isinstance(e, tirx.IntImm):
        raise CodegenError(f"loop bound {e} is not a constant")
    return int(e.value)


def _clip(name: str, vals: tuple) -> tuple[str, tuple]:
    """(name, operands) of a stage value ``name(*vals)`` made one ``clip(x, lo, hi)`` (=
    ``min(max(x, lo), hi)``) where it is a clamp: ``min(max(x, lo), hi)`` (``max(x, 0)`` read as
    ``relu(x)``), or ``max(min(x, hi), lo)`` with constants ``lo <= hi`` (TVM's ``clip``, where
    the two orders agree); else as it was."""
    if name == "min":
        inner = [v for v in vals if isinstance(v, Op) and v.name in ("max", "relu")]
        if inner:
            low = inner[0].kids if inner[0].name == "max" else (*inner[0].kids, Const(0.0))
            return "clip", (*low, next(v for v in vals if v is not inner[0]))
        return name, vals
    inner = [v for v in vals if isinstance(v, Op) and v.name == "min"]
    if not inner:
        return name, vals
    low = Const(0.0) if name == "relu" else next((v for v in vals if v is not inner[0]), None)
    x, high = inner[0].kids if isinstance(inner[0].kids[1], Const) else inner[0].kids[::-1]
    if isinstance(low, Const) and isinstance(high, Const) and low.value <= high.value:
        return "clip", (x, low, high)
    return name, vals


def _dims(v) -> frozenset:
    if isinstance(v, Read):
        return v.access.dims()
    if isinstance(v, Op):
        return v.dims
    return frozenset()


def _comparisons(c, stage: str) -> list:
    """``c`` as (op, expr) pairs meaning ``expr (op) 0``, op one of le lt ge gt; an equality
    (what ``StmtSimplify`` makes of ``4 <= v`` when ``v < 5``) is two of them."""
    ops = {tirx.LE: "le", tirx.LT: "lt", tirx.GE: "ge", tirx.GT: "gt"}
    if type(c) in ops:
        return [(ops[type(c)], c.a - c.b)]
    if isinstance(c, tirx.EQ):
        return [("le", c.a - c.b), ("ge", c.a - c.b)]
    raise CodegenError(f"stage {stage}: condition {c} is not a bound")


def _conjuncts(cond) -> list:
    if isinstance(cond, tirx.And):
        return _conjuncts(cond.a) + _conjuncts(cond.b)
    return [cond]


def _children(e) -> list:
    if type(e) in BINARY_NODES or type(e) in COMPARE_NODES:
        return [e.a, e.b]
    if isinstance(e, tirx.Select) or isinstance(e, Call) and call_name(e) == "if_then_else":
        return list(data_select(e))
    if isinstance(e, Call) and (call_name(e) in UNARY_CALLS or call_name(e) in BINARY_CALLS):
        return list(e.args)
    return []


def read_kernel(func) -> KernelIR:
    """The KernelIR of a lowered PrimFunc (one nest of tile loops). Cached per body and
    parameters (immutable all): the tiling search, the load estimate and the stitcher read the
    same one, and a sub-graph's repeated layers are one lowered body under several attributes."""
    wide = tuple(int(i) for i in func.attrs[WIDE]) if func.attrs is not None and WIDE in func.attrs else ()
    return _read_kernel(func.body, tuple(func.params), wide)


@functools.lru_cache(maxsize=256)
def _read_kernel(stmt, func_params, wide: tuple = ()) -> KernelIR:
    root = stmt.block if isinstance(stmt, SBlockRealize) else None
    body = stmt if root is None else root.body
    double = None if root is None or DOUBLE_BUFFER not in root.annotations else bool(int(root.annotations[DOUBLE_BUFFER]))
    reader = _Reader()
    nodes = reader.loops(body)
    if len(nodes) != 1 or not isinstance(nodes[0], Loop) or nodes[0].kind != "tile":
        raise CodegenError("a lowered kernel is one nest of tile loops")
    params = tuple((str(p.name), tuple(int(s) for s in p.shape), str(p.dtype)) for p in func_params)
    return KernelIR(fold_zero_init(nodes[0]), len(reader.slot_of), params, double, frozenset(reader.clamped),
                    frozenset(params[i][0] for i in wide))


def fold_zero_init(loop: Loop) -> Loop:
    """``loop`` with each zero fill of an LB accumulator dropped where the next stage to touch
    the accumulator is the contraction (or sum) adding into exactly that box, past nothing but
    reduction chunk loops: that stage overwrites on the first pass of those loops
    (``Stage.overwrite``). One instruction and one pass over the accumulator fewer per tile."""
    nodes = [fold_zero_init(n) if isinstance(n, Loop) else n for n in loop.body]
    k = 0
    while k < len(nodes):
        fill = nodes[k]
        if isinstance(fill, Stage) and fill.op == "dma" and fill.dst.lb and fill.value == Const(0.0):
            for j in range(k + 1, len(nodes)):
                folded = _overwriting(nodes[j], fill, ())
                if folded is None:
                    continue  # does not touch the accumulator
                if folded is not False:
                    nodes[j] = folded
                    del nodes[k]
                    k -= 1
                break
        k += 1
    return replace(loop, body=tuple(nodes))


def _overwriting(node, fill: Stage, slots: tuple):
    """``node`` with the stage that first touches ``fill``'s buffer overwriting it (on the first
    pass of the chunk loops ``slots`` and those inside ``node``); None when ``node`` does not touch
    the buffer, False when it touches it otherwise."""
    buf = fill.dst.buffer
    if isinstance(node, Loop):
        for i, child in enumerate(node.body):
            folded = _overwriting(child, fill, slots + (node.slot,))
            if folded is None:
                continue
            if folded is False or node.kind != "chunk":
                return False
            return replace(node, body=node.body[:i] + (folded,) + node.body[i + 1:])
        return None
    if node.dst.buffer != buf and all(a.buffer != buf for a in node.reads()):
        return None
    adds = node.op == "mme" or (node.op == "reduce" and node.reduce_op == "sum")
    if not adds or node.dst.buffer != buf or node.overwrite is not None or \
            any(a.buffer == buf for a in node.reads()) or not _same_box(fill, node):
        return False
    return replace(node, overwrite=slots)


def _same_box(a: Stage, b: Stage) -> bool:
    """Whether the two stages' destinations are the same dense box of one buffer."""
    x, y = a.dst, b.dst
    if (x.buffer, x.const, x.outer, x.outer_fn) != (y.buffer, y.const, y.outer, y.outer_fn):
        return False
    if any(c < 0 for row in x.inner + y.inner for c in row):
        return False
    box = x.extents(a.shape)
    if box != y.extents(b.shape):
        return False
    n = 1
    for e in box:
        n *= e
    covered_a = 1
    for e in a.shape:
        covered_a *= e
    covered_b = 1
    for i, e in enumerate(b.shape):
        if any(row[i] for row in y.inner):
            covered_b *= e
    return covered_a == n == covered_b


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

        n = DTYPES[self.dtype]
        for e in self.extents:
            n *= e
        return n


@dataclass(frozen=True)
class LBPlan:
    buffers: dict  # buffer name -> LBBuffer
    scratch_offset: int
    scratch_bytes: int
    total_bytes: int

    @property
    def double_buffered(self) -> bool:
        return any(len(b.slots) == 2 for b in self.buffers.values())


def lb_dtypes(stages: list[Stage], hw: Hardware, wide: frozenset = frozenset(), stored=None) -> dict[str, str]:
    """Element type of each LB buffer: MME accumulators in the accumulation type, other reduction
    accumulators in float32, what the MME reads in the storage type, what a DMA moves to/from DDR
    in the storage type (but for the ``wide`` parameters) or, given ``stored`` (an integer
    kernel's ``KernelIR.ddr_dtype``), in the type its DDR side is stored in, every other
    intermediate in float32 (the vector units compute in float32)."""
    out: dict[str, str] = {}
    for st in stages:
        if st.op in ("mme", "reduce"):
            out[st.dst.buffer] = hw.mme.accum_dtype if st.op == "mme" else "float32"
    for st in stages:
        if st.op == "mme":
            out.update({a.buffer: hw.storage_dtype for a in st.reads() if a.lb and a.buffer not in out})
    for st in stages:
        crosses_ddr = st.op == "dma" and not all(a.lb or a.buffer in wide for a in [st.dst] + st.reads())
        outside = [a.buffer for a in [st.dst] + st.reads() if not a.lb]
        for acc in [st.dst] + st.reads():
            if acc.lb and acc.buffer not in out and crosses_ddr:
                out[acc.buffer] = hw.storage_dtype if stored is None else stored(outside[0])
    for st in stages:
        for acc in [st.dst] + st.reads():
            if acc.lb:
                out.setdefault(acc.buffer, "float32")
    return out


def scratch_bytes(stage: Stage, dtypes: dict[str, str], ddr_dtype, rounding=align) -> int:
    """Bytes of temporaries a stage needs: one per inner op of its expression, a materialised
    update for a compound reduction, a cast buffer for a copy between element types (LB buffers'
    ``dtypes``, ``ddr_dtype(param)`` outside; two where a read and the destination are outside the
    LB); each through ``rounding``. A sum of products summed a point at a time
    (``Stage.point_sums``) needs none."""
    box = 1
    for n in stage.shape:
        box *= n
    if stage.op == "dma":  # a read from outside into a place outside converts between two casts in the LB
        types = {dtypes[a.buffer] if a.lb else ddr_dtype(a.buffer) for a in [stage.dst] + stage.reads()}
        casts = max([1] + [int(not a.lb) + int(not stage.dst.lb) for a in stage.reads()])
        return casts * rounding(4 * box) if len(types) > 1 else 0
    if stage.op == "mme":
        return 0

    def size(dims):
        n = 1
        for i in dims:
            n *= stage.shape[i]
        return rounding(4 * n)

    total = 0

    def walk(v, root):
        nonlocal total
        if isinstance(v, Op):
            for k in v.kids:
                walk(k, False)
            if not root:
                total += size(v.dims)

    if stage.point_sums():  # multiply-accumulated into the destination
        return 0
    walk(stage.value, stage.op == "vector")
    if stage.op == "reduce" and isinstance(stage.value, Op):
        total += rounding(4 * box)
    return total


def plan_lb(kernel: KernelIR, hw: Hardware, lb_bytes: int | None = None) -> LBPlan:
    """Place the kernel's LB buffers in the first ``lb_bytes`` of the LB (all of it by default),
    two copies of each when the kernel asks for double buffering or, without a decision, when two
    fit; without a decision and without room for two of each, two copies of the buffers DMAs load,
    or of those loaded in the chunk loop (each chunk's loads then overlap the compute on the one
    before; ViT's 197-row matmul tiles, BERT's output projection with its residual tile), with
    two of the chunk loop's accumulators as well where they fit (the tiles take turns: the next
    tile's products run while this tile's epilogue drains the other, ``tiling.lower_timed``);
    raises ``CodegenError`` when one tile (or the two copies asked for) does not fit.

    Buffers a tile computes (not loads) share their place with others whose use in the tile ends
    before theirs begins (``_shared_places``): an elementwise chain's temporaries (a GELU is five)
    then take two places, not five, and leave room for larger tiles."""
    capacity = hw.lb_bytes if lb_bytes is None else lb_bytes
    first, loaded, places, sizes, scratch = _tile_layout(kernel, hw)
    single = sum(sizes.values())
    if single + scratch > capacity:
        raise CodegenError(f"tile working set {single + scratch} bytes exceeds the LB ({capacity})")
    fits_two = 2 * single + scratch <= capacity
    if kernel.double_buffer and not fits_two:
        raise CodegenError(f"double-buffered tile working set {2 * single + scratch} bytes exceeds the LB ({capacity})")
    if fits_two if kernel.double_buffer is None else kernel.double_buffer:
        doubled = set(sizes)
    else:  # without a decision, two copies of what DMAs load if they fit: loads overlap compute
        doubled = set()
        if kernel.double_buffer is None:  # all loads, else those repeated per chunk of the reduction
            for names in (loaded, {st.dst.buffer for st in stages_of(chunk_loops(kernel)) if st.op == "dma"} & loaded):
                if single + sum(sizes[p] for p in {places[n] for n in names}) + scratch <= capacity:
                    doubled = {places[n] for n in names}
                    break
            accumulating = {places[name] for name in accumulators(kernel)}
            if doubled and single + sum(sizes[p] for p in doubled | accumulating) + scratch <= capacity:
                doubled |= accumulating
    offset, slots = 0, {}
    for place, size in sizes.items():
        slots[place] = []
        for _ in range(2 if place in doubled else 1):
            slots[place].append(offset)
            offset += size
    placed = {b.name: LBBuffer(b.name, b.dtype, b.extents, b.writer, tuple(slots[places[b.name]]))
              for b in first.values()}
    return LBPlan(placed, offset, scratch, offset + scratch)


def _tile_layout(kernel: KernelIR, hw: Hardware, rounding=align):
    """One tile's LB buffers (by name), those DMAs fill, each buffer's place (``_shared_places``),
    each place's bytes (its largest buffer's) and the temporaries' bytes of the stage that needs
    most; every size passed through ``rounding``."""
    stages = kernel.stages()
    dtypes = lb_dtypes(stages, hw, kernel.wide, (lambda b: kernel.ddr_dtype(b, hw)) if kernel.integer else None)
    first: dict[str, LBBuffer] = {}
    loaded: set = set()  # buffers a DMA fills
    for st in stages:
        for acc, is_write in [(st.dst, True)] + [(a, False) for a in st.reads()]:
            if not acc.lb or acc.buffer in first:
                continue
            if not is_write:
                raise CodegenError(f"LB buffer {acc.buffer} is read by {st.name} before it is written")
            first[acc.buffer] = LBBuffer(acc.buffer, dtypes[acc.buffer], acc.extents(st.shape), st.name)
            if st.op == "dma":
                loaded.add(acc.buffer)
    places = _shared_places(kernel, first)  # buffer -> place; a place's size is its largest buffer's
    sizes: dict = {}
    for name, place in places.items():
        sizes[place] = max(sizes.get(place, 0), rounding(first[name].nbytes))
    scratch = max((scratch_bytes(st, dtypes, lambda b: kernel.ddr_dtype(b, hw), rounding) for st in stages),
                  default=0)
    return first, loaded, places, sizes, scratch


def tile_bytes(kernel: KernelIR, hw: Hardware) -> int:
    """LB bytes one tile of ``kernel`` needs, one copy of each buffer (``plan_lb``'s least), sizes
    not rounded up to ``ALIGN``: it shrinks in proportion to the boxes, which lets a tile search
    predict which smaller tiling fits (``tiling.lower_kernel``)."""
    *_, sizes, scratch = _tile_layout(kernel, hw, rounding=int)
    return sum(sizes.values()) + scratch


def chunk_loops(kernel: KernelIR) -> list[Loop]:
    """The chunk loops (of a reduction) in the innermost tile loop."""
    return [n for n in kernel.tile_loops()[-1].body if isinstance(n, Loop) and n.kind == "chunk"]


def accumulators(kernel: KernelIR) -> set[str]:
    """The LB buffers the MME accumulates into over the chunk loops (a tile's partial sums)."""
    return {st.dst.buffer for st in stages_of(chunk_loops(kernel)) if st.op == "mme"}


def _shared_places(kernel: KernelIR, buffers: dict[str, LBBuffer]) -> dict[str, tuple]:
    """A place per LB buffer. A tile runs the nodes of its innermost tile loop in order (a stage,
    or a chunk loop with the stages it repeats); a buffer is in use from the node that first
    writes it to the node that last reads it. A buffer a compute stage writes first takes, first
    fit, the place of one whose use ended before, or of the one it is computed from element for
    element where that one's use ends (a vector stage reading it at the very indices it writes,
    same type and box: in place). Buffers a DMA fills keep places of their own (the emitter may
    find their content still there in the next tile and skip the load). Sharing a place makes two
    buffers one memory object for the emitter's dependencies, which keeps the order of their uses.
    A strip loop's or a chunk loop's stages count as nodes of their own (what one strip or chunk
    writes and reads is that strip's or chunk's: a contraction fused before the anchor computes
    its temporaries per chunk), but a buffer from before the loop that it reads is in use to the
    loop's end, and one it writes and reads after it (the anchor's partial sums) from its start."""
    body, loops = [], []  # the nodes in order, a strip or chunk loop's stages one by one; its (first, last)
    for node in kernel.tile_loops()[-1].body:
        if isinstance(node, Loop) and node.kind in (STRIP, "chunk"):
            inner = stages_of(node.body)
            loops.append((len(body), len(body) + len(inner) - 1))
            body += inner
        else:
            body.append(node)
    ops = {}
    span: dict = {}  # buffer -> (first node, last node)
    for k, node in enumerate(body):
        for st in stages_of([node]):
            ops[st.name] = st.op
            for acc in [st.dst] + st.reads():
                if acc.lb:
                    span[acc.buffer] = (span.get(acc.buffer, (k, k))[0], k)
    for lo, hi in loops:
        span.update({name: (min(a, lo) if lo <= a <= hi < b else a, hi if a < lo <= b else b)
                     for name, (a, b) in span.items()})

    def in_place(old: str, new: str, k: int) -> bool:
        st = body[k]
        a, b = buffers[old], buffers[new]
        return (isinstance(st, Stage) and st.op == "vector" and st.dst.buffer == new
                and (a.dtype, a.extents) == (b.dtype, b.extents)
                and any(r.buffer == old and (r.const, r.outer, r.inner, r.outer_fn) ==
                        (st.dst.const, st.dst.outer, st.dst.inner, st.dst.outer_fn) for r in st.reads()))

    places: dict[str, tuple] = {}
    held: list[tuple[str, int]] = []  # per shared place, (the buffer placed there last, its last node)
    for name, b in buffers.items():
        if ops.get(b.writer, "dma") == "dma" or name not in span:
            places[name] = ("own", name)
            continue
        lo, hi = span[name]
        free = next((p for p, (last, end) in enumerate(held)
                     if end < lo or (end == lo and in_place(last, name, lo))), len(held))
        held[free:free + 1] = [(name, hi)]
        places[name] = ("shared", free)
    return places
