"""Compile and simulation time of the tiny zoo models, flat MME model against TENET's (closed forms).

    python benchmarks/tenet_default.py                     # every model's --tiny configuration, dsa/stcp920
    python benchmarks/tenet_default.py --target dsa/set-edge16-fp16 --models resnet18 bert_base

What ``tvm-dsa run --tiny`` does, per model and MME cost model: compile for the DSA, then one
functional simulation (numbers computed, timing simulated, hazards checked). Each (model, cost model)
is measured ``--repeat`` times in alternation and the fastest kept (the machine is shared). Printed: the
seconds of each and the growth TENET brings, and the simulated cycles under each model.
"""

from __future__ import annotations

import argparse
import sys

from tenet_mme import mme_variant

from tvm_dsa.driver import Compiled, import_onnx, load_model
from tvm_dsa.models import TINY, example_inputs


def measure(mod, inputs, target: str) -> tuple[float, float, int]:
    """(compile seconds, simulation seconds, simulated cycles) of one compile and one functional run."""
    compiled = Compiled.build(mod, target)
    run = compiled.run(inputs)
    return compiled.seconds, run.seconds, run.report.cycles


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="dsa/stcp920")
    p.add_argument("--models", nargs="*", default=list(TINY))
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args()
    targets = {m: mme_variant(args.target, m) for m in ("flat", "tenet")}
    rows = [("model", "compile flat", "compile TENET", "simulate flat", "simulate TENET", "growth",
             "cycles flat", "cycles TENET", "ratio")]
    total = {"flat": 0.0, "tenet": 0.0}
    for name in args.models:
        model = load_model(name, tiny=True)
        mod, inputs = import_onnx(model), example_inputs(model)
        best = {}
        for _ in range(args.repeat):
            for m, target in targets.items():
                print(f"... {name} on {target}", file=sys.stderr, flush=True)
                c, s, cycles = measure(mod, inputs, target)
                old = best.get(m, (float("inf"), float("inf"), cycles))
                best[m] = (min(old[0], c), min(old[1], s), cycles)
        (cf, sf, yf), (ct, stt, yt) = best["flat"], best["tenet"]
        total["flat"] += cf + sf
        total["tenet"] += ct + stt
        rows.append((name, f"{cf:.2f}", f"{ct:.2f}", f"{sf:.3f}", f"{stt:.3f}",
                     f"{(ct + stt) / (cf + sf) - 1:+.1%}", f"{yf:,}", f"{yt:,}", f"{yt / yf:.3f}"))
    rows.append(("total (compile + simulate)", f"{total['flat']:.2f}", f"{total['tenet']:.2f}", "", "",
                 f"{total['tenet'] / total['flat'] - 1:+.1%}", "", "", ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print(f"tiny models on {args.target}, fastest of {args.repeat}; seconds\n")
    for r in rows:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip())


if __name__ == "__main__":
    main()
