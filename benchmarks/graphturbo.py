"""GraphTurbo against layerwise on the simulated chip (seed 000 §5): throughput, ablation, memory.

    python benchmarks/graphturbo.py                          # all workloads, full size, batch 8 (long)
    python benchmarks/graphturbo.py --models resnet50 --batch 8
    python benchmarks/graphturbo.py --models bert-128 --table1   # + BERT at batch 8, 16, 32
    python benchmarks/graphturbo.py --models --table1        # only BERT's Table 1
    python benchmarks/graphturbo.py --models vit_b16 --ends  # layerwise and graphturbo only
    python benchmarks/graphturbo.py --tiny                   # a quick check of the script

Every schedule variant of every workload is compiled, run once in timing-only mode (throughput =
batch / simulated time; the dependency tokens are trusted there) and, with ``--check``, once
functionally against llvm (with the tokens checked). Printed tables:
throughput and speed-up over layerwise with the geometric mean, each step of the ablation
(seed 000 Fig. 15), bytes read and written at DDR, GB and LB (Table 3), MME / VME utilisation per
ResNet-50 stage (Figs. 16-17), compile times (Table 4) and, with ``--table1``, BERT's throughput
and latency at batch 8, 16 and 32 (Table 1).
"""

from __future__ import annotations

import argparse
import math
import sys
import time

from tvm_dsa import hardware
from tvm_dsa.harness import Compiled, import_onnx, max_relative_error
from tvm_dsa.models import TINY, example_inputs, get_model
from tvm_dsa.emit.emitter import PROMOTE
from tvm_dsa.kernelgen.stitched import StitchOptions

# (label, schedule, options): the ablation of Fig. 15, cumulative
VARIANTS = [
    ("layerwise", "layerwise", None),
    ("stitched, DDR", "graphturbo", StitchOptions(gb=False, order="dfs", prefetch=0, lb_keep=0)),
    ("+ GB (LLB)", "graphturbo", StitchOptions(gb=True, order="dfs", prefetch=0, lb_keep=0)),
    ("+ LB (L1)", "graphturbo", StitchOptions(gb=True, order="dfs", prefetch=0, lb_keep=0.5)),
    ("+ instance order", "graphturbo", StitchOptions(gb=True, order="best", prefetch=0, lb_keep=0.5)),
    ("+ cross-layer", "graphturbo", StitchOptions(gb=True, order="best", prefetch=2, lb_keep=0.5)),
    # what ``relax_pipeline="dsa"`` compiles: the same without the L1 level, whose smaller tiles
    # cost more than the kept intermediates save on this LB (docs/graphturbo.md)
    ("graphturbo", "graphturbo", StitchOptions()),
]
ENDS = [VARIANTS[0], VARIANTS[-1]]  # layerwise and graphturbo as the pipeline compiles it
BASE, BEST = ENDS[0][0], ENDS[1][0]


# workload label -> (built-in model, builder arguments): the seven models of seed 000 §5, BERT at
# the four sequence lengths
WORKLOADS = {
    "resnet50": ("resnet50", {}),
    **{f"bert-{n}": ("bert_base", {"seq": n}) for n in (128, 256, 384, 512)},
    "mobilenet_v2": ("mobilenet_v2", {}),
    "vit_b16": ("vit_b16", {}),
    "densenet121": ("densenet121", {}),
    "conformer": ("conformer", {}),
    "dlrm": ("dlrm", {}),
}


