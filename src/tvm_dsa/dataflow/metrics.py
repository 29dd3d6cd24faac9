"""Seed 003's performance model of a dataflow, counted exactly on the relations.

Per tensor F, with A = A_D,F (pairs stamp -> element):
- total = sum(A): accesses over all stamps;
- reuse = sum(A ∩ M⁻¹·A) with M = M_temporal ∪ M_spatial: accesses whose element the stamp can
  take from the same PE at the previous time stamp or from a linked PE (the overlap of
  neighbouring stamps); temporal = the part the same PE already holds; spatial = the rest, so
  reuse = spatial + temporal exactly;
- unique = total - reuse: what must move between the scratchpad and the PEs;
- reuse factor = total / unique.
Array-wide: utilisation = busy PE-stamps / (PEs x time stamps in use), by walking the stamps;
Delay_compute = sum(D_S) / (utilisation x PEs); Delay_read / Delay_write = unique volume of the
inputs / outputs over the scratchpad bandwidth; latency = max(Delay_compute, Delay_read,
Delay_write); IBW = spatial reuse / Delay_compute; SBW = unique / Delay_compute.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Mapping

from tvm_dsa.dataflow.notation import Dataflow, PEArray

if TYPE_CHECKING:  # counting needs islpy with barvinok; the closed forms' DataflowMetrics do not
    from tvm_dsa.dataflow import relations as rel


@dataclass(frozen=True)
class TensorVolumes:
    """Data volumes of one tensor under a dataflow, in element accesses."""

    tensor: str
    is_output: bool
    total: int
    temporal_reuse: int
    spatial_reuse: int

    @property
    def reuse(self) -> int:
        return self.temporal_reuse + self.spatial_reuse

    @property
    def unique(self) -> int:
        return self.total - self.reuse

    @property
    def reuse_factor(self) -> float:
        return self.total / self.unique if self.unique else float("inf")


@dataclass(frozen=True)
class DataflowMetrics:
    """What a dataflow costs on a PE array: the counts, and the seed's derived figures."""

    op: str
    dataflow: str
    array: tuple[int, ...]
    interconnect: str
    bandwidth: float
    instances: int       # sum(D_S): MACs, one per PE per stamp, so also the busy PE-stamps
    time_stamps: int     # distinct time stamps in use: the array's cycles
    tensors: tuple[TensorVolumes, ...]

    @property
    def pes(self) -> int:
        return math.prod(self.array)

    @property
    def utilisation(self) -> float:
        """Busy PE-stamps over all PE-stamps of the time stamps in use."""
        return self.instances / (self.pes * self.time_stamps)

    @property
    def compute_delay(self) -> float:
        """sum(D_S) / (Util_PE x PE size): the number of time stamps when a PE does one instance per stamp."""
        return self.instances / (self.utilisation * self.pes)

    @property
    def read_delay(self) -> float:
        return sum(t.unique for t in self.tensors if not t.is_output) / self.bandwidth

    @property
    def write_delay(self) -> float:
        return sum(t.unique for t in self.tensors if t.is_output) / self.bandwidth

    @property
    def latency(self) -> float:
        return max(self.compute_delay, self.read_delay, self.write_delay)

    def ibw(self, tensor: str | None = None) -> float:
        """PE-to-PE bandwidth (elements per stamp) of one tensor, or of all."""
        return sum(t.spatial_reuse for t in self._select(tensor)) / self.compute_delay

    def sbw(self, tensor: str | None = None) -> float:
        """Scratchpad-to-PE bandwidth (elements per stamp) of one tensor, or of all."""
        return sum(t.unique for t in self._select(tensor)) / self.compute_delay

    def energy(self, itemsize: Mapping[str, int], scratchpad: float, link: float, register: float) -> dict[str, float]:
        """Picojoules per tensor (the seed's "energy?"): its accesses at each level — unique volume at the
        scratchpad, spatial reuse over PE links, temporal reuse from PE registers — times its element's
        bits (``itemsize`` bytes) and the level's picojoules per bit."""
        return {t.tensor: (t.unique * scratchpad + t.spatial_reuse * link + t.temporal_reuse * register)
                * 8 * itemsize[t.tensor] for t in self.tensors}

    def tensor(self, name: str) -> TensorVolumes:
        return self._select(name)[0]

    def _select(self, tensor: str | None) -> tuple[TensorVolumes, ...]:
        picked = tuple(t for t in self.tensors if tensor in (None, t.tensor))
        if not picked:
            raise KeyError(f"no tensor {tensor!r} in {self.op}; tensors: {[t.tensor for t in self.tensors]}")
        return picked

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tensors"] = [dict(asdict(t), reuse=t.reuse, unique=t.unique, reuse_factor=t.reuse_factor,
                             ibw=self.ibw(t.tensor), sbw=self.sbw(t.tensor)) for t in self.tensors]
        d.update(pes=self.pes, utilisation=self.utilisation, compute_delay=self.compute_delay,
                 read_delay=self.read_delay, write_delay=self.write_delay, latency=self.latency,
                 ibw=self.ibw(), sbw=self.sbw())
        return d

    def __str__(self) -> str:
        shape = "x".join(map(str, self.array))
        head = [f"{self.op}: {self.dataflow} on a {shape} {self.interconnect} array, "
                f"scratchpad {self.bandwidth:g} elements/stamp",
                f"  instances {self.instances:,}, time stamps {self.time_stamps:,}, utilisation "
                f"{self.utilisation:.1%}, latency {self.latency:,.1f} (compute {self.compute_delay:,.1f}, "
                f"read {self.read_delay:,.1f}, write {self.write_delay:,.1f})"]
        rows = [("tensor", "total", "reuse", "spatial", "temporal", "unique", "reuse factor", "IBW", "SBW")]
        for t in self.tensors:
            rows.append((t.tensor + (" (out)" if t.is_output else ""), f"{t.total:,}", f"{t.reuse:,}",
                         f"{t.spatial_reuse:,}", f"{t.temporal_reuse:,}", f"{t.unique:,}",
                         f"{t.reuse_factor:.3f}", f"{self.ibw(t.tensor):.2f}", f"{self.sbw(t.tensor):.2f}"))
        return "\n".join(head + ["  " + line for line in _columns(rows, left=1)])


