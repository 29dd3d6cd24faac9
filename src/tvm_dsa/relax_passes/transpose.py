"""CancelTransposePairs: a transpose, a softmax along one axis, and the inverse transpose become the
softmax along the axis the first transpose moved there.

``permute_dims(softmax(permute_dims(x, p), axis=a), q)`` with ``q`` the inverse of ``p`` is
``softmax(x, axis=p[a])``: a softmax works on each line along its axis on its own, so it commutes
with a permutation that carries the axis along, and a permutation followed by its inverse is the
identity. shape_chain's head split and merge (``[0, 2, 1, 3]`` around a softmax over the last
axis, which the permutation keeps) write two tensors that carry nothing; after this pass neither
exists (the reshapes around them are views).

    mod = CancelTransposePairs(mod)   # before legalization
"""

from __future__ import annotations

import tvm
from tvm import relax

from tvm_dsa.relax_passes.rewrite import rewrite_functions


_PERMUTE = tvm.ir.Op.get("relax.permute_dims")
_ALONG_AXIS = {tvm.ir.Op.get(name): getattr(relax.op.nn, name.rsplit(".", 1)[1])
               for name in ("relax.nn.softmax", "relax.nn.log_softmax")}


def _axes(call) -> list[int] | None:
    """The permutation of a ``permute_dims`` call (None: the input's rank is unknown)."""
    ndim = call.args[0].ty.ndim
    if ndim < 0:
        return None
    return [int(a) for a in call.attrs.axes] if call.attrs.axes is not None else list(reversed(range(ndim)))


@relax.expr_functor.mutator
class _Cancel(relax.PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not call.op.same_as(_PERMUTE) or not isinstance(call.args[0], relax.Var):
            return call
        inner = self.lookup_binding(call.args[0])
        if not (isinstance(inner, relax.Call) and inner.op in _ALONG_AXIS and isinstance(inner.args[0], relax.Var)):
            return call
        first = self.lookup_binding(inner.args[0])
        if not (isinstance(first, relax.Call) and first.op.same_as(_PERMUTE)):
            return call
        p, q = _axes(first), _axes(call)
        if p is None or q is None or [p[i] for i in q] != list(range(len(p))):
            return call
        axis = int(inner.attrs.axis) % len(p)
        return _ALONG_AXIS[inner.op](first.args[0], axis=p[axis])


@tvm.transform.module_pass(opt_level=0, name="dsa.CancelTransposePairs")
def CancelTransposePairs(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 (a pass, named like TVM's)
    return rewrite_functions(mod, _Cancel)
