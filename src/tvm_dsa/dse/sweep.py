"""A sweep: which trials a search runs (the grid, a seeded random sample, or Optuna's TPE asking in
fixed batches), each done once: a journal holds every finished trial, so a sweep run again skips
what it has (an interrupted sweep resumes) and gives the same results for the same seed, in this
process or on Ray.

    config = SweepConfig(("resnet18",), tiny=True, batch=None, space=load_space("space.toml"))
    results = sweep(config, InProcess(), Journal("sweep.journal.jsonl"), progress=print)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tvm_dsa.dse.space import Space
from tvm_dsa.dse.trial import TrialResult, TrialSpec

SEARCHES = ("grid", "random", "optuna")
# Optuna's trials asked per round, whatever the engine's width: the sampler sees the same history, in
# the same order, in this process and on any cluster, so a seed gives the same trials.
OPTUNA_BATCH = 4


@dataclass(frozen=True)
class SweepConfig:
    """What to sweep: the models (at ``batch``; ``tiny``), the space, the search and its trials per
    model (``samples``: random and optuna), the objective to minimise and the seed."""

    models: tuple[str, ...]
    tiny: bool
    batch: int | None
    space: Space
    search: str = "grid"
    samples: int | None = None
    objective: str = "latency"
    seed: int = 0

    def spec(self, model: str, point: dict) -> TrialSpec:
        return TrialSpec(model, self.tiny, self.batch, self.space.base.to_dict(), tuple(point.items()))

    @property
    def trials(self) -> int:
        """Trials the sweep runs in all."""
        per_model = {"grid": self.space.size, "random": min(self.samples or 0, self.space.size)}
        return per_model.get(self.search, self.samples or 0) * len(self.models)


@dataclass
class Status:
    """Where a sweep is, for its progress display: trials done (``resumed`` of them from the
    journal; ``failed`` and ``invalid`` among them), running, and the best by the objective."""

    total: int
    objective: str
    done: int = 0
    resumed: int = 0
    running: int = 0
    failed: int = 0
    invalid: int = 0
    best: TrialResult | None = None
    last: TrialResult | None = None

    def record(self, result: TrialResult, resumed: bool = False) -> None:
        self.done += 1
        self.resumed += resumed
        self.failed += result.status in ("failed", "lost")
        self.invalid += result.status == "invalid"
        self.last = result
        value = result.objective(self.objective)
        if value is not None and (self.best is None or value < self.best.objective(self.objective)):
            self.best = result


class Journal:
    """Finished trials, one JSON line each, appended (and flushed) as each finishes; a line cut by
    an interruption is ignored, and so is a trial whose worker died (``lost``: a resumed sweep
    runs it again; two of a 108-chip ResNet-50 sweep were killed by Ray's out-of-memory monitor
    while other jobs filled the machine)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.done: dict[str, TrialResult] = {}
        if self.path.is_file():
            for line in self.path.read_text().splitlines():
                try:
                    result = TrialResult.from_dict(json.loads(line))
                except (ValueError, TypeError):
                    continue
                if result.status != "lost":
                    self.done[result.key] = result

    def add(self, result: TrialResult) -> None:
        self.done[result.key] = result
        with self.path.open("a") as f:
            f.write(json.dumps(result.to_dict()) + "\n")


@dataclass
class _Runner:
    """Runs specs on an engine, each key once, through the journal, keeping the status."""

    engine: object
    journal: Journal
    status: Status
    progress: Callable[[Status], None]
    results: dict = field(default_factory=dict)

    def run(self, specs: list[TrialSpec]) -> list[TrialResult]:
        todo, again = {}, []
        for s in specs:
            if s.key in self.journal.done:
                self.status.record(self.journal.done[s.key], resumed=True)
            elif s.key in todo:
                again.append(s)  # a point asked twice runs once
            else:
                todo[s.key] = s
        self.progress(self.status)
        for result in self.engine.run(list(todo.values()), self._running):
            self.journal.add(result)
            self.status.record(result)
            self.progress(self.status)
        for s in again:
            self.status.record(self.journal.done[s.key], resumed=True)
        self._running(0)
        return [self.journal.done[s.key] for s in specs]

    def _running(self, n: int) -> None:
        self.status.running = n
        self.progress(self.status)


def sweep(config: SweepConfig, engine, journal: Journal, progress: Callable[[Status], None]) -> list[TrialResult]:
    """Every trial of the sweep, in the search's order (per model, the points as asked), run on
    ``engine`` where ``journal`` does not have it; ``progress`` is called with the status as it
    changes, first before any trial runs."""
    runner = _Runner(engine, journal, Status(config.trials, config.objective), progress)
    if config.search == "optuna":
        return [r for m in config.models for r in _optuna(config, m, runner)]
    space = config.space
    points = space.grid() if config.search == "grid" else space.sample(config.samples, config.seed)
    return runner.run([config.spec(m, p) for m in config.models for p in points])


def _optuna(config: SweepConfig, model: str, runner: _Runner) -> list[TrialResult]:
    """``config.samples`` trials of ``model`` asked of Optuna's TPE sampler (seeded) in rounds of
    ``OPTUNA_BATCH``; each axis is a categorical choice of its values' index."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=config.seed))
    axes, out = config.space.axes, []
    while len(out) < config.samples:
        asked = [study.ask() for _ in range(min(OPTUNA_BATCH, config.samples - len(out)))]
        points = [{k: v for a in axes for k, v in a.assign(t.suggest_categorical(a.name, list(range(len(a.values))))).items()}
                  for t in asked]
        results = runner.run([config.spec(model, p) for p in points])
        for trial, result in zip(asked, results):
            value = result.objective(config.objective)
            study.tell(trial, value, state=None if value is not None else optuna.trial.TrialState.FAIL)
        out += results
    return out
