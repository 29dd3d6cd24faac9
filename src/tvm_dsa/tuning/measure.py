"""Measurement for meta-schedule on the DSA: a builder that turns a tuned kernel into a DSA program
and a runner whose "run time" is the simulator's time for it (timing-only mode).

Each artifact gets its own temporary directory: meta-schedule's ``RemoveBuildArtifact`` callback
deletes the folder of every artifact once it has been measured.
"""

from __future__ import annotations

import os
import tempfile

from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.builder import BuilderResult
from tvm.s_tir.meta_schedule.runner import RunnerFuture, RunnerResult
from tvm.ir.utils import derived_object

from .. import hardware
from ..codegen.emit import build_program
from ..isa import Program
from ..runtime import simulate
from ..tir_passes import Unsupported
from .space import lower_scheduled

ARTIFACT = "program.json"


def build_candidate(func, hw, name: str = "candidate") -> Program:
    """The one-kernel DSA program of a tiled PrimFunc (``Unsupported`` if it cannot be lowered)."""
    return build_program(lower_scheduled(func, hw), hw, name)


def simulated_seconds(program: Program, check_hazards: bool = False) -> float:
    """Seconds the program takes on its chip, simulated in time only."""
    return simulate(program, mode="timing", check_hazards=check_hazards).report.seconds


@derived_object
class DSABuilder(ms.builder.PyBuilder):
    """Builds each candidate into a DSA program file; a candidate the codegen refuses is a failed
    build with the reason as its message."""

    def build(self, build_inputs):
        results = []
        for bi in build_inputs:
            try:
                program = build_candidate(bi.mod["main"], hardware.from_target(bi.target))
            except Unsupported as err:
                results.append(BuilderResult(None, f"not a DSA kernel: {err}"))
                continue
            folder = tempfile.mkdtemp(prefix="tvm-dsa-tune-")
            path = os.path.join(folder, ARTIFACT)
            with open(path, "w") as f:
                f.write(program.serialize())
            results.append(BuilderResult(path, None))
        return results


@derived_object
class DSARunner(ms.runner.PyRunner):
    """Runs each program on the timing simulator; ``check_hazards`` also checks its tokens."""

    def __init__(self, check_hazards: bool = False):
        super().__init__()
        self.check_hazards = check_hazards

    def run(self, runner_inputs):
        futures = []
        for ri in runner_inputs:
            with open(ri.artifact_path) as f:
                program = Program.deserialize(f.read())
            result = RunnerResult([simulated_seconds(program, self.check_hazards)], None)
            futures.append(RunnerFuture(lambda: True, lambda r=result: r))
        return futures
