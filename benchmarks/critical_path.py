"""The critical path of a SET tree's program on the simulator (issue 39): where the cycles the
evaluator does not see go.

    python benchmarks/critical_path.py --model googlenet --preset set-cloud144 --tree trees/googlenet-set-cloud144-b1-ls.json
    python benchmarks/critical_path.py --model resnet50 --preset set-cloud144 --beta 20   # the tree a SET search finds
    python benchmarks/critical_path.py --tiny                                             # a quick check of the script

The tree (saved by ``benchmarks/set.py --save``, or searched here) is lowered as ``set.py
--lower`` lowers it and run in timing mode. From the instruction that ends last, the path steps
back to whichever ended last of the instruction's dependencies and the instruction before it on
its queue (a core's DMA, prefetch DMA, MME or vector unit, in program order). Printed: the path's
cycles per unit, and as waits (a step starting after its predecessor ended: a multicast waiting
for its other destinations, a queue's set-up); per layer (instructions outside every invocation
are ``promote``: pins and weights loaded ahead); and its longest runs of one layer on one unit,
with their instructions' mean bytes (a run of small DMAs is a tile gathering or scattering
pieces, docs/set.md).
"""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter, defaultdict

from tvm_dsa import hardware, isa
from tvm_dsa.harness import layer_graph
from tvm_dsa.hardware.model import Hardware
from tvm_dsa.models import TINY, get_model
from tvm_dsa.runtime.timing import simulate_program
from tvm_dsa.schedule.set import Evaluator, Tree
from tvm_dsa.schedule.set.search import Anneal, anneal

from graphturbo import _table
from set import lower_tree


def critical_path(lowered, names: list[str]) -> tuple[int, list[tuple]]:
    """(the kernel's cycles, its critical path from the first step on): per step (instruction,
    unit kind, layer name, start, end, bytes moved, cycles waited after its predecessor ended).
    A step's start is counted from its predecessor's end where it started before (a run-ahead
    DMA set up while the transfer before it moved), so the steps' waits and runs add up to the
    kernel's cycles."""
    hw = Hardware.from_dict(lowered.program.hardware)
    kernel = lowered.program.expanded().kernels[0]
    timing = simulate_program(lowered.program, hw, False).kernels[0]
    layer = ["promote"] * len(kernel.instructions)
    for s in lowered.spans:
        layer[s.first:s.last] = [names[s.layer]] * (s.last - s.first)
    before, last = {}, {}
    for i, unit in enumerate(timing.units):
        if unit in last:
            before[i] = last[unit]
        last[unit] = i
    end = timing.end
    i = max(range(len(end)), key=end.__getitem__)
    path = []
    while True:
        ins = kernel.instructions[i]
        came = [j for j in ins.deps] + ([before[i]] if i in before else [])
        j = max(came, key=end.__getitem__) if came else None
        moved = math.prod(ins.shape) * ins.dst.itemsize if isinstance(ins, isa.Dma) else 0
        ready = end[j] if j is not None else 0  # the step adds end - ready to the path: waiting, then running
        start = max(timing.start[i], ready)
        path.append((i, timing.units[i][0], layer[i], start, end[i], moved, start - ready))
        if j is None:
            break
        i = j
    return timing.cycles, path[::-1]


def runs(path: list[tuple]) -> list[tuple]:
    """Consecutive steps of one layer on one unit kind: (start, cycles, layer, unit, steps, mean bytes)."""
    out = []
    for step in path:
        _, unit, name, start, end, moved, wait = step
        if out and out[-1][2] == name and out[-1][3] == unit:
            s, _, _, _, n, total = out[-1]
            out[-1] = (s, end - s, name, unit, n + 1, total + moved)
        else:
            out.append((start - wait, end - start + wait, name, unit, 1, moved))
    return [(s, c, name, unit, n, total / n) for s, c, name, unit, n, total in out]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="googlenet")
    ap.add_argument("--preset", default="set-cloud144")
    ap.add_argument("--tree", help="a tree saved as JSON by benchmarks/set.py --save (else a SET search's)")
    ap.add_argument("--beta", type=float, default=20.0, help="the search's iterations per layer, without --tree")
    ap.add_argument("--batch", type=int, default=1, help="the search's batch, without --tree (a tree has its own)")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--tiny", action="store_true", help="a small ResNet-18 on set-edge16-fp16 (a check of the script)")
    args = ap.parse_args()
    if args.tiny:
        args.model, args.preset, args.tree, args.beta = "resnet18", "set-edge16-fp16", None, 1.0

    options = TINY[args.model] if args.tiny else {}
    graph = layer_graph(get_model(args.model, **options))
    hw = hardware.get(args.preset)
    if args.tree:
        with open(args.tree) as f:
            tree = Tree.from_json(json.load(f), graph)
    else:
        tree = anneal(graph, hw, args.batch, Anneal(beta=args.beta)).tree
    evaluated = Evaluator(graph, hw).evaluate(tree).latency
    lowered = lower_tree(args.model, args.preset, tree, graph, **options)
    cycles, path = critical_path(lowered, [layer.name for layer in graph.layers])
    print(f"{args.model} on {args.preset}, batch {tree.batch}: simulated {cycles:,} cycles, evaluated "
          f"{evaluated:,.0f} ({cycles / evaluated:.2f}x); critical path {len(path)} instructions")
    per_unit, per_layer = Counter(), defaultdict(Counter)
    for _, unit, name, start, end, _, wait in path:
        per_unit[unit] += end - start
        per_unit["waits"] += wait
        per_layer[name][unit] += end - start + wait
    _table("the critical path's cycles per unit kind (waits: a step starting after its predecessor ended)",
           ["unit", "cycles", "share"], [[u, f"{c:,}", f"{c / cycles:.1%}"] for u, c in per_unit.most_common()])
    top = sorted(per_layer.items(), key=lambda kv: -sum(kv[1].values()))[:args.top]
    _table(f"the {args.top} layers longest on it (cycles; by unit kind)", ["layer", "cycles", "by unit"],
           [[name, f"{sum(c.values()):,}", ", ".join(f"{u} {n:,}" for u, n in c.most_common())] for name, c in top])
    longest = sorted(runs(path), key=lambda r: -r[1])[:args.top]
    _table(f"its {args.top} longest runs of one layer on one unit kind",
           ["from cycle", "cycles", "layer", "unit", "instructions", "mean bytes"],
           [[f"{s:,}", f"{c:,}", name, unit, n, f"{b:,.0f}" if b else "-"] for s, c, name, unit, n, b in sorted(longest)])


if __name__ == "__main__":
    main()
