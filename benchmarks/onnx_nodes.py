"""ONNX's backend node tests on llvm and on the DSA, and why kernels stay on the host.

Which of ONNX's single-operator models TVM builds right for llvm, which of those the DSA computes
right, which kernels of them stay on the host and why.

    python benchmarks/onnx_nodes.py --jobs 2 --json /tmp/nodes.json   # the whole suite (15 minutes)
    python benchmarks/onnx_nodes.py --filter 'conv|gemm'              # cases whose name matches
    python benchmarks/onnx_nodes.py --filter '^test_softmax' --schedule graphturbo --list-host

The cases are regenerated in memory by the generators the onnx wheel ships
(``onnx.backend.test.case.node.collect_testcases()``: a one-node model, its inputs and expected
outputs each; the wheel has no test data). Each case runs in a worker process, ``--jobs`` of them;
a target (import, compile and run) that takes longer than ``--timeout`` is interrupted where it is,
and a worker that crashes, or does not return to Python to be interrupted, is replaced. A case is

- imported with ``tvm_dsa.frontend.from_onnx`` (TVM's importer, ``TopK`` with a computed ``k``
  added), compiled for llvm with TVM's default pipeline and run; it *passes llvm* if its outputs
  have the expected shapes and dtypes and are within the case's rtol / atol (as ONNX's backend
  runner checks: ``np.testing.assert_allclose``, rtol 1e-3, atol 1e-7);
- if it passes llvm, compiled for ``--target`` with ``tvm_dsa.pipeline(schedule=--schedule)`` (for
  layerwise what ``relax_pipeline="dsa"`` compiles) and simulated; it *passes dsa* if each output
  is within the chip's fp16 precision, max |dsa - expected| <= 2e-2 max |expected| over its finite
  values, with its non-finite values where the expected ones are, and integer and boolean
  outputs exact. Otherwise it is *wrong* (the largest relative error), an *error* (the
  exception's type, the first line of its message and the innermost tvm_dsa frame it went
  through) or a *timeout* (with that frame too).

Printed: a summary line, the cases that pass llvm and fail on the DSA with their reasons (grouped
by cause), the reasons kernels stay on the host (without the names of blocks and expressions) with
how many kernels and cases each, and with ``--list-host`` every case with a kernel on the host.
``--json`` writes every case's record: the llvm verdict, the DSA outcome, reason and error, compile
times, the kernels on the DSA, those on the host with their reasons, the share of MACs on the DSA.
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing as mp
import os
import re
import signal
import statistics
import sys
import time
import traceback
import warnings
from collections import Counter, deque
from multiprocessing.connection import wait

import numpy as np
import onnx
import tvm
import tvm_ffi
from tvm import relax

import tvm_dsa
from tvm_dsa.harness import dsa_mac_share
from tvm_dsa.frontend import from_onnx

TOLERANCE = 2e-2  # of max |expected|: what fp16 storage keeps (README)
STARTUP = 60.0  # seconds a new worker may take to start
GRACE = 30.0  # seconds past --timeout before a worker that does not return to Python is killed
OVERRUN = "timeout after"  # how an Overrun's message starts
FAULT = "the DSA path failed"  # how the offload's reason starts for an error building a kernel (a fault)
PACKAGES = [os.path.dirname(m.__file__) for m in (tvm_dsa, tvm)]  # where() names files from these


def _step(text: str) -> None:
    print(f"... {text}", file=sys.stderr, flush=True)


def table(title: str, header: list[str], rows: list[list[str]]) -> None:
    """A table with its numeric columns right-aligned, the others left-aligned."""
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    numeric = [all(re.fullmatch(r"[\d.%-]*", str(r[i])) for r in rows) for i in range(len(header))]
    print(f"\n{title}")
    for r in [header, ["-" * w for w in widths]] + rows:
        print("  ".join(str(c).rjust(w) if num else str(c).ljust(w)
                        for c, w, num in zip(r, widths, numeric)).rstrip())


# -- the cases -------------------------------------------------------------------------------------

def _array(value):
    """A case's value as numpy: TensorProto converted, sequences as lists, scalars as 0-d arrays."""
    if value is None:
        return None
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    if isinstance(value, (list, tuple)):
        return [_array(v) for v in value]
    return np.asarray(value)


