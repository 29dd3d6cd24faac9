"""Inference simplification: seed 004's NNVM passes in their Relax form.

SimplifyInference (batch-norm folding into the preceding convolution where it follows one, the
remaining batch norms decomposed into scale and shift: ``FoldAffineChains``), then constant folding, which also performs
the pre-computation of everything that depends only on weights: in numpy where it can
(``FoldWeights``), with TVM's compile-and-run ``FoldConstant`` for the rest (``FoldConstantsLeft``).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

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
    mod = mod.clone()
    for gv, func in list(mod.functions.items()):
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        uses: dict = {}
        for v in _reads(func):
            uses[v] = uses.get(v, 0) + 1
        forms: dict = {}
        blocks = []
        for block in func.body.blocks:
            bindings = []
            for b in block.bindings:
                form = _affine(b.value, forms, uses) if isinstance(b, relax.VarBinding) else None
                if form is not None:
                    forms[b.var] = form
                if form is not None and form[3] >= 3:
                    x, scale, shift, _ = form
                    dtype = str(b.var.ty.dtype)
                    y = relax.op.multiply(x, relax.const(np.asarray(scale, dtype=dtype), dtype))
                    b = relax.VarBinding(b.var, relax.op.add(y, relax.const(np.asarray(shift, dtype=dtype), dtype)))
                bindings.append(b)
            blocks.append(type(block)(bindings))
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
