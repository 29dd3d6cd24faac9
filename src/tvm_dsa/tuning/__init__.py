"""Meta-schedule on the DSA: tune a model's kernels by their simulated time, apply the records.

    result = tvm_dsa.tune(mod, "dsa/stcp920", trials=16, work_dir="tuned")   # per kernel; a JSON database
    print(result)                                         # cycles per kernel, before and after
    ex = tvm.compile(mod, target="dsa/stcp920", relax_pipeline=tvm_dsa.pipeline(database="tuned"))

The tasks are the fused PrimFuncs the ``dsa`` pipeline offloads (``extract_tasks``); the space is
their tiling (``space``), measured by building each candidate into a DSA program and simulating it
in time (``measure``), searched by meta-schedule's evolutionary search with its XGBoost cost model.
The kernel generation's own tiling (``lower_kernel``) is measured first and committed as a record,
so the search starts from it and a tuned kernel is never slower than the default one.
"""

from __future__ import annotations

import os
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from tvm_dsa import hardware
from tvm_dsa.emit.emitter import build_program
from tvm_dsa.kernel.ir import plan_lb, read_kernel
from tvm_dsa.hardware import Hardware
from tvm_dsa.schedule.graph import OpGraph
from tvm_dsa.tir_passes.tile import TilePlan, anchor_info
from tvm_dsa.kernel.analysis import Unsupported
from tvm_dsa.tiling import lower_kernel
from tvm_dsa.kernel.analysis import copy_func
from tvm_dsa.tuning.measure import DSABuilder, DSARunner, build_candidate, simulated_seconds
from tvm_dsa.tuning.shipped import merge_records, pretuned, records_dir
from tvm_dsa.tuning.space import lower_scheduled, sample_tiling, space_generator, tile_orders, unit_choice
from tvm_dsa.relax_passes.fusion import fuse


# Random samples a round needs besides the records' mutations: on a full-size layer most random
# tilings fail ``FitsDSA`` (beyond the LB or below the PE array), and asking for 16 ended the search
# of 13 of full ResNet-50's 27 kernels before any trial ("Cannot sample enough initial
# population"); with 2, the search grows from the default record (a 256-channel 3x3 conv at 14x14:
# 3.29x in 16 trials).
MIN_FRESH_SAMPLES = 2


@dataclass(frozen=True)
class Task:
    """A kernel to tune: its PrimFunc (as the workload module), how often the model calls it, and
    the kernel generation's default tiling (and whether it double-buffers) with its simulated time."""

    name: str
    mod: tvm.IRModule
    calls: int
    default_plan: TilePlan
    default_double_buffer: bool
    default_seconds: float


@dataclass(frozen=True)
class TaskResult:
    name: str
    calls: int
    default_cycles: int
    tuned_cycles: int
    trials: int  # candidates measured (failed builds included)

    @property
    def speedup(self) -> float:
        return self.default_cycles / self.tuned_cycles if self.tuned_cycles else 0.0

    @property
    def outcome(self) -> str:
        """What tuning did to the kernel: "faster", "default kept" (no candidate beat it), "no trial"."""
        if self.tuned_cycles < self.default_cycles:
            return "faster"
        return "default kept" if self.trials else "no trial"


@dataclass
class TuneResult:
    """Per kernel the cycles before and after tuning; ``database`` holds the records."""

    target: str
    work_dir: str
    tasks: list[TaskResult]
    database: object = field(repr=False)

    def cycles(self, tuned: bool) -> int:
        """Cycles of all kernel calls of the model (each kernel times its call count)."""
        return sum(t.calls * (t.tuned_cycles if tuned else t.default_cycles) for t in self.tasks)

    def to_dict(self) -> dict:
        return {"target": self.target, "work_dir": self.work_dir,
                "default_cycles": self.cycles(False), "tuned_cycles": self.cycles(True),
                "tasks": [{"name": t.name, "calls": t.calls, "default_cycles": t.default_cycles,
                           "tuned_cycles": t.tuned_cycles, "trials": t.trials, "result": t.outcome}
                          for t in self.tasks]}

    def rows(self) -> list[tuple[str, ...]]:
        """The result as table rows (a header first, a total last: how many kernels gained)."""
        rows = [("kernel", "calls", "default cycles", "tuned cycles", "speedup", "trials", "result")]
        rows += [(t.name, str(t.calls), f"{t.default_cycles:,}", f"{t.tuned_cycles:,}", f"{t.speedup:.2f}x",
                  str(t.trials), t.outcome) for t in self.tasks]
        before, after = self.cycles(False), self.cycles(True)
        faster = sum(t.outcome == "faster" for t in self.tasks)
        rows.append(("all calls", "", f"{before:,}", f"{after:,}", f"{before / after:.2f}x" if after else "",
                     str(sum(t.trials for t in self.tasks)), f"{faster} of {len(self.tasks)} faster"))
        return rows

    def __str__(self) -> str:
        rows = self.rows()
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def workload(func: tirx.PrimFunc) -> tvm.IRModule:
    """The module meta-schedule keys a kernel's records by: a copy of the function as ``main``
    (the shipped records are keyed so).

    A copy, because a schedule of ``IRModule({"main": func.with_attr(...)})`` rewrites the body
    it shares with ``func`` in place (TVM 0.27)."""
    return tvm.IRModule({"main": copy_func(func).with_attr("global_symbol", "main")})


