"""OffloadToDSA: replace each scheduled kernel's ``call_tir`` by a call that runs its DSA program.

For every kernel of the schedule the PrimFunc is lowered by the TIR passes, turned into a program
by the codegen, and the call becomes ``call_dps_packed("tvm_dsa.execute", (program, info, *args))``:
the program text lives in the VM bytecode, so ``export_library`` / ``load_module`` keep it. A kernel
the DSA cannot run keeps its ``call_tir`` and runs on the host; the reason is recorded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import tvm
from tvm import relax

from .. import schedule as schedules
from ..codegen.emit import build_program
from ..hardware import Hardware
from ..tir_passes import Unsupported, lower_kernel
from .stats import kernel_macs

EXECUTE = "tvm_dsa.execute"


@dataclass
class OffloadResult:
    """What the pass decided, per kernel (``tvm_dsa.pipeline_result()`` returns the last one)."""

    dsa: list = field(default_factory=list)  # kernel names
    host: dict = field(default_factory=dict)  # kernel name -> reason
    dsa_macs: int = 0
    host_macs: int = 0


def offload(mod: tvm.IRModule, hw: Hardware, schedule: str = "layerwise", run_id: str = "model"):
    """Return (new module, OffloadResult)."""
    specs = schedules.get(schedule)(mod, hw)
    result = OffloadResult()
    programs: dict[str, str] = {}
    for spec in specs:  # one spec per call site; a PrimFunc called twice is compiled once
        name = spec.name
        macs = kernel_macs(mod[name])
        if name not in programs and name not in result.host:
            if relax.analysis.has_reshape_pattern(mod[name]):
                result.host[name] = "a pure reshape: a view on the host, no data moves"
                result.host_macs += macs
                continue
            try:
                lowered, _ = lower_kernel(mod[name], hw)
                programs[name] = build_program(lowered, hw, name).serialize()
                result.dsa.append(name)
            except Unsupported as err:
                result.host[name] = str(err)
        if name in programs:
            result.dsa_macs += macs
        else:
            result.host_macs += macs
    call_tir = tvm.ir.Op.get("relax.call_tir")
    calls = sum(1 for s in specs if s.name in programs)

    @relax.expr_functor.mutator
    class _Rewrite(relax.PyExprMutator):
        index = 0  # DSA call sites in program order; the first one starts a run

        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not call.op.same_as(call_tir) or call.args[0].name_hint not in programs:
                return call
            name = call.args[0].name_hint
            info = json.dumps({"run": run_id, "kernel": name, "index": self.index, "count": calls})
            self.index += 1
            args = [tvm.ir.StringImm(programs[name]), tvm.ir.StringImm(info), *call.args[1].fields]
            return relax.call_dps_packed(EXECUTE, args, out_ty=call.ty_args[0] if call.ty_args else call.ty)

    rewriter = _Rewrite(mod)
    new_main = rewriter.visit_expr(mod["main"])
    mod = mod.clone()  # the caller's module is not modified
    mod["main"] = new_main
    mod = relax.transform.DeadCodeElimination(["main"])(mod)
    return mod, result
