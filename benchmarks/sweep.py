"""The same sweep in this process and on a local Ray: wall time, speed-up and the cost Ray adds per
trial (issue 41; docs/dse.md, "Engine").

    python benchmarks/sweep.py                       # 8 tiny ResNet-18 chips, 64 invalid chips, 2 workers
    python benchmarks/sweep.py --model resnet50 --batch 8 --chips 4

Two sweeps, each run in-process and then on a local Ray of ``--workers`` CPUs (started before the
clock runs: its start is reported apart): ``--chips`` chips around stcp920 (the MME's rows and the
DDR bandwidth varied) that compile and run, and 64 chips whose LB holds no MME tile, which the
validator refuses at once: on them the wall time is Ray's cost of a task alone. Every row checks
that both engines gave the same results.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

from tvm_dsa import dse
from tvm_dsa.show.table import render_table

GRIDS = {  # chips that compile and run: the MME's rows x the DDR bandwidth
    4: {"mme.rows": [16, 32], "ddr_bytes_per_cycle": [64.0, 128.0]},
    8: {"mme.rows": [8, 16, 32, 64], "ddr_bytes_per_cycle": [64.0, 128.0]},
    16: {"mme.rows": [8, 16, 32, 64], "ddr_bytes_per_cycle": [32.0, 64.0, 128.0, 256.0]},
}


def timed(config: dse.SweepConfig, engine) -> tuple[float, list[dse.TrialResult]]:
    """Wall seconds of the sweep on ``engine`` from an empty journal, and its results."""
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        results = dse.sweep(config, engine, dse.Journal(Path(tmp) / "journal.jsonl"), lambda status: None)
        return time.perf_counter() - start, results


def same(a: list[dse.TrialResult], b: list[dse.TrialResult]) -> bool:
    """Equal results but for the compile time."""
    def strip(r):
        return dataclasses.replace(r, metrics={k: v for k, v in r.metrics.items() if k != "compile_seconds"})
    return [strip(r) for r in a] == [strip(r) for r in b]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet18")
    p.add_argument("--batch", type=int)
    p.add_argument("--full", action="store_true", help="the model's full size (default: tiny)")
    p.add_argument("--chips", type=int, default=8, choices=sorted(GRIDS))
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()

    sweeps = {f"{args.chips} chips": GRIDS[args.chips], "64 invalid chips": {"lb_bytes": list(range(16, 1040, 16))}}
    start = time.perf_counter()
    with dse.ray_engine(None, args.workers) as ray:
        ray_start = time.perf_counter() - start
        table = [("sweep", "trials", "in-process (s)", f"Ray, {ray.slots} CPUs (s)", "speed-up",
                  "per trial, in-process (ms)", "per trial, Ray (ms)", "same results")]
        for name, hw in sweeps.items():
            space = dse.parse_space({"base": "stcp920", "hardware": hw})
            config = dse.SweepConfig((args.model,), not args.full, args.batch, space)
            warm = dataclasses.replace(config, space=dse.parse_space({"base": "stcp920", "hardware": {
                "mme.rows": [24, 48]}}))
            for engine in (dse.InProcess("benchmark"), ray):  # TVM and the model imported before the clock runs
                timed(warm, engine)
            local, a = timed(config, dse.InProcess("benchmark"))
            remote, b = timed(config, ray)
            n = len(a)
            table.append((name, str(n), f"{local:.2f}", f"{remote:.2f}", f"{local / remote:.2f}x",
                          f"{local / n * 1e3:.1f}", f"{remote / n * 1e3:.1f}", str(same(a, b))))
    render_table(table, title=f"{args.model}{'' if args.full else ' (tiny)'}"
                              f"{f', batch {args.batch}' if args.batch else ''}: in-process vs a local Ray "
                              f"(started in {ray_start:.1f} s)")


if __name__ == "__main__":
    main()
