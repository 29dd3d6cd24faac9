"""Measurement for meta-schedule on the DSA: a builder that turns a tuned kernel into a DSA program
and a runner whose "run time" is the simulator's time for it (timing-only mode).

Builder and runner hand a program over in the tuning process's memory: the builder's artifact path
is a handle into ``BUILT``, which the runner empties. Both work in this process or as Ray tasks
(``on_ray``), to which the candidate's PrimFunc and the program go pickled. Writing and parsing each program
as JSON cost as much as simulating it (0.2 s each for a full-size ResNet-50 layer of 2,500
instructions, against 0.7 s to build it and 0.2 s to simulate it), a third of a candidate's
measurement. Nothing is written to disk, so ``tune`` leaves meta-schedule's
``RemoveBuildArtifact`` callback out.
"""

from __future__ import annotations

import functools
import itertools

from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.builder import BuilderResult
from tvm.s_tir.meta_schedule.runner import RunnerFuture, RunnerResult
from tvm.ir.utils import derived_object

from tvm_dsa import hardware
from tvm_dsa.emit.emitter import build_program
from tvm_dsa.isa import Program
from tvm_dsa.runtime import simulate
from tvm_dsa.kernel.analysis import Unsupported
from tvm_dsa.tuning.space import lower_scheduled

BUILT: dict[str, Program] = {}  # artifact handle -> program built and not yet measured
_HANDLES = itertools.count()


def build_candidate(func, hw, name: str = "candidate") -> Program:
    """The one-kernel DSA program of a tiled PrimFunc (``Unsupported`` if it cannot be lowered)."""
    return build_program(lower_scheduled(func, hw), hw, name)


def simulated_seconds(program: Program, check_hazards: bool = False) -> float:
    """Seconds the program takes on its chip, simulated in time only."""
    return simulate(program, mode="timing", check_hazards=check_hazards).report.seconds


def built_or_refused(func, hw) -> Program | str:
    """The program of a candidate, or why the codegen refuses it."""
    try:
        return build_candidate(func, hw)
    except Unsupported as err:
        return f"not a DSA kernel: {err}"


@derived_object
class DSABuilder(ms.builder.PyBuilder):
    """Builds each candidate into a DSA program kept in ``BUILT``; a candidate the codegen refuses
    is a failed build with the reason as its message. With ``on_ray`` the round's candidates are
    built at once as Ray tasks of one CPU (each PrimFunc pickled to a worker, its program back);
    the builds are deterministic, so the programs are those built here. A task that fails (its
    worker died) is a failed build with the reason."""

    def __init__(self, on_ray: bool = False):
        super().__init__()
        self.on_ray = on_ray

    def build(self, build_inputs):
        jobs = [(bi.mod["main"], hardware.from_target(bi.target)) for bi in build_inputs]
        if self.on_ray:  # all submitted, then waited for
            built = [_fetched(ref) for ref in [_remote(built_or_refused).remote(*job) for job in jobs]]
        else:
            built = [built_or_refused(*job) for job in jobs]
        results = []
        for program in built:
            if isinstance(program, str):
                results.append(BuilderResult(None, program))
                continue
            handle = f"dsa-program-{next(_HANDLES)}"
            BUILT[handle] = program
            results.append(BuilderResult(handle, None))
        return results


@derived_object
class DSARunner(ms.runner.PyRunner):
    """Runs each built program on the timing simulator; ``check_hazards`` also checks its tokens.
    In this process, or with ``on_ray`` as Ray tasks of one CPU (on the Ray this process is
    connected to), so that a round's candidates are measured in parallel and the futures are the
    tasks: the same seconds either way, so the same records for the same search. A task that fails
    (its worker died) is a failed run with the reason."""

    def __init__(self, check_hazards: bool = False, on_ray: bool = False):
        super().__init__()
        self.check_hazards, self.on_ray = check_hazards, on_ray

    def run(self, runner_inputs):
        futures = []
        for ri in runner_inputs:
            program = BUILT.pop(ri.artifact_path, None)
            if program is None:
                raise RuntimeError(f"no program built as {ri.artifact_path!r}: DSARunner measures what "
                                   "DSABuilder built in this process")
            futures.append(self._on_ray(program) if self.on_ray else self._here(program))
        return futures

    def _here(self, program: Program) -> RunnerFuture:
        result = RunnerResult([simulated_seconds(program, self.check_hazards)], None)
        return RunnerFuture(lambda: True, lambda: result)

    def _on_ray(self, program: Program) -> RunnerFuture:
        import ray

        ref = _remote(simulated_seconds).remote(program, self.check_hazards)

        def result() -> RunnerResult:
            seconds = _fetched(ref)
            return RunnerResult(None, seconds) if isinstance(seconds, str) else RunnerResult([seconds], None)

        return RunnerFuture(lambda: bool(ray.wait([ref], timeout=0)[0]), result)


def _fetched(ref):
    """What a Ray task returned, or why it failed where its worker died (out of memory, a crash);
    an exception of the task's own code is raised, as it would be in this process."""
    import ray

    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError:
        raise
    except ray.exceptions.RayError as err:
        return f"{type(err).__name__}: {err}"


@functools.cache
def _remote(function):
    """``function`` as a Ray task of one CPU (made once: each ``ray.remote`` exports it anew)."""
    import ray

    return ray.remote(num_cpus=1, max_retries=0)(function)
