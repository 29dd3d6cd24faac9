"""The layerwise schedule: every fused group of TVM's FuseOps is one kernel, its tensors in DDR."""

from __future__ import annotations

from tvm_dsa.schedule import register
from tvm_dsa.schedule.graph import OpGraph
from tvm_dsa.schedule.plan import KernelSpec


@register("layerwise", launch_together=False)
def layerwise(mod, hw, supported, options=None) -> list[KernelSpec]:  # noqa: ARG001 - same signature for every scheduler
    """One kernel per supported ``call_tir`` of ``main``, in program order, all tensors in DDR."""
    return [KernelSpec(n.func, (n.name,)) for n in OpGraph.from_relax(mod).nodes if n.func in supported]
