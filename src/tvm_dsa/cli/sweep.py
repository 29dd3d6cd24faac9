"""``tvm-dsa sweep``: a design-space sweep (docs/dse.md) from the command line.

    tvm-dsa sweep resnet50 --batch 8 --space examples/space-stcp920.toml --out sweep.parquet --plot plots
    tvm-dsa sweep resnet18 bert_base --tiny --space space.toml --search optuna --samples 32 --objective edp
    tvm-dsa sweep resnet50 --batch 8 --space space.toml --address 10.0.0.1:6379   # on a Ray cluster

Runs each trial on Ray (a local Ray of ``--workers`` CPUs unless ``--address`` or ``RAY_ADDRESS``
names a cluster), or in this process without Ray or with ``--in-process``; shows trials done /
running / failed and the best so far on stderr; prints a table sorted by the objective (or
``--json``), writes ``--out`` and its journal (``<out>.journal.jsonl``: the same command run again
skips the trials it holds; Ctrl-C stops a sweep with exit code 130) and ``--plot`` the Pareto fronts
and the sensitivity per parameter.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from tvm_dsa.cli.args import add_ray_args, engine, model_title, positive_int, say
from tvm_dsa.dse import (
    OBJECTIVES, SEARCHES, Journal, Status, SweepConfig, TrialResult, load_space, sweep
)
from tvm_dsa.dse.results import check_out, pareto, rows, write
from tvm_dsa.dse.space import SCHEDULES
from tvm_dsa.harness import InputError, check_inputs, load_model
from tvm_dsa.models import MODELS
from tvm_dsa.show.sweep import SHOWN, AGAINST, format_value, label, plot_pareto, plot_sensitivity, varied
from tvm_dsa.show.table import render_table

JOURNAL = "sweep.journal.jsonl"  # without --out


def _sweep(args) -> int:
    if args.out:
        check_out(args.out)
    if args.plot and not Path(args.plot).resolve().parent.is_dir():
        raise InputError(f"cannot write plots to {args.plot}: its parent directory does not exist")
    config = _config(args)
    where = engine(args, "sweep")
    journal = Journal(f"{args.out}.journal.jsonl" if args.out else JOURNAL)
    say(f"sweep: {config.trials} trials ({config.search} over {config.space.size} points around "
         f"{config.space.base.name}, {len(config.models)} model(s)); journal {journal.path} "
         f"holds {len(journal.done)} trial(s)")
    try:
        with where as e:
            say(f"sweep: trials run {e.describe()}")
            with _Progress(config) as progress:
                results = sweep(config, e, journal, progress)
    except KeyboardInterrupt:
        say(f"tvm-dsa: sweep interrupted: {len(journal.done)} trial(s) in {journal.path}; the same command resumes")
        return 130
    if args.out:
        write(results, config.objective, args.out)
    plots = _plots(results, config, args) if args.plot else []
    if args.json:
        print(json.dumps({"models": list(config.models), "tiny": config.tiny, "batch": config.batch,
                          "base": config.space.base.name, "search": config.search, "objective": config.objective,
                          "seed": config.seed, "out": args.out, "journal": str(journal.path), "plots": plots,
                          "trials": rows(results, config.objective)}, indent=1))
    else:
        _table(results, config)
        for path in [args.out, *plots]:
            if path:
                print(f"written: {path}")
    return 0


def _config(args) -> SweepConfig:
    """The sweep the arguments ask for; an InputError for a bad space file, model or combination."""
    space = load_space(args.space)
    if args.schedule:
        space = space.with_schedules(args.schedule)
    if args.search == "grid" and args.samples:
        raise InputError("--samples goes with --search random or optuna; a grid runs every point")
    if args.search != "grid" and not args.samples:
        raise InputError(f"--search {args.search} needs --samples N (trials per model)")
    if args.search == "optuna":
        try:
            import optuna  # noqa: F401
        except ImportError:
            raise InputError("--search optuna needs optuna: pip install 'tvm-dsa[dse]'") from None
    for m in dict.fromkeys(args.model):  # a model that cannot be loaded stops the sweep before a trial runs
        check_inputs(load_model(m, tiny=args.tiny, batch=args.batch))
    return SweepConfig(tuple(dict.fromkeys(args.model)), args.tiny, args.batch, space, args.search, args.samples,
                       args.objective, args.seed)


class _Progress:
    """Trials done / running / failed and the best so far on stderr: one live line on a terminal
    (its clock ticks from the first second, while a trial runs), a line per finished trial otherwise."""

    def __init__(self, config: SweepConfig):
        self.config, self.start, self.status, self.live, self.shown = config, time.monotonic(), None, None, -1

    def __enter__(self):
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.live import Live

            self.live = Live(self, console=Console(stderr=True), refresh_per_second=2, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc):
        if self.live:
            self.live.__exit__(*exc)

    def __call__(self, status: Status) -> None:
        self.status = status
        if self.live is None and status.done != self.shown:
            self.shown = status.done
            say(self.line())

    def __rich__(self):
        from rich.text import Text

        return Text(self.line())  # as it is: a mesh's "[8, 4]" is no markup

    def line(self) -> str:
        s = self.status
        if s is None:
            return f"[{time.monotonic() - self.start:4.0f} s] starting"
        text = (f"[{time.monotonic() - self.start:4.0f} s] {s.done}/{s.total} done"
                + (f" ({s.resumed} from the journal)" if s.resumed else "")
                + f", {s.running} running, {s.failed} failed, {s.invalid} invalid")
        if s.best:
            text += (f"; best {self.config.objective} {_objective(s.best, self.config.objective)}: "
                     f"{_model(s.best)} {label(s.best, self.config.space.axes)}")
        return text


def _objective(r: TrialResult, objective: str) -> str:
    _, unit, scale = SHOWN[objective]
    return f"{r.objective(objective) * scale:.4g} {unit}"


def _model(r: TrialResult) -> str:
    return r.model + (" (tiny)" if r.tiny else "") + (f", batch {r.batch}" if r.batch else "")


def _table(results: list[TrialResult], config: SweepConfig) -> None:
    """The trials, per model best first by the objective (those that did not run last, with why);
    ``front`` marks each model's latency-energy Pareto front."""
    front = {r.key for m in config.models for r in pareto([r for r in results if r.model == m], "seconds",
                                                          "energy_joules")}
    fields = [f for a in config.space.axes for f in a.fields]
    order = sorted(range(len(results)), key=lambda i: (config.models.index(results[i].model),
                                                      results[i].objective(config.objective) is None,
                                                      results[i].objective(config.objective) or 0.0, i))
    table = [("#", *(["model"] if len(config.models) > 1 else []), *fields, "compiled", "latency (us)",
              "energy (uJ)", "EDP (J*s)", "area (mm2)", "% roofline", "MME util", "DDR (MB)", "compile (s)", "front",
              "status")]
    for i in order:
        r, m = results[i], results[i].metrics
        cells = [str(i), *([r.model] if len(config.models) > 1 else []), *(format_value(f, r.params[f]) for f in fields)]
        if r.status == "ok":
            cells += [r.schedule, f"{m['seconds'] * 1e6:,.1f}", f"{m['energy_joules'] * 1e6:,.1f}",
                      f"{m['seconds'] * m['energy_joules']:.3e}", f"{m['area_mm2']:.1f}", f"{m['roofline_fraction']:.1%}",
                      f"{m['mme_mac_utilisation']:.1%}", f"{m['ddr_burst_bytes'] / 1e6:.2f}",
                      f"{m['compile_seconds']:.1f}", "*" if r.key in front else "", "ok"]
        else:
            cells += [""] * 10 + [f"{r.status}: {r.message}"]
        table.append(tuple(cells))
    model = ", ".join(config.models) + (" (tiny)" if config.tiny else "") + (
        f", batch {config.batch}" if config.batch else "")
    render_table(table, title=f"{model} around {config.space.base.name}: {len(results)} trials ({config.search}), "
                              f"best {config.objective} first")


