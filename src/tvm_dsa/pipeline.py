"""The ``dsa`` Relax pipeline: simplify, fuse with TVM's rules, offload scheduled kernels to the
DSA, then TVM's own CPU lowering for what remains on the host (keeping ``VMShapeLower`` and
``AttachGlobalSymbol``, which symbolic shapes and the VM need)."""

from __future__ import annotations

import os

import tvm
from tvm import relax
from tvm.relax.backend import cpu_generic

from . import hardware
from .relax_passes import SimplifyInference, offload
from .relax_passes.offload import StitchOptions

LAST_OFFLOAD: dict = {}  # "result": the OffloadResult of the last compilation


def pipeline(schedule: str = "layerwise", hw: hardware.Hardware | str | None = None,
             options: StitchOptions | None = None, database=None) -> tvm.transform.Pass:
    """The DSA compilation pipeline as a pass; ``hw`` defaults to the chip of the current target;
    ``options`` are the stitched kernels' choices (``graphturbo``). ``database`` (a meta-schedule
    database or the work_dir of ``tvm_dsa.tune``; default: the one in scope, ``with database:``)
    gives the kernels it has records for their tuned tiling."""
    from . import schedule as schedules

    schedules.get(schedule)  # fail early on an unknown name

    @tvm.transform.module_pass(opt_level=0, name="dsa.Pipeline")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        target = tvm.target.Target.current(allow_none=True)
        chip = hardware.get(hw) if isinstance(hw, str) else hw or hardware.from_target(target)
        host = target or tvm.target.Target("llvm")
        with host:
            mod = fuse_passes(host)(mod)
            mod, result = offload(mod, chip, schedule, options=options or StitchOptions(),
                                  tuned=_tuned_kernels(database, chip))
            LAST_OFFLOAD["result"] = result
            mod = tvm.transform.Sequential(
                [relax.transform.DeadCodeElimination()]
                + cpu_generic.pipeline.dataflow_lower_passes(host)
                + cpu_generic.finalize_passes(host)
            )(mod)
        return mod

    return _pipeline


def _tuned_kernels(database, chip: hardware.Hardware):
    """``func -> lowered PrimFunc or None`` from a tuning database (default: the meta-schedule
    database in scope), or None without one."""
    from tvm.s_tir import meta_schedule as ms

    database = ms.Database.current() if database is None else database
    if database is None:
        return None
    from .tuning import load_database, tuned_kernel

    if isinstance(database, (str, os.PathLike)):
        if not os.path.isdir(database):
            raise ValueError(f"tuning database {str(database)!r} is not a directory (the work_dir of tvm_dsa.tune)")
        database = load_database(database)
    return lambda func: tuned_kernel(database, func, chip)


def fuse_passes(host: tvm.target.Target) -> tvm.transform.Pass:
    """Simplify, legalize and fuse with TVM's rules: the fused PrimFuncs that become DSA kernels
    (``tvm_dsa.tune`` extracts its tasks with the same passes)."""
    return tvm.transform.Sequential(
        [SimplifyInference()]
        + cpu_generic.library_dispatch_passes(host)
        + [relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
           relax.transform.FoldConstant(), relax.transform.FuseOps(), relax.transform.FuseTIR()]
    )


def register() -> None:
    if "dsa" not in relax.pipeline.PIPELINE_MAP:
        relax.register_pipeline("dsa")(pipeline)


def pipeline_result():
    """What the last ``dsa`` compilation offloaded (an ``OffloadResult``), or None."""
    return LAST_OFFLOAD.get("result")
