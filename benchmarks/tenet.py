"""TENET metrics (seed 003) of the standard dataflows of the five benchmarks on a PE array.

    python benchmarks/tenet.py                       # stcp920's MME: 16 x 32 PEs, LB 128 elements/cycle
    python benchmarks/tenet.py --array 8x8 --bandwidth 16
    python benchmarks/tenet.py --tiny                # small sizes on a 4x8 array: a quick check of the script

Printed: first the two notations compared (seed 003's "dataflow comparison"): for each benchmark and
interconnect, the best dataflow each notation can express, found by exploring its space
(``tvm_dsa.dataflow.explore``), with its exact latency, the relation-centric one's gain, and the
exploration's size and run time; beside it the dataflow a MAESTRO-style search picks by its own
polynomial estimate, with that estimate and its exact latency. Then, for each benchmark, every standard dataflow (output-, weight-, input-stationary; plain on
row/column multicast buses, skewed on a 2-D systolic array) with its utilisation, delays, latency,
unique volume, IBW and SBW, and the seconds barvinok took to count it; then the reuse factor of
each tensor; then the output-stationary dataflows on every interconnect (the seed's bandwidth
analysis: what the links carry, IBW, against what the scratchpad must, SBW).
"""

from __future__ import annotations

import argparse

from tvm_dsa import hardware
from tvm_dsa.dataflow import PEArray, analyse
from tvm_dsa.cli.dataflow import parse_shape
from tvm_dsa.dataflow.explore import best_datacentric, best_relation, maestro_pick
from tvm_dsa.dataflow.library import BENCHMARKS, evaluate_standard, mme_bandwidth, standard_dataflows
from tvm_dsa.dataflow.metrics import summary
from tvm_dsa.dataflow.notation import interconnect

TINY = {"gemm": {"i": 8, "j": 8, "k": 8}, "conv2d": {"k": 4, "c": 4, "ox": 6, "oy": 6, "rx": 3, "ry": 3},
        "mttkrp": {"i": 8, "j": 8, "k": 4, "l": 4}, "mmc": {"i": 8, "j": 8, "k": 4, "l": 4},
        "jacobi2d": {"i": 16, "j": 16}}
TINY_ARRAY, TINY_BANDWIDTH = (4, 8), 8.0
INTERCONNECTS = ("systolic-1d", "systolic-2d", "mesh", "multicast-1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="dsa/stcp920", help="chip whose MME is the array (default dsa/stcp920)")
    ap.add_argument("--array", help="PE array shape instead of the MME's, e.g. 8x8")
    ap.add_argument("--bandwidth", type=float, help="scratchpad elements per cycle instead of the LB's")
    ap.add_argument("--tiny", action="store_true", help="small loop sizes on a 4x8 array, 8 elements/cycle")
    args = ap.parse_args()
    hw = hardware.get(args.target)
    shape = parse_shape(args.array) if args.array else TINY_ARRAY if args.tiny else (hw.mme.rows, hw.mme.cols)
    bandwidth = args.bandwidth or (TINY_BANDWIDTH if args.tiny else mme_bandwidth(hw))
    print(f"PE array {'x'.join(map(str, shape))}, scratchpad {bandwidth:g} elements/cycle "
          f"({'--array' if args.array else '--tiny' if args.tiny else args.target + ' MME'})\n")

    compare(shape, bandwidth, args.tiny)
    reuse_rows = [("benchmark", "dataflow", "reuse factor per tensor")]
    for bench in BENCHMARKS.values():
        op = bench.op(TINY[bench.name] if args.tiny else None)
        found = evaluate_standard(bench, op, shape, bandwidth)
        sizes = ", ".join(f"{k}={v}" for k, v in op.sizes.items())
        print(f"== {bench.name}: {op.statement}  ({sizes}; {found[0].metrics.instances:,} MACs)")
        print(summary([(e.name, e.metrics) for e in found]))
        best = min(found, key=lambda e: e.metrics.latency)
        print(f"best: {best.name}, latency {best.metrics.latency:,.0f}; counted in "
              f"{sum(e.seconds for e in found):.2f} s ({max(e.seconds for e in found):.2f} s the slowest)\n")
        reuse_rows += [(bench.name, e.name, "  ".join(f"{t.tensor} {t.reuse_factor:.1f}" for t in e.metrics.tensors))
                       for e in found]

    print("== reuse factor (total / unique) of each tensor")
    widths = [max(len(r[i]) for r in reuse_rows) for i in range(3)]
    for r in reuse_rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())

    print("\n== output-stationary dataflows on each interconnect (IBW: PE-to-PE, SBW: scratchpad, elements/cycle)")
    for bench in BENCHMARKS.values():
        op = bench.op(TINY[bench.name] if args.tiny else None)
        flows = standard_dataflows(bench, op, shape)
        rows = [(f"{bench.name}: {kind}", analyse(flows[kind], PEArray(shape, interconnect(name, 2), bandwidth)))
                for kind in ("output-stationary", "output-stationary, systolic") for name in INTERCONNECTS]
        print(summary(rows) + "\n")


def compare(shape: tuple[int, ...], bandwidth: float, tiny: bool) -> None:
    """The best dataflow of each notation per benchmark and interconnect, and MAESTRO's own pick."""
    print("== data-centric (MAESTRO directives) against relation-centric (TENET) dataflows: exact latency of the "
          "best each can express; MAESTRO's pick by its polynomial estimate")
    rows = [("benchmark", "interconnect", "data-centric", "relation-centric", "gain", "candidates", "counted",
             "evaluated", "seconds", "MAESTRO pick: estimate", "exact")]
    winners = []
    for bench in BENCHMARKS.values():
        op = bench.op(TINY[bench.name] if tiny else None)
        for name in ("multicast-1", "systolic-2d"):
            array = PEArray(shape, interconnect(name, 2), bandwidth)
            dc, rc = best_datacentric(op, array), best_relation(op, array)
            pick, estimate = maestro_pick(op, array)
            exact = analyse(pick.relation(shape), array).latency
            d, r = dc.best.metrics.latency, rc.best.metrics.latency
            rows.append((bench.name, name, f"{d:,.0f}", f"{r:,.0f}", f"{(r - d) / d:+.1%}", f"{rc.candidates:,}",
                         f"{rc.stamps_counted:,}", f"{rc.evaluated:,}", f"{dc.seconds + rc.seconds:.1f}",
                         f"{estimate.latency:,.0f}", f"{exact:,.0f}"))
            winners.append((f"{bench.name}, {name}", dc.best.metrics.dataflow, rc.best.metrics.dataflow))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip())
    print("\nthe best dataflows (data-centric, then relation-centric):")
    for where, d, r in winners:
        print(f"  {where}:\n    {d}\n    {r}")
    print()


if __name__ == "__main__":
    main()
