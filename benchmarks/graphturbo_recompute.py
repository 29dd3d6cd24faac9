"""What §3.1's recomputation cost model would do inside Algorithm 1 (seed 000; docs/graphturbo.md).

    python benchmarks/graphturbo_recompute.py                      # the seven models, batch 8
    python benchmarks/graphturbo_recompute.py --models resnet50 --tiny

The seed: Algorithm 1 splits a sub-graph's output and propagates the split to its intermediates,
which may recompute them ("在融合多个卷积或矩阵乘法算子时开销较大"), so "a simple cost model
prevents excessive recomputation from offsetting the benefits of fusion". tvm-dsa applies that
control in kernel generation instead (``kernelgen.stitch.RECOMPUTE_LIMIT``: instances are made
coarser). This script measures the model the seed describes, applied where the seed puts it, on
one cluster's share of the batch (as ``graphturbo`` groups):

- an instance's work: the output split by the best split (d, f), a middle instance, propagated
  backwards through the sub-graph's layers by the regions their PrimFuncs' blocks read (TVM's
  interval sets over the block iterators; a data-dependent index reads its whole dimension);
  contraction iterations at the cluster's MME rate, every other iteration at its VME lanes;
- recomputation = f × an instance's cycles - the sub-graph's cycles;
- what fusion saves: each tensor kept inside the sub-graph written to and read back from DDR at
  the cluster's share of the bandwidth, plus a kernel launch per layer after the first.

A split whose recomputation costs more than fusion saves is taken as not fitting (split_d false);
the grouping is then run again with that rule. Printed per model: layers, sub-graphs of the
current grouping, how many of its multi-layer sub-graphs the rule rejects and their recomputation
(in units of their own work), and the sub-graphs the grouping gives with the rule.
"""

from __future__ import annotations

import argparse
import functools
import math

import tvm
import tvm_ffi
from graphturbo import WORKLOADS, _step, _table, load_workload
from tvm.s_tir import SBlockRealize

from tvm_dsa import hardware
from tvm_dsa.harness import import_onnx
from tvm_dsa.relax_passes.fusion import fuse
from tvm_dsa.schedule import graphturbo as gt
from tvm_dsa.schedule.graph import OpGraph, SubGraphs
from tvm_dsa.kernel.analysis import contraction, int_value

DEFAULT = ["resnet50", "bert-128", "mobilenet_v2", "vit_b16", "densenet121", "conformer", "dlrm"]
EVERYTHING = (-(2 ** 62), 2 ** 62)
Box = tuple[tuple[int, int], ...]  # inclusive (low, high) per dimension


@functools.lru_cache(maxsize=None)
def _blocks(func) -> list:
    out = []
    tvm_ffi.structural_walk(func.body, [(SBlockRealize, lambda r: out.append(r.block))])
    return [b for b in out if b.writes]


def reads_for(func, box: Box) -> tuple[dict[int, Box], list[tuple[bool, int]]]:
    """The box of each parameter (by position) ``func`` reads to compute ``box`` of its output,
    and the iterations each block runs for it, as (is a contraction, iterations)."""
    analyzer = tvm.sym.Analyzer()
    need = [(func.params[-1], list(box))]  # (buffer variable, box) in discovery order

    def find(var):
        return next((r for v, r in need if v.same_as(var)), None)

    work = []
    for block in reversed(_blocks(func)):
        write = block.writes[0]
        region = find(write.source)
        if region is None:
            continue
        dom = {iv.var: (int(iv.dom.min), int(iv.dom.min) + int(iv.dom.extent) - 1) for iv in block.iter_vars}
        for k, r in enumerate(write.region):
            if r.min in dom and int_value(r.extent) == 1:
                lo, hi = dom[r.min]
                dom[r.min] = (max(lo, region[k][0]), min(hi, region[k][1]))
        work.append((contraction(block) is not None, math.prod(hi - lo + 1 for lo, hi in dom.values())))
        sets = {v: tvm.sym.IntervalSet(lo, hi) for v, (lo, hi) in dom.items()}
        for read in block.reads:
            if read.source.same_as(write.source):
                continue
            box_read = []
            for r in read.region:
                s, extent = analyzer.int_set(r.min, sets), int_value(r.extent)
                bounded = all(isinstance(x, tvm.tirx.IntImm) for x in (s.min_value, s.max_value))
                box_read.append((int(s.min_value), int(s.max_value) + extent - 1)
                                if bounded and extent is not None else EVERYTHING)
            old = find(read.source)
            if old is None:
                need.append((read.source, box_read))
            else:
                old[:] = [(min(a, c), max(b, d)) for (a, b), (c, d) in zip(old, box_read)]
    params = {i: find(p) for i, p in enumerate(func.params[:-1])}
    return {i: tuple(r) for i, r in params.items() if r is not None}, work


def _clamp(box, shape) -> Box:
    return tuple((max(0, lo), min(s - 1, hi)) for (lo, hi), s in zip(box, shape))