def _plots(results: list[TrialResult], config: SweepConfig, args) -> list[str]:
    """Per model: the Pareto fronts of latency against energy and against area, and the sensitivity
    of the objective to each parameter, in ``args.plot``. Returns the files written."""
    out = Path(args.plot)
    out.mkdir(exist_ok=True)
    files = []
    for model in config.models:
        mine = [r for r in results if r.model == model]
        if not any(r.status == "ok" for r in mine):
            say(f"sweep: no trial of {model} ran: no plots of it")
            continue
        built = load_model(model, tiny=config.tiny, batch=config.batch)  # its batch, where --batch is not given
        title = f"{model_title(model, config.tiny, built)} around {config.space.base.name}"
        stem = Path(model).stem
        for against in AGAINST:
            path = out / f"pareto-{against.split('_')[0]}-{stem}.png"
            plot_pareto(mine, against, config.space.axes, path, f"{title}: latency vs {against.split('_')[0]}")
            files.append(str(path))
        if not varied(config.space.axes):
            continue
        path = out / f"sensitivity-{stem}.png"
        plot_sensitivity(mine, config.space.axes, config.objective, path,
                         f"{title}: {config.objective} per parameter ({config.search}, {len(mine)} trials)")
        files.append(str(path))
    return files


def add_parser(sub) -> None:
    p = sub.add_parser("sweep", help="sweep chips and compiler choices around a base chip (design-space exploration)",
                       description="Compile and simulate (timing mode) MODEL on each chip of a space around a base "
                                   "chip (docs/dse.md), as Ray tasks or in this process; a table by the objective, "
                                   "the results as JSON or parquet, Pareto and sensitivity plots. Trials done go "
                                   "to a journal: the same command run again skips them.")
    p.add_argument("model", nargs="+", help=f"built-in models ({', '.join(MODELS)}) or .onnx files")
    p.add_argument("--space", required=True, help="the space file (TOML, docs/dse.md)")
    p.add_argument("--schedule", action="append", choices=SCHEDULES,
                   help="the schedules to sweep, instead of the space's (repeat for several)")
    p.add_argument("--tiny", action="store_true", help="the built-in models' small configuration")
    p.add_argument("--batch", type=positive_int, help="batch size of built-in models")
    p.add_argument("--search", choices=SEARCHES, default="grid",
                   help="every point (grid, the default), --samples random points, or Optuna's TPE")
    p.add_argument("--samples", type=positive_int, help="trials per model of a random or optuna search")
    p.add_argument("--objective", choices=OBJECTIVES, default="latency",
                   help="what the table sorts by and optuna minimises (default latency)")
    p.add_argument("--seed", type=int, default=0)
    add_ray_args(p, "trials")
    p.add_argument("--out", help="the results: a .json or .parquet file (its journal beside it)")
    p.add_argument("--plot", metavar="DIR", help="write the Pareto and sensitivity plots (PNG) to DIR")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=_sweep)
