"""Data-centric (MAESTRO-style) dataflows: map directives and their polynomial estimates.

A data-centric dataflow is a list of directives, outermost first, one per loop of the statement,
with size = offset = 1 (seed 003's assumption for comparing the notations):

- ``TemporalMap(1,1) k``: the loop runs in time, one index per step, the same on every PE;
- ``SpatialMap(1,1) i``: the loop is spread over one axis of the PE array (the first SpatialMap over
  axis 0, the second over axis 1); when it exceeds the axis its folds run in time at the
  directive's position.

Two things follow from a directive list:

- ``relation``: the same dataflow as a rectangular Θ (``PE[i % R, j] | T[i // R, k]``), which the
  relation-centric model counts exactly; so the two notations can be compared on one metric;
- ``estimate``: MAESTRO's way of costing it, polynomials of the loop sizes: the number of steps,
  each tensor's footprint on the array in a step (one fetch per distinct element of the step: the
  array multicasts) and reuse across the innermost time loop only, either stationary (the loop
  does not index the tensor) or a sliding window (it shifts one index of the tensor).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from tvm_dsa.dataflow.expr import NotationError, linear_form
from tvm_dsa.dataflow.notation import Dataflow, PEArray, TensorOp


@dataclass(frozen=True)
class Directive:
    """``SpatialMap(1,1) loop`` or ``TemporalMap(1,1) loop``."""

    spatial: bool
    loop: str

    def __str__(self) -> str:
        return f"{'SpatialMap' if self.spatial else 'TemporalMap'}(1,1) {self.loop}"


_DIRECTIVE = re.compile(r"^(SpatialMap|TemporalMap)\s*(?:\(\s*(\d+)\s*,\s*(\d+)\s*\))?\s*([A-Za-z_]\w*)$")


@dataclass(frozen=True)
class TimeLoop:
    """One time dimension of a data-centric dataflow: ``loop`` advancing by ``step`` for ``trips`` steps
    (a TemporalMap: step 1; the folds of a SpatialMap: step = its array axis)."""

    loop: str
    step: int
    trips: int


@dataclass(frozen=True)
class DataCentric:
    """A MAESTRO-style dataflow of ``op``: its directives, outermost first."""

    op: TensorOp
    directives: tuple[Directive, ...]
    name: str = ""

    def __post_init__(self) -> None:
        named = [d.loop for d in self.directives]
        unknown = sorted(set(named) - set(self.op.loops))
        if unknown:
            raise NotationError(f"{self}: {', '.join(unknown)} not a loop of {self.op.name} ({', '.join(self.op.loops)})")
        if sorted(named) != sorted(self.op.loops):
            raise NotationError(f"{self}: the data-centric notation needs one directive per loop of {self.op.name} "
                                f"({', '.join(self.op.loops)}), each once")
        if not any(d.spatial for d in self.directives):
            raise NotationError(f"{self}: no SpatialMap, nothing runs in parallel")

    @classmethod
    def parse(cls, op: TensorOp, text: str, name: str = "") -> "DataCentric":
        """``"SpatialMap(1,1) i; SpatialMap(1,1) j; TemporalMap(1,1) k"`` (``;`` or new lines between)."""
        directives = []
        for part in filter(None, (p.strip() for p in re.split(r"[;\n]", text))):
            m = _DIRECTIVE.match(part)
            if not m:
                raise NotationError(f"expected 'SpatialMap(1,1) loop' or 'TemporalMap(1,1) loop', got {part!r}")
            if m[2] is not None and (m[2], m[3]) != ("1", "1"):
                raise NotationError(f"{part!r}: only size = offset = 1 directives are modelled (seed 003's "
                                    "assumption for comparing the notations)")
            directives.append(Directive(m[1] == "SpatialMap", m[4]))
        return cls(op, tuple(directives), name)

    def __str__(self) -> str:
        return "; ".join(map(str, self.directives))

    @property
    def spatial(self) -> tuple[str, ...]:
        """The SpatialMap loops, in the order of the array axes they map to."""
        return tuple(d.loop for d in self.directives if d.spatial)

    def axes(self, shape: tuple[int, ...]) -> dict[str, int]:
        """Each SpatialMap loop's array axis length; raises unless there is one per axis."""
        if len(self.spatial) != len(shape):
            raise NotationError(f"{self} has {len(self.spatial)} SpatialMap(s) but the PE array {shape} has "
                                f"{len(shape)} axes")
        return dict(zip(self.spatial, shape))

    def time_loops(self, shape: tuple[int, ...]) -> tuple[TimeLoop, ...]:
        """The time dimensions, outermost first: every TemporalMap, and the folds of a SpatialMap
        whose loop exceeds its axis."""
        axes, sizes = self.axes(shape), self.op.sizes
        out = []
        for d in self.directives:
            if not d.spatial:
                out.append(TimeLoop(d.loop, 1, sizes[d.loop]))
            elif sizes[d.loop] > axes[d.loop]:
                out.append(TimeLoop(d.loop, axes[d.loop], -(-sizes[d.loop] // axes[d.loop])))
        return tuple(out)

    def relation(self, shape: tuple[int, ...]) -> Dataflow:
        """The same dataflow as Θ: ``PE[s % n ...] | T[...]`` with a fold ``s // n`` where a SpatialMap
        loop exceeds its axis, at the directive's position."""
        axes, sizes = self.axes(shape), self.op.sizes
        space = [s if sizes[s] <= n else f"{s} % {n}" for s, n in axes.items()]
        time = [t.loop if t.step == 1 else f"{t.loop} // {t.step}" for t in self.time_loops(shape)]
        return Dataflow(self.op, tuple(space), tuple(time) or ("0",), self.name or str(self))

    def estimate(self, array: PEArray) -> "Estimate":
        """MAESTRO-style polynomial estimate of this dataflow on ``array`` (see the module doc)."""
        axes, sizes = self.axes(array.shape), self.op.sizes
        times = self.time_loops(array.shape)
        steps = math.prod(t.trips for t in times)
        tile = {v: min(sizes[v], axes.get(v, 1)) for v in self.op.loops}
        inner = times[-1] if times else None
        fetched = {t: _fetched(self.op, t, tile, inner, steps) for t in self.op.tensors}
        return Estimate(str(self), steps, math.prod(self.op.extents) / (steps * array.size), fetched,
                        self.op.output.tensor, array.bandwidth)


def _fetched(op: TensorOp, tensor: str, tile: dict[str, int], inner: TimeLoop | None, steps: int) -> float:
    """Elements of ``tensor`` moved between the scratchpad and the array over all steps: its footprint
    per step (the bounding box of its accesses over the spatial tile), fetched afresh every step except
    across the innermost time loop, which keeps it (stationary) or shifts it (sliding window)."""
    forms = [[linear_form(i, op.loops) for i in a.indices] for a in op.accesses(tensor)]
    ranges = []
    for position in zip(*forms):
        spans = [sum(abs(c) * (tile[v] - 1) for v, c in coefs.items()) for coefs, _ in position]
        consts = [const for _, const in position]
        ranges.append(max(spans) + max(consts) - min(consts) + 1)
    footprint = math.prod(ranges)
    if inner is None:
        return float(footprint)
    shifted = [p for p, position in enumerate(zip(*forms)) if any(inner.loop in coefs for coefs, _ in position)]
    if not shifted:
        return steps / inner.trips * footprint
    if len(shifted) > 1:
        return float(steps * footprint)
    p = shifted[0]
    shift = inner.step * max(abs(coefs.get(inner.loop, 0)) for coefs, _ in (f[p] for f in forms))
    fresh = min(shift, ranges[p]) / ranges[p]
    return steps / inner.trips * footprint * (1 + (inner.trips - 1) * fresh)


@dataclass(frozen=True)
class Estimate:
    """A data-centric dataflow's polynomial estimate: steps (cycles of compute), utilisation, and the
    elements of each tensor fetched from (inputs) or written to (the output) the scratchpad."""

    dataflow: str
    steps: int
    utilisation: float
    fetched: dict[str, float]
    output: str
    bandwidth: float

    @property
    def read_delay(self) -> float:
        return sum(v for t, v in self.fetched.items() if t != self.output) / self.bandwidth

    @property
    def write_delay(self) -> float:
        return self.fetched[self.output] / self.bandwidth

    @property
    def latency(self) -> float:
        return max(self.steps, self.read_delay, self.write_delay)
