"""RDP's transfer functions (seed 001 Table 3): forward and backward, for shapes and for values,
chosen by an op's dynamism class after constant propagation and by its shape family.

``ctx`` is the solver (``rdp._Solver``): it evaluates argument facts (``fact_of``), converts
lattice elements to TIR expressions and back (``to_expr`` / ``from_expr``, ⊤ and ⊥ as fresh
variables), substitutes RDP's symbols (``substitute``) and names values only execution knows
(``name``).
"""

from __future__ import annotations

import math
import operator

import tvm
from tvm import relax, tirx
from tvm.ir.expr import Constant

from tvm_dsa.relax_passes.dynamism import Dynamism, Family, OpClass, classify_relax
from tvm_dsa.relax_passes.lattice import DIMS_NAC, DIMS_UNDEF, FACT_NAC, FACT_UNDEF, NAC, UNDEF, Dim, Dims, Fact, Kind

#: integer tensors with at most this many elements (rank <= 1) have their value tracked
MAX_TRACKED = 16

_EDO_FALLBACK = OpClass(Dynamism.EDO, note="not in the classification: treated as execution determined")
_CALLED_FUNCTION = OpClass(Dynamism.ISDOS, note="call of a function: its declared output")


def op_class(call) -> OpClass:
    """The class of a call: its op's, EDO for an op the table does not know."""
    if not isinstance(call.op, tvm.ir.Op):
        return _CALLED_FUNCTION
    try:
        return classify_relax(call.op.name)
    except KeyError:
        return _EDO_FALLBACK


def _known_value(f: Fact) -> bool:
    if f.fields is not None:
        return all(_known_value(g) for g in f.fields)
    return f.value.determined


# ================================================================================ forward
def forward(ctx, call) -> Fact:
    args = [ctx.fact_of(a) for a in call.args]
    dyn = op_class(call).effective(lambda i: i < len(args) and _known_value(args[i]))
    out = FORWARD_SHAPE[dyn](ctx, call, args)
    if out.undef or out.fields is not None:
        return out
    if not tracks(call.ty, out.shape):
        return Fact(out.shape, DIMS_NAC)
    return Fact(out.shape, FORWARD_VALUE[dyn](ctx, call, args, out))


def tracks(ty, shape: Dims) -> bool:
    """Whether RDP tracks the value of a variable of this type and shape: shapes, integer
    scalars, integer tensors of rank <= 1 and at most MAX_TRACKED elements."""
    if isinstance(ty, (relax.ShapeType, tvm.ir.PrimType)):
        return True
    if not (isinstance(ty, relax.TensorType) and str(ty.dtype).startswith(("int", "uint"))):
        return False
    if not shape.known or len(shape) > 1:
        return False
    return all(d.kind is Kind.KNOWN for d in shape) and math.prod(d.value for d in shape) <= MAX_TRACKED


def _infer(ctx, call, args, wait: bool = True) -> Fact:
    """Relax's own inference of the op, on arguments carrying what RDP knows."""
    new_args = [_as_arg(ctx, a, f) for a, f in zip(call.args, args)]
    if any(a is None for a in new_args):
        return FACT_UNDEF  # an input not known yet: wait (optimistic ⊤)
    sinfo = [ctx.substitute(s) for s in call.ty_args]
    try:
        ty = ctx.bb.normalize(relax.Call(call.op, new_args, call.attrs, sinfo)).ty
    except Exception:  # noqa: BLE001 - the op's inference rejects the shapes RDP proposes: a conflict
        return FACT_NAC
    out = ctx.fact_of_type(ty)
    # Relax gives up on a whole shape it cannot decide; while an input is ⊤, that is not ⊥ yet
    return out.opened() if wait and any(a.pending for a in args) else out


