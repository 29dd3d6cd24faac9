"""Inference simplification: seed 004's NNVM passes in their Relax form.

SimplifyInference (batch-norm folding into the preceding convolution where it follows one, the
remaining batch norms decomposed into scale and shift: ``FoldAffineChains``), then constant folding, which also performs
the pre-computation of everything that depends only on weights: in numpy where it can
(``FoldWeights``), with TVM's compile-and-run ``FoldConstant`` for the rest (``FoldConstantsLeft``).
After it, ``ClampAsClip`` makes a clamp between two constants one ``clip``.
"""

from __future__ import annotations

import functools

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.s_tir import SBlockRealize

from tvm_dsa.kernel.analysis import Load
from tvm_dsa.relax_passes.fold import FoldConstantsLeft, FoldWeights, constant_value, static_shape

_AFFINE = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide")


def FoldBatchNorms() -> tvm.transform.Pass:  # noqa: N802 - TVM pass naming
    """Batch norms folded into the convolutions before them, the others decomposed, and what
    depends only on weights evaluated in numpy (``FoldWeights``): the graph keeps its Relax ops
    (no op is legalized), as pattern matching needs (``byoc.partition``)."""
    return tvm.transform.Sequential(
        [
            relax.transform.FoldBatchnormToConv2D(),
            relax.transform.DecomposeOpsForInference(),
            relax.transform.CanonicalizeBindings(),
            FoldWeights,
            FoldAffineChains,
        ],
        name="dsa.FoldBatchNorms",
    )


def SimplifyInference() -> tvm.transform.Pass:  # noqa: N802 - TVM pass naming
    return tvm.transform.Sequential([FoldBatchNorms(), FoldConstantsLeft], name="dsa.SimplifyInference")


def _affine(value, forms: dict, uses: dict) -> tuple | None:
    """``value`` as (x, scale, shift, ops): x * scale + shift, where it is an add, subtract,
    multiply or divide of a tensor by a constant that keeps the tensor's shape, and x the start
    of the chain of such ops through tensors nothing else reads."""
    if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name in _AFFINE):
        return None
    (a, b), name = value.args, value.op.name
    c, flipped = (constant_value(b), False) if isinstance(a, relax.Var) else (constant_value(a), True)
    x = a if not flipped else b
    shape = static_shape(value.ty)
    if c is None or not isinstance(x, relax.Var) or shape is None or static_shape(x.ty) != shape or \
            (flipped and name == "relax.divide"):
        return None
    x, scale, shift, ops = forms[x] if x in forms and uses.get(x) == 1 else (x, np.float64(1), np.float64(0), 0)
    c = c.astype(np.float64)
    if name == "relax.add":
        shift = shift + c
    elif name == "relax.subtract":
        scale, shift = (-scale, c - shift) if flipped else (scale, shift - c)
    elif name == "relax.multiply":
        scale, shift = scale * c, shift * c
    else:
        scale, shift = scale / c, shift / c
    return x, scale, shift, ops + 1


