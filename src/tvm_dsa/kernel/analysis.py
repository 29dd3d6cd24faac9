"""What a TIR block computes, in the terms the DSA understands.

A kernel's blocks (from ``LegalizeOps`` + ``FuseTIR``) are classified into stage kinds:

- ``copy``: the value is a load, a constant, or ``if_then_else`` of an index condition between
  copy-like values (padding, concatenation): DMA and fill.
- ``mme``: a reduction ``acc + a * b`` of two loads: a contraction (matmul, batch matmul, conv,
  depthwise conv) for the matrix engine.
- ``reduce``: a reduction ``acc op expr`` with op in sum / max / min.
- ``vector``: an elementwise expression of loads and constants.

Integers (a quantized model's int8 and int32 tensors, ``relax_passes.quantized``) are read as
float32 by the vector units, as a cast to float32 reads them, and multiplied by the MME as int8
into int32; a block writes an integer only where that is exact: a copy, an int8 x int8 -> int32
contraction, a max or min of integers, or an integer value in the type's range (a cast of a
clipped rounded value: a requantisation). Anything else (non-affine indices, integer arithmetic,
gathers) is ``Unsupported`` and the kernel stays on the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir import SBlock, SBlockRealize
from tvm_ffi.serialization import from_json_graph_str, to_json_graph_str

# TVM's Schedule methods check their argument types in Python on every call (~20 us, ~70 us for
# a primitive with list arguments). The passes query blocks and loops tens of thousands of times
# per model, and apply thousands of primitives, with handles the schedule itself returned, so
# they go around the check: the queries were a third of lowering time, the primitives 0.2 s of
# ViT-B/16's 3.6 s graphturbo build.
sch_get = s_tir.Schedule.get.__wrapped__
sch_loops = s_tir.Schedule.get_loops.__wrapped__
sch_children = s_tir.Schedule.get_child_blocks.__wrapped__
sch_get_sblock = s_tir.Schedule.get_sblock.__wrapped__
sch_split = s_tir.Schedule.split.__wrapped__
sch_reorder = s_tir.Schedule.reorder.__wrapped__
sch_annotate = s_tir.Schedule.annotate.__wrapped__
sch_compute_at = s_tir.Schedule.compute_at.__wrapped__
sch_reverse_compute_at = s_tir.Schedule.reverse_compute_at.__wrapped__
sch_cache_read = s_tir.Schedule.cache_read.__wrapped__
sch_cache_write = s_tir.Schedule.cache_write.__wrapped__
sch_set_scope = s_tir.Schedule.set_scope.__wrapped__
sch_decompose_reduction = s_tir.Schedule.decompose_reduction.__wrapped__


def copy_func(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """A copy of ``func`` that shares no node with it: a schedule of a module rewrites a body it
    shares in place (TVM 0.27). Through the FFI's JSON graph: ``tvm.ir.load_json`` would also run
    the version upgrade on JSON this same version wrote, twice the copy's cost."""
    return from_json_graph_str(to_json_graph_str(func))


class Unsupported(Exception):
    """A block the DSA cannot run; the message says what and why."""


FLOAT_DTYPES = ("float16", "float32")
INT_DTYPES = ("int8", "int32")
DSA_DTYPES = FLOAT_DTYPES + INT_DTYPES
REDUCE_ITER = 2  # IterVar.CommReduce

# TVM 0.27 node classes (tirx.BufferLoad is a constructor function; the class is TensorLoad).
Load = tvm.ir.expr.TensorLoad
Call = tvm.ir.expr.Call

# TIR intrinsics -> vector op names of the ISA.
# (Op names carry a "tirx." or "prim." prefix depending on the op; ``call_name`` drops it.)
UNARY_CALLS = {
    "exp": "exp", "log": "log", "sqrt": "sqrt", "rsqrt": "rsqrt", "tanh": "tanh",
    "sigmoid": "sigmoid", "erf": "erf", "floor": "floor", "ceil": "ceil", "round": "round",
    "fabs": "abs", "sin": "sin", "cos": "cos", "nearbyint": "round",
}
BINARY_NODES = {tirx.Add: "add", tirx.Sub: "sub", tirx.Mul: "mul", tirx.Div: "div",
                tirx.Max: "max", tirx.Min: "min"}
BINARY_CALLS = {"pow": "pow"}
# comparisons (1.0 where they hold, else 0.0) and the logic of such masks, on the vector core
COMPARE_NODES = {tirx.LT: "lt", tirx.LE: "le", tirx.GT: "gt", tirx.GE: "ge", tirx.EQ: "eq", tirx.NE: "ne",
                 tirx.And: "min", tirx.Or: "max"}