def collect(pattern: str | None) -> list[dict]:
    """The node cases whose name matches ``pattern`` (``re.search``), each as what a worker needs:
    the serialized model (IR version at most 10, which TVM's importer reads), inputs and expected
    outputs as numpy, the tolerances."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings(), np.errstate(all="ignore"):  # the generators overflow casts on purpose
        warnings.simplefilter("ignore")
        cases = collect_testcases()
    out = []
    for case in sorted(cases, key=lambda c: c.name):
        if pattern and not re.search(pattern, case.name):
            continue
        model = case.model
        model.ir_version = min(model.ir_version, 10)
        (inputs, expected), = case.data_sets
        out.append({"name": case.name, "op": model.graph.node[0].op_type, "model": model.SerializeToString(),
                    "inputs": _array(list(inputs)), "expected": _array(list(expected)),
                    "rtol": case.rtol, "atol": case.atol})
    return out


# -- checking outputs ------------------------------------------------------------------------------

class Mismatch(Exception):
    """Outputs that differ from the expected ones (the message says where and how)."""


def _pairs(outputs: list, expected: list, prefix: str = "output"):
    """(label, output, expected) per tensor, through sequences; Mismatch for a different structure."""
    if len(outputs) != len(expected):
        raise Mismatch(f"{len(outputs)} {prefix}s, expected {len(expected)}")
    for i, (out, ref) in enumerate(zip(outputs, expected)):
        label = f"{prefix} {i}"
        if isinstance(ref, list) or isinstance(out, list):
            if not (isinstance(ref, list) and isinstance(out, list)):
                raise Mismatch(f"{label}: {type(out).__name__}, expected {type(ref).__name__}")
            yield from _pairs(out, ref, f"{label} item")
        elif ref is None or out is None:
            if ref is not out:
                raise Mismatch(f"{label}: {type(out).__name__}, expected {type(ref).__name__}")
        else:
            if out.shape != ref.shape:
                raise Mismatch(f"{label}: shape {out.shape}, expected {ref.shape}")
            if out.dtype != ref.dtype:
                raise Mismatch(f"{label}: dtype {out.dtype}, expected {ref.dtype}")
            if ref.dtype.name == "bfloat16":  # numpy compares it only as float32
                out, ref = out.astype(np.float32), ref.astype(np.float32)
            yield label, out, ref


def check_llvm(outputs: list, expected: list, rtol: float, atol: float) -> None:
    """ONNX's backend-test check; Mismatch if it fails."""
    for label, out, ref in _pairs(outputs, expected):
        if ref.dtype == object:
            if not np.array_equal(out, ref):
                raise Mismatch(f"{label}: strings differ")
        elif not np.allclose(out, ref, rtol=rtol, atol=atol, equal_nan=True):
            diff = np.abs(out.astype(np.float64) - ref.astype(np.float64))
            raise Mismatch(f"{label}: not within rtol {rtol:g} / atol {atol:g} (max abs diff {np.nanmax(diff):.3g})")


def _nonfinite_differ(out: np.ndarray, ref: np.ndarray) -> bool:
    """Whether the non-finite values of ``out`` are not exactly those of ``ref``."""
    finite = np.isfinite(ref)
    return not (np.array_equal(out[~finite], ref[~finite], equal_nan=True) and np.isfinite(out[finite]).all())


def relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    """max |out - ref| / max |ref| where both are finite (inf where ref is all zero and out is not)."""
    out, ref = out.astype(np.float64), ref.astype(np.float64)
    finite = np.isfinite(ref) & np.isfinite(out)
    diff = float(np.abs(out[finite] - ref[finite]).max(initial=0.0))
    scale = float(np.abs(ref[finite]).max(initial=0.0))
    return diff / scale if scale else (0.0 if diff == 0 else np.inf)


