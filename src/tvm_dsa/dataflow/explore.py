"""Design-space exploration: the best dataflow each notation can express for an operation on a PE array.

Both spaces are enumerated as relations Θ and searched by branch and bound on the exact
(relation-centric) latency, so the two notations are compared on one metric:

- **data-centric** (``datacentric_space``): every pair of loops under the two SpatialMaps, every
  other loop a TemporalMap (seed 003: size = offset = 1);
- **relation-centric** (``relation_space``): seed 003's affine space-time maps with coefficients
  0/1 — each PE axis a loop (tiled onto the array with ``%`` and ``//``) or the sum of two loops
  (``ox + rx``) — the time loops that make Θ one-to-one, plain, skewed by the PE coordinates (a
  systolic wavefront) or skewed with the tiles' wavefronts overlapping (pipelined); it contains
  the data-centric space.

Pruning (counted in ``Exploration``):

1. *one time order per innermost loop*: reuse in the model is between neighbouring stamps (the
   same PE one time stamp back, or a linked PE), so two orders of the time loops that end in the same
   loop differ only at the stamps where that loop wraps around; one order per innermost loop is
   generated (the others in the statement's order);
2. *sums fit their axis*: a PE axis that is the sum of two loops is kept only when its values fit
   the axis; folded with ``%`` it cuts the iteration space into parallelogram tiles, partial at both
   ends (their time stamps are also the slowest sets to count: tens of seconds each);
3. *skew only over registers*: a skewed dataflow is generated only when the interconnect's links
   have a register (delay 1); on wires (delay 0) values are shared within a stamp, which a skew
   breaks;
4. *bounds*: the latency is at least the distinct elements of the inputs (or the output) over the
   scratchpad bandwidth, and at least the compute delay, which is at least the MACs over the PE
   coordinates the space map reaches on each axis (cheap: one count per axis expression), and is
   exactly the time stamps in use (one count, shared by the orders of the same time dimensions).
   Candidates are taken in order of the first bound and dropped as soon as a bound reaches the best
   latency found; a candidate's volumes are counted tensor by tensor and given up once its read
   delay does. The search is exact: no candidate of the space with a lower latency is skipped.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from time import perf_counter

import islpy as isl
import numpy as np

from tvm_dsa.dataflow import relations as rel
from tvm_dsa.dataflow.datacentric import DataCentric, Directive, Estimate
from tvm_dsa.dataflow.expr import linear_form
from tvm_dsa.dataflow.library import VARIANTS, Evaluated, evaluate, expression_range, stationary
from tvm_dsa.dataflow.metrics import unique_volume
from tvm_dsa.dataflow.notation import Dataflow, PEArray, TensorOp


def datacentric_space(op: TensorOp, shape: tuple[int, ...]) -> list[DataCentric]:
    """The data-centric dataflows of ``op`` on a ``shape`` array, one per choice of SpatialMap loops and
    innermost time loop (a TemporalMap, or the folds of the last SpatialMap when its loop exceeds its
    axis); the other TemporalMaps in the statement's order."""
    out = []
    for spatial in itertools.permutations(op.loops, len(shape)):
        temporal = [v for v in op.loops if v not in spatial]
        heads = [Directive(True, s) for s in spatial]
        for inner in temporal:
            rest = [Directive(False, v) for v in temporal if v != inner]
            out.append(DataCentric(op, tuple(heads + rest + [Directive(False, inner)])))
        if op.sizes[spatial[-1]] > shape[-1] or not temporal:
            out.append(DataCentric(op, tuple(heads[:-1] + [Directive(False, v) for v in temporal] + heads[-1:])))
    return out


def _rank(rows: list[dict[str, int]], loops: tuple[str, ...]) -> int:
    return int(np.linalg.matrix_rank(np.array([[r.get(v, 0) for v in loops] for r in rows]))) if rows else 0


def space_expressions(op: TensorOp) -> list[str]:
    """Candidate PE-axis expressions: each loop, and the sum of each two loops."""
    return list(op.loops) + [f"{a} + {b}" for a, b in itertools.combinations(op.loops, 2)]


