"""GraphTurbo against layerwise on the simulated chip (seed 000 §5): throughput, ablation, memory.

    python benchmarks/graphturbo.py                          # all models, full size, batch 8 (long)
    python benchmarks/graphturbo.py --models resnet50 --batch 8
    python benchmarks/graphturbo.py --tiny                   # a quick check of the script

Every schedule variant of every model is compiled, run once in timing-only mode (throughput =
batch / simulated time) and, with ``--check``, once functionally against llvm. Printed tables:
throughput and speed-up over layerwise with the geometric mean, each step of the ablation
(seed 000 Fig. 15), bytes read and written at DDR, GB and LB (Table 3), compile times (Table 4).
"""

from __future__ import annotations

import argparse
import math
import sys
import time

from tvm_dsa import hardware
from tvm_dsa.driver import Compiled, import_onnx, load_model, max_relative_error
from tvm_dsa.models import MODELS, example_inputs, macs
from tvm_dsa.relax_passes.offload import StitchOptions

# (label, schedule, options): the ablation of Fig. 15, cumulative
VARIANTS = [
    ("layerwise", "layerwise", None),
    ("stitched, DDR", "graphturbo", StitchOptions(gb=False, order="dfs", prefetch=0, lb_keep=0)),
    ("+ GB (LLB)", "graphturbo", StitchOptions(gb=True, order="dfs", prefetch=0, lb_keep=0)),
    ("+ LB (L1)", "graphturbo", StitchOptions(gb=True, order="dfs", prefetch=0, lb_keep=0.5)),
    ("+ instance order", "graphturbo", StitchOptions(gb=True, order="best", prefetch=0, lb_keep=0.5)),
    ("+ cross-layer", "graphturbo", StitchOptions(gb=True, order="best", prefetch=2, lb_keep=0.5)),
]


def _step(text: str) -> None:
    print(f"... {text}", file=sys.stderr, flush=True)


def _table(title: str, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    print(f"\n{title}")
    print("  ".join(str(h).ljust(w) for h, w in zip(header, widths)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(str(c).rjust(w) if k else str(c).ljust(w) for k, (c, w) in enumerate(zip(r, widths))))


def roofline_cycles(model, hw) -> float:
    """The model's bound on the chip, whatever the schedule: all its MACs at the peak rate, or
    its inputs, weights and outputs through DDR once, in the storage type."""
    esize = {"float16": 2, "float32": 4, "int8": 1}[hw.storage_dtype]
    elems = sum(math.prod(t.dims) for t in model.graph.initializer)
    for v in list(model.graph.input) + list(model.graph.output):
        if v.name not in {t.name for t in model.graph.initializer}:
            elems += math.prod(d.dim_value for d in v.type.tensor_type.shape.dim)
    return max(macs(model) / hw.peak_macs_per_cycle, elems * esize / hw.ddr_bytes_per_cycle)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["resnet50", "bert_base", "mobilenet_v2", "vit_b16",
                                                   "densenet121", "conformer", "dlrm"], choices=list(MODELS))
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--target", default="dsa/stcp920")
    p.add_argument("--check", action="store_true", help="also run functionally and compare with llvm")
    args = p.parse_args()

    results = {}
    for name in args.models:
        model = load_model(name, tiny=args.tiny, batch=args.batch)
        mod, inputs = import_onnx(model), example_inputs(model)
        start = time.perf_counter()
        llvm = Compiled.build(mod, "llvm")
        results[name] = {"llvm_compile": time.perf_counter() - start,
                         "roofline": roofline_cycles(model, hardware.get(args.target.split("/")[-1]))}
        ref = llvm.run(inputs).outputs if args.check else None
        for label, schedule, options in VARIANTS:
            _step(f"{name}: {label}")
            c = Compiled.build(mod, args.target, schedule=schedule, options=options)
            report = c.run(inputs, mode="timing").report
            err = max_relative_error(c.run(inputs).outputs, ref) if args.check else None
            results[name][label] = (c, report, err)

    base = VARIANTS[0][0]
    best = VARIANTS[-1][0]
    rows, speedups = [], []
    for name, r in results.items():
        lw, gt = r[base][1], r[best][1]
        s = lw.cycles / gt.cycles
        speedups.append(s)
        rows.append([name, f"{args.batch / lw.seconds:,.0f}", f"{args.batch / gt.seconds:,.0f}", f"{s:.2f}x",
                     f"{r['roofline'] / lw.cycles:.1%}", f"{r['roofline'] / gt.cycles:.1%}"])
    rows.append(["geo-mean", "", "", f"{math.prod(speedups) ** (1 / len(speedups)):.2f}x", "", ""])
    _table(f"Throughput (samples/s) on {args.target}, batch {args.batch}{' (tiny)' if args.tiny else ''}",
           ["model", "layerwise", "graphturbo", "speed-up", "lw % roofline", "gt % roofline"], rows)

    rows = []
    for name, r in results.items():
        cyc = [r[label][1].cycles for label, *_ in VARIANTS]
        rows.append([name] + [f"{c:,}" for c in cyc] + [f"{a / b:.2f}x" for a, b in zip(cyc, cyc[1:])])
    _table("Ablation (seed 000 Fig. 15): cycles per variant, then the speed-up of each step",
           ["model"] + [label for label, *_ in VARIANTS] + [f"-> {label}" for label, *_ in VARIANTS[1:]], rows)

    rows = []
    for name, r in results.items():
        for label in (base, best):
            rep = r[label][1]
            rows.append([name, label] + [f"{getattr(rep, f'{lv}_read') / 1e6:.2f} / {getattr(rep, f'{lv}_write') / 1e6:.2f}"
                                         for lv in ("ddr", "gb", "lb")])
    _table("Memory hierarchy (seed 000 Table 3): MB read / written per run",
           ["model", "schedule", "DDR", "GB", "LB"], rows)

    rows = []
    for name, r in results.items():
        rows.append([name, f"{r['llvm_compile']:.1f}", f"{r[base][0].seconds:.1f}", f"{r[best][0].seconds:.1f}",
                     f"{r[best][0].seconds / r['llvm_compile']:.2f}x",
                     f"{len(r[base][0].offload.dsa)}", f"{len(r[best][0].offload.dsa)}"])
    _table("Compile time, s (seed 000 Table 4) and DSA kernels",
           ["model", "llvm", "layerwise", "graphturbo", "gt / llvm", "kernels lw", "kernels gt"], rows)

    if args.check:
        rows = [[name] + [f"{r[label][2]:.2e}" for label, *_ in VARIANTS] for name, r in results.items()]
        _table("max |dsa - llvm| / max |llvm|", ["model"] + [label for label, *_ in VARIANTS], rows)


if __name__ == "__main__":
    main()