def _as_arg(ctx, arg, fact: Fact):
    """An argument with the struct info RDP knows (None while it is ⊤)."""
    if isinstance(arg, relax.Tuple):
        fields = fact.fields or (FACT_NAC,) * len(arg.fields)
        items = [_as_arg(ctx, a, f) for a, f in zip(arg.fields, fields)]
        return None if any(i is None for i in items) else relax.Tuple(items)
    if isinstance(arg, Constant) or not hasattr(arg, "ty"):
        return arg
    ty = arg.ty
    if isinstance(ty, relax.TensorType):
        if fact.shape.undef:
            return None
        if not fact.shape.known:
            return relax.Var("rdp", relax.TensorType(ndim=-1, dtype=ty.dtype))
        return relax.Var("rdp", relax.TensorType(relax.ShapeExpr([ctx.to_expr(d) for d in fact.shape]), ty.dtype))
    if isinstance(ty, relax.ShapeType):
        if fact.value.undef:
            return None
        if fact.value.known:
            return relax.ShapeExpr([ctx.to_expr(d) for d in fact.value])
        return relax.Var("rdp", relax.ShapeType(ndim=ty.ndim))
    if isinstance(ty, tvm.ir.PrimType):
        if fact.value.undef:
            return None
        return ctx.to_expr(fact.value[0]) if fact.value.known else relax.Var("rdp", tvm.ir.PrimType(ty.dtype))
    return arg


def _executed(ctx, call, args) -> Fact:
    """Execution determined: the rank and what the op's inference derives from the input
    shapes (NonZero's first dim is the input's rank); the dims only execution knows are ⊥ for
    good, whatever the inputs still lack."""
    return _infer(ctx, call, args, wait=False)


FORWARD_SHAPE = {Dynamism.ISDO: _infer, Dynamism.ISDOS: _infer, Dynamism.ISVDOS: _infer, Dynamism.EDO: _executed}


# ---------------------------------------------------------------------- forward values
def _value_from_shapes(ctx, call, args, out) -> Dims:
    """ISDO: the value is a function of the input shapes. Elements only execution knows get a
    symbolic constant of their own (Algorithm 1, lines 16-18)."""
    name = call.op.name
    shape = args[0].shape if args else DIMS_NAC
    if name == "relax.shape_of":
        if shape.undef:
            return DIMS_UNDEF
        if not shape.known:
            return DIMS_NAC
        return Dims(tuple(ctx.name(ctx.current, i) if d.kind is Kind.NAC else d for i, d in enumerate(shape)))
    if name in ("relax.zeros_like", "relax.ones_like"):
        return Dims.of([int(name == "relax.ones_like")] * math.prod(d.value for d in out.shape))
    if name == "relax.size":
        return _join([shape], lambda s: Dims((_prod(ctx, s[0]),)))
    return out.value


def _prod(ctx, dims: Dims) -> Dim:
    return ctx.from_expr(math.prod((ctx.to_expr(d) for d in dims), start=tirx.IntImm("int64", 1)))


_BINARY = {
    "relax.add": operator.add, "relax.subtract": operator.sub, "relax.multiply": operator.mul,
    "relax.floor_divide": tirx.floordiv, "relax.divide": tirx.truncdiv, "relax.floor_mod": tirx.floormod,
    "relax.maximum": tirx.max, "relax.minimum": tirx.min,
}
_SAME_ELEMENTS = {"relax.shape_to_tensor", "relax.tensor_to_shape", "relax.astype", "relax.reshape",
                  "relax.expand_dims", "relax.squeeze", "relax.flatten", "relax.permute_dims"}


def _evaluate(ctx, call, args, out) -> Dims:
    """ISDOS / ISVDOS: evaluate the op on small integer values, element by element."""
    name = call.op.name if isinstance(call.op, tvm.ir.Op) else ""
    values = [a.value for a in args]
    if name in _SAME_ELEMENTS:
        return values[0]
    if name == "relax.concat":
        parts = [f.value for f in args[0].fields] if args[0].fields is not None else [DIMS_NAC]
        return _join(parts, lambda ps: Dims(tuple(d for p in ps for d in p)))
    if name in _BINARY or name == "relax.negative":
        fn = _BINARY.get(name, lambda a: -a)
        return _join(values, lambda vs: _elementwise(ctx, fn, vs))
    if name == "relax.take":
        return _join(values, lambda vs: _take(vs[0], vs[1]))
    if name == "relax.strided_slice":
        return _join([values[0], *map(_tuple_value, args[1:])], lambda vs: _slice(vs[0], vs[1:]))
    if name == "relax.arange":
        return _join(values, lambda vs: _arange(vs))
    if name in ("relax.zeros", "relax.ones"):
        return Dims.of([int(name == "relax.ones")] * math.prod(d.value for d in out.shape))
    return out.value


