"""Compile time of the ``dsa`` schedules next to TVM's llvm build (seed 000 Table 4).

    python benchmarks/compile_time.py                            # the seven models, full size, batch 8
    python benchmarks/compile_time.py --models resnet50 --batch 1 --reps 5
    python benchmarks/compile_time.py --tiny --reps 1           # a quick check of the script

Each workload is imported once and compiled ``--reps`` times by each of llvm, ``layerwise`` and
``graphturbo`` (as ``relax_pipeline="dsa"`` compiles it: the ablation's last row), in turn; the
table keeps each one's fastest run (the machine is shared and noisy: the minimum is the least
disturbed) and the ratios to llvm, with their geometric means.
"""

from __future__ import annotations

import argparse
import math
import time

from graphturbo import VARIANTS, WORKLOADS, _step, _table, load_workload

from tvm_dsa import hardware
from tvm_dsa.harness import Compiled, import_onnx

DEFAULT = ["resnet50", "bert-128", "mobilenet_v2", "vit_b16", "densenet121", "conformer", "dlrm"]


def seconds(mod, target: str, schedule: str = "layerwise", options=None) -> float:
    """Wall time of one build (``Compiled.build`` gives a non-DSA target TVM's default pipeline)."""
    start = time.perf_counter()
    Compiled.build(mod, target, schedule=schedule, options=options)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", choices=sorted(WORKLOADS), default=DEFAULT)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--target", default="dsa/stcp920")
    args = p.parse_args()
    if args.reps < 1:
        p.error("--reps must be at least 1")
    hardware.init()
    _, gt_schedule, gt_options = VARIANTS[-1]
    rows, ratios = [], {"layerwise": [], "graphturbo": []}
    for label in args.models:
        _step(f"{label} batch {args.batch}")
        mod = import_onnx(load_workload(label, args.batch, args.tiny))
        runs: dict = {"llvm": [], "layerwise": [], "graphturbo": []}
        for _ in range(args.reps):
            runs["llvm"].append(seconds(mod, "llvm"))
            runs["layerwise"].append(seconds(mod, args.target))
            runs["graphturbo"].append(seconds(mod, args.target, gt_schedule, gt_options))
        best = {k: min(v) for k, v in runs.items()}
        for k in ratios:
            ratios[k].append(best[k] / best["llvm"])
        rows.append([label, f"{best['llvm']:.1f}", f"{best['layerwise']:.1f}", f"{best['graphturbo']:.1f}",
                     f"{best['layerwise'] / best['llvm']:.2f}x", f"{best['graphturbo'] / best['llvm']:.2f}x"])
    geo = {k: math.exp(sum(map(math.log, v)) / len(v)) for k, v in ratios.items()}
    rows.append(["geo-mean", "", "", "", f"{geo['layerwise']:.2f}x", f"{geo['graphturbo']:.2f}x"])
    size = "tiny" if args.tiny else "full size"
    _table(f"Compile time, seconds ({size}, batch {args.batch}, fastest of {args.reps}; Table 4)",
           ["model", "llvm", "layerwise", "graphturbo", "lw / llvm", "gt / llvm"], rows)


if __name__ == "__main__":
    main()