def extract_tasks(mod: tvm.IRModule, target: str = "dsa/stcp920") -> list[Task]:
    """The kernels the ``dsa`` pipeline would offload from ``mod`` (a Relax module before the
    pipeline), one task per distinct PrimFunc, with the number of calls to it."""

    hw = hardware.get(target)
    host = hardware.make_target(target)
    with host:
        mod = fuse(mod)
    calls = Counter(n.func for n in OpGraph.from_relax(mod).nodes)
    tasks: list[Task] = []
    for name, count in calls.items():
        func = mod[name]
        if not isinstance(func, tirx.PrimFunc) or relax.analysis.has_reshape_pattern(func):
            continue
        wl = workload(func)
        same = next((i for i, t in enumerate(tasks) if tvm_ffi.structural_equal(t.mod, wl)), None)
        if same is not None:
            t = tasks[same]
            tasks[same] = replace(t, calls=t.calls + count)
            continue
        try:
            lowered, plan = lower_kernel(func, hw)
            seconds = simulated_seconds(build_program(lowered, hw, name))
        except Unsupported:  # runs on the host: nothing to tune
            continue
        tasks.append(Task(name, wl, count, plan, plan_lb(read_kernel(lowered), hw).double_buffered, seconds))
    return tasks


def load_database(work_dir: str | os.PathLike) -> ms.database.JSONDatabase:
    """The JSON database of tuning records in ``work_dir`` (created if missing)."""
    Path(work_dir).mkdir(parents=True, exist_ok=True)
    return ms.database.JSONDatabase(work_dir=str(work_dir), module_equality="structural")


def tune(mod: tvm.IRModule, target: str = "dsa/stcp920", trials: int = 16, work_dir: str | os.PathLike = "tune",
         *, per_iter: int = 16, population: int = 64, seed: int = 0, check_hazards: bool = False,
         on_ray: bool = False, progress=None) -> TuneResult:
    """Tune the DSA kernels of ``mod`` for ``target`` with ``trials`` measured candidates per kernel
    in rounds of at most ``per_iter``; records go to the JSON database in ``work_dir``.
    ``population`` is the evolutionary search's population; ``progress(measured, total)`` is called
    before the first round and after each. ``on_ray`` builds and measures each round's candidates as Ray
    tasks (``DSABuilder``, ``DSARunner``; on the Ray this process is connected to, else a local one
    Ray starts): the same records as in-process.

    Per kernel, because the gradient task scheduler gives each task one round in turn before it
    weighs them: a budget for the whole model smaller than a round per kernel left most kernels
    without a trial (tiny ResNet-18, 8 trials in rounds of 16: 14 of 15 kernels got none). Rounds
    no larger than ``trials`` give every kernel its first round, and none gets more than ``trials``."""
    if trials < 1:
        raise ValueError(f"trials must be at least 1, not {trials}")
    hw = hardware.get(target)
    tvm_target = hardware.make_target(target)
    tasks = extract_tasks(mod, target)
    if not tasks:
        raise ValueError(f"no kernel of the model runs on {target}: nothing to tune")
    database = load_database(work_dir)
    for task in tasks:
        _commit_default(database, task, tvm_target)
    contexts = [
        ms.TuneContext(
            mod=task.mod, target=tvm_target, space_generator=space_generator(hw),
            search_strategy=ms.search_strategy.EvolutionarySearch(
                population_size=population, init_min_unmeasured=MIN_FRESH_SAMPLES, genetic_num_iters=2),
            task_name=task.name, rand_state=seed + i, num_threads=1,
        ).clone()
        for i, task in enumerate(tasks)
    ]
    counter = _Measured(len(tasks), trials * len(tasks), progress)
    if progress is not None:
        progress(0, counter.total)
    # meta-schedule's default callbacks but RemoveBuildArtifact: the programs are not files (measure.py)
    callbacks = [ms.measure_callback.AddToDatabase(), ms.measure_callback.UpdateCostModel(), counter]
    with _numpy_seeded(seed):
        ms.tune_tasks(tasks=contexts, task_weights=[float(t.calls) for t in tasks], work_dir=str(work_dir),
                      max_trials_global=trials * len(tasks), max_trials_per_task=trials,
                      num_trials_per_iter=min(per_iter, trials), builder=DSABuilder(on_ray),
                      runner=DSARunner(check_hazards, on_ray), database=database, cost_model="xgb",
                      measure_callbacks=callbacks, task_scheduler=ms.task_scheduler.GradientBased(seed=seed))
    results = [TaskResult(task.name, task.calls, _cycles(task.default_seconds, hw),
                          _cycles(_best_seconds(database, task, hw), hw), counter.per_task[i])
               for i, task in enumerate(tasks)]
    return TuneResult(str(tvm_target.attrs["model"]), str(work_dir), results, database)