def _tuple_value(f: Fact) -> Dims:
    """The elements of a tuple of integers (strided_slice's axes, begin, end, strides)."""
    if f.fields is None:
        return f.value
    return _join([g.value for g in f.fields], lambda vs: Dims(tuple(v[0] for v in vs)))


def _join(values: list[Dims], fn) -> Dims:
    """Apply ``fn`` to tuples of known length; ⊤ if one is ⊤, ⊥ if one is ⊥."""
    if any(v.undef for v in values):
        return DIMS_UNDEF
    if any(not v.known for v in values):
        return DIMS_NAC
    return fn(values)


def _elementwise(ctx, fn, values: list[Dims]) -> Dims:
    n = max(len(v) for v in values)
    if any(len(v) not in (1, n) for v in values):
        return DIMS_NAC
    out = []
    for i in range(n):
        operands = [ctx.to_expr(v[i if len(v) > 1 else 0]) for v in values]
        out.append(ctx.from_expr(fn(*operands)))
    return Dims(tuple(out))


def _ints(dims: Dims) -> list[int] | None:
    return [d.value for d in dims] if all(d.kind is Kind.KNOWN for d in dims) else None


def _take(data: Dims, indices: Dims) -> Dims:
    idx = _ints(indices)
    if idx is None:
        return Dims((NAC,) * len(indices))
    n = len(data)
    return Dims(tuple(data[i % n] if -n <= i < n else NAC for i in idx))


def _slice(data: Dims, params: list[Dims]) -> Dims:
    p = [_ints(v) for v in params]
    if any(x is None for x in p) or p[0] != [0]:
        return Dims((NAC,) * len(data)) if data.known else DIMS_NAC
    begin, end = p[1][0], p[2][0]
    step = p[3][0] if len(p) > 3 else 1
    return Dims(tuple(data.items[slice(begin, end, step)]))


def _arange(values: list[Dims]) -> Dims:
    start, end, step = (_ints(v) for v in values)
    if None in (start, end, step) or step[0] == 0 or len(range(start[0], end[0], step[0])) > MAX_TRACKED:
        return DIMS_NAC
    return Dims.of(range(start[0], end[0], step[0]))


def _unknown_value(ctx, call, args, out) -> Dims:
    return DIMS_NAC


FORWARD_VALUE = {Dynamism.ISDO: _value_from_shapes, Dynamism.ISDOS: _evaluate,
                 Dynamism.ISVDOS: _evaluate, Dynamism.EDO: _unknown_value}


# =============================================================================== backward
def backward(ctx, call, out: Fact) -> list[tuple]:
    """(argument, fact) pairs that the output's fact implies for the call's arguments. Execution
    determined ops imply nothing; the others by their shape family."""
    cls = op_class(call)
    if cls.dynamism is Dynamism.EDO or out.undef:
        return []
    args = [ctx.fact_of(a) for a in call.args]
    return [(call.args[i], f) for i, f in BACKWARD[cls.family](ctx, call, args, out, cls)]


def _shape(dims: Dims) -> Fact:
    return Fact(dims, DIMS_UNDEF)


def _back_same(ctx, call, args, out, cls):
    return [(0, _shape(out.shape))] if out.shape.known else []


def _is_one(d: Dim) -> bool:
    return d.kind is Kind.KNOWN and d.value == 1


def _back_broadcast(ctx, call, args, out, cls):
    """Numpy broadcasting backwards: an input dim is 1 where the output's is 1, and equals the
    output's where every other input is broadcast there (absent or 1); otherwise it could be
    either, ⊤."""
    if not out.shape.known:
        return []
    rank = len(out.shape)
    tensors = [i for i, a in enumerate(call.args) if isinstance(a.ty, relax.TensorType)]
    ranks = {i: len(args[i].shape) if args[i].shape.known else None for i in tensors}
    result = []
    for i in tensors:
        r = ranks[i]
        if r is None and all(ranks[j] is not None and ranks[j] < rank for j in tensors if j != i):
            r = rank  # the only input that can give the output its rank
        if r is None:
            continue
        dims = []
        for j in range(r):
            k = j + rank - r
            od = out.shape[k]
            others = [args[o].shape[ranks[o] - rank + k] if k - (rank - ranks[o]) >= 0 else None
                      for o in tensors if o != i and ranks[o] is not None]
            broadcast_elsewhere = len(others) == len(tensors) - 1 and all(d is None or _is_one(d) for d in others)
            dims.append(od if _is_one(od) or broadcast_elsewhere else UNDEF)
        result.append((i, _shape(Dims(tuple(dims)))))
    return result


