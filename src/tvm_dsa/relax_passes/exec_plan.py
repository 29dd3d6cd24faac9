"""Static execution planning (seed 001 §4.3): an order of a graph's ops that keeps the bytes of
live intermediates low.

A ``DataflowGraph`` is a DAG of ops, each writing one tensor of ``sizes[i]`` bytes and reading
the tensors of ``inputs[i]``; graph inputs and weights are not counted. While op ``v`` runs, its
inputs and its output are live, and so is every tensor written earlier that a later op still
reads (or that the graph returns). The peak of an order is the most bytes live while one op
runs; finding the order of least peak is NP-complete (the seed, citing "Ordering Chaos"), so:

* ``optimal_order``: exact, by dynamic programming over the sets of ops already run (each set
  closed under producers), the best peak to reach it and the last op that got there — feasible
  while the graph has few such sets (the seed's rule 1: "如果sg中所有张量的形状都是已知常量,那么sg的
  最优执行计划可以通过穷举搜索静态获得");
* ``greedy_order``: a memory-aware list schedule — among the ops whose inputs are ready, the one
  that leaves the fewest bytes live, then the one that needs the fewest while it runs;
* ``plan_order``: the exact order when the search stays under a budget, else the greedy one.

Sizes are integers. Symbolic sizes that are all multiples of one product of symbols (``B·S·k``)
have the same best order for every value of the product (scaling every size by one positive
factor scales every peak by it): plan with the product set to 1 — the seed's rule 2, "如果这些形状是
从同一组符号常量派生出来的". ``lifetimes`` turns an order into the memory planners' lifetimes.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Sequence

from tvm_dsa.memory_plan import Lifetime


@dataclass(frozen=True)
class DataflowGraph:
    sizes: tuple[int, ...]                # bytes each op writes
    inputs: tuple[tuple[int, ...], ...]   # the ops whose tensors each op reads
    outputs: frozenset = frozenset()      # ops whose tensors the graph returns (live to the end)
    consumers: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if len(self.sizes) != len(self.inputs):
            raise ValueError(f"{len(self.sizes)} sizes for {len(self.inputs)} ops")
        for v, preds in enumerate(self.inputs):
            for u in preds:
                if not 0 <= u < len(self.sizes) or u == v:
                    raise ValueError(f"op {v} reads op {u}, which is not another op of the graph")
        if any(s < 0 for s in self.sizes):
            raise ValueError("sizes must be non-negative")
        consumers: list[list[int]] = [[] for _ in self.sizes]
        for v, preds in enumerate(self.inputs):
            for u in set(preds):
                consumers[u].append(v)
        object.__setattr__(self, "consumers", tuple(tuple(c) for c in consumers))
        if len(topological(self)) != len(self.sizes):
            raise ValueError("the graph has a cycle")

    @classmethod
    def from_opgraph(cls, graph) -> "DataflowGraph":
        """The graph of an ``OpGraph``'s nodes (``tvm_dsa.schedule.graph``), node order kept."""
        producer = {t.name: t.producer for t in graph.tensors.values() if t.producer is not None}
        inputs = tuple(tuple(sorted({producer[t] for t in n.inputs if t in producer})) for n in graph.nodes)
        sizes = tuple(graph.tensors[n.output].nbytes for n in graph.nodes)
        outputs = frozenset(graph.tensors[t].producer for t in graph.outputs)
        return cls(sizes, inputs, outputs)


@dataclass(frozen=True)
class Schedule:
    order: tuple[int, ...]
    peak: int


def topological(g: DataflowGraph) -> list[int]:
    """Kahn's order, lowest index first among the ready ops (the program's own order if it is
    one)."""
    missing = [len(set(p)) for p in g.inputs]
    ready = [v for v, m in enumerate(missing) if m == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        v = heapq.heappop(ready)
        order.append(v)
        for c in g.consumers[v]:
            missing[c] -= 1
            if missing[c] == 0:
                heapq.heappush(ready, c)
    return order


def _grown(g: DataflowGraph, v: int, done) -> int:
    """Bytes live after running ``v`` minus before, ``done`` the ops run before it: its output
    (unless nothing reads or returns it) less the inputs read for the last time (not returned)."""
    freed = sum(g.sizes[u] for u in set(g.inputs[v])
                if u not in g.outputs and all(c == v or c in done for c in g.consumers[u]))
    kept = g.sizes[v] if g.consumers[v] or v in g.outputs else 0
    return kept - freed


def peak_of(g: DataflowGraph, order: Sequence[int]) -> int:
    """The most bytes live while one op of ``order`` runs."""
    if sorted(order) != list(range(len(g.sizes))):
        raise ValueError("the order must list every op exactly once")
    done, live, peak = set(), 0, 0
    for v in order:
        if any(u not in done for u in g.inputs[v]):
            raise ValueError(f"op {v} runs before one of its inputs")
        peak = max(peak, live + g.sizes[v])
        live += _grown(g, v, done)
        done.add(v)
    return peak


def greedy_order(g: DataflowGraph) -> Schedule:
    done: set[int] = set()
    missing = [len(set(p)) for p in g.inputs]
    ready = {v for v, m in enumerate(missing) if m == 0}
    order = []
    while ready:
        v = min(ready, key=lambda u: (_grown(g, u, done), g.sizes[u], u))
        ready.remove(v)
        done.add(v)
        order.append(v)
        for c in g.consumers[v]:
            missing[c] -= 1
            if missing[c] == 0:
                ready.add(c)
    return Schedule(tuple(order), peak_of(g, order))


def optimal_order(g: DataflowGraph, max_states: int = 200_000) -> Schedule | None:
    """The order of least peak, or None if the search would visit more than ``max_states`` sets
    of ops already run."""
    n = len(g.sizes)
    preds = [sum(1 << u for u in set(p)) for p in g.inputs]
    # per set of ops run: (best peak to reach it, bytes live after it, last op, previous set)
    layer = {0: (0, 0, -1, -1)}
    states, parents = 1, {}
    for _ in range(n):
        nxt: dict[int, tuple] = {}
        for done, (peak, live, _, _) in layer.items():
            ran = {u for u in range(n) if done >> u & 1}
            for v in range(n):
                if done >> v & 1 or preds[v] & ~done:
                    continue
                key = done | 1 << v
                cand = (max(peak, live + g.sizes[v]), live + _grown(g, v, ran), v, done)
                if key not in nxt or cand[0] < nxt[key][0]:
                    nxt[key] = cand
        states += len(nxt)
        if states > max_states:
            return None
        parents.update((k, (v, prev)) for k, (_, _, v, prev) in nxt.items())
        layer = nxt
    if n == 0:
        return Schedule((), 0)
    ((full, (peak, _, _, _)),) = layer.items()
    order = []
    while full:
        v, full = parents[full]
        order.append(v)
    return Schedule(tuple(reversed(order)), peak)


def plan_order(g: DataflowGraph, max_states: int = 200_000) -> Schedule:
    """The exact order where the search is small enough, else the greedy one."""
    return optimal_order(g, max_states) or greedy_order(g)


def lifetimes(g: DataflowGraph, order: Sequence[int]) -> list[Lifetime]:
    """Each op's tensor as a memory-plan lifetime, steps = positions in ``order``: written at its
    op's step, last read at its last consumer's (returned tensors: the last step)."""
    step = {v: i for i, v in enumerate(order)}
    end = len(order) - 1
    return [Lifetime(g.sizes[v], step[v], end if v in g.outputs else max((step[c] for c in g.consumers[v]),
                                                                           default=step[v]))
            for v in range(len(g.sizes))]
