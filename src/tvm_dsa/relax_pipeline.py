"""The ``dsa`` Relax pipeline: simplify, fuse with TVM's rules, offload scheduled kernels to the
DSA (``OffloadToDSA``), then TVM's own CPU lowering for what remains on the host (keeping
``VMShapeLower`` and ``AttachGlobalSymbol``, which symbolic shapes and the VM need).

A dynamic model (symbolic or unknown dims, control flow) first gets the shapes RDP proves
(``ApplyRDP``), has each max pooling fused into the convolution before it where the DSA runs the
two as one kernel (``FusePooling``), and is offloaded by ``offload_symbolic``: one kernel per
fused op, programs built per concrete shape at run time (``docs/sod2.md``)."""

from __future__ import annotations

import contextlib
import gc

import tvm
from tvm import relax
from tvm.relax.backend import cpu_generic

from tvm_dsa import hardware, schedule as schedules
from tvm_dsa.kernelgen.offload import offload
from tvm_dsa.kernelgen.stitched import StitchOptions
from tvm_dsa.relax_passes.arena import PlanArena
from tvm_dsa.relax_passes.bound import constant_bytes, model_ddr_bytes
from tvm_dsa.relax_passes.fusion import fuse
from tvm_dsa.kernelgen.symbolic import is_dynamic, offload_symbolic_pass
from tvm_dsa.relax_passes.pool_fusion import FusePooling
from tvm_dsa.relax_passes.reorder import ApplyExecutionPlan
from tvm_dsa.relax_passes.sink import SinkIntoBranches
from tvm_dsa.schedule.set.scheduler import SetOptions, SetScheduleError
from tvm_dsa.tuning import tuned_kernels
from tvm_dsa.execution import compilation_of, current, dsa_cycles, record_compilation
from tvm_dsa.relax_passes.run_start import MarkRunStart

AUTO = "auto"  # the schedule the compiler chooses (``choose_schedule``)
OPTIONS = {"graphturbo": StitchOptions, "set": SetOptions}  # each scheduler's options type


def choose_schedule(dynamic: bool, hw: hardware.Hardware) -> tuple[str, ...]:
    """The schedules ``pipeline(schedule="auto")`` tries; of several, the one whose DSA programs
    take the fewest cycles in a timing simulation is kept (``_fastest``). A dynamic model runs
    layerwise (the only schedule for symbolic shapes and control flow). On a bus chip a static
    one takes graphturbo's stitched kernels (on stcp920 1.3-7.3x faster than layerwise on every
    zoo model and batch measured; a sub-graph it cannot stitch runs layer by layer; set needs a
    mesh). On a mesh chip all three are timed: at batch 1 set was the fastest on all seven
    models on set-edge16-fp16, and on set-cloud144-fp16 on five, layerwise on ResNet-50 and
    graphturbo on BERT-128, each by 1-3 % (docs/performance.md, "The default schedule on the
    mesh presets")."""
    if dynamic:
        return ("layerwise",)
    return ("set", "layerwise", "graphturbo") if hw.interconnect == "mesh" else ("graphturbo",)


def _fastest(mod: tvm.IRModule, chip, candidates: tuple[str, ...], options, tuned) -> tuple:
    """(module, OffloadResult) of ``offload`` under the candidate whose DSA calls simulate in the
    fewest cycles (timing, launches included; one candidate: not simulated). A candidate that
    cannot schedule the module (``set`` without a batch dimension) is skipped; ``options`` go to
    the candidate they belong to. The result records each candidate's cycles."""
    tried, errors = [], []
    for name in candidates:
        mine = options if len(candidates) == 1 or isinstance(options, OPTIONS.get(name, ())) else None
        try:
            tried.append(offload(mod, chip, name, options=mine, tuned=tuned))
        except SetScheduleError as err:
            errors.append(err)
    if not tried:
        raise errors[0]
    if len(tried) == 1:
        return tried[0]
    cycles = [dsa_cycles(m) for m, _ in tried]
    best = min(range(len(tried)), key=cycles.__getitem__)
    tried[best][1].timed = dict(zip(candidates, cycles))
    return tried[best]


