"""The layerwise schedule: every fused group of TVM's FuseOps is one kernel, its tensors in DDR."""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax, tirx

from . import KernelSpec, register


def call_tirs(func) -> list:
    """The ``call_tir`` calls of a Relax function, in program order."""
    op, out = tvm.ir.Op.get("relax.call_tir"), []
    tvm_ffi.structural_walk(func, [(relax.Call, lambda c: out.append(c) if c.op.same_as(op) else None)])
    return out


@register("layerwise")
def layerwise(mod, hw) -> list[KernelSpec]:  # noqa: ARG001 - same signature for every scheduler
    """One kernel per ``call_tir`` of ``main``, in program order, all arguments in DDR."""
    specs = []
    for call in call_tirs(mod["main"]):
        func = mod[call.args[0]]
        if isinstance(func, tirx.PrimFunc):
            specs.append(KernelSpec(call.args[0].name_hint, ("ddr",) * len(func.params), len(specs)))
    return specs
