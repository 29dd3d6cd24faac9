"""Compile and simulation time of the tiny zoo models, flat MME model against TENET's (closed forms).

    python benchmarks/tenet_default.py                     # every model's --tiny configuration, dsa/stcp920
    python benchmarks/tenet_default.py --target dsa/set-edge16-fp16 --models resnet18 bert_base

What ``tvm-dsa run --tiny`` does, per model and MME cost model: compile for the DSA, then a
functional simulation (numbers computed, timing simulated, hazards checked). Each model is compiled
once per cost model (a static model's compilation does not cost MME instructions), then simulated
``--repeat`` times alternating the two, keeping the fastest (the machine is shared). Printed: the
seconds of each, the growth TENET brings to compile + simulate and to the simulation alone, and the
simulated cycles under each model.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from tvm_dsa import hardware
from tvm_dsa.harness import Compiled, import_onnx, load_model
from tvm_dsa.models import TINY, example_inputs


def mme_variant(target: str, model: str) -> str:
    """Register the chip of ``target`` with the MME cost ``model`` as ``<chip>-<model>``; its target tag."""
    hw = hardware.get(target.removeprefix("dsa/"))
    variant = dataclasses.replace(hw, name=f"{hw.name}-{model}", mme=dataclasses.replace(hw.mme, model=model))
    hardware.register(variant, override=True)
    return f"dsa/{variant.name}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="dsa/stcp920")
    p.add_argument("--models", nargs="*", default=list(TINY))
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    targets = {m: mme_variant(args.target, m) for m in ("flat", "tenet")}
    rows = [("model", "compile flat", "compile TENET", "simulate flat", "simulate TENET", "growth", "sim growth",
             "cycles flat", "cycles TENET", "ratio")]
    total = {"flat": [0.0, 0.0], "tenet": [0.0, 0.0]}
    for name in args.models:
        model = load_model(name, tiny=True)
        mod, inputs = import_onnx(model), example_inputs(model)
        compiled = {m: Compiled.build(mod, target, "layerwise") for m, target in targets.items()}
        best: dict[str, float] = {}
        cycles: dict[str, int] = {}
        for _ in range(args.repeat):
            for m in targets:
                print(f"... {name} on {targets[m]}", file=sys.stderr, flush=True)
                run = compiled[m].run(inputs)
                best[m], cycles[m] = min(best.get(m, float("inf")), run.seconds), run.report.cycles
        for m in targets:
            total[m][0] += compiled[m].seconds
            total[m][1] += best[m]
        cf, ct = compiled["flat"].seconds, compiled["tenet"].seconds
        rows.append((name, f"{cf:.2f}", f"{ct:.2f}", f"{best['flat']:.3f}", f"{best['tenet']:.3f}",
                     f"{(ct + best['tenet']) / (cf + best['flat']) - 1:+.1%}", f"{best['tenet'] / best['flat'] - 1:+.1%}",
                     f"{cycles['flat']:,}", f"{cycles['tenet']:,}", f"{cycles['tenet'] / cycles['flat']:.3f}"))
    (cf, sf), (ct, st) = total["flat"], total["tenet"]
    rows.append(("total", f"{cf:.2f}", f"{ct:.2f}", f"{sf:.3f}", f"{st:.3f}", f"{(ct + st) / (cf + sf) - 1:+.1%}",
                 f"{st / sf - 1:+.1%}", "", "", ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print(f"tiny models on {args.target}; compiled once, simulated fastest of {args.repeat}; seconds\n")
    for r in rows:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip())


if __name__ == "__main__":
    main()