@contextmanager
def _numpy_seeded(seed: int):
    """numpy's global generator seeded with ``seed``, restored on leaving: meta-schedule's XGBoost
    model scores candidates with ``np.random.uniform`` until it has 100 samples, so without this the
    same seed measured other candidates (tiny ResNet-18, 4 trials per kernel: two runs differed)."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def tuned_kernels(database, chip: hardware.Hardware):
    """``func -> lowered PrimFunc or None`` from a tuning database (default: the meta-schedule
    database in scope, else the chip's shipped records), or None without one (or with False)."""
    if database is False:
        return None
    database = database or ms.Database.current() or pretuned(chip.name)
    if database is None:
        return None

    if isinstance(database, (str, os.PathLike)):
        if not os.path.isdir(database):
            raise ValueError(f"tuning database {str(database)!r} is not a directory (the work_dir of tvm_dsa.tune)")
        database = load_database(database)
    return lambda func: tuned_kernel(database, func, chip)


def tuned_kernel(database, func: tirx.PrimFunc, hw: Hardware):
    """``func`` lowered with its best record for ``hw`` in ``database``, or None without one."""
    wl = workload(func)
    record = _best_record(database, wl, hw)
    if record is None:
        return None
    sch = s_tir.Schedule(wl)
    record.trace.apply_to_schedule(sch, remove_postproc=False)
    return lower_scheduled(sch.mod["main"], hw)


def _best_record(database, mod: tvm.IRModule, hw: Hardware):
    """The fastest record of ``mod`` measured on chip ``hw`` (records of other chips are skipped)."""
    if not database.has_workload(mod):
        return None
    records = database.get_top_k(database.commit_workload(mod), 1 << 16)
    return next((r for r in records if r.target is not None and str(r.target.attrs.get("model")) == hw.name), None)


def _best_seconds(database, task: Task, hw: Hardware) -> float:
    """Simulated seconds of the task's best record, or of its default tiling without one."""
    record = _best_record(database, task.mod, hw)
    return task.default_seconds if record is None else float(record.run_secs[0])


def _commit_default(database, task: Task, target) -> None:
    """Record the default tiling as a sample of the design space (its decisions, the anchor's loop
    order), so that the evolutionary search starts from it. Its time is that of the program its
    trace gives: ``lower_kernel`` tiles the kernel with its indices simplified, the trace tiles
    the workload as it is, and a reshape's indices can lower to other DMAs (tiny BERT's
    transpose-reshape on set-edge16-fp16: 2,503 cycles by default, 2,878 replayed) or not at all
    (tiny ViT's head split: tiles of the simplified indices' alignment leave a raw index
    non-affine); then nothing is committed, and the search starts from its own samples."""
    hw = hardware.from_target(target)
    info = anchor_info(task.mod["main"])
    sch = s_tir.Schedule(task.mod)
    sample_tiling(sch, tile_orders(info.spatial)[0], task.default_plan, task.default_double_buffer,
                  choose_unit=unit_choice(info, hw))
    try:
        seconds = simulated_seconds(build_candidate(sch.mod["main"], hw, task.name))
    except Unsupported:
        return
    database.commit_tuning_record(ms.database.TuningRecord(
        sch.trace, database.commit_workload(task.mod), [seconds], target,
        ms.arg_info.ArgInfo.from_prim_func(task.mod["main"])))


def replayed_seconds(record, hw: Hardware) -> float:
    """Simulated seconds of the program a record's trace gives on chip ``hw`` (``Unsupported`` if
    it no longer lowers)."""
    sch = s_tir.Schedule(record.workload.mod)
    record.trace.apply_to_schedule(sch, remove_postproc=False)
    return simulated_seconds(build_candidate(sch.mod["main"], hw))


def default_seconds(func: tirx.PrimFunc, hw: Hardware) -> float:
    """Simulated seconds of ``func`` tiled by default (``lower_kernel``) on chip ``hw``."""
    return simulated_seconds(build_program(lower_kernel(func, hw)[0], hw, "kernel"))


def _cycles(seconds: float, hw: Hardware) -> int:
    return round(seconds * hw.clock_hz)


@derived_object
class _Measured(ms.measure_callback.PyMeasureCallback):
    """Counts measured candidates per task and reports progress."""

    def __init__(self, tasks: int, total: int, progress):
        super().__init__()
        self.per_task, self.total, self.progress = [0] * tasks, total, progress

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results) -> None:
        self.per_task[task_id] += len(measure_candidates)
        if self.progress is not None:
            self.progress(min(sum(self.per_task), self.total), self.total)


__all__ = ["Task", "TaskResult", "TuneResult", "extract_tasks", "load_database", "tune", "tuned_kernel",
           "default_seconds", "replayed_seconds",
           "pretuned", "merge_records", "records_dir",
           "DSABuilder", "DSARunner", "space_generator"]
