"""``tvm-dsa compare``, ``trace``, ``tune`` and ``hw``: side-by-side runs, a trace with its per-unit
summary and Gantt chart, tuning with a progress bar, the chips and their hardware files.

    tvm-dsa compare resnet18 --tiny --target dsa/stcp920 --target dsa/set-edge16 --schedule graphturbo
    tvm-dsa trace resnet18 --tiny -o run.json --gantt run.png
    tvm-dsa trace resnet50 --tiny --schedule graphturbo --lifetimes lifetimes.svg
    tvm-dsa tune resnet50 --tiny --trials 16 --work-dir tuned   # on a local Ray (--address: a cluster)
    tvm-dsa hw my-chip.toml                     # validate a hardware file and show its parameters
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

from tvm_dsa import hardware
from tvm_dsa.cli.activity import step
from tvm_dsa.cli.args import add_ray_args, check_mesh, check_plot_path, engine, model_title, positive_int, say
from tvm_dsa.dse import OnRay
from tvm_dsa.harness import (
    Compiled, InputError, check_inputs, check_target, fused_module, import_onnx, label_trace, layer_labels, load_model,
    model_names, timing_run
)
from tvm_dsa.models import MODELS
from tvm_dsa.runtime import write_trace
from tvm_dsa.runtime.report import UNIT_TYPES
from tvm_dsa.show.table import render_table
from tvm_dsa.tuning.shipped import pretuned
from tvm_dsa.show.plots import plot_gantt, plot_roofline, roofline_point
from tvm_dsa.show.lifetimes import capture_allocations, plot_lifetimes
from tvm_dsa.tuning import tune


SCHEDULES = ("auto", "layerwise", "graphturbo", "set")


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help=f"an .onnx file or a built-in model: {', '.join(MODELS)}")
    p.add_argument("--tiny", action="store_true", help="the built-in model's small configuration")
    p.add_argument("--batch", type=positive_int, help="batch size of a built-in model")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def _timed_run(model, mod, target: str, schedule: str, database=None, trace: bool = False):
    """Compile ``mod`` (``model`` imported) for ``target`` and run it in timing mode (tokens
    trusted: the runs are for cycles; ``timing_run``: no inputs made where none are needed);
    returns the build and the run."""
    if schedule == "set":
        check_mesh(target, hardware.get(target), "schedule 'set'")
    step(f"compiling for {target} ({schedule})")
    compiled = Compiled.build(mod, target, schedule, database=database)
    step(f"simulating on {target} ({schedule}, timing)")
    return compiled, timing_run(compiled, model, trace=trace, check_hazards=False)


# -- compare -------------------------------------------------------------------------------------
def _compare(args) -> int:
    model = load_model(args.model, tiny=args.tiny, batch=args.batch)
    targets = args.target or ["dsa/stcp920"]
    for t in targets:
        check_target(t, model, timing_only=True)
    if args.database and not Path(args.database).is_dir():
        raise InputError(f"no tuning database at {args.database}: give the work_dir of `tvm-dsa tune`")
    if args.roofline:
        if len(targets) != 1:
            raise InputError("--roofline draws one chip's roofline: give a single --target")
        check_plot_path(args.roofline)

    check_inputs(model)
    mod = import_onnx(model)
    # False: no records; None: the default (a shipped database for the chip, if any)
    databases = [False] * args.no_records + [None] + [args.database] * bool(args.database)
    rows, points = [], []
    for target, schedule, db in itertools.product(targets, args.schedule or ["auto"], databases):
        compiled, run = _timed_run(model, mod, target, schedule, db)
        report = run.report
        if report is None:
            raise InputError(f"no kernel of {args.model} runs on {target}: nothing to compare")
        records = "none" if db is False else db or ("shipped" if pretuned(hardware.get(target).name) else "none")
        if args.roofline:
            points.append(roofline_point(f"{schedule} ({records})", report))
        chosen = compiled.offload.schedule
        rows.append({"target": target, "schedule": chosen if schedule == chosen else f"{schedule} ({chosen})",
                     "records": records,
                     "tuned_kernels": len(compiled.offload.tuned), "cycles": report.cycles,
                     "seconds": report.seconds, "kernels": report.kernels,
                     "ddr_bytes": report.ddr_burst_bytes, "mme_utilisation": report.mme_mac_utilisation,
                     "roofline_fraction": report.roofline_fraction, "energy_joules": report.energy_total})
    base = rows[0]["seconds"]
    for r in rows:
        r["speedup"] = base / r["seconds"] if r["seconds"] else 0.0
    if args.roofline:

        plot_roofline(points, hardware.get(targets[0]), args.roofline,
                      title=f"{model_title(args.model, args.tiny, model)} on {targets[0]}")
    if args.json:
        print(json.dumps({"model": args.model, "tiny": args.tiny, "runs": rows}, indent=2))
        return 0
    table = [("target", "schedule", "records", "tuned kernels", "cycles", "time (us)", "kernels", "DDR bytes",
              "MME util", "% roofline", "energy (uJ)", "speedup")]
    table += [(r["target"], r["schedule"], r["records"], str(r["tuned_kernels"]), f"{r['cycles']:,}",
               f"{r['seconds'] * 1e6:.1f}", str(r["kernels"]), f"{r['ddr_bytes']:,}", f"{r['mme_utilisation']:.1%}",
               f"{r['roofline_fraction']:.1%}", f"{r['energy_joules'] * 1e6:.3g}", f"{r['speedup']:.2f}x") for r in rows]
    render_table(table, title=f"{args.model}{' (tiny)' if args.tiny else ''}: timing-only simulation")
    return 0


# -- trace ---------------------------------------------------------------------------------------


def _trace(args) -> int:
    if not Path(args.output).resolve().parent.is_dir():
        raise InputError(f"cannot write {args.output}: its directory does not exist")
    if args.gantt:
        check_plot_path(args.gantt)
    if args.lifetimes:
        if args.schedule == "layerwise":
            raise InputError("--lifetimes draws stitched kernels: not with --schedule layerwise")
        check_plot_path(args.lifetimes)
    model = load_model(args.model, tiny=args.tiny, batch=args.batch)
    check_target(args.target, model, timing_only=True)
    check_inputs(model)

    with capture_allocations() as stitched:
        compiled, run = _timed_run(model, import_onnx(model), args.target, args.schedule, trace=True)
    if not run.trace:
        raise InputError(f"no kernel of {args.model} runs on {args.target}: the trace is empty")
    names = compiled.names(compiled.labels(model))  # the model's names of the layers and kernels
    write_trace(label_trace(run.trace, names), args.output)
    summary = trace_summary(run.trace)
    title = f"{model_title(args.model, args.tiny, model)} on {args.target}"
    if args.gantt:
        plot_gantt(run.trace, args.gantt, title=f"{title} ({args.schedule})")
    lifetimes = _plot_lifetimes(stitched, args.lifetimes, title, names) if args.lifetimes else {}
    if args.json:
        print(json.dumps({"trace": args.output, "gantt": args.gantt, "lifetimes": lifetimes,
                          "cycles": run.report.cycles, "units": summary}, indent=2))
        return 0
    rows = [("unit", "tracks", "instructions", "busy (us)", "busy / run")]
    span = run.report.seconds * 1e6
    for unit, s in summary.items():
        rows.append((unit, str(s["tracks"]), f"{s['instructions']:,}", f"{s['busy_us']:.1f}",
                     f"{s['busy_us'] / (span * s['tracks']):.1%}" if span else "-"))
    render_table(rows, title=f"{args.model} on {args.target}: {run.report.cycles:,} cycles")
    print(f"trace: {len(run.trace)} events written to {args.output} (open in ui.perfetto.dev)")
    if args.gantt:
        print(f"Gantt chart: {args.gantt}")
    for kernel, path in lifetimes.items():
        print(f"tensor lifetimes of {names.get(kernel, kernel)}: {path}")
    return 0


def _plot_lifetimes(stitched: dict, path: str, title: str, names: dict) -> dict:
    """Each stitched kernel's lifetimes plot (cluster 0), titled and labelled with the model's
    ``names``: at ``path`` for one kernel, else at ``path`` with the kernel's name before the
    suffix. Returns kernel name -> file."""

    if not stitched:
        raise InputError("the model has no stitched kernel: no tensor lifetimes to draw")
    p = Path(path)
    files = {k: str(p if len(stitched) == 1 else p.with_name(f"{p.stem}-{k}{p.suffix}")) for k in stitched}
    for kernel, buffers in stitched.items():
        plot_lifetimes(buffers, files[kernel], title=f"{title}\ntensor lifetimes of {names.get(kernel, kernel)} "
                                                    "(cluster 0)", names=names)
    return files


def trace_summary(events: list[dict]) -> dict:
    """Per unit type: tracks that ran something, instructions, busy microseconds summed."""
    out = {}
    for unit in UNIT_TYPES:
        mine = [e for e in events if e.get("ph") == "X" and e["cat"] == unit]
        if mine:
            out[unit] = {"tracks": len({(e["pid"], e["tid"]) for e in mine}), "instructions": len(mine),
                         "busy_us": sum(e["dur"] for e in mine)}
    return out


# -- tune ----------------------------------------------------------------------------------------
def _tune(args) -> int:
    model = load_model(args.model, tiny=args.tiny, batch=args.batch)
    check_target(args.target, model, timing_only=True)
    mod = import_onnx(model)

    with engine(args, "tune") as where:
        say(f"tune: candidates built and measured {where.describe()}")
        step("extracting the kernels, measuring their default tilings")
        try:
            result = tune(mod, args.target, trials=args.trials, work_dir=args.work_dir, per_iter=args.per_iter,
                          seed=args.seed, on_ray=isinstance(where, OnRay),
                          progress=lambda done, total: step("measuring candidates", done, total))
        except ValueError as err:
            raise InputError(str(err)) from None
    fused = fused_module(mod)  # the kernels as extract_tasks fuses them
    names = model_names(layer_labels(model, fused), fused)
    if args.json:
        print(json.dumps(result.to_dict() | {"kernel_labels": {t.name: names.get(t.name, t.name) for t in result.tasks}},
                         indent=2))
        return 0
    rows = result.rows()
    render_table([rows[0], *((names.get(r[0], r[0]), *r[1:]) for r in rows[1:])],
                 title=f"{model_title(args.model, args.tiny, model)} on {args.target}: {args.trials} trials per kernel")
    print(f"records: {args.work_dir} (compile with tvm_dsa.pipeline(database={str(args.work_dir)!r}))")
    return 0


def _add_tune_parser(sub) -> None:
    p = sub.add_parser("tune", help="tune a model's DSA kernels with meta-schedule on the simulator",
                       description="Tune the tiling of every DSA kernel of a model with meta-schedule (evolutionary "
                                   "search, XGBoost cost model), each candidate measured as its simulated time; the "
                                   "records go to a JSON database in --work-dir (docs/tuning.md). Where Ray is installed the "
                                   "candidates are built and simulated as Ray tasks (a local Ray, or --address), with "
                                   "the records of --in-process.")
    _model_args(p)
    p.add_argument("--target", default="dsa/stcp920", help="a DSA preset (default dsa/stcp920) or a hardware file")
    p.add_argument("--trials", type=positive_int, default=16, help="measured candidates per kernel (default 16)")
    p.add_argument("--per-iter", type=positive_int, default=16,
                   help="candidates per search round, at most --trials (default 16)")
    p.add_argument("--work-dir", default="tune", help="where the JSON database goes (default ./tune)")
    p.add_argument("--seed", type=int, default=0)
    add_ray_args(p, "builds and simulations")
    p.set_defaults(func=_tune)


# -- hw ------------------------------------------------------------------------------------------
def _hw(args) -> int:
    if args.chip is None:
        return _presets(args.json)
    source = "preset"
    if hardware.is_file(args.chip):
        try:
            hw = hardware.load_file(args.chip)
        except hardware.HardwareError as err:
            raise InputError(str(err)) from None
        source = f"file {args.chip}"
    else:
        hw = check_target(args.chip)
    if args.json:
        print(json.dumps(hw.to_dict(), indent=2))
        return 0
    print(f"{hw.name} ({source}): a valid hardware description")
    render_table([("field", "value")] + [(k, _value(v)) for k, v in _flat(hw.to_dict())])
    return 0


def _presets(as_json: bool) -> int:
    chips = [hardware.get(n) for n in hardware.names()]
    if as_json:
        print(json.dumps({f"dsa/{hw.name}": hw.to_dict() for hw in chips}, indent=2))
        return 0
    rows = [("target", "cores", "MME", "storage", "clock", "peak MAC/cycle", "LB", "GB", "DDR B/cycle")]
    for hw in chips:
        rows.append((f"dsa/{hw.name}", str(hw.cores), f"{hw.mme.rows}x{hw.mme.cols}", hw.storage_dtype,
                     f"{hw.clock_hz / 1e9:g} GHz", f"{hw.peak_macs_per_cycle:,}", f"{hw.lb_bytes // 1024} KiB",
                     f"{hw.gb_bytes // 1024} KiB", f"{hw.ddr_bytes_per_cycle:g}"))
    render_table(rows)
    return 0


def _flat(d: dict, prefix: str = ""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _flat(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def _value(v) -> str:
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


def add_parsers(sub) -> None:
    compare = sub.add_parser("compare", help="run a model on several targets / schedules and compare them in a table",
                             description="Compile a model for each combination of --target and --schedule (with "
                                         "the shipped tuning records, and without records or with a --database), "
                                         "simulate each in timing-only mode, and print one table (speedup against "
                                         "the first row).")
    _model_args(compare)
    compare.add_argument("--target", action="append",
                         help="a DSA preset or a hardware file; repeat to compare (default dsa/stcp920)")
    compare.add_argument("--schedule", action="append", choices=SCHEDULES, help="repeat to compare (default auto: the compiler's choice)")
    compare.add_argument("--database", help="a `tvm-dsa tune` work_dir: adds the build with its records")
    compare.add_argument("--no-records", action="store_true",
                         help="adds, first, the build without tuning records (not even the shipped ones)")
    compare.add_argument("--roofline", metavar="PNG_OR_SVG", help="plot each run under the chip's roofline (one target)")
    compare.set_defaults(func=_compare)
    trace = sub.add_parser("trace", help="simulate a model and write its Perfetto/Chrome trace (and a Gantt chart)",
                           description="Compile and simulate a model in timing-only mode, write the trace "
                                       "(one track per unit; open it in ui.perfetto.dev) and print busy time per unit.")
    _model_args(trace)
    trace.add_argument("-o", "--output", default="trace.json", help="trace file (default trace.json)")
    trace.add_argument("--gantt", metavar="PNG_OR_SVG", help="also draw a per-unit Gantt chart")
    trace.add_argument("--lifetimes", metavar="PNG_OR_SVG",
                       help="with --schedule graphturbo: draw each stitched kernel's tensor lifetimes in LB/GB")
    trace.add_argument("--target", default="dsa/stcp920", help="a DSA preset (default dsa/stcp920) or a hardware file")
    trace.add_argument("--schedule", default="auto", choices=SCHEDULES)
    trace.set_defaults(func=_trace)
    hw = sub.add_parser("hw", help="list the DSA presets, or validate and show one chip or hardware file",
                        description="Without argument: the presets. With a preset (dsa/<chip>) or a .toml/.json "
                                    "hardware file: validate it and show every parameter (docs/hardware-format.md).")
    hw.add_argument("chip", nargs="?", help="a preset, e.g. dsa/stcp920, or a hardware file")
    hw.add_argument("--json", action="store_true", help="print as JSON")
    hw.set_defaults(func=_hw)
    _add_tune_parser(sub)