@tvm.transform.module_pass(opt_level=0, name="dsa.FoldAffineChains")
def FoldAffineChains(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass naming
    """Chains of three or more adds, subtracts, multiplies and divides by constants (a batch norm
    decomposed: (x - mean) / std * gamma + beta) as one multiply and one add by constants folded
    from theirs: two passes over the tensor and two parameter vectors instead of four (the
    kernels then load one vector per parameter and chunk, and multiply-add in one pass)."""
    return _rebound(mod, _folded_affine)


def _folded_affine(b: relax.VarBinding, uses: dict, forms: dict) -> relax.VarBinding:
    """``b``, or where it ends a chain of three or more, the chain's multiply and add."""
    form = _affine(b.value, forms, uses)
    if form is None:
        return b
    forms[b.var] = form
    if form[3] < 3:
        return b
    x, scale, shift, _ = form
    dtype = str(b.var.ty.dtype)
    y = relax.op.multiply(x, relax.const(np.asarray(scale, dtype=dtype), dtype))
    return relax.VarBinding(b.var, relax.op.add(y, relax.const(np.asarray(shift, dtype=dtype), dtype)))


_OTHER_HALF = {"relax.minimum": "relax.maximum", "relax.maximum": "relax.minimum"}
_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


@tvm.transform.module_pass(opt_level=0, name="dsa.ClampAsClip")
def ClampAsClip(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass naming
    """``minimum(maximum(x, lo), hi)`` and ``maximum(minimum(x, hi), lo)``, with float scalar
    constants ``lo <= hi`` and the inner result read by nothing else, as ``clip(x, lo, hi)``.
    ONNX's Clip with its bounds as inputs (ReLU6 as PyTorch exports it) imports as that pair with
    the bounds as tensors: fused, its kernel read them as buffers, the stage reader saw no
    constant clamp (``kernel.ir._clip``), and the VME took a max and a min pass where
    ``clip``'s legalized form, its bounds literals, takes one (MobileNetV2's 35 ReLU6s)."""
    return _rebound(mod, functools.partial(_clamp_clipped, mod))


def _half(mod: tvm.IRModule, value) -> tuple | None:
    """(op, x, c) where ``value`` takes the elementwise maximum or minimum (``op``) of a tensor
    ``x`` and a float scalar constant ``c`` (not NaN): a Relax op, or TVM's topi one in a
    ``call_tir`` (as the ONNX importer emits it)."""
    if not isinstance(value, relax.Call):
        return None
    if isinstance(value.op, tvm.ir.Op) and value.op.name in _OTHER_HALF:
        op, args = value.op.name, list(value.args)
        orders = (args, args[::-1])
    elif value.op.same_as(_CALL_TIR) and len(value.args[1].fields) == 2:
        op, orders = _extremum(mod[value.args[0]]), (list(value.args[1].fields),)
    else:
        return None
    for x, bound in orders if op else ():
        c = constant_value(bound)
        if isinstance(x, relax.Var) and c is not None and c.ndim == 0 and c.dtype.kind == "f" and not np.isnan(c) \
                and static_shape(x.ty) is not None and static_shape(x.ty) == static_shape(value.ty):
            return op, x, float(c)
    return None


def _extremum(func: tirx.PrimFunc) -> str | None:
    """The Relax op a PrimFunc of one block storing ``T.max(a[i], b[()])`` or ``T.min`` (topi's
    ``maximum`` or ``minimum`` of a tensor and a scalar, its parameters in that order) computes."""
    node = func.body.block.body if isinstance(func.body, SBlockRealize) else None
    while isinstance(node, tirx.For):
        node = node.body
    store = node.block.body if isinstance(node, SBlockRealize) else None
    if not isinstance(store, tirx.BufferStore) or type(store.value) not in (tirx.Max, tirx.Min) or \
            len(func.params) != 3:
        return None
    a, b = store.value.a, store.value.b
    x, c = func.params[:2]
    if not (isinstance(a, Load) and isinstance(b, Load) and a.source.same_as(x) and b.source.same_as(c)
            and not b.indices and len(a.indices) == len(store.indices)
            and all(i.same_as(j) for i, j in zip(a.indices, store.indices))):
        return None
    return "relax.maximum" if type(store.value) is tirx.Max else "relax.minimum"


def _clamp_clipped(mod: tvm.IRModule, b: relax.VarBinding, uses: dict, halves: dict) -> relax.VarBinding:
    """``b``, or the clip where it and the binding it reads (``halves``: var -> (op, x, bound))
    make a clamp."""
    half = _half(mod, b.value)
    if half is None:
        return b
    op, x, bound = halves[b.var] = half
    inner = halves.get(x) if uses.get(x) == 1 else None
    if inner is None or inner[0] != _OTHER_HALF[op]:
        return b
    lo, hi = (inner[2], bound) if op == "relax.minimum" else (bound, inner[2])
    return b if lo > hi else relax.VarBinding(b.var, relax.op.clip(inner[1], lo, hi))


def _rebound(mod: tvm.IRModule, rewrite) -> tvm.IRModule:
    """``mod`` with each variable binding ``b`` of its Relax functions ``rewrite(b, uses, seen)``
    (``uses``: var -> its reads; ``seen``: a dict the rewrite keeps per function) and the
    bindings then unread dropped."""
    mod = mod.clone()
    for gv, func in list(mod.functions.items()):
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        uses: dict = {}
        for v in _reads(func):
            uses[v] = uses.get(v, 0) + 1
        seen: dict = {}
        blocks = [type(block)([rewrite(b, uses, seen) if isinstance(b, relax.VarBinding) else b
                               for b in block.bindings]) for block in func.body.blocks]
        new = relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty, func.is_pure, func.attrs)
        mod[gv] = relax.analysis.remove_all_unused(new)
    return relax.transform.Normalize()(mod)


def _reads(func: relax.Function) -> list:
    """Every read of a variable in ``func`` (one per operand)."""
    out: list = []
    relax.analysis.post_order_visit(func.body, lambda e: out.extend(
        a for a in (e.args if isinstance(e, relax.Call) else e.fields if isinstance(e, relax.Tuple) else ())
        if isinstance(a, relax.Var)))
    relax.analysis.post_order_visit(func.body.body, lambda e: out.append(e) if isinstance(e, relax.Var) else None)
    return out
