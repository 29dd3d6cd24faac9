"""Host side of offloaded kernels: the ``tvm_dsa.execute`` function the VM calls, and the reports.

Each call runs one kernel's program on the simulator (numerics and time) and writes the outputs
into the VM's tensors (``execute``; ``execute_shaped`` first builds the program of a kernel with
symbolic dims for the call's shapes, once per shape). Calls of one model run are gathered into one report: a run starts at the
call whose ``info.index`` is 0. Programs are parsed once and cached by their text; a call's
``info.names`` renames its program's args and layers (sub-graphs of one form share one text).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import tvm_ffi

from tvm_dsa.kernelgen.specialize import VERSIONS
from tvm_dsa.isa import Program
from tvm_dsa.relax_passes.arena import arena_plan
from tvm_dsa.runtime import Report, simulate



@dataclass(frozen=True)
class KernelRun:
    """One DSA kernel call of a model run: its name, the shapes of its outputs, its report, its program."""

    name: str
    output_shapes: tuple
    report: Report
    program: Program | None = None


_RUN: list[KernelRun] = []  # the kernels of the current (or last) model run, in call order
_TRACE: list = []
_MODE = {"mode": "functional", "trace": bool(os.environ.get("TVM_DSA_TRACE")), "check_hazards": True, "strict": False}


def set_mode(mode: str = "functional", trace: bool | None = None, check_hazards: bool = True,
             strict: bool = False) -> None:
    """How offloaded kernels run from now on: ``functional`` (numerics and time) or ``timing``
    (time only: outputs are left untouched, so the model's results are meaningless). ``trace``
    records trace events for ``last_trace()``. ``check_hazards=False`` (timing only) trusts the
    programs' dependency tokens instead of checking them, for speed on large programs. A kernel
    whose values the chip's number types cannot hold (an fp16 overflow, inf/NaN from finite
    inputs) is listed in the report's ``numerics``; with ``strict`` it raises ``FloatingPointError``."""
    if mode not in ("functional", "timing"):
        raise ValueError(f"simulation mode must be 'functional' or 'timing', not {mode!r}")
    if mode == "functional" and not check_hazards:
        raise ValueError("a functional run always checks the dependency tokens (check_hazards=True)")
    _MODE["mode"] = mode
    _MODE["check_hazards"] = check_hazards
    _MODE["strict"] = strict
    if trace is not None:
        _MODE["trace"] = trace


@lru_cache(maxsize=4096)
def _program(text: str) -> Program:
    return Program.deserialize(text)


@lru_cache(maxsize=4096)
def _named(text: str, name: str, names: str) -> Program:
    """The program of ``text`` under the names of a sub-graph of the same form as the one it was
    made for (``names``: the JSON of its arg and layer names -> the call's)."""
    return _program(text).renamed(name, json.loads(names))


def execute(program_text, info_text, *tensors) -> None:
    info = json.loads(str(info_text))
    names = info.get("names")
    program = _program(str(program_text)) if names is None else _named(str(program_text), info["kernel"], json.dumps(names))
    _run(program, info, tensors)


def execute_shaped(kernel_text, info_text, *args) -> None:
    """A kernel with symbolic dims (``kernelgen.specialize``): its program for the shapes of this
    call's tensors and the values of its scalar arguments, built on the first call with them."""
    tensors = [a for a in args if not isinstance(a, int)]
    shapes = tuple(tuple(t.shape) for t in tensors)
    if 0 in shapes[-1]:  # an empty output (the last argument: e.g. no row NonZero selected): nothing to do
        return
    scalars = tuple(a for a in args if isinstance(a, int))
    _run(VERSIONS.get(str(kernel_text), shapes, scalars), json.loads(str(info_text)), tensors)


def _run(program: Program, info: dict, tensors) -> None:
    """Simulate one kernel call on the VM's tensors (inputs first, then outputs)."""
    n_in = sum(1 for a in program.args if a.role == "input")
    inputs = [np.from_dlpack(t) for t in tensors[:n_in]]
    mode = _MODE["mode"]
    if mode == "functional" and not program.hardware["storage_dtype"].startswith("float"):
        raise RuntimeError(
            f"preset {program.hardware['name']} stores {program.hardware['storage_dtype']}: a float model "
            "can only be simulated in timing mode there (tvm_dsa.set_mode('timing')); use its -fp16 "
            "variant for numerics"
        )
    if info["index"] == 0:  # the model's first DSA call site starts a run
        _RUN.clear()
        _TRACE.clear()
    start = sum(k.report.cycles for k in _RUN)
    result = simulate(program, inputs if mode == "functional" else None, mode=mode, start_cycle=start,
                      trace=_MODE["trace"], check_hazards=_MODE["check_hazards"])
    _RUN.append(KernelRun(info["kernel"], tuple(a.shape for a in program.args if a.role == "output"),
                          result.report, program))
    _TRACE.extend(result.trace_events or [])
    if _MODE["strict"] and result.report.numerics:
        raise FloatingPointError(result.report.numerics[0])
    for t, out in zip(tensors[n_in:], result.outputs):
        np.from_dlpack(t)[...] = out


def last_report() -> Report | None:
    """The report of the last model run (all its DSA kernels), or None before any run."""
    return Report.combine([k.report for k in _RUN]) if _RUN else None


def last_kernel_runs() -> list[KernelRun]:
    """Each DSA kernel call of the last model run, in call order (per-kernel reports)."""
    return list(_RUN)


def last_trace() -> list:
    """Trace events of the last run (``set_mode(trace=True)`` or TVM_DSA_TRACE=1 records them)."""
    return list(_TRACE)


def register() -> None:
    tvm_ffi.register_global_func("tvm_dsa.execute", execute, override=True)
    tvm_ffi.register_global_func("tvm_dsa.execute_shaped", execute_shaped, override=True)
    tvm_ffi.register_global_func("tvm_dsa.arena_plan", arena_plan, override=True)
