"""Per-layer MME cycles of a model, the flat MME model against the TENET-derived one.

    python benchmarks/tenet_mme.py                    # ResNet-18, batch 1, 224 x 224, on dsa/stcp920
    python benchmarks/tenet_mme.py --tiny             # the model's small configuration: a quick check
    python benchmarks/tenet_mme.py --target dsa/set-edge16-fp16 --model resnet50
    python benchmarks/tenet_mme.py --dataflow "output-stationary, systolic"   # tiles not overlapped

The model is compiled once for the chip, as ``target="dsa/<chip>"`` compiles it (with the chip's shipped
tuning records), and run timing-only; then each DSA kernel's program is simulated again (timing) with the
chip's ``mme.model`` set to "flat" and to "tenet" (and ``--dataflow`` if given): the programs are the same,
only the MME's cost differs. Printed per DSA kernel (one per layer with the layerwise schedule): its output
shape, MACs, the MME busy cycles (summed over the cores' MMEs) under each model, their ratio and the MME's
MAC utilisation under TENET; then the totals, the whole run's cycles (the kernels' sum) and the number of
distinct tile shapes.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

from tvm_dsa import hardware
from tvm_dsa.harness.dataflow_choice import mme_products
from tvm_dsa.harness import Compiled, check_target, import_onnx, load_model
from tvm_dsa.isa.program import Program
from tvm_dsa.models import MODELS, example_inputs
from tvm_dsa.runtime import simulate


def with_mme(program: Program, **fields) -> Program:
    """``program`` for the same chip with its MME's ``fields`` (``model``, ``dataflow``) replaced."""
    return dataclasses.replace(program, hardware={**program.hardware, "mme": {**program.hardware["mme"], **fields}})


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
    print(f"... compiling and simulating (timing) for {args.target}", file=sys.stderr, flush=True)
    kernels = Compiled.build(import_onnx(model), args.target, "layerwise").run(example_inputs(model), mode="timing",
                                                                  check_hazards=False).kernels
    hw = hardware.get(args.target.removeprefix("dsa/"))
    mme = dataclasses.replace(hw.mme, model="tenet", dataflow=args.dataflow or hw.mme.dataflow)
    models = {"flat": {"model": "flat"}, "tenet": {"model": "tenet", "dataflow": mme.dataflow}}
    reports, seconds = {}, {}
    for name, fields in models.items():
        start = time.perf_counter()
        reports[name] = [simulate(with_mme(k.program, **fields), mode="timing", check_hazards=False).report
                         for k in kernels]
        seconds[name] = time.perf_counter() - start
    print(f"{args.model}{' (tiny)' if args.tiny else ''}, batch 1, on {args.target}: MME {mme.rows}x{mme.cols} "
          f"{mme.interconnect}, dataflow {mme.dataflow!r}; MME busy cycles summed over the cores\n")
    rows = [("layer (DSA kernel)", "output", "MACs", "flat", "TENET", "TENET/flat", "MAC util (TENET)")]
    for k, f, t in zip(kernels, reports["flat"], reports["tenet"]):
        if not f.macs:
            continue
        a, b = f.busy["mme"], t.busy["mme"]
        rows.append((k.name, "x".join(map(str, k.output_shapes[0])), f"{f.macs:,}", f"{a:,}", f"{b:,}",
                     f"{b / a:.3f}", f"{f.macs / (b * mme.rows * mme.cols):.1%}"))
    a, b = (sum(r.busy["mme"] for r in reports[m]) for m in models)
    macs = sum(r.macs for r in reports["flat"])
    rows.append(("total", "", f"{macs:,}", f"{a:,}", f"{b:,}", f"{b / a:.3f}", f"{macs / (b * mme.rows * mme.cols):.1%}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip())
    shapes = len(mme_products(k.program for k in kernels))
    cf, ct = (sum(r.cycles for r in reports[m]) for m in models)
    print(f"\nwhole run: {cf:,} cycles flat, {ct:,} TENET ({ct / cf:.3f}); simulation wall time "
          f"{seconds['flat']:.1f} s flat, {seconds['tenet']:.1f} s TENET; {shapes} distinct tile shapes (M x N x K)")


if __name__ == "__main__":
    main()