def pipeline(schedule: str = AUTO, hw: hardware.Hardware | str | None = None,
             options: StitchOptions | SetOptions | None = None, database=None,
             rdp_fusion: bool = True, memory_plan: bool = True) -> tvm.transform.Pass:
    """The DSA compilation pipeline as a pass; ``hw`` defaults to the chip of the current target;
    ``schedule``: ``auto`` (the compiler's choice, ``choose_schedule``), ``layerwise``,
    ``graphturbo`` or ``set``; ``options`` are the scheduler's choices (``graphturbo``: the
    stitched kernels', ``set``: the search's or a given tree). ``database`` (a meta-schedule database or the work_dir of
    ``tvm_dsa.tune``; default: the one in scope, ``with database:``, else the records shipped for
    the chip; False: none) gives the kernels it has records for their tuned tiling.
    ``rdp_fusion=False`` leaves a dynamic model to TVM's fusion as imported (the baseline of seed
    001 §4.2). ``memory_plan=False`` leaves the order of the kernels as fused and every allocation
    to Relax's ``StaticPlanBlockMemory``, instead of the execution plan (kernels only one branch of
    an If uses run in that branch, ``relax_passes.sink``; the order, ``relax_passes.reorder``) and
    the arena (the best of ``memory_plan.best_greedy``'s orders) with in-place outputs
    (``relax_passes.arena``). The compilation's id is marked in ``main`` (``MarkRunStart``): runs and
    ``pipeline_result(ex)`` find it. ``import tvm`` registers it as ``dsa`` (``tvm_dsa.plugin``)."""

    if schedule != AUTO:
        schedules.get(schedule)  # fail early on an unknown name

    @tvm.transform.module_pass(opt_level=0, name="dsa.Pipeline")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        target = tvm.target.Target.current(allow_none=True)
        chip = hardware.get(hw) if isinstance(hw, str) else hw or hardware.from_target(target)
        host = target or tvm.target.Target("llvm")
        dynamic = is_dynamic(mod)
        chosen = choose_schedule(dynamic, chip) if schedule == AUTO else (schedule,)
        ddr_bytes, weight_bytes = model_ddr_bytes(mod, chip), constant_bytes(mod, chip)
        with host, _no_cyclic_gc():
            mod = fuse(mod, rdp_fusion)
            if dynamic:
                mod = FusePooling(chip)(mod)
            if memory_plan:
                mod = ApplyExecutionPlan(SinkIntoBranches(mod))
            if dynamic:
                decided = []
                mod = offload_symbolic_pass(chip, decided.append)(mod)
                result = decided[0]
            else:
                mod, result = _fastest(mod, chip, chosen, options, tuned_kernels(database, chip))
            result.model_ddr_bytes, result.weight_bytes = ddr_bytes, weight_bytes
            if dynamic:
                result.schedule = "layerwise"
                if chosen != ("layerwise",):
                    result.unstitched[chosen[0]] = (f"the {chosen[0]} schedule needs static shapes and no "
                                                    "control flow: a dynamic model runs layerwise")
            mod = tvm.transform.Sequential(
                [relax.transform.DeadCodeElimination(), MarkRunStart(record_compilation(result), io=ddr_bytes is None)]
                + cpu_generic.pipeline.dataflow_lower_passes(host)
                + ([PlanArena] if memory_plan else [])
                + cpu_generic.finalize_passes(host)
            )(mod)
        return mod

    return _pipeline


@contextlib.contextmanager
def _no_cyclic_gc():
    """CPython's cycle collector off while compiling: code generation makes millions of small
    acyclic objects (instructions, operands, tiles), which each full collection walks again
    (2.2 s of a 13 s ResNet-50 batch-8 compile). Reference counting still frees them."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def pipeline_result(executable=None):
    """What a ``dsa`` compilation offloaded (an ``OffloadResult``): the one that made
    ``executable`` (a ``tvm.compile`` result made in this process), else the last one of the
    current session; None when there is none."""
    return compilation_of(executable) if executable is not None else current().pipeline_result()