def expr_dtype(e) -> str:
    """The value type of a TIR expression (``.ty`` in TVM 0.27)."""
    return str(e.ty)


def call_name(e) -> str:
    """The op name of a call without its namespace ("prim.if_then_else" -> "if_then_else")."""
    return str(e.op.name).rsplit(".", 1)[-1]


def int_value(e) -> int | None:
    if isinstance(e, (int,)):
        return e
    if isinstance(e, tirx.IntImm):
        return int(e.value)
    return None


def uses_var(expr, var) -> bool:
    """Whether ``var`` occurs in ``expr``."""
    hit = []
    tvm_ffi.structural_walk(expr, [(tvm.ir.Var, lambda v: hit.append(v) if v.same_as(var) else None)])
    return bool(hit)


def linear_form(expr, variables) -> tuple[dict, int]:
    """``expr`` as ``const + sum(coeff * var)`` over ``variables`` (a set of Vars).

    Raises ``Unsupported`` for anything that is not an integer affine expression of them."""
    if isinstance(expr, tirx.IntImm):
        return {}, int(expr.value)
    if isinstance(expr, tvm.ir.Var) and not tirx.is_buffer_var(expr):
        if expr not in variables:
            raise Unsupported(f"index uses {expr}, which is not a loop variable")
        return {expr: 1}, 0
    if isinstance(expr, tirx.Cast) and "int" in expr_dtype(expr):
        return linear_form(expr.value, variables)
    if isinstance(expr, (tirx.Add, tirx.Sub)):
        (ca, ka), (cb, kb) = linear_form(expr.a, variables), linear_form(expr.b, variables)
        sign = 1 if isinstance(expr, tirx.Add) else -1
        out = dict(ca)
        for v, c in cb.items():
            out[v] = out.get(v, 0) + sign * c
        return {v: c for v, c in out.items() if c}, ka + sign * kb
    if isinstance(expr, tirx.Mul):
        (ca, ka), (cb, kb) = linear_form(expr.a, variables), linear_form(expr.b, variables)
        if ca and cb:
            raise Unsupported(f"index {expr} is not affine")
        coeffs, scale = (ca, kb) if ca else (cb, ka)
        return {v: c * scale for v, c in coeffs.items() if c * scale}, ka * kb
    raise Unsupported(f"index {expr} is not affine ({type(expr).__name__})")


def implicit_cast(src: str, dst: str) -> bool:
    """Whether the DSA makes a cast from ``src`` to ``dst`` as TIR does, without an instruction:
    between floats (compute in fp32, round on store), int8 or int32 to float32 and int8 to any
    float (the vector units read integers as float32, rounded as the cast rounds), int8 to int32
    (the MME's products of int8)."""
    if dst in FLOAT_DTYPES:
        return src in FLOAT_DTYPES or src == "int8" or src == "int32" and dst == "float32"
    return src == "int8" and dst == "int32"


def strip_cast(e):
    """``e`` without the casts the DSA makes implicitly (``implicit_cast``)."""
    while isinstance(e, tirx.Cast) and implicit_cast(expr_dtype(e.value), expr_dtype(e)):
        e = e.value
    return e


def stored_value(block: SBlock):
    """The value a block's store writes, as the DSA computes it: for an integer destination, the
    value inside the cast of a requantisation (``requantized``) where it is one."""
    value = strip_cast(block.body.value)
    inner = requantized(value)
    return value if inner is None else inner


def requantized(e):
    """The float value ``v`` of ``e = int(clip(v, lo, hi))`` where ``v`` is an integer by its
    form (rounded, or sums, maxima, minima of rounded values, integer constants and integers
    read) and ``[lo, hi]`` lies in the integer type's range: the cast then takes an integer in
    range, which the DSA's round-to-nearest, saturating store gives unchanged. Else None."""
    if not (isinstance(e, tirx.Cast) and expr_dtype(e) in INT_DTYPES and expr_dtype(e.value) in FLOAT_DTYPES):
        return None
    info, v = np.iinfo(expr_dtype(e)), e.value
    bounds = []
    inner = v
    for _ in range(2):  # clip: max(min(x, hi), lo) or min(max(x, lo), hi)
        if isinstance(inner, (tirx.Max, tirx.Min)) and isinstance(inner.b, tirx.FloatImm):
            bounds.append((type(inner), float(inner.b.value)))
            inner = inner.a
    kinds = {kind for kind, _ in bounds}
    if kinds != {tirx.Max, tirx.Min} or not all(info.min <= b <= info.max for _, b in bounds):
        return None
    return v if _integral(inner) else None


EXACT_F32 = 2 ** 24  # float32 holds every integer below this exactly
_INTEGER_BOUNDS = {"int8": 128}  # an integer read: its largest magnitude (int32's: none known)


