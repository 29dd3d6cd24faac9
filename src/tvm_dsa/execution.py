"""Execution of offloaded kernels: the functions the VM calls, and the session their reports go to.

A model compiled by the ``dsa`` pipeline calls ``tvm_dsa.begin_run`` first (``MarkRunStart``: one
run per call of ``main``, whether or not it reaches a DSA kernel), then ``tvm_dsa.execute`` per
DSA kernel call: one kernel's program run on the simulator (numerics and time), its outputs
written into the VM's tensors; ``execute_shaped`` first builds the program of a kernel with
symbolic dims for the call's shapes (``kernelgen.specialize.VERSIONS``). A call's report joins
the current run of the current ``Session``.

The current session lives in a context variable: each thread has its own (made on its first
call), and ``with tvm_dsa.session(mode=...) as s:`` makes ``s`` current for the block. So two
threads running two executables get two reports, and a report is never another run's.
Programs are parsed once and cached by their text; a call's ``info.names`` renames its
program's args and layers (sub-graphs of one form share one text).
"""

from __future__ import annotations

import collections
import json
import math
import os
import re
import threading
import uuid
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import tvm
import tvm_ffi

from tvm_dsa.isa import Program
from tvm_dsa.kernelgen.offload import OffloadResult
from tvm_dsa.kernelgen.specialize import VERSIONS
from tvm_dsa.packed import BEGIN_RUN, EXECUTE
from tvm_dsa.runtime import Report, holds_values, simulate

KEEP = 16  # runs a session keeps (the oldest are dropped); compilations the process remembers: 4x


@dataclass(frozen=True)
class KernelRun:
    """One DSA kernel call of a model run: its name, the shapes of its outputs, its report, its program."""

    name: str
    output_shapes: tuple
    report: Report
    program: Program | None = None


@dataclass
class Run:
    """One call of a compiled model's ``main``: its DSA kernel calls in call order, their trace."""

    compilation: str  # the id of the compilation that made the model (``pipeline_result``)
    kernels: list[KernelRun] = field(default_factory=list)
    trace: list = field(default_factory=list)
    input_elements: int = 0  # a dynamic model's (``begin_run``)
    output_elements: int | None = None  # a dynamic model's, once it returned (``end_run``)

    def report(self) -> Report | None:
        """All of the run's DSA kernels in one report, None where it ran none. Its roofline is the
        model's bound: a static model's from its compilation; a dynamic one's from this run's
        inputs and outputs, its weights, the MACs of the DSA kernels it ran and those of its host
        kernels with static shapes. Without a compilation (another process's), its kernels'."""
        if not self.kernels:
            return None
        report = Report.combine([k.report for k in self.kernels])
        compiled = COMPILATIONS.get(self.compilation) if self.compilation else None
        if compiled is None:
            return report
        host = compiled.host_kernels
        if compiled.model_ddr_bytes is not None:
            return report.with_bound(compiled.model_macs, compiled.model_ddr_bytes, host)
        if self.output_elements is None:  # the run stopped before its end
            return report
        elements = self.input_elements + self.output_elements
        return report.with_bound(report.bound_macs + compiled.host_macs,
                                 elements * report.hardware.storage_bytes + compiled.weight_bytes, host)


class Session:
    """How offloaded kernels run (``set_mode``) and the runs they made, newest last (``runs``,
    the last ``KEEP``). A context manager: ``with tvm_dsa.session(mode="timing") as s:`` makes
    it the current session of the block's context (thread)."""

    def __init__(self, mode: str = "functional", trace: bool | None = None, check_hazards: bool = True,
                 strict: bool = False):
        self.runs: collections.deque[Run] = collections.deque(maxlen=KEEP)
        self.compilation: str | None = None  # the id of the last compilation made in the session
        self.trace = bool(os.environ.get("TVM_DSA_TRACE"))
        self._tokens: list = []
        self.set_mode(mode, trace, check_hazards, strict)

    def set_mode(self, mode: str = "functional", trace: bool | None = None, check_hazards: bool = True,
                 strict: bool = False) -> None:
        """How offloaded kernels run from now on: ``functional`` (numerics and time) or ``timing``
        (time only: outputs are left untouched, so the model's results are meaningless). ``trace``
        records trace events (``last_trace``). ``check_hazards=False`` (timing only) trusts the
        programs' dependency tokens instead of checking them, for speed on large programs. A
        kernel whose values the chip's number types cannot hold (an fp16 overflow, inf/NaN from
        finite inputs) is listed in the report's ``numerics``; with ``strict`` it raises
        ``FloatingPointError``."""
        if mode not in ("functional", "timing"):
            raise ValueError(f"simulation mode must be 'functional' or 'timing', not {mode!r}")
        if mode == "functional" and not check_hazards:
            raise ValueError("a functional run always checks the dependency tokens (check_hazards=True)")
        self.mode, self.check_hazards, self.strict = mode, check_hazards, strict
        if trace is not None:
            self.trace = trace

    def last_run(self) -> Run | None:
        return self.runs[-1] if self.runs else None

    def report(self) -> Report | None:
        """The report of the session's last model run (all its DSA kernels); None before any run
        and after a run that called no DSA kernel."""
        run = self.last_run()
        return run.report() if run else None

    def kernel_runs(self) -> list[KernelRun]:
        """Each DSA kernel call of the last model run, in call order (per-kernel reports)."""
        run = self.last_run()
        return list(run.kernels) if run else []

    def last_trace(self) -> list:
        """Trace events of the last run (``trace=True`` or TVM_DSA_TRACE=1 records them)."""
        run = self.last_run()
        return list(run.trace) if run else []

    def pipeline_result(self) -> OffloadResult | None:
        """What the session's last ``dsa`` compilation offloaded (an ``OffloadResult``), or None."""
        return COMPILATIONS.get(self.compilation) if self.compilation else None

    def __enter__(self) -> "Session":
        self._tokens.append(_CURRENT.set(self))
        return self

    def __exit__(self, *exc) -> None:
        _CURRENT.reset(self._tokens.pop())


