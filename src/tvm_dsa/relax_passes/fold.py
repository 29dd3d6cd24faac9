"""FoldWeights: evaluate the weight pre-computation (batch-norm folding's scales and shifts,
layout changes of constants) and index arithmetic on static shapes (an ONNX Gather's index
normalisation) in numpy.

TVM's ``FoldConstant`` compiles each constant call with LLVM to run it once: ~17 ms a call, which
for ResNet-50's 270 folded batch-norm ops was half of the whole compilation. Elementwise and
layout ops on constants are evaluated here directly; anything else is left for ``FoldConstant``,
which ``FoldConstantsLeft`` runs only where a call is left with constant operands: it legalizes
every op of a dataflow block to see whether it folds (ViT-B/16: 0.25 s, with nothing to fold).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

_BINARY = {"relax.add": np.add, "relax.subtract": np.subtract, "relax.multiply": np.multiply,
           "relax.divide": np.divide, "relax.power": np.power, "relax.maximum": np.maximum,
           "relax.minimum": np.minimum}
_COMPARE = {"relax.less": np.less, "relax.less_equal": np.less_equal, "relax.greater": np.greater,
            "relax.greater_equal": np.greater_equal, "relax.equal": np.equal, "relax.not_equal": np.not_equal}
_UNARY = {"relax.sqrt": np.sqrt, "relax.rsqrt": lambda a: 1 / np.sqrt(a), "relax.negative": np.negative,
          "relax.exp": np.exp, "relax.abs": np.abs}


def _shape(expr) -> tuple[int, ...] | None:
    if isinstance(expr, relax.ShapeExpr) and all(isinstance(v, tvm.tirx.IntImm) for v in expr.values):
        return tuple(int(v) for v in expr.values)
    return None


def constant_value(c) -> np.ndarray | None:
    """The value of a Relax constant as a numpy array (None where ``c`` is not a constant or its
    type has no dtype)."""
    if not isinstance(c, tvm.ir.expr.Constant):
        return None
    if isinstance(c.value, tvm.runtime.Tensor):
        return c.value.numpy()
    dtype = getattr(c.ty, "dtype", None)
    return np.asarray(c.value, dtype=str(dtype)) if dtype else None


def static_shape(ty) -> tuple[int, ...] | None:
    """The dims of a tensor type where all are known, else None."""
    dims = getattr(ty, "shape", None)
    if dims is None or not all(isinstance(d, tvm.tirx.IntImm) for d in dims):
        return None
    return tuple(int(d) for d in dims)


def _elementwise(fn):
    return lambda call, *operands: fn(*operands)


def _reshape(call, a):
    shape = _shape(call.args[1])
    return None if shape is None else a.reshape(shape)


def _broadcast(call, a):
    shape = _shape(call.args[1])
    return None if shape is None else np.broadcast_to(a, shape)


def _axes(value):
    return None if value is None else tuple(int(a) for a in value)


def _take(call, a, indices):
    """``take`` with indices in range (relax's fast mode leaves the others undefined)."""
    axis = None if call.attrs.axis is None else int(call.attrs.axis)
    n = a.size if axis is None else a.shape[axis]
    return np.take(a, indices, axis=axis) if np.all((indices >= 0) & (indices < n)) else None


# op name -> numpy evaluation (call, *operands), None where the call cannot be folded here
EVALUATORS = {
    **{name: _elementwise(fn) for name, fn in {**_BINARY, **_COMPARE, **_UNARY}.items()},
    "relax.where": _elementwise(np.where),
    "relax.take": _take,
    "relax.permute_dims": lambda call, a: np.transpose(a, _axes(call.attrs.axes)),
    "relax.expand_dims": lambda call, a: np.expand_dims(a, _axes(call.attrs.axis)),
    "relax.squeeze": lambda call, a: np.squeeze(a, _axes(call.attrs.axis)),
    "relax.astype": lambda call, a: a.astype(str(call.attrs.dtype)),
    "relax.reshape": _reshape,
    "relax.broadcast_to": _broadcast,
}


def _fold_block(block, values: dict, shapes: dict) -> list:
    bindings = []
    for b in block.bindings:
        value = b.value
        name = value.op.name if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) else None
        if isinstance(value, tvm.ir.expr.Constant):  # a constant bound to a name (the importer's index constants)
            values[b.var] = constant_value(value)
        elif isinstance(value, relax.Var):  # an alias
            for known in (values, shapes):
                if value in known:
                    known[b.var] = known[value]
        elif name == "relax.shape_of" and static_shape(value.args[0].ty) is not None:
            shapes[b.var] = static_shape(value.args[0].ty)  # a static shape: the index arithmetic on it folds
            value = relax.ShapeExpr(list(shapes[b.var]))
        elif name == "relax.shape_to_tensor" and (shapes.get(value.args[0]) or _shape(value.args[0])) is not None:
            out = np.array(shapes.get(value.args[0]) or _shape(value.args[0]), dtype=str(value.ty.dtype))
            values[b.var] = out
            value = relax.const(out, str(value.ty.dtype))
        elif name is not None:
            tensor_args = [a for a in value.args if not isinstance(a, relax.ShapeExpr)]
            consts = [constant_value(a) if isinstance(a, tvm.ir.expr.Constant) else values.get(a)
                      for a in tensor_args]
            fold = EVALUATORS.get(value.op.name)
            if fold and tensor_args and all(c is not None for c in consts):
                out = fold(value, *consts)
                if out is not None:
                    out = np.array(out, dtype=str(value.ty.dtype), order="C")  # ascontiguousarray makes 0-d 1-d
                    if static_shape(value.ty) == tuple(out.shape):
                        values[b.var] = out
                        value = relax.const(out, str(value.ty.dtype))
        bindings.append(relax.VarBinding(b.var, value) if not value.same_as(b.value) else b)
    return bindings


