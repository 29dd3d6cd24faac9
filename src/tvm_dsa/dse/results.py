"""A sweep's results as data: flat rows (one per trial: the point's fields, the status, the metrics),
the Pareto front of two metrics, and the output file (JSON, or parquet for pandas).

    rows(results, "latency")            # [{"trial": 0, "model": ..., "mme.rows": 32, ..., "cycles": ...}]
    pareto(results, "seconds", "energy_joules")
    write(results, "latency", "sweep.parquet")
"""

from __future__ import annotations

import json
from pathlib import Path

from tvm_dsa.dse.trial import TrialResult
from tvm_dsa.harness import InputError

FORMATS = (".json", ".parquet")


def rows(results: list[TrialResult], objective: str) -> list[dict]:
    """A flat dict per trial, in the sweep's order: its index, model, the point's fields, chip,
    status and message, the schedule compiled, the metrics and the objective's value."""
    return [{"trial": i, "model": r.model, "batch": r.batch, "tiny": r.tiny, **r.params, "chip": r.chip,
             "status": r.status, "message": r.message, "compiled_schedule": r.schedule, **r.metrics,
             "objective": r.objective(objective)} for i, r in enumerate(results)]


def pareto(results: list[TrialResult], x: str, y: str) -> list[TrialResult]:
    """The trials that ran and that no other beats on both metrics ``x`` and ``y`` (lower is
    better), by increasing ``x``; of trials with equal values, the first."""
    ok = sorted((r for r in results if r.status == "ok"), key=lambda r: (r.metrics[x], r.metrics[y]))
    front, best_y = [], float("inf")
    for r in ok:
        if r.metrics[y] < best_y:
            front.append(r)
            best_y = r.metrics[y]
    return front


def check_out(path: str) -> None:
    """An ``InputError`` unless the results can be written to ``path``: a .json or .parquet file
    (parquet needs pandas and pyarrow) in a directory that exists."""
    p = Path(path)
    if p.suffix not in FORMATS:
        raise InputError(f"cannot write the results to {path}: use a .json or .parquet file")
    if not p.resolve().parent.is_dir():
        raise InputError(f"cannot write the results to {path}: its directory does not exist")
    if p.suffix == ".parquet":
        try:
            import pandas  # noqa: F401
            import pyarrow  # noqa: F401
        except ImportError:
            raise InputError("parquet needs pandas and pyarrow: pip install 'tvm-dsa[dse]', or write .json") from None


def write(results: list[TrialResult], objective: str, path: str) -> None:
    """The rows as a JSON list, or a parquet table (a column per key)."""
    table = rows(results, objective)
    if Path(path).suffix == ".parquet":
        import pandas as pd

        pd.DataFrame(table).to_parquet(path)
    else:
        Path(path).write_text(json.dumps(table, indent=1))
