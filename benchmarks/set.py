"""SET vs LS vs LP (seed 002 §5): latency, energy and EDP of the best tree each search finds.

    python benchmarks/set.py                                   # ResNet-50, both presets, batch 1/8/64
    python benchmarks/set.py --models resnet50 bert_base --beta 20
    python benchmarks/set.py --presets set-edge16 --batches 1 --objective delay --save trees/

All three schemes come from one simulated-annealing engine (``schedule.set.search``): SET over all
trees, LS over trees whose depth-one cuts are T-cuts, LP over depth-one S-cuts. The objective is
the preset's (edge E²D, cloud ED²) unless ``--objective`` says otherwise. Prints one row per
(model, preset, batch, scheme), then SET's ratios to LS and LP and their averages.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import tvm_dsa  # noqa: F401  (registers the presets)
from tvm_dsa import hardware
from tvm_dsa.models import MODELS, get_model
from tvm_dsa.schedule.set import Evaluator, LayerGraph
from tvm_dsa.schedule.set.ops import LP, LS, SET
from tvm_dsa.schedule.set.search import Anneal, anneal

PRESET_OBJECTIVE = {"set-edge16": "e2d", "set-cloud144": "ed2"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["resnet50"], choices=sorted(MODELS))
    ap.add_argument("--presets", nargs="+", default=["set-edge16", "set-cloud144"])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8, 64])
    ap.add_argument("--objective", default="preset", help="preset (E²D edge, ED² cloud), delay, edp, e2d, ed2")
    ap.add_argument("--beta", type=float, default=100.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save", type=Path, help="directory for each best tree as .txt and .json")
    args = ap.parse_args()

    print(f"{'model':<10} {'preset':<13} {'batch':>5} {'scheme':<4} {'latency(cyc)':>13} {'energy(mJ)':>11} "
          f"{'EDP(J*s)':>10} {'DRAM(MB)':>9} {'iters':>6} {'search(s)':>9}  tree")
    ratios = []
    for model in args.models:
        t = time.perf_counter()
        graph = LayerGraph.from_onnx(get_model(model))
        print(f"# {model}: {len(graph)} layers, graph built in {time.perf_counter() - t:.1f} s")
        for preset in args.presets:
            hw = hardware.get(preset)
            objective = PRESET_OBJECTIVE[preset] if args.objective == "preset" else args.objective
            ev = Evaluator(graph, hw)
            for batch in args.batches:
                found = {}
                for space in (SET, LS, LP):
                    r = anneal(graph, hw, batch, Anneal(beta=args.beta, objective=objective, seed=args.seed,
                                                         space=space), evaluator=ev)
                    e = r.evaluation
                    found[space.name] = e
                    text = r.tree.text(graph)
                    if args.save:
                        args.save.mkdir(parents=True, exist_ok=True)
                        stem = args.save / f"{model}-{preset}-b{batch}-{space.name}"
                        stem.with_suffix(".txt").write_text(text + "\n")
                        stem.with_suffix(".json").write_text(json.dumps(r.tree.to_json(graph), indent=1))
                    print(f"{model:<10} {preset:<13} {batch:>5} {space.name.upper():<4} {e.latency:>13.0f} "
                          f"{e.joules * 1e3:>11.3f} {e.edp:>10.3e} {e.dram_bytes / 1e6:>9.2f} {r.iterations:>6} "
                          f"{r.seconds:>9.1f}  {text[:70]}{'...' if len(text) > 70 else ''}", flush=True)
                s, ls, lp = found["set"], found["ls"], found["lp"]
                ratios.append((model, preset, batch, objective, s.latency / ls.latency, s.latency / lp.latency,
                               s.joules / ls.joules, s.joules / lp.joules))
    print(f"\n{'model':<10} {'preset':<13} {'batch':>5} {'objective':<9} {'lat SET/LS':>10} {'lat SET/LP':>10} "
          f"{'E SET/LS':>9} {'E SET/LP':>9}")
    for model, preset, batch, objective, *r in ratios:
        print(f"{model:<10} {preset:<13} {batch:>5} {objective:<9} " + " ".join(f"{x:>9.3f} " for x in r))
    n = len(ratios)
    speedup_lp = sum(1 / r[5] for r in ratios) / n
    saving_lp = 1 - sum(r[7] for r in ratios) / n
    print(f"\naverage over {n} cases: SET is {speedup_lp:.2f}x faster than LP and uses {100 * saving_lp:.1f} % "
          f"less energy; {sum(1 / r[4] for r in ratios) / n:.2f}x faster than LS, "
          f"{100 * (1 - sum(r[6] for r in ratios) / n):.1f} % less energy")


if __name__ == "__main__":
    main()
