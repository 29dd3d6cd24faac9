"""GraphTurbo's hardware-aware partitioning (seed 000 §3; docs/graphturbo.md is the spec).

This module holds the pure algorithms on ``SubGraphs``; the scheduler that turns their result
into kernels comes later. Implemented so far:

- ``split_info`` (Algorithm 1): for each loop dimension ``d`` of a sub-graph's output tensor,
  whether it can split the sub-graph into instances whose footprint fits the local buffer, with
  which factor ``f_d``, and how many of the sub-graph's layers that split reaches (``n_d``).
- ``best_split`` (Eq. 1): lexmax(n_d, -f_d, -d).

Choices where the seed is silent (docs/graphturbo.md, §1 [AMBIG]):
- candidate factors ``v`` are the divisors of the dimension's extent (load balance), tried from
  small to large; the first whose instance fits (⌈peak / v⌉ ≤ LB) is kept, the greedy choice
  ("a smaller v cuts peak into larger pieces");
- ``peak`` is the bytes of the sub-graph's activations that one run keeps: the inputs it reads from
  other sub-graphs, its intermediates and its outputs, in the chip's storage type (weights are
  promoted separately, §2.2, and not counted);
- a layer is reached by the split when its output has the dimension ``d`` (same rank, same
  position) and the factor divides its extent there.
The recomputation cost model of §3.1 is not implemented yet.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .graph import SubGraphs


@dataclass(frozen=True)
class Split:
    """One entry of SplitInfo: the 4-tuple (split_d, n_d, f_d, d) of seed 000 Algorithm 1."""

    d: int
    split: bool
    n: int
    f: int


def sg_tensors(sgs: SubGraphs, g: int) -> tuple[list[str], list[str], list[str]]:
    """(inputs from outside, intermediates, outputs) of SG ``g``: activation tensor names."""
    graph, members = sgs.graph, sgs.groups[g]
    inputs, inner, outputs = [], [], []
    for n in sorted(members):
        node = graph.nodes[n]
        for t in node.inputs:
            tensor = graph.tensors[t]
            if not tensor.constant and tensor.producer not in members and t not in inputs:
                inputs.append(t)
        used_outside = any(c not in members for c in graph.consumers(n)) or node.output in graph.outputs
        (outputs if used_outside or not graph.consumers(n) else inner).append(node.output)
    return inputs, inner, outputs


def peak_bytes(sgs: SubGraphs, g: int, element_bytes: int) -> int:
    """Activation bytes one run of SG ``g`` holds, in a storage type of ``element_bytes``."""
    return sum(math.prod(sgs.graph.tensors[t].shape) * element_bytes for t in sum(sg_tensors(sgs, g), []))


def split_info(sgs: SubGraphs, g: int, lb_bytes: int, element_bytes: int) -> list[Split]:
    """Algorithm 1 for SG ``g``'s (first) output tensor: one ``Split`` per loop dimension."""
    graph = sgs.graph
    _, _, outputs = sg_tensors(sgs, g)
    out = graph.tensors[outputs[0]].shape
    peak = peak_bytes(sgs, g, element_bytes)
    layers = [graph.tensors[graph.nodes[n].output].shape for n in sorted(sgs.groups[g])]
    info = []
    for d, extent in enumerate(out):
        fits = [v for v in range(1, extent + 1) if extent % v == 0 and math.ceil(peak / v) <= lb_bytes]
        if not fits:
            info.append(Split(d, False, 0, 0))
            continue
        f = fits[0]
        reached = sum(1 for shape in layers if len(shape) == len(out) and shape[d] % f == 0)
        info.append(Split(d, True, reached, f))
    return info


def best_split(info: list[Split]) -> Split | None:
    """Eq. 1: the split reaching most layers, then with the smallest factor (fuller LB), then the
    outermost dimension (parallelism without communication). None when nothing splits."""
    candidates = [s for s in info if s.split]
    return max(candidates, key=lambda s: (s.n, -s.f, -s.d)) if candidates else None