_CURRENT: ContextVar[Session] = ContextVar("tvm_dsa.session")


def current() -> Session:
    """The session of the current context: the innermost ``with tvm_dsa.session()``, else the
    thread's own, made on first use."""
    try:
        return _CURRENT.get()
    except LookupError:
        s = Session()
        _CURRENT.set(s)
        return s


class Registry:
    """Values kept under ids made here (``<prefix>-<16 hex digits>``), which compiled code carries
    to find them again: the last ``keep``, thread-safe."""

    def __init__(self, prefix: str, keep: int):
        self.prefix, self._keep = prefix, keep
        self._pattern = re.compile(rf"{re.escape(prefix)}-[0-9a-f]{{16}}")
        self._values: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()

    def add(self, value) -> str:
        key = f"{self.prefix}-{uuid.uuid4().hex[:16]}"
        with self._lock:
            self._values[key] = value
            while len(self._values) > self._keep:
                self._values.popitem(last=False)
        return key

    def get(self, key: str):
        """The value of ``key``; None for one made by another process or one of more than
        ``keep`` since."""
        with self._lock:
            return self._values.get(key)

    def ids_in(self, text: str) -> list[str]:
        """The ids ``text`` holds, in order, each once."""
        return list(dict.fromkeys(self._pattern.findall(text)))


COMPILATIONS = Registry("dsa-compilation", 4 * KEEP)  # what each recent dsa compilation decided


def record_compilation(result: OffloadResult) -> str:
    """Keep what a compilation decided; its id, for ``MarkRunStart`` to embed in ``main``. It is
    the current session's last compilation from now on."""
    key = COMPILATIONS.add(result)
    current().compilation = key
    return key


def compilation_of(executable) -> OffloadResult | None:
    """What the compilation that made ``executable`` (a ``tvm.compile`` result, or one loaded
    back in this process) offloaded; None for one made by another process or long forgotten."""
    found = COMPILATIONS.ids_in(executable.stats())
    return COMPILATIONS.get(found[0]) if found else None


@lru_cache(maxsize=4096)
def parsed_program(text: str) -> Program:
    """The program of ``text``, parsed once (a model's calls share a few texts)."""
    return Program.deserialize(text)


@lru_cache(maxsize=4096)
def _named(text: str, name: str, names: str) -> Program:
    """The program of ``text`` under the names of a sub-graph of the same form as the one it was
    made for (``names``: the JSON of its arg and layer names -> the call's)."""
    return parsed_program(text).renamed(name, json.loads(names))


def begin_run(compilation, *inputs) -> None:
    """A model run starts (the first call of ``main``): its kernels' reports go to a new run. A
    dynamic model passes its tensor inputs (``end_run`` its outputs): their elements count."""
    current().runs.append(Run(str(compilation), input_elements=_elements(inputs)))


def end_run(outputs) -> None:
    """A dynamic model's run ends with ``outputs`` (a tensor or a tuple)."""
    run = current().last_run()
    if run is not None:
        run.output_elements = _elements([outputs])


def _elements(values) -> int:
    """Elements of the tensors in ``values``, tuples flattened; shapes and scalars count none."""
    total = 0
    for v in values:
        if isinstance(v, tvm.runtime.Tensor):
            total += math.prod(v.shape)
        elif isinstance(v, (tvm_ffi.Array, list, tuple)):
            total += _elements(v)
    return total