def check_dsa(outputs: list, expected: list) -> tuple[float, list[str]]:
    """(the largest relative error of the outputs, what is beyond fp16 precision: non-finite values
    elsewhere, a larger error, integer or boolean values not exact); Mismatch for another structure,
    shape or dtype."""
    worst, problems = 0.0, []
    for label, out, ref in _pairs(outputs, expected):
        if ref.dtype.kind not in "fc":
            if not np.array_equal(out, ref):
                problems.append(f"{label}: {np.count_nonzero(out != ref)} of {ref.size} values differ")
            continue
        if _nonfinite_differ(out, ref):
            problems.append(f"{label}: non-finite values differ")
        err = relative_error(out, ref)
        if err > TOLERANCE:
            problems.append(f"{label}: max rel error {err:.2e}")
        worst = max(worst, err)
    return worst, problems


# -- one case, in a worker -------------------------------------------------------------------------

def where(err: BaseException) -> str:
    """file:line of the innermost tvm_dsa frame an exception went through (else of its innermost
    frame with a file), relative to the directory of its package."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if os.path.isfile(f.filename)]
    if not frames:
        return "?"
    ours = [f for f in frames if f.filename.startswith(PACKAGES[0] + os.sep)]
    frame = (ours or frames)[-1]
    root = next((os.path.dirname(p) for p in PACKAGES if frame.filename.startswith(p + os.sep)),
                os.path.dirname(frame.filename))
    return f"{os.path.relpath(frame.filename, root)}:{frame.lineno}"


class Overrun(BaseException):
    """Raised by SIGALRM in a worker at ``--timeout``: a BaseException, so that no ``except
    Exception`` of the compiler takes it for a failed attempt (through TVM's FFI it arrives as a
    RuntimeError with the same message)."""


def _failure(stage: str, err: BaseException) -> dict:
    """The DSA outcome of an exception (timeout or error) and its account: the stage, the type and
    first line of its message, where it was raised."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    loc = where(err)
    if lines and lines[0].startswith(OVERRUN):
        return {"dsa": "timeout", "reason": f"{stage}: {lines[0]} ({loc})",
                "cause": f"{stage}: timeout in {loc.rpartition(':')[0]}"}
    return {"dsa": "error", "reason": f"{stage}: {type(err).__name__}: {lines[0] if lines else ''} ({loc})",
            "cause": f"{stage}: {type(err).__name__} at {loc}"}


def _tensors(value):
    if isinstance(value, list):
        return [_tensors(v) for v in value]
    return None if value is None else tvm.runtime.tensor(np.array(value, order="C"))


def _numpy(value):
    """A VM result as numpy: tensors as arrays, shapes as int64 arrays, tuples as lists."""
    if hasattr(value, "numpy"):
        return value.numpy()
    if isinstance(value, tvm_ffi.Shape):
        return np.array(list(value), dtype=np.int64)
    if isinstance(value, (int, float, bool)):
        return np.asarray(value)
    return None if value is None else [_numpy(v) for v in value]


def _compile(mod, target: str, pipeline):
    start = time.perf_counter()
    return tvm.compile(mod, target=target, relax_pipeline=pipeline), time.perf_counter() - start


def _run(ex, case: dict) -> list:
    out = _numpy(relax.VirtualMachine(ex, tvm.cpu())["main"](*_tensors(case["inputs"])))
    return [out] if len(case["expected"]) == 1 else out


def run_llvm(case: dict):
    """(the Relax module, or None if the case fails llvm; the llvm part of its record)."""
    stage = "import"
    try:
        mod = from_onnx(onnx.ModelProto.FromString(case["model"]), keep_params_in_input=False)
        stage = "compile"
        ex, seconds = _compile(mod, "llvm", "default")
        stage = "run"
        check_llvm(_run(ex, case), case["expected"], case["rtol"], case["atol"])
    except Mismatch as err:
        return None, {"llvm": f"wrong: {err}"}
    except (Exception, Overrun) as err:  # an unsupported operator, a failed build or run: the case fails llvm
        return None, {"llvm": _failure(stage, err)["reason"]}
    return mod, {"llvm": "pass", "llvm_seconds": seconds}