def load_workload(label: str, batch: int, tiny: bool):
    """The workload's ONNX model at ``batch``; ``tiny``: the model's small configuration (BERT's
    sequence lengths divided by 8)."""
    name, kwargs = WORKLOADS[label]
    if tiny:
        kwargs = {**TINY[name], **{k: v // 8 for k, v in kwargs.items()}}
    return get_model(name, **{**kwargs, "batch": batch})  # the tiny DLRM names a batch of its own


def timed_run(label: str, batch: int, tiny: bool, target: str):
    """The workload compiled as ``relax_pipeline="dsa"`` compiles it for ``target`` and run once
    in timing mode, the dependency tokens trusted."""
    model = load_workload(label, batch, tiny)
    return Compiled.build(import_onnx(model), target).run(example_inputs(model), mode="timing", check_hazards=False)


def workload_parser(doc: str, models: list[str]) -> argparse.ArgumentParser:
    """The options of a script over workloads (``models`` by default) at one batch on one target."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--models", nargs="+", choices=list(WORKLOADS), default=models)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--target", default="dsa/stcp920")
    return p


def stage_of(shape: tuple) -> str:
    """A CNN layer's stage, named by its output's spatial size (ResNet-50's stages each keep one)."""
    return f"{shape[2]}x{shape[3]}" if len(shape) == 4 else "head"


def stage_utilisation(events, hw) -> dict[str, dict[str, float]]:
    """Per stage (largest feature map first), per unit type: the busy time of the stage's
    instructions over the time any of them runs, times the units (from a trace's layer marks;
    a stitched kernel's stages overlap in time, each counts the time it is active)."""
    busy: dict = {}
    spans: dict = {}
    for e in events:
        if e["ph"] != "X" or e["args"].get("layer", PROMOTE) == PROMOTE:
            continue
        st = stage_of(tuple(e["args"]["output"]))
        busy.setdefault(st, {}).setdefault(e["cat"], 0.0)
        busy[st][e["cat"]] += e["dur"]
        spans.setdefault(st, []).append((e["ts"], e["ts"] + e["dur"]))
    out = {}
    for st in sorted(spans, key=lambda s: -int(s.split("x")[0]) if s != "head" else 0):
        active, end = 0.0, -math.inf
        for lo, hi in sorted(spans[st]):
            active += max(0.0, hi - max(lo, end))
            end = max(end, hi)
        out[st] = {u: busy[st].get(u, 0.0) / (active * hw.cores) if active else 0.0 for u in ("mme", "vme")}
    return out


def _step(text: str) -> None:
    print(f"... {text}", file=sys.stderr, flush=True)


def _table(title: str, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    print(f"\n{title}")
    print("  ".join(str(h).ljust(w) for h, w in zip(header, widths)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(str(c).rjust(w) if k else str(c).ljust(w) for k, (c, w) in enumerate(zip(r, widths))))


def _geo(xs: list[float]) -> float:
    return math.prod(xs) ** (1 / len(xs))


def run_variants(label: str, batch: int, tiny: bool, target: str, check: bool, variants, traced=()) -> dict:
    """Compile and time ``variants`` of one workload; with ``check`` also run them against llvm;
    the variants named in ``traced`` keep their trace."""
    model = load_workload(label, batch, tiny)
    mod, inputs = import_onnx(model), example_inputs(model)
    start = time.perf_counter()
    llvm = Compiled.build(mod, "llvm")
    out = {"llvm_compile": time.perf_counter() - start}
    ref = llvm.run(inputs).outputs if check else None
    for name, schedule, options in variants:
        _step(f"{label} batch {batch}: {name}")
        c = Compiled.build(mod, target, schedule=schedule, options=options)
        # --check runs check the tokens
        run = c.run(inputs, mode="timing", trace=name in traced, check_hazards=False)
        err = max_relative_error(c.run(inputs).outputs, ref) if check else None
        out[name] = (c, run, err)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="*", default=[w for w in WORKLOADS if w not in ("bert-256", "bert-384", "bert-512")],
                   choices=list(WORKLOADS), help="workloads (default: the seven models, BERT at sequence 128)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--target", default="dsa/stcp920")
    p.add_argument("--check", action="store_true", help="also run functionally and compare with llvm")
    p.add_argument("--table1", action="store_true", help="also BERT-128 at batch 8, 16, 32 (seed 000 Table 1)")
    p.add_argument("--ends", action="store_true",
                   help="only layerwise and graphturbo as the pipeline compiles it (no ablation steps)")
    args = p.parse_args()

    variants = ENDS if args.ends else VARIANTS
    results = {label: run_variants(label, args.batch, args.tiny, args.target, args.check, variants,
                                   traced=(BASE, BEST) if label == "resnet50" else ())
               for label in args.models}
    if results:
        _model_tables(args, results, variants)
    if args.table1:
        rows = []
        for batch in (8, 16, 32):
            r = run_variants("bert-128", batch, args.tiny, args.target, False, ENDS)
            rows.append([str(batch)] + [x for label in (BASE, BEST) for x in (
                f"{batch / r[label][1].report.seconds:,.0f}", f"{r[label][1].report.seconds * 1e3:.2f}")])
        _table(f"BERT-128 on {args.target} (seed 000 Table 1){' (tiny)' if args.tiny else ''}",
               ["batch", "lw samples/s", "lw latency ms", "gt samples/s", "gt latency ms"], rows)


def _model_tables(args, results: dict, variants: list) -> None:
    """Throughput, ablation, memory, ResNet-50 utilisation, compile time and numerics per model."""
    rows, speedups, ceilings = [], [], []
    for name, r in results.items():
        lw, gt = r[BASE][1].report, r[BEST][1].report
        s = lw.cycles / gt.cycles
        speedups.append(s)
        ceilings.append(lw.roofline_ratio)  # the model's bound (the reports' roofline)
        rows.append([name, f"{args.batch / lw.seconds:,.0f}", f"{args.batch / gt.seconds:,.0f}", f"{s:.2f}x",
                     f"{lw.roofline_fraction:.1%}", f"{gt.roofline_fraction:.1%}", f"{ceilings[-1]:.2f}x"])
    rows.append(["geo-mean", "", "", f"{_geo(speedups):.2f}x", "", "", f"{_geo(ceilings):.2f}x"])
    _table(f"Throughput (samples/s) on {args.target}, batch {args.batch}{' (tiny)' if args.tiny else ''}; "
           "ceiling: the speed-up of a schedule at the roofline",
           ["model", "layerwise", "graphturbo", "speed-up", "lw % roofline", "gt % roofline", "ceiling"], rows)

    rows = []
    for name, r in results.items():
        cyc = [r[label][1].report.cycles for label, *_ in variants]
        rows.append([name] + [f"{c:,}" for c in cyc] + [f"{a / b:.2f}x" for a, b in zip(cyc, cyc[1:])])
    _table("Ablation (seed 000 Fig. 15): cycles per variant, then the speed-up of each step",
           ["model"] + [label for label, *_ in variants] + [f"-> {label}" for label, *_ in variants[1:]], rows)

    rows = []
    for name, r in results.items():
        for label in (BASE, BEST):
            rep = r[label][1].report
            rows.append([name, label] + [f"{getattr(rep, f'{lv}_read') / 1e6:.2f} / {getattr(rep, f'{lv}_write') / 1e6:.2f}"
                                         for lv in ("ddr", "gb", "lb")])
    _table("Memory hierarchy (seed 000 Table 3): MB read / written per run",
           ["model", "schedule", "DDR", "GB", "LB"], rows)

    if "resnet50" in results:
        chip = hardware.get(args.target.split("/")[-1])
        per = {label: stage_utilisation(results["resnet50"][label][1].trace, chip) for label in (BASE, BEST)}
        rows = [[stage] + [f"{per[label][stage][u]:.1%}" if stage in per[label] else "-"
                           for u in ("mme", "vme") for label in (BASE, BEST)]
                for stage in per[BASE]]
        _table("ResNet-50 unit utilisation per stage (seed 000 Figs. 16-17): busy time / (time the stage "
               "runs x units)", ["stage (output)", "MME lw", "MME gt", "VME lw", "VME gt"], rows)

    rows = []
    for name, r in results.items():
        rows.append([name, f"{r['llvm_compile']:.1f}", f"{r[BASE][0].seconds:.1f}", f"{r[BEST][0].seconds:.1f}",
                     f"{r[BEST][0].seconds / r['llvm_compile']:.2f}x",
                     f"{len(r[BASE][0].offload.dsa)}", f"{len(r[BEST][0].offload.dsa)}",
                     f"{len(r[BEST][0].offload.unstitched)}"])
    _table("Compile time, s (seed 000 Table 4) and DSA kernels; unstitched: graphturbo sub-graphs built layer by "
           "layer instead (their reasons below)",
           ["model", "llvm", "layerwise", "graphturbo", "gt / llvm", "kernels lw", "kernels gt", "unstitched"], rows)
    for name, r in results.items():  # a generator that raises shows here, not only as a slower model
        for sub, why in r[BEST][0].offload.unstitched.items():
            print(f"  {name} {sub}: {why}")

    if args.check:
        rows = [[name] + [f"{r[label][2]:.2e}" for label, *_ in variants] for name, r in results.items()]
        _table("max |dsa - llvm| / max |llvm|", ["model"] + [label for label, *_ in variants], rows)

if __name__ == "__main__":
    main()