def execute(program_text, info_text, *tensors) -> None:
    info = json.loads(str(info_text))
    _run(program_of(str(program_text), info), info, tensors)


def program_of(text: str, info: dict) -> Program:
    """The program a DSA call runs: its text, under the names its info gives (``names``)."""
    names = info.get("names")
    return parsed_program(text) if names is None else _named(text, info["kernel"], json.dumps(names))


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
    outputs = run_kernel(program, info, [np.from_dlpack(t) for t in tensors[:n_in]])
    for t, out in zip(tensors[n_in:], outputs):
        np.from_dlpack(t)[...] = out


def run_kernel(program: Program, info: dict, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Simulate one kernel call in the current session's mode; its report joins the session's
    current run. Returns the outputs (none in timing mode)."""
    s = current()
    if s.mode == "functional" and not holds_values(program):
        raise RuntimeError(
            f"preset {program.hardware['name']} stores {program.hardware['storage_dtype']}: a float model "
            "can only be simulated in timing mode there (tvm_dsa.set_mode('timing')); use its -fp16 "
            "variant for numerics"
        )
    if not s.runs:  # a module compiled without MarkRunStart (an older executable)
        s.runs.append(Run(""))
    run = s.runs[-1]
    start = sum(k.report.cycles for k in run.kernels)
    result = simulate(program, inputs if s.mode == "functional" else None, mode=s.mode, start_cycle=start,
                      trace=s.trace, check_hazards=s.check_hazards)
    run.kernels.append(KernelRun(info["kernel"], tuple(a.shape for a in program.args if a.role == "output"),
                                 result.report, program))
    run.trace.extend(result.trace_events or [])
    if s.strict and result.report.numerics:
        raise FloatingPointError(result.report.numerics[0])
    return list(result.outputs or [])


def timing_calls(mod: tvm.IRModule) -> tuple[tuple[str, tuple[str, ...]], ...] | None:
    """The calls of ``begin_run`` and ``execute`` a run of ``mod``'s ``main`` (lowered for the VM)
    makes, in order, with their string arguments: all a timing run needs, for a DSA kernel's time
    does not depend on its tensors' values (``replay``). None where the calls may depend on the
    inputs: ``main`` branches or calls another Relax function, or makes another ``tvm_dsa`` call
    (a kernel with symbolic dims, a dynamic model's run end or its inputs counted)."""
    from tvm import relax

    body = mod["main"].body
    if not isinstance(body, relax.SeqExpr):
        return None
    calls = []
    for binding in (b for block in body.blocks for b in block.bindings):
        value = binding.value
        if isinstance(value, relax.If):
            return None
        if not isinstance(value, relax.Call):
            continue
        if isinstance(value.op, relax.GlobalVar) and isinstance(mod[value.op], relax.Function):
            return None
        name = value.op.global_symbol if isinstance(value.op, relax.ExternFunc) else ""
        if name == EXECUTE:  # its program and info; the tensors follow
            calls.append((name, (value.args[0].value, value.args[1].value)))
        elif name == BEGIN_RUN and all(isinstance(a, tvm.ir.StringImm) for a in value.args):  # the compilation's id
            calls.append((name, tuple(a.value for a in value.args)))
        elif name.startswith("tvm_dsa."):
            return None
    return tuple(calls)


def replay(calls) -> None:
    """Make ``calls`` (``timing_calls``) in the current session, without the VM and without
    tensors: each kernel's program is simulated for its time only."""
    if current().mode != "timing":
        raise ValueError("a replay of a model's DSA calls simulates timing only: the kernels get no tensors")
    for name, args in calls:
        if name == BEGIN_RUN:
            begin_run(*args)
        else:
            text, info = args[0], json.loads(args[1])
            run_kernel(program_of(text, info), info, [])


def dsa_cycles(mod: tvm.IRModule) -> int:
    """Cycles of the DSA calls of ``mod``'s ``main`` (after ``OffloadToDSA``) in a timing
    simulation, launches included: how the pipeline compares schedules."""
    from tvm import relax

    from tvm_dsa.packed import EXECUTE
    from tvm_dsa.runtime import timing_cycles

    texts = []

    def visit(expr) -> None:
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == "relax.call_dps_packed" \
                and isinstance(expr.args[0], relax.ExternFunc) and expr.args[0].global_symbol == EXECUTE:
            texts.append(expr.args[1].fields[0].value)

    relax.analysis.post_order_visit(mod["main"], visit)
    return sum(timing_cycles(parsed_program(t)) for t in texts)