class CostModel:
    """Recomputation and fusion savings of a sub-graph's split, in cycles of one cluster."""

    def __init__(self, mod, graph: OpGraph, hw):
        self.mod, self.graph, self.hw = mod, graph, hw

    def cycles(self, work) -> float:
        cores, mme = self.hw.cores_per_cluster, self.hw.mme.macs_per_cycle
        return sum(n / (mme if c else self.hw.vme_lanes) for c, n in work) / cores

    def recompute(self, sgs: SubGraphs, g: int, split: gt.Split) -> tuple[float, float]:
        """(recomputed cycles, the sub-graph's cycles) of splitting SG ``g`` by ``split``."""
        graph, members = self.graph, sgs.groups[g]
        _, _, outputs = gt.sg_tensors(sgs, g)
        out = graph.tensors[outputs[0]].shape
        piece, middle = out[split.d] // split.f, split.f // 2
        need = {}
        for t in outputs:
            shape = graph.tensors[t].shape
            box = [(0, s - 1) for s in shape]
            if len(shape) == len(out) and shape[split.d] == out[split.d]:
                box[split.d] = (middle * piece, (middle + 1) * piece - 1)
            need[t] = tuple(box)
        whole = part = 0.0
        for n in sorted(members, reverse=True):
            node = graph.nodes[n]
            if node.output not in need:
                continue
            func, shape = self.mod[node.func], graph.tensors[node.output].shape
            regions, work = reads_for(func, _clamp(need[node.output], shape))
            part += self.cycles(work)
            whole += self.cycles(reads_for(func, tuple((0, s - 1) for s in shape))[1])
            for k, t in enumerate(node.inputs):
                tensor = graph.tensors[t]
                if k in regions and tensor.producer in members:
                    box = _clamp(regions[k], tensor.shape)
                    need[t] = tuple((min(a, c), max(b, d)) for (a, b), (c, d) in zip(need[t], box)) \
                        if t in need else box
        return split.f * part - whole, whole

    def fusion_saves(self, sgs: SubGraphs, g: int) -> float:
        _, inner, _ = gt.sg_tensors(sgs, g)
        nbytes = sum(math.prod(self.graph.tensors[t].shape) for t in inner) * self.hw.storage_bytes
        return 2 * nbytes / (self.hw.ddr_bytes_per_cycle / self.hw.clusters) \
            + (len(sgs.groups[g]) - 1) * self.hw.kernel_launch_cycles

    def split_info(self, sgs, g, capacity, esize) -> list[gt.Split]:
        """Algorithm 1 with the rule: a split recomputing more than fusion saves does not fit."""
        info = PLAIN_SPLIT_INFO(sgs, g, capacity, esize)
        if len(sgs.groups[g]) == 1:
            return info
        saves = self.fusion_saves(sgs, g)
        return [s if not s.split or self.recompute(sgs, g, s)[0] <= saves else gt.Split(s.d, False, 0, 0)
                for s in info]


PLAIN_SPLIT_INFO = gt.split_info


def grouping(graph: OpGraph, hw):
    return gt.group_two_levels(SubGraphs(graph), hw.lb_bytes, hw.gb_bytes, hw.storage_bytes)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", choices=sorted(WORKLOADS), default=DEFAULT)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--target", default="dsa/stcp920")
    args = p.parse_args()
    hw = hardware.get(args.target)
    rows = []
    for label in args.models:
        _step(f"{label} batch {args.batch}")
        with tvm.target.Target("llvm"):
            mod = fuse(import_onnx(load_workload(label, args.batch, args.tiny)))
        graph, _ = OpGraph.from_relax(mod).per_cluster(hw.clusters)
        model = CostModel(mod, graph, hw)
        now = grouping(graph, hw)
        rejected, factors = 0, []
        for g, members in enumerate(now.groups):
            best = gt.best_split(gt.split_info(now, g, hw.lb_bytes, hw.storage_bytes))
            if len(members) == 1 or best is None:
                continue
            extra, whole = model.recompute(now, g, best)
            if extra > model.fusion_saves(now, g):
                rejected += 1
                factors.append(extra / whole)
        gt.split_info = model.split_info
        try:
            ruled = grouping(graph, hw)
        finally:
            gt.split_info = PLAIN_SPLIT_INFO
        multi = sum(len(m) > 1 for m in now.groups)
        span = f"{min(factors):.1f}-{max(factors):.1f}" if factors else "-"
        rows.append([label, len(graph.nodes), len(now.groups), f"{rejected} of {multi}", span, len(ruled.groups)])
    size = "tiny" if args.tiny else "full size"
    _table(f"Algorithm 1 with the recomputation cost model ({size}, batch {args.batch}, one cluster's share)",
           ["model", "layers", "sub-graphs", "rejected by the model", "their recomputation (x own work)",
            "sub-graphs with the model"], rows)


if __name__ == "__main__":
    main()
