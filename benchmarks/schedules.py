"""Each schedule's cycles per model and chip, and the one the pipeline's default keeps (issue 39).

    python benchmarks/schedules.py                                       # the seven models, both mesh presets, batch 1
    python benchmarks/schedules.py --chips stcp920 --models resnet50 --batch 8
    python benchmarks/schedules.py --tiny                                # a quick check of the script

Each workload (``graphturbo.WORKLOADS``) is compiled with every schedule the chip takes
(``layerwise``, ``graphturbo``, and ``set`` on a mesh) and run once in timing mode. Printed per
model and chip: each schedule's cycles and the fastest's share of the model's roofline, then the
schedule ``schedule="auto"`` kept (its compile times the candidates ``choose_schedule`` names)
and whether it is the fastest measured. Long: set compiles take up to minutes on set-cloud144.
"""

from __future__ import annotations

import argparse

from graphturbo import WORKLOADS, _step, _table, load_workload
from tvm_dsa import hardware
from tvm_dsa.harness import Compiled, import_onnx
from tvm_dsa.models import example_inputs

SEVEN = [w for w in WORKLOADS if w not in ("bert-256", "bert-384", "bert-512")]
MESH = ["set-edge16-fp16", "set-cloud144-fp16"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=SEVEN, choices=list(WORKLOADS))
    ap.add_argument("--chips", nargs="+", default=MESH, help="presets (default: the two float mesh presets)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--tiny", action="store_true", help="the models' small configurations")
    args = ap.parse_args()
    names = ["layerwise", "graphturbo", "set"]
    rows = []
    for chip in args.chips:
        mesh = hardware.get(chip).interconnect == "mesh"
        for label in args.models:
            model = load_workload(label, args.batch, args.tiny)
            mod, inputs = import_onnx(model), example_inputs(model)
            cycles, fraction = {}, {}
            for name in names if mesh else names[:2]:
                _step(f"{label} on {chip}: {name}")
                report = Compiled.build(mod, f"dsa/{chip}", schedule=name).run(
                    inputs, mode="timing", check_hazards=False).report
                cycles[name], fraction[name] = report.cycles, report.roofline_fraction
            _step(f"{label} on {chip}: auto")
            kept = Compiled.build(mod, f"dsa/{chip}").offload.schedule
            fastest = min(cycles, key=cycles.get)
            rows.append([chip, label] + [f"{cycles[n]:,}" if n in cycles else "-" for n in names]
                        + [f"{fastest} ({fraction[fastest]:.1%})", kept, "yes" if kept == fastest else "NO"])
    _table(f"cycles per schedule, batch {args.batch}{' (tiny)' if args.tiny else ''}",
           ["chip", "model", *names, "fastest (% of roofline)", "auto kept", "auto fastest"], rows)


if __name__ == "__main__":
    main()
