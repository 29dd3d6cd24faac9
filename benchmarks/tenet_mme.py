"""Per-layer MME cycles of a model, the flat MME model against the TENET-derived one.

    python benchmarks/tenet_mme.py                    # ResNet-18, batch 1, 224 x 224, on dsa/stcp920
    python benchmarks/tenet_mme.py --tiny             # the model's small configuration: a quick check
    python benchmarks/tenet_mme.py --target dsa/set-edge16-fp16 --model resnet50
    python benchmarks/tenet_mme.py --dataflow "output-stationary, systolic"   # tiles not overlapped

The model is compiled twice, for the chip with ``mme.model = "flat"`` and with ``"tenet"`` (registered
as ``<preset>-flat`` and ``<preset>-tenet``; the programs are the same, only the MME's cost differs),
and run timing-only. Printed per DSA kernel (one per layer with the layerwise schedule): its output shape,
MACs, the MME busy cycles (summed over the cores' MMEs) under each model, their ratio and the
MME's MAC utilisation under TENET; then the totals, the whole run's cycles, and how many distinct
tile shapes TENET counted and how long that took.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

from tvm_dsa import hardware
from tvm_dsa.dataflow.mme import cache_info
from tvm_dsa.driver import Compiled, check_target, import_onnx, load_model
from tvm_dsa.models import MODELS, example_inputs


def mme_variant(target: str, model: str, dataflow: str | None = None) -> str:
    """Register the chip of ``target`` with the MME cost ``model`` (and ``dataflow`` if given) as
    ``<chip>-<model>``; its target tag."""
    hw = hardware.get(target.removeprefix("dsa/"))
    mme = dataclasses.replace(hw.mme, model=model, dataflow=dataflow or hw.mme.dataflow)
    variant = dataclasses.replace(hw, name=f"{hw.name}-{model}", mme=mme)
    hardware.register(variant, override=True)
    return f"dsa/{variant.name}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet18", choices=list(MODELS))
    p.add_argument("--tiny", action="store_true", help="the model's small configuration")
    p.add_argument("--target", default="dsa/stcp920")
    p.add_argument("--dataflow", help="the MME's dataflow for TENET instead of the preset's, e.g. "
                                      "'output-stationary, systolic'")
    args = p.parse_args()

    model = load_model(args.model, tiny=args.tiny)
    check_target(args.target, model, timing_only=True)
    mod, inputs = import_onnx(model), example_inputs(model)
    runs = {}
    for name in ("flat", "tenet"):
        target = mme_variant(args.target, name, args.dataflow if name == "tenet" else None)
        print(f"... compiling and simulating (timing) for {target}", file=sys.stderr, flush=True)
        compiled = Compiled.build(mod, target)
        start = time.perf_counter()
        runs[name] = compiled.run(inputs, mode="timing", check_hazards=False)
        runs[name].seconds = time.perf_counter() - start
    mme = hardware.get(args.target.removeprefix("dsa/") + "-tenet").mme
    print(f"{args.model}{' (tiny)' if args.tiny else ''}, batch 1, on {args.target}: MME {mme.rows}x{mme.cols} "
          f"{mme.interconnect}, dataflow {mme.dataflow!r}; MME busy cycles summed over the cores\n")
    rows = [("layer (DSA kernel)", "output", "MACs", "flat", "TENET", "TENET/flat", "MAC util (TENET)")]
    flat_runs, tenet_runs = runs["flat"].kernels, runs["tenet"].kernels
    for f, t in zip(flat_runs, tenet_runs):
        if not f.report.macs:
            continue
        a, b = f.report.busy["mme"], t.report.busy["mme"]
        rows.append((f.name, "x".join(map(str, f.output_shapes[0])), f"{f.report.macs:,}", f"{a:,}", f"{b:,}",
                     f"{b / a:.3f}", f"{f.report.macs / (b * mme.rows * mme.cols):.1%}"))
    a, b = (sum(k.report.busy["mme"] for k in r) for r in (flat_runs, tenet_runs))
    macs = sum(k.report.macs for k in flat_runs)
    rows.append(("total", "", f"{macs:,}", f"{a:,}", f"{b:,}", f"{b / a:.3f}", f"{macs / (b * mme.rows * mme.cols):.1%}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip())
    info = cache_info()
    cf, ct = runs["flat"].report.cycles, runs["tenet"].report.cycles
    print(f"\nwhole run: {cf:,} cycles flat, {ct:,} TENET ({ct / cf:.3f}); simulation wall time "
          f"{runs['flat'].seconds:.1f} s flat, {runs['tenet'].seconds:.1f} s TENET, which counted "
          f"{info.misses} distinct tile shapes ({info.hits:,} cache hits)")


if __name__ == "__main__":
    main()