def overlap(a, neighbours):
    """A ∩ M⁻¹·A: the accesses whose element a neighbouring stamp (under ``neighbours``) holds."""
    return a.intersect(neighbours.reverse().apply_range(a))


def reuse_sets(st: rel.SpaceTime, tensor: str):
    """The reused accesses of ``tensor`` (A_D,F ∩ M⁻¹·A_D,F) and the temporally reused ones (the same
    PE held the element at the previous time stamp)."""
    a = st.assignment(tensor)
    return overlap(a, st.neighbours), overlap(a, st.temporal_map)


def _total(st: rel.SpaceTime, tensor: str) -> int:
    # Θ is a bijection onto the stamps (check_fits), so sum(A_D,F) = sum(A_S,F), which has no
    # existential variables to count through.
    from tvm_dsa.dataflow import relations as rel
    return rel.count(rel.access(st.df.op, tensor))


def tensor_volumes(st: rel.SpaceTime, tensor: str) -> TensorVolumes:
    """Total, temporal and spatial reuse of ``tensor`` (exact counts)."""
    from tvm_dsa.dataflow import relations as rel
    reuse, temporal_reuse = (rel.count(s) for s in reuse_sets(st, tensor))
    return TensorVolumes(tensor, tensor == st.df.op.output.tensor, _total(st, tensor), temporal_reuse,
                         reuse - temporal_reuse)


def unique_volume(st: rel.SpaceTime, tensor: str) -> int:
    """``tensor_volumes(st, tensor).unique`` with one count fewer (the search's inner loop)."""
    from tvm_dsa.dataflow import relations as rel
    return _total(st, tensor) - rel.count(overlap(st.assignment(tensor), st.neighbours))


def analyse(df: Dataflow, array: PEArray) -> DataflowMetrics:
    """The metrics of dataflow ``df`` on ``array`` (raises ``NotationError`` if it does not fit)."""
    from tvm_dsa.dataflow import relations as rel
    rel.check_fits(df, array)
    st = rel.SpaceTime(df, array)
    return DataflowMetrics(
        op=df.op.name, dataflow=str(df), array=array.shape, interconnect=array.interconnect.name,
        bandwidth=array.bandwidth, instances=rel.count(rel.domain(df.op)), time_stamps=rel.count(st.time_stamps), tensors=tuple(tensor_volumes(st, t) for t in df.op.tensors),
    )


def summary(rows: list[tuple[str, DataflowMetrics]]) -> str:
    """One line per named dataflow: utilisation, delays, latency, unique volume, IBW and SBW."""
    table = [("dataflow", "interconnect", "util", "compute", "read", "write", "latency", "unique", "IBW", "SBW")]
    for name, m in rows:
        table.append((name, m.interconnect, f"{m.utilisation:.1%}", f"{m.compute_delay:,.0f}",
                      f"{m.read_delay:,.0f}", f"{m.write_delay:,.0f}", f"{m.latency:,.0f}",
                      f"{sum(t.unique for t in m.tensors):,}", f"{m.ibw():.1f}", f"{m.sbw():.1f}"))
    return "\n".join(_columns(table, left=2))


def _columns(rows: list[tuple[str, ...]], left: int) -> list[str]:
    """``rows`` as aligned text: the first ``left`` columns flush left, the numbers flush right."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in rows]
