"""The ``dsa`` Relax pipeline: simplify, fuse with TVM's rules, offload scheduled kernels to the
DSA, then TVM's own CPU lowering for what remains on the host (keeping ``VMShapeLower`` and
``AttachGlobalSymbol``, which symbolic shapes and the VM need)."""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.backend import cpu_generic

from . import hardware
from .relax_passes import SimplifyInference, offload
from .relax_passes.offload import StitchOptions
from .schedule.set.scheduler import SetOptions

LAST_OFFLOAD: dict = {}  # "result": the OffloadResult of the last compilation


def pipeline(schedule: str = "layerwise", hw: hardware.Hardware | str | None = None,
             options: StitchOptions | SetOptions | None = None) -> tvm.transform.Pass:
    """The DSA compilation pipeline as a pass; ``hw`` defaults to the chip of the current target;
    ``options`` are the scheduler's choices (``graphturbo``: the stitched kernels', ``set``: the
    search's or a given tree)."""
    from . import schedule as schedules

    schedules.get(schedule)  # fail early on an unknown name

    @tvm.transform.module_pass(opt_level=0, name="dsa.Pipeline")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        target = tvm.target.Target.current(allow_none=True)
        chip = hardware.get(hw) if isinstance(hw, str) else hw or hardware.from_target(target)
        host = target or tvm.target.Target("llvm")
        with host:
            mod = tvm.transform.Sequential(
                [SimplifyInference()]
                + cpu_generic.library_dispatch_passes(host)
                + [relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
                   relax.transform.FoldConstant(), relax.transform.FuseOps(), relax.transform.FuseTIR()]
            )(mod)
            mod, result = offload(mod, chip, schedule, options=options)
            LAST_OFFLOAD["result"] = result
            mod = tvm.transform.Sequential(
                [relax.transform.DeadCodeElimination()]
                + cpu_generic.pipeline.dataflow_lower_passes(host)
                + cpu_generic.finalize_passes(host)
            )(mod)
        return mod

    return _pipeline


def register() -> None:
    if "dsa" not in relax.pipeline.PIPELINE_MAP:
        relax.register_pipeline("dsa")(pipeline)


def pipeline_result():
    """What the last ``dsa`` compilation offloaded (an ``OffloadResult``), or None."""
    return LAST_OFFLOAD.get("result")
