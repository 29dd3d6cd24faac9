"""OffloadSymbolic: the DSA offload of a dynamic model (symbolic dims, control flow).

Each ``call_tir`` of ``main`` — in its bindings and inside ``If`` branches — whose PrimFunc the
DSA can run becomes one DSA call, ``layerwise`` (one kernel per fused op):

- a PrimFunc with static shapes gets its program now, ``call_dps_packed("tvm_dsa.execute", ...)``
  as in ``OffloadToDSA``;
- a PrimFunc with symbolic dims is carried as TIR, ``call_dps_packed("tvm_dsa.execute_shaped",
  (kernel, info, *args))``, and gets one program per concrete shape on first use at run time
  (``kernelgen.specialize``). The VM passes the call's tensors and scalar symbols, so the dispatch
  needs nothing but the arguments.

Whether the DSA can run a symbolic PrimFunc is decided now, by lowering it at a probe size
(every symbol ``PROBE``, less where there are many: ``probe``): what the DSA refuses (gathers, integer arithmetic) does not depend on
the size. Pure reshapes stay on the host as views, as in ``OffloadToDSA``.
"""

from __future__ import annotations

import json

import tvm
import tvm_ffi
from tvm import relax, tirx

from tvm_dsa.emit.emitter import build_program
from tvm_dsa.kernelgen.specialize import SymbolicKernel, free_symbols
from tvm_dsa.hardware import Hardware
from tvm_dsa.tiling import lower_kernel
from tvm_dsa.isa.validation import validate
from tvm_dsa.kernelgen.offload import VIEW, OffloadResult, host_reason
from tvm_dsa.packed import EXECUTE, EXECUTE_SHAPED
from tvm_dsa.kernel.macs import kernel_macs

PROBE = 16  # the size every symbol takes when deciding whether the DSA can run a kernel


def probe(symbols) -> dict:
    """The size each symbol takes for the decision: ``PROBE``, smaller where more than two symbols
    would make the probe kernel large (a tensor of five symbolic dims, 16^5 elements, took 414 s
    to emit) — what the DSA refuses does not depend on the size."""
    value = PROBE if len(symbols) <= 2 else max(2, round(PROBE ** (2 / len(symbols))))
    return {s: value for s in symbols}


def is_dynamic(mod: tvm.IRModule, func: str = "main") -> bool:
    """Whether ``func`` is a dynamic model: a tensor with a symbolic or unknown dim (a parameter,
    or one the importer could not infer) or control flow (``If``)."""
    found = []
    tvm_ffi.structural_walk(mod[func].body, [(relax.If, found.append)])
    return bool(found) or has_unknown_dims(mod, func)


def has_unknown_dims(mod: tvm.IRModule, func: str = "main") -> bool:
    """Whether a tensor of ``func`` (a parameter or a binding) has a dim that is not an integer."""
    f = mod[func]
    return not all(_static(v.ty) for v in [*f.params, *relax.analysis.all_vars(f.body)])


def _static(ty) -> bool:
    if isinstance(ty, relax.TensorType):
        return isinstance(ty.shape, relax.ShapeExpr) and all(isinstance(d, tirx.IntImm) for d in ty.shape.values)
    if isinstance(ty, relax.TupleType):
        return all(_static(t) for t in ty.fields)
    return True


def _call_tir_funcs(func: relax.Function) -> list:
    """The PrimFuncs ``func`` calls with ``call_tir``, in program order (If branches included)."""
    op = tvm.ir.Op.get("relax.call_tir")
    seen: dict = {}
    tvm_ffi.structural_walk(func.body, [(relax.Call, lambda c: seen.setdefault(c.args[0], None)
                                         if c.op.same_as(op) else None)])
    return list(seen)


def kernel_text(name: str, func: tirx.PrimFunc, hw: Hardware) -> tuple[str, str]:
    """(packed function, its kernel argument) for one PrimFunc; ``Unsupported`` if the DSA cannot
    run it, ``ProgramError`` where its program is not valid."""
    symbols = free_symbols(func)
    if not symbols:
        program = build_program(lower_kernel(func, hw)[0], hw, name)
        validate(program)
        return EXECUTE, program.serialize()
    kernel = SymbolicKernel(name, func, hw)
    validate(kernel.program(probe(symbols)))
    return EXECUTE_SHAPED, kernel.serialize()


OFFLOAD_SYMBOLIC_PASS = "dsa.OffloadSymbolic"


def offload_symbolic_pass(hw: Hardware, on_result, run_id: str = "model") -> tvm.transform.Pass:
    """``offload_symbolic`` as a named pass (``on_result`` hears its ``OffloadResult``): what the
    harness watches to keep the module a dynamic model's kernels were made of
    (``harness.Compiled.fused``, for the layers' labels), as ``dsa.OffloadToDSA`` for a static one."""

    @tvm.transform.module_pass(opt_level=0, name=OFFLOAD_SYMBOLIC_PASS)
    def offload(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        mod, result = offload_symbolic(mod, hw, run_id)
        on_result(result)
        return mod

    return offload


def offload_symbolic(mod: tvm.IRModule, hw: Hardware, run_id: str = "model"):
    """Return (new module, OffloadResult); ``result.dsa_macs`` / ``host_macs`` count the kernels
    with static shapes only (a symbolic kernel's MACs depend on the shape)."""
    result = OffloadResult()
    calls: dict = {}  # GlobalVar -> (packed function name, kernel text)
    for gv in _call_tir_funcs(mod["main"]):
        func, name = mod[gv], gv.name_hint
        macs = 0 if free_symbols(func) else kernel_macs(func)
        if relax.analysis.has_reshape_pattern(func):
            result.host[name] = VIEW
        else:
            try:
                calls[gv] = kernel_text(name, func, hw)
                result.dsa.append(name)
            except Exception as err:  # noqa: BLE001 - a kernel the DSA path cannot build runs on the host
                result.host[name] = host_reason(err)
        if gv in calls:
            result.dsa_macs += macs
        else:
            result.host_macs += macs
    out = mod.clone()
    out["main"] = _Rewrite(calls, run_id, mod).visit_expr(mod["main"])
    return relax.transform.DeadCodeElimination(["main"])(out), result


@relax.expr_functor.mutator
class _Rewrite(relax.PyExprMutator):
    """Every ``call_tir`` of a kernel in ``calls`` becomes its DSA call; calls are numbered in
    program order (index 0 starts a model run's report)."""

    def __init__(self, calls: dict, run_id: str, mod=None):
        super().__init__(mod)
        self.calls, self.run_id, self.index = calls, run_id, 0
        self.call_tir = tvm.ir.Op.get("relax.call_tir")

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not (call.op.same_as(self.call_tir) and call.args[0] in self.calls):
            return call
        packed, text = self.calls[call.args[0]]
        info = json.dumps({"run": self.run_id, "kernel": call.args[0].name_hint, "index": self.index})
        self.index += 1
        args = [tvm.ir.StringImm(text), tvm.ir.StringImm(info), *call.args[1].fields]
        return relax.call_dps_packed(packed, args, out_ty=call.ty)
