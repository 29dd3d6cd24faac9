"""GatherOfRangeAsSlice: a gather at an arithmetic progression of indices becomes a strided slice.

``take(A, idx, axis)`` where ``idx`` is provably ``start + step * i`` for ``i`` in ``[0, n)``
(``step >= 1``) is ``strided_slice(A, axis, start, start + step * n, step)``. The indices are
followed through the bindings that make them: an ``arange``, casts to an integer type, multiplying
or adding an integer constant, and the negative-index fix ONNX's Gather brings,
``where(idx < 0, idx + dim, idx)`` (``idx`` itself when the progression is never negative).

Position embeddings as exported, ``table[arange(seq)]`` (shape_chain), are then a slice of a
constant, which fuses into the add that reads it: neither the indices nor the gathered rows are
written out (a gather stays a kernel of its own, on the host).

    mod = GatherOfRangeAsSlice(mod)   # before legalization
"""

from __future__ import annotations

import tvm
from tvm import relax, tirx

from tvm_dsa.relax_passes.fold import constant_value as _value
from tvm_dsa.relax_passes.rewrite import rewrite_functions


_OP = {name: tvm.ir.Op.get(f"relax.{name}") for name in
       ("take", "arange", "astype", "multiply", "add", "where", "less")}


def _constant(expr) -> int | None:
    """The value of a scalar integer constant."""
    if not isinstance(expr, tvm.ir.expr.Constant):
        return None
    value = _value(expr)
    return int(value) if value is not None and value.ndim == 0 and value.dtype.kind in "iu" else None


def _int(expr) -> int | None:
    return int(expr.value) if isinstance(expr, tirx.IntImm) else None


@relax.expr_functor.mutator
class _Rewrite(relax.PyExprMutator):
    def progression(self, expr) -> tuple[int, int, tirx.PrimExpr] | None:
        """(start, step, count) of the indices ``expr`` holds, or None where not proven."""
        if isinstance(expr, relax.Var):
            expr = self.lookup_binding(expr)
        if not isinstance(expr, relax.Call):
            return None
        op, args = expr.op, expr.args
        if op.same_as(_OP["arange"]):
            start, step = _int(args[0]), _int(args[2])
            return None if start is None or step is None else (start, step, expr.ty.shape.values[0])
        if op.same_as(_OP["astype"]) and "int" in str(expr.attrs.dtype):
            return self.progression(args[0])
        if op.same_as(_OP["multiply"]) or op.same_as(_OP["add"]):
            inner, c = (args[1], _constant(args[0])) if _constant(args[1]) is None else (args[0], _constant(args[1]))
            found = None if c is None else self.progression(inner)
            if found is None:
                return None
            start, step, n = found
            return (start * c, step * c, n) if op.same_as(_OP["multiply"]) else (start + c, step, n)
        if op.same_as(_OP["where"]):  # where(idx < 0, idx + dim, idx): idx where it is never negative
            cond, found = self.lookup_binding(args[0]), self.progression(args[2])
            never_negative = found is not None and found[0] >= 0 and found[1] >= 0
            if (never_negative and isinstance(cond, relax.Call) and cond.op.same_as(_OP["less"])
                    and cond.args[0].same_as(args[2]) and _constant(cond.args[1]) == 0):
                return found
        return None

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not call.op.same_as(_OP["take"]) or call.attrs.axis is None:
            return call
        found = self.progression(call.args[1])
        if found is None or found[1] < 1 or call.args[1].ty.ndim != 1:
            return call
        start, step, n = found
        return relax.op.strided_slice(call.args[0], [int(call.attrs.axis)], [start], [start + step * n], [step],
                                      assume_inbound=True)


@tvm.transform.module_pass(opt_level=0, name="dsa.GatherOfRangeAsSlice")
def GatherOfRangeAsSlice(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 (a pass, named like TVM's)
    return rewrite_functions(mod, _Rewrite)
