"""What binds a model's programs: each program re-timed with one of the chip's rates changed (issue 39).

    python benchmarks/sensitivity.py --models mobilenet_v2 --batch 8
    python benchmarks/sensitivity.py --models resnet50 --batch 1 --target dsa/set-cloud144-fp16
    python benchmarks/sensitivity.py --tiny                    # a quick check of the script

Each workload is compiled as ``relax_pipeline="dsa"`` compiles it and run once in timing mode;
then every program of its kernels is timed again (``runtime.timing.simulate_program``, the
dependency tokens trusted) on the same chip with one rate changed: no DMA set-up, no vector
pipeline latency, four times the GB ports, the LB ports, DDR or the mesh links, twice the VME's
lanes, and all of these at once. The programs are not compiled again: a row says how much of
the run waits on that rate as the compiler laid the program out, not what a compiler aware of
the faster rate would do. Where no single rate moves the cycles much but all at once do, the
units are not overlapped (a layer runs its loads, products and epilogues in turn); where all at
once leave most of the cycles, the chain of products and vector work binds.
"""

from __future__ import annotations

import dataclasses

from graphturbo import _step, _table, timed_run, workload_parser
from time_budget import SEVEN
from tvm_dsa.runtime.timing import simulate_program

# (label, Hardware fields -> the changed value from the chip's)
VARIANTS = (
    ("DMA set-up 0", {"dma_latency_cycles": lambda v: 0}),
    ("vector latency 0", {"vector_latency_cycles": lambda v: 0}),
    ("GB ports 4x", {"gb_bytes_per_cycle": lambda v: 4 * v}),
    ("LB ports 4x", {"lb_bytes_per_cycle": lambda v: 4 * v}),
    ("DDR 4x", {"ddr_bytes_per_cycle": lambda v: 4 * v}),
    ("mesh links 4x", {"noc_link_bytes_per_cycle": lambda v: 4 * v}),
    ("VME lanes 2x", {"vme_lanes": lambda v: 2 * v}),
)


def variants(hw) -> list[tuple[str, object]]:
    """(label, chip) per variant, the last all of them at once; a mesh's links only on a mesh."""
    out, every = [], {}
    for label, fields in VARIANTS:
        if "noc_link_bytes_per_cycle" in fields and hw.interconnect != "mesh":
            continue
        changed = {f: change(getattr(hw, f)) for f, change in fields.items()}
        every.update(changed)
        out.append((label, dataclasses.replace(hw, **changed)))
    return out + [("all at once", dataclasses.replace(hw, **every))]


def sensitivity(label: str, batch: int, tiny: bool, target: str) -> tuple[list[str], list[str]]:
    """(header, one row of the table) for ``label`` at ``batch``: the programs' cycles as
    compiled, then under each variant (and its change)."""
    run = timed_run(label, batch, tiny, target)
    programs = [k.program for k in run.kernels]
    hw = run.report.hardware
    base = sum(simulate_program(p, hw, False).cycles for p in programs)
    header, row = ["model", "batch", "cycles"], [label, str(batch), f"{base:,}"]
    for name, chip in variants(hw):
        cycles = sum(simulate_program(p, chip, False).cycles for p in programs)
        header.append(name)
        row.append(f"{cycles:,} ({cycles / base - 1:+.0%})")
    return header, row


def main() -> None:
    args = workload_parser(__doc__, SEVEN).parse_args()
    header, rows = [], []
    for label in args.models:
        _step(f"{label} batch {args.batch}")
        header, row = sensitivity(label, args.batch, args.tiny, args.target)
        rows.append(row)
    _table(f"The programs re-timed with one rate of {args.target} changed, batch {args.batch}"
           f"{' (tiny)' if args.tiny else ''}", header, rows)


if __name__ == "__main__":
    main()
