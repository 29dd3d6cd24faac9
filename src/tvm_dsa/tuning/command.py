"""``tvm-dsa tune``: tune a model's DSA kernels with meta-schedule, with a progress bar.

    tvm-dsa tune resnet50 --tiny --trials 64 --work-dir tuned
    tvm-dsa run resnet50 --tiny  ...  /  tvm-dsa compare resnet50 --tiny --database tuned
"""

from __future__ import annotations

import json
import sys
from contextlib import nullcontext

from ..driver import InputError, check_target, import_onnx, load_model
from ..models import MODELS


def _tune(args) -> int:
    model = load_model(args.model, tiny=args.tiny, batch=args.batch)
    check_target(args.target, model, timing_only=True)
    mod = import_onnx(model)
    from . import tune  # meta-schedule: imported only when tuning

    with _progress(args.json) as bar:
        try:
            result = tune(mod, args.target, trials=args.trials, work_dir=args.work_dir, per_iter=args.per_iter,
                          seed=args.seed, progress=bar)
        except ValueError as err:
            raise InputError(str(err)) from None
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return 0
    from ..show import render_table

    rows = [("kernel", "calls", "default cycles", "tuned cycles", "speedup", "trials")]
    rows += [(t.name, str(t.calls), f"{t.default_cycles:,}", f"{t.tuned_cycles:,}", f"{t.speedup:.2f}x",
              str(t.trials)) for t in result.tasks]
    before, after = result.cycles(False), result.cycles(True)
    rows.append(("all calls", "", f"{before:,}", f"{after:,}", f"{before / after:.2f}x", ""))
    render_table(rows, title=f"{args.model} on {args.target}: {args.trials} trials")
    print(f"records: {args.work_dir} (compile with tvm_dsa.pipeline(database={str(args.work_dir)!r}))")
    return 0


class _Bar:
    """A rich progress bar on stderr as a ``progress(done, total)`` callback."""

    def __init__(self):
        from rich.progress import Progress

        self.progress = Progress(transient=False, console=None)
        self.task = None

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        return self.progress.__exit__(*exc)

    def __call__(self, done: int, total: int) -> None:
        if self.task is None:
            self.task = self.progress.add_task("measuring candidates", total=total)
        self.progress.update(self.task, completed=done)


def _progress(quiet: bool):
    """A progress bar on a terminal (rich), nothing otherwise (or with --json)."""
    if quiet or not sys.stderr.isatty():
        return nullcontext(None)
    try:
        return _Bar()
    except ImportError:
        return nullcontext(None)


def _positive(text: str) -> int:
    import argparse

    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def add_parser(sub) -> None:
    p = sub.add_parser("tune", help="tune a model's DSA kernels with meta-schedule on the simulator",
                       description="Tune the tiling of every DSA kernel of a model with meta-schedule (evolutionary "
                                   "search, XGBoost cost model), each candidate measured as its simulated time; the "
                                   "records go to a JSON database in --work-dir (docs/tuning.md).")
    p.add_argument("model", help=f"an .onnx file or a built-in model: {', '.join(MODELS)}")
    p.add_argument("--target", default="dsa/stcp920", help="DSA preset (default dsa/stcp920)")
    p.add_argument("--tiny", action="store_true", help="the built-in model's small configuration")
    p.add_argument("--batch", type=_positive, help="batch size of a built-in model")
    p.add_argument("--trials", type=_positive, default=64, help="measured candidates in all (default 64)")
    p.add_argument("--per-iter", type=_positive, default=16, help="candidates per search round (default 16)")
    p.add_argument("--work-dir", default="tune", help="where the JSON database goes (default ./tune)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=_tune)