def _back_concat(ctx, call, args, out, cls):
    """Every input has the output's dims off the axis; on the axis, the one input not known has
    the output's dim minus the others'."""
    fields = args[0].fields
    if not out.shape.known or fields is None:
        return []
    rank = len(out.shape)
    axis = int(call.attrs.axis) % rank
    along = [f.shape[axis] if f.shape.known else UNDEF for f in fields]
    unknown = [k for k, d in enumerate(along) if not d.determined]
    facts = []
    for k in range(len(fields)):
        dims = list(out.shape)
        dims[axis] = UNDEF
        if unknown == [k] and out.shape[axis].determined:
            rest = sum((ctx.to_expr(d) for j, d in enumerate(along) if j != k), tirx.IntImm("int64", 0))
            dims[axis] = ctx.from_expr(ctx.to_expr(out.shape[axis]) - rest)
        facts.append(_shape(Dims(tuple(dims))))
    return [(0, Fact(DIMS_UNDEF, DIMS_UNDEF, tuple(facts)))]


def _back_permute(ctx, call, args, out, cls):
    if not out.shape.known:
        return []
    rank = len(out.shape)
    axes = [int(a) for a in call.attrs.axes] if call.attrs.axes is not None else list(range(rank))[::-1]
    dims = [UNDEF] * rank
    for i, a in enumerate(axes):
        dims[a % rank] = out.shape[i]
    return [(0, _shape(Dims(tuple(dims))))]


def _back_matmul(ctx, call, args, out, cls):
    """The output's rows are A's rows, its columns B's columns; A's columns are B's rows."""
    a, b = args[0].shape, args[1].shape
    if not (a.known and b.known and len(a) >= 2 and len(b) >= 2):
        return []
    da, db = [UNDEF] * len(a), [UNDEF] * len(b)
    da[-1], db[-2] = b[-2], a[-1]
    if out.shape.known:
        da[-2], db[-1] = out.shape[-2], out.shape[-1]
    return [(0, _shape(Dims(tuple(da)))), (1, _shape(Dims(tuple(db))))]


def _back_reshape(ctx, call, args, out, cls):
    """The new shape's value is the output's shape; the data has as many elements, which fixes
    its one dim not known if the others are."""
    if not out.shape.known:
        return []
    result = _back_create(ctx, call, args, out, cls)
    data = args[0].shape
    if data.known and all(d.determined for d in out.shape):
        unknown = [k for k, d in enumerate(data) if not d.determined]
        if len(unknown) == 1:
            total = _prod(ctx, out.shape)
            rest = _prod(ctx, Dims(tuple(d for k, d in enumerate(data) if k != unknown[0])))
            dims = list(data)
            dims[unknown[0]] = ctx.from_expr(tirx.floordiv(ctx.to_expr(total), ctx.to_expr(rest)))
            result.append((0, _shape(Dims(tuple(dims)))))
    return result


def _back_create(ctx, call, args, out, cls):
    """The shape input's value is the output's shape."""
    i = cls.value_inputs[0]
    if not out.shape.known or not isinstance(call.args[i].ty, relax.ShapeType):
        return []
    return [(i, Fact(Dims.of([len(out.shape)]), out.shape))]


def _back_shape_of(ctx, call, args, out, cls):
    return [(0, _shape(out.value))] if out.value.known else []


def _back_to_shape(ctx, call, args, out, cls):
    return [(0, Fact(DIMS_UNDEF, out.value))] if out.value.known else []


def _back_none(ctx, call, args, out, cls):
    return []


BACKWARD = {
    Family.SAME: _back_same, Family.BROADCAST: _back_broadcast, Family.CONCAT: _back_concat,
    Family.PERMUTE: _back_permute, Family.MATMUL: _back_matmul, Family.RESHAPE: _back_reshape,
    Family.CREATE: _back_create, Family.SHAPE_OF: _back_shape_of, Family.TO_SHAPE: _back_to_shape,
    Family.OTHER: _back_none,
}