def integer_bound(e) -> float:
    """The largest magnitude an integer expression of int8 reads and constants can take, through
    ``+ - * max min`` (inf for anything else: an int32 read, a division), for the vector units
    compute it exactly in float32 below ``EXACT_F32`` (a dequantize's ``int32(q) - z``)."""
    e = strip_cast(e)
    if isinstance(e, tirx.IntImm):
        return abs(int(e.value))
    if isinstance(e, Load):
        return _INTEGER_BOUNDS.get(expr_dtype(e), float("inf"))
    if isinstance(e, (tirx.Add, tirx.Sub, tirx.Max, tirx.Min)):
        a, b = integer_bound(e.a), integer_bound(e.b)
        return a + b if isinstance(e, (tirx.Add, tirx.Sub)) else max(a, b)
    if isinstance(e, tirx.Mul):
        return integer_bound(e.a) * integer_bound(e.b)
    return float("inf")


def _integral(e) -> bool:
    """Whether ``e`` (a float expression) is an integer by its form."""
    e = strip_cast(e)
    if isinstance(e, Call) and call_name(e) in ("round", "nearbyint", "floor", "ceil"):
        return True
    if isinstance(e, (tirx.Add, tirx.Sub, tirx.Max, tirx.Min)):
        return _integral(e.a) and _integral(e.b)
    if isinstance(e, tirx.FloatImm):
        return float(e.value).is_integer()
    return isinstance(e, tirx.IntImm) or isinstance(e, Load) and expr_dtype(e) in INT_DTYPES


@dataclass(frozen=True)
class StageKind:
    kind: str  # "copy" | "mme" | "reduce" | "vector"
    reduce_op: str = ""  # for "reduce"


def is_index_expr(e) -> bool:
    """True when ``e`` (an expression or a list of them) reads no buffer (a function of loop
    indices and constants only)."""
    found = []
    tvm_ffi.structural_walk(e, [(Load, found.append)])
    return not found


def is_copy_like(e) -> bool:
    e = strip_cast(e)
    if isinstance(e, (Load, tirx.FloatImm, tirx.IntImm)):
        return True
    if isinstance(e, Call) and call_name(e) == "if_then_else":
        return is_index_expr(e.args[0]) and is_copy_like(e.args[1]) and is_copy_like(e.args[2])
    return False


def data_select(e) -> tuple:
    """(condition, then, else) of a ``Select`` or ``if_then_else`` (a select by the data: LeakyRelu,
    PRelu, Sign; one by the index alone is a box bound, ``kernel.ir``)."""
    cond, then, other = (e.condition, e.true_value, e.false_value) if isinstance(e, tirx.Select) else e.args
    return _mask(cond), then, other


def _mask(cond):
    """A condition as a comparison of floats: ``0 < int(mask)`` and ``int(mask) != 0`` (how
    ``Where`` reads a bool its inlined ``Greater`` computed) are ``mask``."""
    while True:
        if isinstance(cond, tirx.Cast) and expr_dtype(cond.value) == "bool":
            cond = cond.value
        elif isinstance(cond, (tirx.LT, tirx.NE)) and int_value(cond.a) == 0 and isinstance(cond.b, tirx.Cast):
            cond = cond.b
        elif isinstance(cond, (tirx.GT, tirx.NE)) and int_value(cond.b) == 0 and isinstance(cond.a, tirx.Cast):
            cond = cond.a
        else:
            return cond


def check_vector_expr(e) -> None:
    """Raise ``Unsupported`` unless ``e`` is an elementwise expression the vector units run."""
    e = strip_cast(e)
    if isinstance(e, (Load, tirx.FloatImm)):
        if expr_dtype(e) not in DSA_DTYPES:
            raise Unsupported(f"{expr_dtype(e)} value {e}")
        return
    if type(e) in BINARY_NODES and expr_dtype(e) not in FLOAT_DTYPES and not integer_bound(e) < EXACT_F32:
        raise Unsupported(f"integer arithmetic {e}: the vector units compute in float32")
    if type(e) in BINARY_NODES or type(e) in COMPARE_NODES:
        check_vector_expr(e.a), check_vector_expr(e.b)
        return
    if isinstance(e, tirx.Select) or isinstance(e, Call) and call_name(e) == "if_then_else" and not is_index_expr(e.args[0]):
        for operand in data_select(e):
            check_vector_expr(operand)
        return
    if isinstance(e, Call):
        if call_name(e) in UNARY_CALLS:
            return check_vector_expr(e.args[0])
        if call_name(e) in BINARY_CALLS:
            return [check_vector_expr(a) for a in e.args] and None
    if is_index_expr(e) and expr_dtype(e) in DSA_DTYPES:
        return  # folded to a constant per box by the lowering, or rejected there
    raise Unsupported(f"expression {type(e).__name__} {e} is not supported by the vector units")


