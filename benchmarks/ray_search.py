"""Tuning and SET's restarts in this process and on a local Ray: wall time, speed-up, the cost Ray
adds per task, and whether both gave the same records / trees (issue 41; docs/tuning.md, docs/set.md).

    python benchmarks/ray_search.py                          # tiny ResNet-18: 4 trials per kernel, 8 restarts
    python benchmarks/ray_search.py --model resnet50 --trials 8 --restarts 4 --batch 8

Each is run in-process and then on a local Ray of ``--workers`` CPUs (started before the clock runs:
its start is reported apart), after a warm-up on both that pays meta-schedule's first use and the
Ray workers' imports. Tuning on Ray builds and simulates each round's candidates as Ray tasks; the
search stays in this process (docs/tuning.md, "On Ray").
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import tvm_dsa
from tvm_dsa import dse, hardware
from tvm_dsa.harness import import_onnx, layer_graph, load_model
from tvm_dsa.schedule.set.ops import LP, LS, SET
from tvm_dsa.schedule.set.search import Anneal, anneal_each
from tvm_dsa.show.table import render_table


def timed_tune(mod, target: str, trials: int, on_ray: bool) -> tuple[float, list, int]:
    """Wall seconds of tuning ``mod`` from an empty database, its records and candidates measured."""
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        result = tvm_dsa.tune(mod, target, trials=trials, work_dir=tmp, on_ray=on_ray)
        seconds = time.perf_counter() - start
        records = [json.loads(line) for line in (Path(tmp) / "database_tuning_record.json").read_text().splitlines()]
        return seconds, records, sum(t.trials for t in result.tasks)


def timed_restarts(graph, hw, batch: int, configs: list[Anneal], on_ray: bool) -> tuple[float, list]:
    start = time.perf_counter()
    results = anneal_each(graph, hw, batch, configs, on_ray)
    return time.perf_counter() - start, [(r.tree, r.cost) for r in results]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet18")
    p.add_argument("--full", action="store_true", help="the model's full size (default: tiny)")
    p.add_argument("--target", default="dsa/stcp920", help="the chip tuned for (default dsa/stcp920)")
    p.add_argument("--set-target", default="dsa/set-edge16", help="the chip SET searches (default dsa/set-edge16)")
    p.add_argument("--trials", type=int, default=4, help="tuning trials per kernel (default 4)")
    p.add_argument("--restarts", type=int, default=8, help="SET restarts per scheme (default 8)")
    p.add_argument("--beta", type=float, default=20.0, help="SET search effort (default 20)")
    p.add_argument("--batch", type=int, default=1, help="the batch SET schedules (default 1)")
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()

    model = load_model(args.model, tiny=not args.full)
    mod, graph, set_hw = import_onnx(model), layer_graph(model), hardware.get(args.set_target)
    configs = [Anneal(beta=args.beta, seed=s, space=space) for space in (SET, LS, LP) for s in range(args.restarts)]
    start = time.perf_counter()
    with dse.ray_engine(None, args.workers) as ray:
        ray_start = time.perf_counter() - start
        for on_ray in (False, True):  # meta-schedule's first use, the workers' imports: before the clock runs
            timed_tune(mod, args.target, 1, on_ray)
            timed_restarts(graph, set_hw, args.batch, configs[:2], on_ray)
        table = [("work", "tasks", "in-process (s)", f"Ray, {ray.slots} CPUs (s)", "speed-up",
                  "Ray - in-process, per task (ms)", "same results")]
        local, a, n = timed_tune(mod, args.target, args.trials, False)
        remote, b, _ = timed_tune(mod, args.target, args.trials, True)
        table.append((f"tune, {args.trials} trials per kernel", str(n), f"{local:.2f}", f"{remote:.2f}",
                      f"{local / remote:.2f}x", f"{(remote - local) / n * 1e3:.1f}", str(a == b)))
        local, a = timed_restarts(graph, set_hw, args.batch, configs, False)
        remote, b = timed_restarts(graph, set_hw, args.batch, configs, True)
        table.append((f"SET / LS / LP, {args.restarts} restarts each", str(len(configs)), f"{local:.2f}",
                      f"{remote:.2f}", f"{local / remote:.2f}x", f"{(remote - local) / len(configs) * 1e3:.1f}",
                      str(a == b)))
    render_table(table, title=f"{args.model}{'' if args.full else ' (tiny)'}: in-process vs a local Ray "
                              f"(started in {ray_start:.1f} s); SET at batch {args.batch}, beta {args.beta:g}")


if __name__ == "__main__":
    main()
