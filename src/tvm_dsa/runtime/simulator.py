"""Run a DSA program: the public entry of the simulator.

Timing always runs (it also checks the dependency tokens); functional mode then applies each
instruction's effect to the memories in the order the instructions started, so an ordering the
tokens did not enforce shows up as wrong bytes or a ``HazardError``, never as a lucky right answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tvm_dsa.hardware.model import Hardware
from tvm_dsa.isa.program import Program
from tvm_dsa.isa.validation import validate
from tvm_dsa.runtime.functional import Machine
from tvm_dsa.runtime.report import Report, build_report
from tvm_dsa.runtime.timing import simulate_program
from tvm_dsa.runtime.trace import trace_events

MODES = ("functional", "timing")


@dataclass
class SimResult:
    outputs: list[np.ndarray]  # the program's output args in order (empty in timing mode)
    report: Report
    trace_events: list[dict] = field(default_factory=list)


def simulate(program: Program, inputs: list[np.ndarray] | None = None, mode: str = "functional",
             start_cycle: int = 0, trace: bool = False, check_hazards: bool = True) -> SimResult:
    """Validate and run ``program``; ``inputs`` are its input args in order. ``start_cycle`` shifts
    the trace so that the traces of several runs concatenate. ``check_hazards=False`` (timing mode
    only) trusts the dependency tokens instead of checking them: much faster on large programs."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {MODES}")
    hw = Hardware.from_dict(program.hardware, source=f"program {program.name!r}")
    program = program.expanded()
    validate(program)
    functional = mode == "functional"
    if functional and not holds_values(program):
        raise ValueError(
            f"program {program.name!r} computes in floating point but preset {hw.name!r} stores "
            f"{hw.storage_dtype}: its values cannot be held, so only timing is possible "
            f"(simulate(..., mode='timing')), or use a float preset such as '{hw.name}-fp16'")
    if functional and not check_hazards:
        raise ValueError("a functional run always checks the dependency tokens (check_hazards=True)")
    arrays = _check_inputs(program, inputs) if functional or inputs is not None else []
    timing = simulate_program(program, hw, check_hazards)
    outputs, numerics = [], []
    if functional:
        machine = Machine(hw, program.ddr_bytes)
        for arg, x in zip([a for a in program.args if a.role == "input"], arrays):
            with np.errstate(over="ignore"):
                stored = x.astype(arg.dtype)
            if stored.dtype.kind == "f" and x.dtype.kind == "f" and (np.isinf(stored) & np.isfinite(x)).any():
                numerics.append(f"kernel {program.name}: input {arg.name} holds {np.abs(x).max():.4g}, beyond the "
                                f"chip's {arg.dtype} (max {np.finfo(stored.dtype).max:.6g}): it became inf")
            machine.ddr[arg.offset:arg.offset + arg.nbytes] = stored.reshape(-1).view(np.uint8)
        for k, kt in zip(program.kernels, timing.kernels):
            instrs = k.instructions
            machine.run_all([instrs[i] for i in kt.order])
            if machine.overflow is not None:
                numerics.append(_overflowed(k, kt.order, *machine.overflow))
        outputs = [np.ndarray(a.shape, np.dtype(a.dtype), machine.ddr, a.offset).astype(a.host_dtype)
                   for a in program.args if a.role == "output"]
        if not numerics and all(np.isfinite(x).all() for x in arrays if x.dtype.kind == "f"):
            numerics += [f"kernel {program.name}: output {a.name} has inf or NaN, its inputs are finite"
                         for a, y in zip([a for a in program.args if a.role == "output"], outputs)
                         if y.dtype.kind == "f" and not np.isfinite(y).all()]
    report = build_report(program, hw, timing, tuple(numerics))
    events = trace_events(program, hw, timing, start_cycle) if trace else []
    return SimResult(outputs, report, events)


def holds_values(program: Program) -> bool:
    """Whether ``program`` can compute its values: no float tensor of the host is stored in an
    integer type (a float model on an int8 chip; a quantized model's kernels store each tensor at
    its own type)."""
    return not any(np.dtype(a.host_dtype).kind == "f" and np.dtype(a.dtype).kind != "f" for a in program.args)


def _overflowed(kernel, order, position: int, largest: float) -> str:
    """The report's line for ``kernel``'s first overflow: its ``position``-th instruction run."""
    mark = kernel.layer_of_each()[order[position]]
    where = f"kernel {kernel.name}" + (f", layer {mark.name}" if mark and mark.name != kernel.name else "")
    return f"{where}: {largest:.4g} overflowed the chip's float16 (max 65504) and became inf"


def _check_inputs(program: Program, inputs) -> list[np.ndarray]:
    args = [a for a in program.args if a.role == "input"]
    inputs = [] if inputs is None else list(inputs)
    if len(inputs) != len(args):
        raise ValueError(f"program {program.name!r} takes {len(args)} input(s) "
                         f"{[a.name for a in args]}, got {len(inputs)}")
    arrays = [np.asarray(x) for x in inputs]
    for a, x in zip(args, arrays):
        if x.shape != a.shape:
            raise ValueError(f"input {a.name!r}: shape {x.shape} does not match the program's {a.shape}")
    return arrays


def timing_cycles(program: Program) -> int:
    """Cycles of ``program`` in a timing-only simulation (how the compiler compares two versions of a
    kernel)."""
    return simulate(program, None, mode="timing", check_hazards=False).report.cycles