def reduction_update(block: SBlock):
    """(combine, update) of a reduction block ``acc = acc (combine) update`` — combine is "sum",
    "max" or "min" — or (None, None) when the stored value does not fold into the accumulator."""
    store = block.body
    value = strip_cast(store.value)

    def is_acc(x):
        x = strip_cast(x)
        return isinstance(x, Load) and x.source.same_as(store.buffer)

    for node, combine in ((tirx.Add, "sum"), (tirx.Max, "max"), (tirx.Min, "min")):
        if isinstance(value, node) and (is_acc(value.a) or is_acc(value.b)):
            return combine, strip_cast(value.b if is_acc(value.a) else value.a)
    return None, None


def contraction(block: SBlock):
    """The two loads (a, b) of a contraction ``acc += a * b``, or None."""
    if not isinstance(block.body, tirx.BufferStore):
        return None
    combine, upd = reduction_update(block)
    if combine == "sum" and isinstance(upd, tirx.Mul):
        a, b = strip_cast(upd.a), strip_cast(upd.b)
        if isinstance(a, Load) and isinstance(b, Load):
            return a, b
    return None


def reads_window(block: SBlock) -> bool:
    """Whether a reduction block reads a window: an index of a load combines a spatial and a
    reduction iterator (a pooling's ``x[2 h + r]``), unlike a matmul's or a mean's reduced axis."""
    spatial = {it.var for it in block.iter_vars if int(it.iter_type) != REDUCE_ITER}
    reduced = {it.var for it in block.iter_vars if int(it.iter_type) == REDUCE_ITER}
    loads = []
    tvm_ffi.structural_walk(block.body, [(Load, loads.append)])
    for ld in loads:
        for index in ld.indices:
            used = set(tirx.analysis.undefined_vars(index))
            if used & spatial and used & reduced:
                return True
    return False


def classify(block: SBlock) -> StageKind:
    """The stage kind of a leaf block, or ``Unsupported`` with the reason."""
    store = block.body
    if not isinstance(store, tirx.BufferStore):
        raise Unsupported(f"block {block.name_hint}: body is {type(store).__name__}, not a store")
    indices = list(store.indices)
    tvm_ffi.structural_walk(store.value, [(Load, lambda ld: indices.extend(ld.indices))])
    if not is_index_expr(indices):  # all at once: one walk per block, not per index
        raise Unsupported(f"block {block.name_hint}: an index reads tensor data (a gather); "
                          "DSA addresses are fixed when the program is compiled")
    dtype = str(store.buffer.dtype)
    if dtype not in DSA_DTYPES:
        raise Unsupported(f"block {block.name_hint}: writes {dtype}")
    integer = dtype in INT_DTYPES
    value = stored_value(block)
    # A reduction has an init (or had one before decompose_reduction) and reduce iterators.
    if block.init is None and not any(int(it.iter_type) == REDUCE_ITER for it in block.iter_vars):
        if is_copy_like(value):
            return StageKind("copy")
        if integer and requantized(strip_cast(store.value)) is None:
            raise Unsupported(f"block {block.name_hint}: integer arithmetic writes {dtype} (the vector units "
                              "compute in float32; only a clipped, rounded value is stored exactly)")
        check_vector_expr(value)
        return StageKind("vector")
    combine, upd = reduction_update(block)
    pair = contraction(block) if combine == "sum" else None
    if pair is not None:
        operands = {expr_dtype(ld) for ld in pair}
        if not operands <= set(FLOAT_DTYPES) | {"int8"} or integer and (dtype != "int32" or operands != {"int8"}):
            raise Unsupported(f"block {block.name_hint}: a contraction of {sorted(operands)} into {dtype} "
                              "(the MME multiplies floats, or int8 into int32)")
        return StageKind("mme")
    if combine is not None:
        if integer and combine == "sum":
            raise Unsupported(f"block {block.name_hint}: an integer sum into {dtype} (the vector units add in float32)")
        check_vector_expr(upd)
        return StageKind("reduce", combine)
    raise Unsupported(f"block {block.name_hint}: reduction {value} is not a sum/max/min or contraction")


def param_dtypes(func: tirx.PrimFunc) -> set[str]:
    """The element types of a PrimFunc's tensor parameters."""
    return {str(p.dtype) for p in func.params}


def contraction_dtypes(func: tirx.PrimFunc) -> set[str]:
    """The element types a PrimFunc's contractions multiply."""
    found: set = set()

    def visit(realize):
        pair = contraction(realize.block)
        found.update(expr_dtype(ld) for ld in pair or ())

    tvm_ffi.structural_walk(func.body, [(SBlockRealize, visit)])
    return found