@tvm.transform.module_pass(opt_level=0, name="dsa.FoldWeights")
def FoldWeights(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass naming
    mod = mod.clone()
    for gv, func in list(mod.functions.items()):
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        values: dict = {}
        shapes: dict = {}
        blocks = [type(block)(_fold_block(block, values, shapes)) for block in func.body.blocks]
        mod[gv] = relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty,
                                 func.is_pure, func.attrs)
    return relax.transform.CanonicalizeBindings()(mod)


def _left_to_fold(func: relax.Function) -> bool:
    """Whether ``FoldConstant`` may fold something in ``func``: a call whose tensor operands are
    all constants (or variables bound to them, or static shapes), or an ``If`` or inner function,
    which ``FoldWeights`` does not look into."""
    known: set = set()  # variables bound to constants or static shapes

    def constant(arg) -> bool:
        if isinstance(arg, relax.Tuple):
            return all(constant(f) for f in arg.fields)
        if isinstance(arg, relax.Var):
            return arg in known
        return not isinstance(arg, relax.Call)  # a constant, a shape, a value, a name

    for block in func.body.blocks:
        for b in block.bindings:
            value = b.value
            if isinstance(value, (relax.If, relax.Function)):
                return True
            if isinstance(value, (tvm.ir.expr.Constant, relax.ShapeExpr)):
                known.add(b.var)
            elif isinstance(value, relax.Call) and all(constant(a) for a in value.args):
                return True
    return False


@tvm.transform.module_pass(opt_level=0, name="dsa.FoldConstantsLeft")
def FoldConstantsLeft(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass naming
    """TVM's ``FoldConstant``, where a Relax function has a call it may fold and the result is
    well formed (folding a ``dynamic_strided_slice`` before legalization leaves a call to a
    ``shape_func`` the module does not define: ONNX's ``test_slice_default_axes``)."""
    funcs = [f for f in mod.functions.values() if isinstance(f, relax.Function)]
    if any(not isinstance(f.body, relax.SeqExpr) or _left_to_fold(f) for f in funcs):
        folded = relax.transform.FoldConstant()(mod)
        try:  # TVM 0.27's check raises on an undefined GlobalVar (and returns None when it passes)
            return mod if relax.analysis.well_formed(folded) is False else folded
        except ValueError:
            return mod
    return mod