def run_dsa(mod, case: dict, target: str, schedule: str) -> dict:
    """The DSA part of a case's record: compiled, simulated, checked at fp16 precision."""
    try:
        ex, seconds = _compile(mod, target, tvm_dsa.pipeline(schedule))
    except (Exception, Overrun) as err:
        return _failure("compile", err)
    result = tvm_dsa.pipeline_result()
    record = {"dsa_seconds": seconds, "dsa_kernels": list(result.dsa), "host": dict(result.host),
              "unstitched": dict(result.unstitched), "mac_share": dsa_mac_share(result)}
    try:
        outputs = _run(ex, case)
    except (Exception, Overrun) as err:
        return {**record, **_failure("run", err)}
    try:
        error, problems = check_dsa(outputs, case["expected"])
    except Mismatch as err:
        return {**record, "dsa": "wrong", "reason": str(err), "cause": "wrong shape, dtype or structure"}
    if problems:
        return {**record, "dsa": "wrong", "reason": "; ".join(problems), "cause": "wrong values", "error": error}
    return {**record, "dsa": "pass", "error": error}


def _let_timeouts_through() -> None:
    """Have the offload's fault barrier (``host_reason``: a kernel whose DSA path fails runs on the
    host) re-raise a timeout, which TVM's FFI turns into a RuntimeError, instead of taking it for a
    kernel that failed to build."""
    offload = importlib.import_module("tvm_dsa.kernelgen.offload")
    original = offload.host_reason

    def host_reason(err: Exception) -> str:
        if str(err).startswith(OVERRUN):
            raise err
        return original(err)

    for module in (offload, importlib.import_module("tvm_dsa.kernelgen.symbolic")):
        module.host_reason = host_reason


def _limited(timeout: float, fn, *args):
    """``fn(*args)``, interrupted by an Overrun after ``timeout`` seconds."""
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        return fn(*args)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _serve(conn, target: str, schedule: str, timeout: float) -> None:
    """A worker: for each case received, send ("start", {}), ("llvm", record) and, if the case passes
    llvm, ("dsa", record); each target has ``timeout`` seconds."""

    def overrun(_signum, _frame):
        raise Overrun(f"{OVERRUN} {timeout:g} s")

    signal.signal(signal.SIGALRM, overrun)
    _let_timeouts_through()
    devnull = os.open(os.devnull, os.O_WRONLY)  # the importer's prints, TVM's warnings: not in the tables
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    warnings.simplefilter("ignore")
    np.seterr(all="ignore")
    while (case := conn.recv()) is not None:
        conn.send(("start", {}))
        mod, record = _limited(timeout, run_llvm, case)
        conn.send(("llvm", record))
        if mod is not None:
            conn.send(("dsa", _limited(timeout, run_dsa, mod, case, target, schedule)))


# -- the pool --------------------------------------------------------------------------------------

class Worker:
    """A worker process; the case it runs (None when idle), the target it is at, its deadline."""

    def __init__(self, ctx, target: str, schedule: str, timeout: float):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, target, schedule, timeout), daemon=True)
        self.proc.start()
        child.close()
        self.timeout = timeout
        self.case = self.phase = None
        self.deadline = 0.0

    def give(self, case: dict) -> None:
        """Send the case; the worker has ``STARTUP`` seconds more to take it (a new one imports TVM first)."""
        self.case, self.phase, self.deadline = case, "llvm", time.monotonic() + STARTUP + self.timeout + GRACE
        self.conn.send(case)

    def poll(self, record: dict) -> str | None:
        """Take the worker's messages into ``record``: "done", a timeout or crash, or None (running)."""
        try:
            while self.conn.poll():
                phase, update = self.conn.recv()
                record.update(update)
                if phase == "dsa" or (phase == "llvm" and update["llvm"] != "pass"):
                    return "done"
                self.phase = "dsa" if phase == "llvm" else "llvm"  # "start": the worker took the case
                self.deadline = time.monotonic() + self.timeout + GRACE
        except (EOFError, OSError):
            pass
        if not self.proc.is_alive():
            return f"worker crashed (exit code {self.proc.exitcode})"
        return f"{OVERRUN} {self.timeout + GRACE:g} s, killed" if time.monotonic() > self.deadline else None

    def stop(self) -> None:
        self.proc.kill()
        self.proc.join()
        self.conn.close()


