"""Simulated annealing over resource allocation trees (seed 002 §4.1), one engine for SET, LS, LP.

From the initial tree (every leaf under a root T-cut) the search makes ``n = beta * L``
iterations. Iteration ``i`` draws a neighbour with a random operator (``ops.mutate``) and accepts
it when it costs no more, or else with probability ``exp(-(c'/c - 1) / T_i)``: the cost is
``E^n * D^m`` (edge E²D, cloud ED², EDP for comparisons), compared relatively so that ``T0`` does
not depend on the workload's scale. The temperature ``T_i = T0 * (1 - i/n)^alpha`` ends at 0
(the seed's formula is lost from the text; this one has its stated properties: starts at ``T0``,
cools at a speed set by ``alpha``, reaches 0). Seed-002 defaults: T0 = 0.07, alpha = 8,
beta = 100. LS and LP are the same search restricted to ``ops.LS`` / ``ops.LP`` trees.
Deterministic for a given seed. Independent restarts from other seeds (``anneal_each``, in this
process or as Ray tasks) and the best of them (``best``) widen the search.

Warm start (``Anneal.warm``, not in the seed): SET's search first runs the LS and the LP search
with its own configuration (the same trees as those searches alone, seed for seed), then its
``n`` iterations in the SET space from the better of their best trees (LS and LP trees are SET
trees), so its result never costs more than theirs. From the seed's initial tree alone, large
batches on many tiles got stuck in a root T-cut of 16 sub-batches over all layers (feature maps on
chip, every weight reloaded 16 times), 1.4x slower than the LS search's segmentation at the same
budget: reaching that from there takes a chain of group and sub-batch moves each of which costs
more first. Warmed in LS alone, it could not reach LP's pipelines either (ResNet-50 on
``set-cloud144``, batch 64, EDP: 1.36x the LP search's cost). The three best trees are the
search's ``finalists``: the evaluator is not exact (up to 17 % on ResNet-50's and GoogLeNet's
trees), so the ``set`` schedule has kernel generation simulate their programs and keep the
cheapest.
"""

from __future__ import annotations

import dataclasses
import math
import random
import sys
import time
from dataclasses import dataclass, field

from tvm_dsa.hardware.model import Hardware
from tvm_dsa.schedule.set.evaluate import Evaluation, Evaluator
from tvm_dsa.schedule.set.layers import LayerGraph
from tvm_dsa.schedule.set.ops import LP, LS, SET, Space, mutate
from tvm_dsa.schedule.set.tree import Tree, initial_tree

#: (n, m) of the objective E^n * D^m by name.
OBJECTIVES = {"e2d": (2, 1), "ed2": (1, 2), "edp": (1, 1), "delay": (0, 1), "energy": (1, 0)}


@dataclass(frozen=True)
class Anneal:
    """Hyper-parameters of the search (seed 002 §5.1.4 defaults)."""

    t0: float = 0.07
    alpha: float = 8.0
    beta: float = 100.0
    objective: str = "edp"
    seed: int = 0
    space: Space = SET
    warm: bool = True  # a SET search starts from the LS and LP searches' best trees

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {self.objective!r}; known: {sorted(OBJECTIVES)}")
        if self.t0 < 0 or self.alpha <= 0 or self.beta <= 0:
            raise ValueError("t0 must be >= 0, alpha and beta > 0")

    def temperature(self, i: int, n: int) -> float:
        return self.t0 * (1 - i / n) ** self.alpha


@dataclass(frozen=True)
class Finalist:
    """The best tree a search found in one space (``scheme``: its name, ``set``, ``ls`` or ``lp``)."""

    scheme: str
    tree: Tree
    evaluation: Evaluation
    cost: float


@dataclass
class SearchResult:
    tree: Tree
    evaluation: Evaluation
    cost: float
    iterations: int
    accepted: int
    seconds: float  # wall clock
    cpu_seconds: float  # this process's CPU time (the wall clock less what other jobs took)
    history: list = field(default_factory=list)  # best cost after each iteration
    seed: int = 0  # the seed of the search that found it
    finalists: tuple[Finalist, ...] = ()  # the best tree of each space searched (SET: SET, LS, LP)


