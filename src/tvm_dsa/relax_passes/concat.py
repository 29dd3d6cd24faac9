"""ConcatApart: a concatenation of two values computed from one tensor is a kernel of its own.

``FuseOps`` fuses the element-wise chains that make a concatenation's inputs into it. Where two
inputs come from one tensor through such chains (``Concat(HardSigmoid(bn(x)), Tanh(bn(x)))``,
``Concat(r, r)``), the fused kernel computes that tensor once per tile for both, and the box it
needs is the union of the boxes both inputs read through the concatenation's selects, reaching
outside the tensor: no tiling of it lowers. With the concatenation opaque, ``FuseOps`` leaves it
a copy kernel of its own and the chains in kernels of theirs: all on the DSA. Concatenations of
unrelated values (DenseNet's, Inception's: convolution outputs) fuse as before.

    mod = ConcatApart(mod)   # after AnnotateTIROpPattern, before FuseOps
"""

from __future__ import annotations

import tvm
from tvm import relax

from tvm_dsa.relax_passes.rewrite import with_copies

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")
INJECTIVE, OPAQUE = 2, 8  # TVM's OpPatternKind values


def _sources(var, bound: dict, mod, memo: dict) -> frozenset:
    """The tensors that element-wise / injective kernels compute on the way to ``var`` (itself
    included where such a kernel computes it): what one fused kernel would compute for it. A
    tensor another kernel computes (a convolution's output) is read, and each reader gets its own
    copy of it (``kernel.attrs.COPY_EACH``)."""
    if var not in memo:
        memo[var] = frozenset()
        value = bound.get(var)
        if isinstance(value, relax.TupleGetItem):
            value = bound.get(value.tuple_value)
        elif isinstance(value, relax.Var):
            memo[var] = _sources(value, bound, mod, memo)
            return memo[var]
        if isinstance(value, relax.Call) and value.op.same_as(_CALL_TIR):
            func = mod[value.args[0]]
            if func.attrs is not None and int(func.attrs.get("op_pattern", OPAQUE)) <= INJECTIVE:
                memo[var] = frozenset({var}).union(*(_sources(a, bound, mod, memo) for a in value.args[1].fields
                                                     if isinstance(a, relax.Var)))
    return memo[var]


@tvm.transform.module_pass(opt_level=0, name="dsa.ConcatApart")
def ConcatApart(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 (a pass, named like TVM's)
    main = mod["main"]
    bound = {b.var: b.value for block in main.body.blocks for b in block.bindings}
    memo: dict = {}
    apart = []
    for value in bound.values():
        if not (isinstance(value, relax.Call) and value.op.same_as(_CALL_TIR)
                and value.args[0].name_hint.startswith("concatenate")):
            continue
        inputs = [_sources(a, bound, mod, memo) for a in value.args[1].fields if isinstance(a, relax.Var)]
        if any(inputs[i] & inputs[j] for i in range(len(inputs)) for j in range(i)):
            apart.append(value)
    return with_copies(mod, {call: ("op_pattern", OPAQUE) for call in apart}, "apart")