def run_all(cases: list[dict], jobs: int, timeout: float, target: str, schedule: str) -> dict[str, dict]:
    """Every case's record, by name; ``jobs`` workers, each replaced after a crash or a timeout."""
    ctx = mp.get_context("spawn")  # TVM's thread pools do not survive a fork
    workers = [Worker(ctx, target, schedule, timeout) for _ in range(min(jobs, len(cases)))]
    todo, results, done = deque(cases), {}, 0
    try:
        while todo or any(w.case for w in workers):
            for w in workers:
                if w.case is None and todo:
                    case = todo.popleft()
                    results[case["name"]] = {"name": case["name"], "op": case["op"]}
                    w.give(case)
            busy = [w for w in workers if w.case]
            wait([w.conn for w in busy] + [w.proc.sentinel for w in busy],
                 timeout=max(0.0, min(w.deadline for w in busy) - time.monotonic()))
            for i, w in enumerate(workers):
                if w.case is None or (state := w.poll(rec := results[w.case["name"]])) is None:
                    continue
                if state != "done":
                    if w.phase == "llvm":
                        rec["llvm"] = state
                    else:
                        killed = state.startswith(OVERRUN)
                        rec.update(dsa="timeout" if killed else "error", reason=state,
                                   cause="timeout, killed" if killed else "worker crashed")
                    w.stop()
                    workers[i] = Worker(ctx, target, schedule, timeout)
                done += 1
                _step(f"[{done}/{len(cases)}] {rec['name']}: llvm {'pass' if rec['llvm'] == 'pass' else 'fail'}"
                      + (f", dsa {rec['dsa']}" if "dsa" in rec else ""))
                w.case = None
    finally:
        for w in workers:
            w.stop()
    return results


# -- the report ------------------------------------------------------------------------------------

# (pattern, replacement): a host-fallback reason without what names one kernel's blocks and expressions
HOST_GROUPS = [
    (r"^(block|stage) \S+: ", ""),
    (r"expression (\w+) (T\.\w+\()?.* is not", lambda m: f"expression {m[2] + '...)' if m[2] else m[1]} is not"),
    (r"^(\w+) value \S+\[.*\]$", r"\1 value (...)"),
    (r"negative stride \([-\d, ]+\)", "negative stride"),
    (r"no tiling of \S+ fits", "no tiling fits"),
    (r"\(last: (stage \S+: )?value .* varies", "(last: a value varies"),
    (r"index .* is not affine", "an index is not affine"),
    (r"\S+ is walked backwards along loop \d+ \(stride -\d+\)", "an operand is walked backwards"),
    (r"^reduction .* is not", "a reduction is not"),
]


def host_reason(reason: str) -> str:
    """A host-fallback reason as grouped (``block T_gather: an index reads ...`` -> ``an index reads ...``)."""
    for pattern, replacement in HOST_GROUPS:
        reason = re.sub(pattern, replacement, reason)
    return reason


def fault_cause(reason: str) -> str:
    """What a DSA-path fault is grouped by: the error's type and where it was raised."""
    return re.sub(r"^.*?: (\w+): .*\((\S+)\)$", r"\1 at \2", reason)


