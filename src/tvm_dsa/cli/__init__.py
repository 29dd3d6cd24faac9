"""``tvm-dsa``: compile and run a model on a simulated DSA from the command line.

    tvm-dsa run resnet18 --tiny                   # compile, simulate, check against llvm, report
    tvm-dsa run model.onnx --target dsa/set-edge16 --timing-only --trace trace.json
    tvm-dsa run model.onnx --target dsa/set-edge16 --quantize --calibration inputs.npz   # int8, onnxruntime's quantizer
    tvm-dsa run resnet18 --tiny --target my-chip.toml   # a hardware file wherever a preset's name goes
    tvm-dsa compare resnet18 --tiny --target dsa/stcp920 --target dsa/set-edge16 --schedule graphturbo
    tvm-dsa trace resnet18 --tiny -o trace.json --gantt run.png   # Perfetto trace, per-unit summary
    tvm-dsa tune resnet50 --tiny --trials 16 --work-dir tuned     # meta-schedule on the simulator (on Ray)
    tvm-dsa explore resnet50 --target dsa/set-edge16 --batch 8    # SET's tree search vs LS / LP (seed 002)
    tvm-dsa explore resnet50 --batch 8 --restarts 8               # 8 seeds per scheme as Ray tasks, the best kept
    tvm-dsa hw [dsa/<chip> | chip.toml] [--json]  # the presets, or validate and show one chip
    tvm-dsa dataflow gemm i=64,j=64,k=64          # TENET metrics of the MME's dataflows (seed 003)
    tvm-dsa sweep resnet50 --batch 8 --space examples/space-stcp920.toml --out sweep.parquet  # chips on Ray

On a terminal every command but ``sweep`` (which has its own status line) shows from its first
second what it is doing and the time elapsed (``cli.activity``).

Exit codes: 0 success, 1 numerics outside the tolerance (or, with ``--strict``, a kernel whose values
overflowed the chip's number type), 2 bad input (model, file, target) or any other failure, each said
in one line (``TVM_DSA_TRACEBACK=1``: a failure's traceback instead).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import nullcontext
from pathlib import Path

from tvm_dsa import hardware
from tvm_dsa.cli import dataflow as dataflow_command
from tvm_dsa.cli.activity import activity, step
from tvm_dsa.cli.args import positive_int
from tvm_dsa.harness import (
    Compiled, InputError, check_inputs, check_target, dsa_mac_share, import_onnx, label_trace, load_model,
    max_relative_error, one_line, timing_run
)
from tvm_dsa.harness.quantize import METHODS, QuantizedModel, load_calibration, quantize
from tvm_dsa.models import MODELS, example_inputs
from tvm_dsa.runtime import write_trace
from tvm_dsa.cli import commands as show_commands
from tvm_dsa.cli import explore as explore_command
from tvm_dsa.cli import sweep as sweep_command

TOLERANCE = 2e-2  # fp16 storage: max |dsa - llvm| relative to max |llvm|


def _run(args: argparse.Namespace) -> int:
    model = float_model = load_model(args.model, tiny=args.tiny, batch=args.batch)
    if (args.calibration or args.calibrate_method) and not args.quantize:
        raise InputError("--calibration and --calibrate-method say how --quantize calibrates: pass --quantize too")
    if args.trace and not Path(args.trace).resolve().parent.is_dir():
        raise InputError(f"cannot write the trace to {args.trace}: its directory does not exist")
    check_inputs(model)
    quantized = _quantized(model, args.calibration, args.calibrate_method) if args.quantize else None
    if quantized:
        model = quantized.model
    check_target(args.target, model, timing_only=args.timing_only)
    inputs = None if args.timing_only else example_inputs(model)  # timing_run makes them only where needed
    step("importing the model")
    mod = import_onnx(model)
    mode = "timing" if args.timing_only else "functional"
    step(f"compiling for {args.target}")
    dsa = Compiled.build(mod, args.target)
    step(f"simulating ({mode})")
    if args.timing_only:
        run = timing_run(dsa, model, trace=bool(args.trace))
    else:
        run = dsa.run(inputs, trace=bool(args.trace))
    check = None
    if not (args.no_check or args.timing_only):
        step("compiling and running on llvm for the check")
        llvm = Compiled.build(mod, "llvm")
        err = max_relative_error(run.outputs, llvm.run(inputs).outputs)
        check = {"max_relative_error": err, "tolerance": args.tolerance, "ok": err <= args.tolerance}
    if quantized:
        quantized_run = {"calibration": quantized.calibration, "samples": quantized.samples,
                         "method": quantized.method}
        if check:
            quantized_run |= _float_error(run.outputs, float_model, inputs)
    labels = dsa.labels(model)
    names = dsa.names(labels)  # the model's names of the layers and kernels
    if args.trace:
        write_trace(label_trace(run.trace, names), args.trace)

    label = args.model + (" (tiny)" if args.tiny else "") + (f", batch {args.batch}" if args.batch else "")
    offload, share = dsa.offload, dsa_mac_share(dsa.offload)
    if args.json:
        print(json.dumps({
            "model": label, "target": args.target, "mode": mode, "schedule": offload.schedule,
            "compile_seconds": dsa.seconds, "run_seconds": run.seconds, "numerics": check,
            "quantized": quantized_run if quantized else None,
            "offload": {"dsa": offload.dsa, "host": offload.host, "dsa_macs": offload.dsa_macs,
                        "host_macs": offload.host_macs, "dsa_mac_share": share, "timed": offload.timed,
                        "kernel_labels": {k: names.get(k, k) for k in [*offload.dsa, *offload.host]}},
            "layers": [layer.to_dict() for layer in labels.values()],
            "report": run.report.to_dict() if run.report else None, "trace": args.trace,
        }, indent=2))
    else:
        print(f"{label} on {args.target} ({mode} simulation)")
        print(f"compile: {dsa.seconds:.2f} s; run: {run.seconds:.2f} s")
        if check:
            verdict = "ok" if check["ok"] else "FAILED"
            print(f"numerics: max |dsa - llvm| / max |llvm| = {check['max_relative_error']:.2e} "
                  f"(tolerance {args.tolerance:.0e}): {verdict}" + (" (the quantized model on llvm)" * bool(quantized)))
        if quantized:
            print(f"quantized: int8 QDQ by onnxruntime's quantize_static (per-channel weights), calibrated "
                  f"({quantized.method}) on {quantized.samples} sample(s) from {quantized.calibration}")
            if "max_abs_error" in quantized_run:
                print(f"quantization error: against the float model on llvm, max |dsa - float| = "
                      f"{quantized_run['max_abs_error']:.3e}, / max |float| = "
                      f"{quantized_run['max_relative_error']:.2e}")
        print(f"kernels: {len(offload.dsa)} on the DSA ({offload.schedule} schedule), {len(offload.host)} on the host")
        if offload.timed:
            print("schedule: timed " + ", ".join(f"{name} {cycles:,} cycles" for name, cycles in offload.timed.items())
                  + f"; {offload.schedule} kept")
        for name, reason in offload.host.items():
            print(f"  host {names.get(name, name)}: {reason}")
        total = offload.dsa_macs + offload.host_macs
        print("MACs on the DSA: " + (f"{share:.1%} ({offload.dsa_macs:,} of {total:,})" if share is not None
                                     else "n/a (the model has no MACs)"))
        print()
        print(run.report if run.report else "no kernel ran on the DSA: no report")
        if args.trace:
            print(f"\ntrace: {len(run.trace)} events written to {args.trace}")
    for line in run.report.numerics if run.report else ():
        print(f"tvm-dsa: {'error' if args.strict else 'warning'}: {line}", file=sys.stderr)
    if args.strict and run.report and run.report.numerics:
        return 1
    if check and not check["ok"]:
        print(f"tvm-dsa: error: DSA output differs from llvm by {check['max_relative_error']:.2e} "
              f"(relative), above the tolerance {args.tolerance:.0e}", file=sys.stderr)
        return 1
    return 0


def _quantized(model, calibration: str | None, method: str | None) -> QuantizedModel:
    """``model`` quantized by onnxruntime, on the samples of the ``calibration`` file or on its
    example inputs, by the calibration ``method`` (default MinMax)."""
    method = method or METHODS[0]
    if calibration is None:
        return quantize(model, method=method)
    return quantize(model, load_calibration(calibration, model), calibration, method)


def _float_error(outputs: list, float_model, inputs: dict) -> dict:
    """How far a quantized model's ``outputs`` are from ``float_model``'s on llvm for ``inputs``:
    max |out - float| and that over max |float|."""
    reference = Compiled.build(import_onnx(float_model), "llvm").run(inputs).outputs
    abs_error = max(float(abs(o.astype("float64") - r).max(initial=0.0))
                    for o, r in zip(outputs, reference, strict=True))
    return {"max_abs_error": abs_error, "max_relative_error": max_relative_error(outputs, reference)}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tvm-dsa", description="Compile and run models on a simulated DSA with TVM.")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="compile a model for the DSA, simulate it, check it against llvm, report")
    run.add_argument("model", help=f"an .onnx file or a built-in model: {', '.join(MODELS)}")
    run.add_argument("--target", default="dsa/stcp920",
                     help="a DSA preset (default dsa/stcp920; see `tvm-dsa hw`) or a hardware file (.toml/.json)")
    run.add_argument("--tiny", action="store_true", help="the built-in model's small configuration")
    run.add_argument("--batch", type=positive_int, help="batch size of a built-in model")
    run.add_argument("--timing-only", action="store_true",
                     help="simulate time only (no numerics, no llvm check, no inputs made where the DSA calls "
                          "cannot depend on them); needed for float models on int presets")
    run.add_argument("--quantize", action="store_true",
                     help="quantize a float model to int8 first (onnxruntime's quantize_static: QDQ, per-channel "
                          "weights) and report its distance from the float model; needs onnxruntime")
    run.add_argument("--calibration", metavar="NPZ",
                     help="with --quantize: the calibration inputs, one array per model input named as it, "
                          "of its shape or [N, *shape] (default: 4 example inputs, not the one run)")
    run.add_argument("--calibrate-method", choices=METHODS,
                     help="with --quantize: onnxruntime's calibration method (default MinMax; Percentile clips "
                          "outliers, docs/quantized.md)")
    run.add_argument("--trace", metavar="PATH", help="write a Chrome/Perfetto trace of the run")
    run.add_argument("--json", action="store_true", help="print the result as JSON")
    run.add_argument("--no-check", action="store_true", help="skip the comparison with llvm")
    run.add_argument("--tolerance", type=float, default=TOLERANCE,
                     help=f"max |dsa - llvm| / max |llvm| accepted (default {TOLERANCE:g})")
    run.add_argument("--strict", action="store_true",
                     help="exit 1 where a DSA kernel's values overflowed the chip's number type (inf/NaN)")
    run.set_defaults(func=_run)
    show_commands.add_parsers(sub)
    explore_command.add_parser(sub)
    dataflow_command.add_parser(sub)
    sweep_command.add_parser(sub)
    return p


def _resolve_targets(args: argparse.Namespace) -> None:
    """Each ``--target`` as its chip's tag, ``dsa/<name>``, so that a hardware file works wherever a
    preset's name does: its chip is registered (``hardware.tag``)."""
    targets = getattr(args, "target", None)
    try:
        if isinstance(targets, list):
            args.target = [hardware.tag(t) for t in targets]
        elif targets is not None:
            args.target = hardware.tag(targets)
    except hardware.HardwareError as err:
        raise InputError(str(err)) from None


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        _resolve_targets(args)
        # a sweep shows its own live status line (trials done / running / failed)
        with nullcontext() if args.command == "sweep" else activity(f"tvm-dsa {args.command}"):
            return args.func(args)
    except InputError as err:
        print(f"tvm-dsa: error: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # noqa: BLE001 - every other failure is one line too
        if os.environ.get("TVM_DSA_TRACEBACK"):
            raise
        print(f"tvm-dsa: error: {_failure(err)}", file=sys.stderr)
        return 2


def _failure(err: Exception) -> str:
    """One line for a failure that is not the input's fault: out of memory, or the error's kind and
    its last line (TVM's errors put their traceback first), and how to see where it happened."""
    if isinstance(err, MemoryError):
        return "out of memory" + (f": {one_line(err)}" if str(err) else "")
    return f"{type(err).__name__}: {one_line(err)} (TVM_DSA_TRACEBACK=1 prints the traceback)"


if __name__ == "__main__":
    sys.exit(main())
