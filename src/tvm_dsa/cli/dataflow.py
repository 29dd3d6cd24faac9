"""``tvm-dsa dataflow``: the TENET metrics of a tensor operation's dataflows on a PE array.

    tvm-dsa dataflow gemm i=64,j=64,k=64              # standard dataflows on stcp920's MME, the best one found
    tvm-dsa dataflow conv2d --array 8x8 --interconnect mesh
    tvm-dsa dataflow "Y[i,j] += A[i,k] * B[k,j]" i=2,j=2,k=4 --array 2x2 --interconnect systolic-2d \
        --dataflow "PE[i,j] | T[i+j+k]" --where "i + j + k <= 3"   # seed 003's worked example
    tvm-dsa dataflow "Y[i] += A[i,k] * x[k]" i=64,k=64  # explore the dataflows of any statement
    tvm-dsa dataflow --model resnet18 --tiny           # the MME dataflow for a model's tile shapes
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tvm_dsa import hardware
from tvm_dsa.harness import InputError
from tvm_dsa.hardware import HardwareError
from tvm_dsa.dataflow import counting
from tvm_dsa.harness.dataflow_choice import Ranked, model_products, rank
from tvm_dsa.dataflow.expr import NotationError
from tvm_dsa.dataflow.library import BENCHMARKS, Evaluated, evaluate, evaluate_standard, mme_bandwidth
from tvm_dsa.dataflow.metrics import summary
from tvm_dsa.dataflow.notation import INTERCONNECTS, Dataflow, PEArray, TensorOp, interconnect

if TYPE_CHECKING:  # imported in run(): it needs islpy, which the CLI and the ranking (--model) do not
    from tvm_dsa.dataflow.explore import Exploration


def parse_sizes(text: str) -> dict[str, int]:
    """``"i=64,j=64,k=64"`` -> ``{"i": 64, "j": 64, "k": 64}``."""
    sizes = {}
    for item in filter(None, text.split(",")):
        name, _, value = item.partition("=")
        if not name.strip().isidentifier() or not value.strip().isdigit():
            raise InputError(f"sizes must look like i=64,j=64,k=64; got {item!r}")
        sizes[name.strip()] = int(value)
    return sizes


def parse_shape(text: str) -> tuple[int, ...]:
    """``"16x32"`` -> ``(16, 32)``."""
    parts = text.lower().split("x")
    if not all(p.isdigit() and int(p) > 0 for p in parts):
        raise InputError(f"--array must look like 16x32; got {text!r}")
    return tuple(int(p) for p in parts)


@dataclass(frozen=True)
class Outcome:
    """What ``tvm-dsa dataflow`` found: the dataflows it evaluated (best first) and the exploration."""

    dataflows: list[Evaluated]
    explored: Exploration | None


def run(args: argparse.Namespace) -> Outcome:
    """The dataflows the arguments ask for, evaluated (the best first), and the best one the design-space
    exploration finds on the array and interconnect (none when a --dataflow is given)."""
    from tvm_dsa.dataflow.explore import best_relation  # needs islpy (the optional extra "tenet")

    if args.bandwidth is not None and not args.bandwidth > 0:
        raise InputError(f"--bandwidth must be positive, got {args.bandwidth:g}")
    hw = hardware.get(args.target)
    shape = parse_shape(args.array) if args.array else (hw.mme.rows, hw.mme.cols)
    bandwidth = args.bandwidth or mme_bandwidth(hw)
    sizes = parse_sizes(args.sizes) if args.sizes else None
    bench = BENCHMARKS.get(args.op)
    if bench is None and "[" not in args.op:
        raise InputError(f"unknown operation {args.op!r}: a benchmark ({', '.join(BENCHMARKS)}) or a "
                           "statement such as 'Y[i,j] += A[i,k] * B[k,j]'")
    if bench is None and not sizes:
        raise InputError("a statement needs its loop sizes, e.g. i=64,j=64,k=64")
    op = bench.op(sizes) if bench else TensorOp.parse("op", args.op, sizes)
    if args.where:
        if not args.dataflow:
            raise InputError("--where cuts the loop domain of a given --dataflow only")
        op = dataclasses.replace(op, where=args.where)
    links = interconnect(args.interconnect, len(shape)) if args.interconnect else None
    if args.dataflow:
        if links is None:
            raise InputError(f"--dataflow needs an --interconnect ({', '.join(INTERCONNECTS)})")
        return Outcome([evaluate("given", Dataflow.parse(op, args.dataflow), PEArray(shape, links, bandwidth))], None)
    if len(shape) != 2:
        raise InputError(f"the standard dataflows and the exploration are for a 2-D array; got {args.array!r}")
    found = evaluate_standard(bench, op, shape, bandwidth, links) if bench else []
    explored = best_relation(op, PEArray(shape, links or interconnect(hw.mme.interconnect, 2), bandwidth))
    return Outcome(sorted(found, key=lambda e: e.metrics.latency), explored)


def choose(args: argparse.Namespace) -> tuple[str, int, list[Ranked]]:
    """Rank the MME's dataflows on the MME products of ``args.model`` compiled for ``args.target``: a
    header line, the number of distinct tile shapes, the ranking."""
    hw = hardware.get(args.target)
    products = model_products(args.model, args.target, args.tiny)
    head = (f"{args.model}{' (tiny)' if args.tiny else ''} on {args.target}: {sum(products.values()):,} MME "
            f"products of {len(products)} tile shapes, on the {hw.mme.rows}x{hw.mme.cols} {hw.mme.interconnect} "
            f"MME (the preset runs {hw.mme.dataflow!r})")
    return head, len(products), rank(hw, products)


def main_choose(args: argparse.Namespace) -> int:
    try:
        head, shapes, ranked = choose(args)
    except ValueError as err:
        raise InputError(str(err)) from None
    if args.json:
        print(json.dumps({"head": head, "shapes": shapes, "ranked": [r.__dict__ for r in ranked]}, indent=2))
        return 0
    width = max(len(r.dataflow) for r in ranked)
    print(head + "\n")
    print(f"{'dataflow':<{width}}  {'MME cycles':>12}  {'MAC util':>8}")
    for r in ranked:
        print(f"{r.dataflow:<{width}}  {r.cycles:>12,}  {r.utilisation:>8.1%}")
    print(f"\nchosen: {ranked[0].dataflow}")
    return 0


def main(args: argparse.Namespace) -> int:
    if args.model:
        return main_choose(args)
    if not args.op:
        raise InputError("give an operation (a benchmark or a statement) or --model")
    if problem := counting.missing():
        raise InputError(f"counting a dataflow's metrics needs barvinok, but {problem}: {counting.INSTALL}")
    try:
        outcome = run(args)
    except (NotationError, HardwareError) as err:
        raise InputError(str(err)) from None
    found, explored = outcome.dataflows, outcome.explored
    if args.json:
        rows = [{"name": e.name, "seconds": e.seconds, **e.metrics.to_dict()} for e in found]
        out = {"dataflows": rows}
        if explored:
            out["explored"] = {"candidates": explored.candidates, "stamps_counted": explored.stamps_counted,
                               "evaluated": explored.evaluated, "seconds": explored.seconds,
                               "best": explored.best.metrics.to_dict()}
        print(json.dumps(out, indent=2))
        return 0
    if found:
        print(summary([(e.name, e.metrics) for e in found]))
    if explored is None:
        print(f"\n{found[0].metrics}")
        return 0
    m = explored.best.metrics
    print(f"\nexplored {explored.candidates:,} affine dataflows on the {'x'.join(map(str, m.array))} {m.interconnect} "
          f"array in {explored.seconds:.1f} s ({explored.stamps_counted:,} time-stamp sets and {explored.evaluated:,} "
          f"volumes counted, the rest pruned by bounds)\nbest found: {m.dataflow}\n{m}")
    return 0


def add_parser(sub) -> None:
    """Register ``tvm-dsa dataflow`` on the CLI's sub-parsers."""
    p = sub.add_parser("dataflow", help="TENET metrics of an operation's dataflows on a PE array (seed 003)")
    p.add_argument("op", nargs="?",
                   help=f"a benchmark ({', '.join(BENCHMARKS)}) or a statement 'Y[i,j] += A[i,k] * B[k,j]'")
    p.add_argument("sizes", nargs="?", help="loop sizes, e.g. i=64,j=64,k=64 (default: the benchmark's)")
    p.add_argument("--target", default="dsa/stcp920",
                   help="the chip whose MME is the PE array: a preset (default dsa/stcp920) or a hardware file")
    p.add_argument("--array", help="PE array shape instead of the MME's, e.g. 8x8")
    p.add_argument("--bandwidth", type=float, help="scratchpad elements per stamp instead of the LB's")
    p.add_argument("--interconnect", help=f"one of {', '.join(INTERCONNECTS)} (default: multicast buses for "
                                          "plain standard dataflows, systolic-2d for skewed ones, the MME's for the "
                                          "exploration)")
    p.add_argument("--dataflow", help="evaluate this dataflow only, e.g. 'PE[i %% 8, j %% 8] | T[i // 8, j // 8, k]'")
    p.add_argument("--where", help="with --dataflow: a constraint on the loops, e.g. 'i + j + k <= 3' (seed 003's "
                                    "worked example shows the stamps t <= 3 only)")
    p.add_argument("--model", help="instead of an operation: rank the MME's dataflows on this model's tile shapes "
                                    "(a built-in model or an .onnx file; compiled for --target, run timing-only)")
    p.add_argument("--tiny", action="store_true", help="with --model: the model's small configuration")
    p.add_argument("--json", action="store_true", help="print the metrics as JSON")
    p.set_defaults(func=main)