def report(results: dict[str, dict], list_host: bool) -> None:
    recs = sorted(results.values(), key=lambda r: r["name"])
    llvm = [r for r in recs if r["llvm"] == "pass"]
    compiled = [r for r in llvm if "dsa_seconds" in r]
    outcomes = Counter(r["dsa"] for r in llvm)
    whole = [r for r in llvm if r["dsa"] == "pass" and r["dsa_kernels"] and not r["host"]]
    faults = sorted(((r["name"], kernel, reason) for r in compiled
                     for kernel, reason in {**r["host"], **r["unstitched"]}.items() if reason.startswith(FAULT)),
                    key=lambda f: (fault_cause(f[2]), f[0]))
    faulty = {name for name, _, _ in faults}
    print(f"node cases: {len(recs)} total, {len(llvm)} pass llvm, {outcomes['pass']} of {len(llvm)} pass dsa, "
          f"{outcomes['wrong']} wrong, {outcomes['error']} errors, {outcomes['timeout']} timeouts; "
          f"{len(whole)} ran wholly on the DSA")
    print(f"DSA-path faults: {len(faulty)} cases ran a kernel the DSA path failed to build on the host instead "
          f"({sum(r['dsa'] == 'pass' for r in compiled if r['name'] in faulty)} of them pass dsa)")
    if compiled:
        print(f"median compile time: llvm {statistics.median(r['llvm_seconds'] for r in llvm):.2f} s, "
              f"dsa {statistics.median(r['dsa_seconds'] for r in compiled):.2f} s")

    failed = sorted((r for r in llvm if r["dsa"] != "pass"), key=lambda r: (r["cause"], r["name"]))
    if failed:
        table("DSA failures by cause", ["cases", "cause"],
              [[str(n), c] for c, n in Counter(r["cause"] for r in failed).most_common()])
        table("Cases that pass llvm and fail on the DSA", ["case", "outcome", "reason"],
              [[r["name"], r["dsa"], r["reason"]] for r in failed])
    if faults:
        causes = Counter(cause for _, cause in {(name, fault_cause(reason)) for name, _, reason in faults})
        table("DSA-path faults by cause (the kernel ran on the host)", ["cases", "cause"],
              [[str(n), c] for c, n in causes.most_common()])
        table("Cases with a DSA-path fault", ["case", "kernel", "fault"], [list(f) for f in faults])

    kernels, cases = Counter(), {}
    for r in compiled:
        for reason in map(host_reason, r["host"].values()):
            kernels[reason] += 1
            cases.setdefault(reason, set()).add(r["name"])
    if kernels:
        table("Why kernels stay on the host (the cases that pass llvm and compile for the DSA)",
              ["kernels", "cases", "reason", "e.g."],
              [[str(n), str(len(cases[k])), k, " ".join(sorted(cases[k])[:3])] for k, n in kernels.most_common()])
    if list_host:
        table("Cases with kernels on the host", ["case", "on dsa", "on host", "MACs on dsa", "reasons"],
              [[r["name"], str(len(r["dsa_kernels"])), str(len(r["host"])),
                f"{r['mac_share']:.0%}" if r["mac_share"] is not None else "-",
                "; ".join(sorted({host_reason(v) for v in r["host"].values()}))] for r in compiled if r["host"]])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--filter", metavar="REGEX", help="only the cases whose name matches (re.search)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per case and target")
    p.add_argument("--target", default="dsa/stcp920")
    p.add_argument("--schedule", choices=["layerwise", "graphturbo"], default="layerwise")
    p.add_argument("--json", metavar="FILE", help="write every case's record there")
    p.add_argument("--list-host", action="store_true", help="list the cases with a kernel on the host")
    args = p.parse_args()
    if args.jobs < 1:
        p.error("--jobs must be at least 1")

    start = time.perf_counter()
    _step("generating the node cases")
    cases = collect(args.filter)
    if not cases:
        p.error(f"no node case matches {args.filter!r}")
    _step(f"running {len(cases)} cases on llvm and {args.target} ({args.schedule}), {args.jobs} at a time")
    results = run_all(cases, args.jobs, args.timeout, args.target, args.schedule)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(sorted(results.values(), key=lambda r: r["name"]), f, indent=1)
    report(results, args.list_host)
    print(f"\nwall time {time.perf_counter() - start:.0f} s, {args.jobs} jobs")


if __name__ == "__main__":
    main()
