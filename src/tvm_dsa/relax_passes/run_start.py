"""MarkRunStart: ``main`` starts with a call of ``tvm_dsa.begin_run``, so each call of the compiled
model is one run in the session's reports, whatever kernels it reaches (the first DSA kernel may
sit in a branch a run does not take). The call carries the compilation's id, which is how an
executable finds what its compilation decided (``tvm_dsa.pipeline_result(ex)``)."""

from __future__ import annotations

import tvm
from tvm import relax

from tvm_dsa.packed import BEGIN_RUN


def MarkRunStart(compilation: str) -> tvm.transform.Pass:  # noqa: N802 - TVM pass naming
    """Pass: ``main`` made impure, its first binding a call of ``tvm_dsa.begin_run(compilation)``."""

    @tvm.transform.module_pass(opt_level=0, name="dsa.MarkRunStart")
    def mark(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        func = mod["main"]
        call = relax.Call(relax.ExternFunc(BEGIN_RUN), [tvm.ir.StringImm(compilation)], ty_args=[relax.ObjectType()])
        first = relax.BindingBlock([relax.VarBinding(relax.Var("run_start", relax.ObjectType()), call)])
        body = relax.SeqExpr([first, *func.body.blocks], func.body.body)
        mod = mod.clone()
        mod["main"] = relax.Function(func.params, body, func.ret_ty, False, func.attrs)
        return mod

    return mark
