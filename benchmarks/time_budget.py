"""Where each model's time goes on the chip, as ``relax_pipeline="dsa"`` compiles it (issue 39).

    python benchmarks/time_budget.py                          # the seven models, batch 1 and 8 (long)
    python benchmarks/time_budget.py --models resnet50 --batches 1
    python benchmarks/time_budget.py --tiny                   # a quick check of the script

Each workload is compiled with the pipeline's own schedule (``schedule="auto"``) and run once in
timing mode. Printed per model and batch, from the run's report and its kernels' programs:
cycles and the share of the model's roofline reached, which half of the roofline binds; the share
of the cycles spent launching kernels; DDR's busy share (the bytes it moved at full bandwidth over
the cycles) and its bytes over the model's compulsory bytes; the MME's busy share over all cores
and over the cores the kernels used; the core DMAs' and the cluster DMAs' busy shares; the cores
the kernels used, weighted by their cycles.
"""

from __future__ import annotations

import argparse

from graphturbo import WORKLOADS, _step, _table, load_workload
from tvm_dsa.harness import Compiled, import_onnx
from tvm_dsa.models import example_inputs
from tvm_dsa.runtime.timing import simulate_program

SEVEN = [w for w in WORKLOADS if w not in ("bert-256", "bert-384", "bert-512")]


def budget(label: str, batch: int, tiny: bool, target: str) -> list[str]:
    """One row of the table for ``label`` at ``batch``."""
    model = load_workload(label, batch, tiny)
    compiled = Compiled.build(import_onnx(model), target)
    run = compiled.run(example_inputs(model), mode="timing", check_hazards=False)
    r, hw = run.report, run.report.hardware
    core_cycles = sum(len(kernel.cores) * timed.cycles for k in run.kernels  # a call's kernels, each timed alone
                      for kernel, timed in zip(k.program.kernels, simulate_program(k.program, hw, False).kernels))
    used, mme_used = core_cycles / r.cycles, r.busy.get("mme", 0) / core_cycles
    u = r.utilisation
    return [label, str(batch), compiled.offload.schedule, f"{r.cycles:,}", f"{r.roofline_fraction:.1%}", r.roofline_binds,
            f"{r.launches * hw.kernel_launch_cycles / r.cycles:.1%}",
            f"{r.ddr_burst_bytes / hw.ddr_bytes_per_cycle / r.cycles:.1%}",
            f"{r.ddr_burst_bytes / r.compulsory_ddr_bytes:.2f}", f"{u['mme']:.1%}", f"{mme_used:.1%}",
            f"{u['dma']:.1%}", f"{u['cdma']:.1%}", f"{used:.1f} of {hw.cores}"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", choices=list(WORKLOADS), default=SEVEN)
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--target", default="dsa/stcp920")
    args = p.parse_args()
    rows = []
    for batch in args.batches:
        for label in args.models:
            _step(f"{label} batch {batch}")
            rows.append(budget(label, batch, args.tiny, args.target))
    _table(f"Where the time goes on {args.target}{' (tiny)' if args.tiny else ''}: the pipeline's schedule, "
           "timing-only; shares of the run's cycles",
           ["model", "batch", "schedule", "cycles", "% roofline", "binds", "launches", "DDR busy",
            "DDR / compulsory", "MME busy", "MME busy, cores used", "DMA busy", "cluster DMA busy", "cores used"],
           rows)


if __name__ == "__main__":
    main()