def anneal(graph: LayerGraph, hw: Hardware, batch: int, config: Anneal = Anneal(),
           evaluator: Evaluator | None = None, progress: bool = False) -> SearchResult:
    """The best tree found for ``graph`` at ``batch`` on ``hw``."""
    start, cpu = time.perf_counter(), time.process_time()
    ev = evaluator or Evaluator(graph, hw)
    rng = random.Random(config.seed)
    iterations = max(1, round(config.beta * len(graph)))
    tree, history, accepted = initial_tree(graph, batch), [], 0
    firsts = []
    # ==, not is: a config sent to another process (a Ray task) holds a copy of SET
    if config.warm and config.space == SET:
        firsts = [anneal(graph, hw, batch, dataclasses.replace(config, space=space), ev, progress)
                  for space in (LS, LP)]
        tree = min(firsts, key=lambda r: r.cost).tree
        history = firsts[0].history + [min(firsts[0].cost, c) for c in firsts[1].history]
        accepted = sum(r.accepted for r in firsts)
    best, accepted = _chain(tree, graph, hw, config, ev, rng, iterations, history, progress, accepted)
    finalists = (Finalist(config.space.name, *best),) + tuple(f for r in firsts for f in r.finalists)
    return SearchResult(*best, len(history), accepted, time.perf_counter() - start, time.process_time() - cpu,
                        history, config.seed, finalists)


def anneal_each(graph: LayerGraph, hw: Hardware, batch: int, configs: list[Anneal], on_ray: bool = False,
                evaluator: Evaluator | None = None, progress=None) -> list[SearchResult]:
    """``anneal`` with each of ``configs`` (e.g. the same search from other seeds), in their order:
    one after another here (sharing ``evaluator``), or with ``on_ray`` all at once as Ray tasks of
    one CPU on the Ray this process is connected to. A search is deterministic for its seed, so
    both give the same trees; ``best`` keeps one. ``progress(done, total)`` is called as searches end."""
    results: list = [None] * len(configs)

    def finished(i: int, result: SearchResult) -> None:
        results[i] = result
        if progress is not None:
            progress(sum(r is not None for r in results), len(configs))

    if not on_ray:
        ev = evaluator or Evaluator(graph, hw)
        for i, c in enumerate(configs):
            finished(i, anneal(graph, hw, batch, c, ev))
        return results
    import ray

    task = ray.remote(num_cpus=1, max_retries=0)(anneal)
    graph_ref, hw_ref = ray.put(graph), ray.put(hw)
    pending = {task.remote(graph_ref, hw_ref, batch, c): i for i, c in enumerate(configs)}
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)  # a wait without one defers Ctrl-C
        for ref in ready:
            finished(pending.pop(ref), ray.get(ref))
    return results


def best(results: list[SearchResult]) -> SearchResult:
    """The result of least cost; of equal costs the first (the lowest seed of a run of restarts)."""
    return min(results, key=lambda r: r.cost)


def _chain(tree: Tree, graph: LayerGraph, hw: Hardware, config: Anneal, ev: Evaluator, rng: random.Random,
           iterations: int, history: list, progress: bool, accepted: int) -> tuple:
    """``iterations`` steps of annealing from ``tree`` (the temperature falls from T0 to 0 over
    them); appends the best cost after each step to ``history``. Returns ((best tree, its
    evaluation, its cost), accepted moves so far)."""
    n_exp, m_exp = OBJECTIVES[config.objective]
    evaluation = ev.evaluate(tree)
    cost = evaluation.cost(n_exp, m_exp)
    best = (tree, evaluation, cost)
    for i in range(iterations):
        candidate = mutate(tree, graph, hw.cores, rng, config.space)
        if candidate is not None:
            e = ev.evaluate(candidate)
            c = e.cost(n_exp, m_exp)
            t = config.temperature(i, iterations)
            if c <= cost or (t > 0 and rng.random() < math.exp(-(c / cost - 1) / t)):
                tree, evaluation, cost = candidate, e, c
                accepted += 1
                if c < best[2]:
                    best = (tree, evaluation, cost)
        history.append(best[2])
        if progress and (i + 1) % max(1, iterations // 50) == 0:
            done = (i + 1) / iterations
            print(f"\r[{'#' * int(40 * done):<40}] {i + 1}/{iterations} best {best[2]:.4g}",
                  end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    return best, accepted
