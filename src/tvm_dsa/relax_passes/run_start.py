"""MarkRunStart: ``main`` starts with a call of ``tvm_dsa.begin_run``, so each call of the compiled
model is one run in the session's reports, whatever kernels it reaches (the first DSA kernel may
sit in a branch a run does not take). The call carries the compilation's id, which is how an
executable finds what its compilation decided (``tvm_dsa.pipeline_result(ex)``). A dynamic
model's call also carries its tensor inputs, and ``main`` ends with a call of ``tvm_dsa.end_run``
with its outputs: the run's roofline counts their bytes."""

from __future__ import annotations

import tvm
from tvm import relax

from tvm_dsa.packed import BEGIN_RUN, END_RUN


def MarkRunStart(compilation: str, io: bool = False) -> tvm.transform.Pass:  # noqa: N802 - TVM pass naming
    """Pass: ``main`` made impure, its first binding a call of ``tvm_dsa.begin_run(compilation)``;
    with ``io``, ``begin_run(compilation, *tensor inputs)`` and a last binding ``end_run(outputs)``."""

    @tvm.transform.module_pass(opt_level=0, name="dsa.MarkRunStart")
    def mark(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        func = mod["main"]
        inputs = [p for p in func.params if isinstance(p.ty, (relax.TensorType, relax.TupleType))] if io else []
        blocks = [_call(BEGIN_RUN, [tvm.ir.StringImm(compilation), *inputs]), *func.body.blocks]
        if io:
            blocks.append(_call(END_RUN, [func.body.body]))
        body = relax.SeqExpr(blocks, func.body.body)
        mod = mod.clone()
        mod["main"] = relax.Function(func.params, body, func.ret_ty, False, func.attrs)
        return mod

    return mark


def _call(name: str, args: list) -> relax.BindingBlock:
    """A block binding the result of the packed function ``name`` called on ``args``."""
    call = relax.Call(relax.ExternFunc(name), args, ty_args=[relax.ObjectType()])
    return relax.BindingBlock([relax.VarBinding(relax.Var(name.split(".")[-1], relax.ObjectType()), call)])