def time_loop_sets(op: TensorOp, space: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The smallest sets of time loops that, with the space expressions, determine every loop (Θ one-to-one):
    the loops no space expression uses, plus as few loops of the space expressions as complete the rank."""
    rows = [linear_form(e, op.loops)[0] for e in space]
    if _rank(rows, op.loops) < len(space):
        return []
    free = [v for v in op.loops if not any(v in r for r in rows)]
    used = [v for v in op.loops if v not in free]
    need = len(op.loops) - _rank(rows + [{v: 1} for v in free], op.loops)
    out = []
    for extra in itertools.combinations(used, need):
        if _rank(rows + [{v: 1} for v in free + list(extra)], op.loops) == len(op.loops):
            out.append(tuple(v for v in op.loops if v in free or v in extra))
    return out


def relation_space(op: TensorOp, shape: tuple[int, ...], skew: bool) -> list[Dataflow]:
    """The affine dataflows of ``op`` on a ``shape`` array (see the module doc): every ordered choice of
    space expressions that fit, every completing set of time loops, every innermost time loop, plain
    and (with ``skew``) the skewed variants of ``VARIANTS``; plus the data-centric ones, which this
    space contains."""
    out = [dc.relation(shape) for dc in datacentric_space(op, shape)]
    for space in itertools.permutations(space_expressions(op), len(shape)):
        if any(e not in op.loops and expression_range(op, e) > n for e, n in zip(space, shape)):
            continue  # a sum of loops that would be folded (pruning 2)
        for times in time_loop_sets(op, space):
            for inner in times or (None,):
                order = tuple(v for v in times if v != inner) + ((inner,) if inner else ())
                out += [stationary(op, space, order, shape, **flags) for flags in VARIANTS.values()
                        if skew or not flags]
    return list({str(df): df for df in out}.values())


@dataclass(frozen=True)
class Exploration:
    """The outcome of a search: the best dataflow (its full metrics), how many candidates the space
    had, for how many the time stamps were counted and for how many the volumes (the others were
    pruned by the bounds), and the wall time."""

    notation: str
    best: Evaluated
    candidates: int
    stamps_counted: int
    evaluated: int
    seconds: float


def distinct_elements(op: TensorOp) -> dict[str, int]:
    """Each tensor's distinct elements: a lower bound of its unique volume under any dataflow."""
    return {t: rel.count(rel.access(op, t).range()) for t in op.tensors}


def _axis_values(df: Dataflow, axis: int) -> int:
    """How many coordinates along PE axis ``axis`` the dataflow uses."""
    used = rel.theta(df).range()
    used = used.project_out(isl.dim_type.set, axis + 1, used.dim(isl.dim_type.set) - axis - 1)
    return rel.count(used.project_out(isl.dim_type.set, 0, axis))


class _Bounds:
    """Lower bounds of a dataflow's latency, each cached across the candidates that share it."""

    def __init__(self, op: TensorOp, array: PEArray):
        self.array, self.macs = array, rel.count(rel.domain(op))
        distinct = distinct_elements(op)
        out = op.output.tensor
        self.floor = max(sum(n for t, n in distinct.items() if t != out), distinct[out]) / array.bandwidth
        self._axis: dict[tuple[int, str], int] = {}
        self._stamps: dict[tuple, int] = {}

    def reach(self, df: Dataflow) -> float:
        """At most the PE coordinates in use along each axis work in a stamp: compute >= MACs / their product."""
        for a, e in enumerate(df.space):
            if (a, e) not in self._axis:
                self._axis[a, e] = _axis_values(df, a)
        return max(self.macs / math.prod(self._axis[a, e] for a, e in enumerate(df.space)), self.floor)

    def stamps(self, df: Dataflow) -> int:
        """The time stamps in use (the compute delay); permuting the time dimensions keeps their number."""
        key = (df.space, tuple(sorted(df.time)))
        if key not in self._stamps:
            self._stamps[key] = rel.count(rel.SpaceTime(df, self.array).time_stamps)
        return self._stamps[key]


def _latency_below(df: Dataflow, array: PEArray, stamps: int, limit: float) -> float | None:
    """The dataflow's latency if it is below ``limit``, else None; stops counting volumes as soon as the
    read delay reaches the limit."""
    st, op = rel.SpaceTime(df, array), df.op
    read = 0.0
    for tensor in op.tensors[1:]:
        read += unique_volume(st, tensor) / array.bandwidth
        if read >= limit:
            return None
    latency = max(stamps, read, unique_volume(st, op.output.tensor) / array.bandwidth)
    return latency if latency < limit else None


def explore(notation: str, dataflows: list[Dataflow], array: PEArray) -> Exploration:
    """The lowest-latency dataflow of ``dataflows`` on ``array``, by branch and bound (module doc, 4):
    candidates in order of the reach bound; the time stamps counted while the bound is below the best
    latency found, the volumes while the time stamps are."""
    start = perf_counter()
    bounds = _Bounds(dataflows[0].op, array)
    order = sorted(range(len(dataflows)), key=lambda i: (bounds.reach(dataflows[i]), i))
    best, best_latency, counted, evaluated = None, math.inf, 0, 0
    for i in order:
        df = dataflows[i]
        if bounds.reach(df) >= best_latency:
            break
        counted += 1
        stamps = bounds.stamps(df)
        if max(stamps, bounds.floor) >= best_latency:
            continue
        evaluated += 1
        latency = _latency_below(df, array, stamps, best_latency)
        if latency is not None:
            best, best_latency = df, latency
    found = evaluate(best.name or str(best), best, array)
    return Exploration(notation, found, len(dataflows), counted, evaluated, perf_counter() - start)


def best_datacentric(op: TensorOp, array: PEArray) -> Exploration:
    return explore("data-centric", [dc.relation(array.shape) for dc in datacentric_space(op, array.shape)], array)


def best_relation(op: TensorOp, array: PEArray) -> Exploration:
    return explore("relation-centric", relation_space(op, array.shape, skew=array.interconnect.delay == 1), array)


def maestro_pick(op: TensorOp, array: PEArray) -> tuple[DataCentric, Estimate]:
    """The data-centric dataflow a MAESTRO-style search picks: the lowest estimated latency."""
    estimates = [(dc, dc.estimate(array)) for dc in datacentric_space(op, array.shape)]
    return min(estimates, key=lambda e: e[1].latency)
