"""The notation's relations as isl integer sets and maps, and exact counting with barvinok.

A space-time stamp (the seed's ``(PE[p] | T[t])``) is one flat isl tuple ``ST[p..., t...]``.

- ``domain``: D_S; ``access``: A_S,F; ``theta``: Θ_S,D; each takes optional ``params`` (loop ->
  parameter name) to bound the loops by symbolic sizes instead of the operation's extents, for
  parametric counting (``card``; ``closed``);
- ``links``: the interconnect I = { PE[p] -> PE[q] } inside the array;
- ``SpaceTime``: for one dataflow on one array, the stamps in use, A_D,F = Θ⁻¹ · A_S,F (the
  elements each stamp touches), and the space-time maps M_D,D' (``temporal_map`` /
  ``spatial_map``) from a stamp to the stamps that can take a value from it: the same PE at the
  next time stamp, or a linked PE at the next (delay 1) or the same (delay 0) time stamp. "Next"
  is the lexicographic successor among the time stamps in use.
"""

from __future__ import annotations

from functools import cached_property
from typing import Mapping

import islpy as isl

from tvm_dsa.dataflow.expr import NotationError, constraint_to_isl, to_isl
from tvm_dsa.dataflow.notation import Dataflow, PEArray, TensorOp

STAMP = "ST"


Params = Mapping[str, str]  # loop -> the name of the parameter that is its extent


def card(obj: isl.Set | isl.Map) -> isl.PwQPolynomial:
    """Number of integer points of a set, or of pairs of a map, as a piecewise quasi-polynomial of its
    parameters (barvinok)."""
    return (obj.wrap() if isinstance(obj, isl.Map) else obj).card()


def count(obj: isl.Set | isl.Map) -> int:
    """Number of integer points of a set, or of pairs of a map without parameters (barvinok, exact)."""
    n = card(obj)
    return n.eval(isl.Point.zero(n.get_domain_space())).to_python()


def _loops(op: TensorOp) -> str:
    return f"S[{', '.join(op.loops)}]"


def _bounds(op: TensorOp, params: Params | None) -> str:
    """The loop bounds: the extents, or the parameters ``params`` names for the loops."""
    extents = {v: (params or {}).get(v, n) for v, n in zip(op.loops, op.extents)}
    box = " and ".join(f"0 <= {v} < {n}" for v, n in extents.items())
    return box + (f" and {constraint_to_isl(op.where, op.loops)}" if op.where else "")


def _declare(params: Params | None) -> str:
    return f"[{', '.join(params.values())}] -> " if params else ""


def domain(op: TensorOp, params: Params | None = None) -> isl.Set:
    """D_S: the loop instances."""
    return isl.Set(f"{_declare(params)}{{ {_loops(op)} : {_bounds(op, params)} }}")


def access(op: TensorOp, tensor: str, params: Params | None = None) -> isl.Map:
    """A_S,F: each instance to the elements of ``tensor`` it reads or writes."""
    parts = [f"{_loops(op)} -> {tensor}[{', '.join(to_isl(i, op.loops) for i in a.indices)}] : "
             f"{_bounds(op, params)}" for a in op.accesses(tensor)]
    return isl.Map(_declare(params) + "{ " + "; ".join(parts) + " }")


def theta(df: Dataflow, params: Params | None = None) -> isl.Map:
    """Θ_S,D: each instance to its stamp ST[space..., time...]."""
    exprs = ", ".join(to_isl(e, df.op.loops) for e in df.space + df.time)
    return isl.Map(f"{_declare(params)}{{ {_loops(df.op)} -> {STAMP}[{exprs}] : {_bounds(df.op, params)} }}")


def pe_domain(array: PEArray) -> isl.Set:
    return isl.Set("{ PE[%s] : %s }" % (", ".join(f"p{a}" for a in range(len(array.shape))),
                                       " and ".join(f"0 <= p{a} < {n}" for a, n in enumerate(array.shape))))


def links(array: PEArray) -> isl.Map:
    """I = { PE[p] -> PE[p + d] } for the interconnect's offsets d, both ends inside the array."""
    ps = [f"p{a}" for a in range(len(array.shape))]
    parts = [f"PE[{', '.join(ps)}] -> PE[{', '.join(f'{p} + {d}' for p, d in zip(ps, off))}]"
             for off in array.interconnect.offsets]
    pes = pe_domain(array)
    return isl.Map("{ " + "; ".join(parts) + " }").intersect_domain(pes).intersect_range(pes)


def _stamp_map(space: isl.Map, time: isl.Map) -> isl.Map:
    """{ ST[p, t] -> ST[q, u] : space(p, q) and time(t, u) }. Not cut to the stamps in use: every
    use goes through A_D,F, whose stamps are."""
    m = space.flat_product(time)
    return m.set_tuple_name(isl.dim_type.in_, STAMP).set_tuple_name(isl.dim_type.out, STAMP)


class SpaceTime:
    """The stamp relations of one dataflow on one PE array, each built once (with ``params``: for
    symbolic loop sizes; with ``theta_map``: a piecewise Θ of ``df``'s shape that the notation cannot
    write, ``closed`` uses one for two consecutive tiles)."""

    def __init__(self, df: Dataflow, array: PEArray, params: Params | None = None,
                 theta_map: isl.Map | None = None):
        self.df, self.array, self.params = df, array, params
        if theta_map is not None:
            self.theta = theta_map

    @cached_property
    def theta(self) -> isl.Map:
        return theta(self.df, self.params)

    @cached_property
    def stamps(self) -> isl.Set:
        """The space-time stamps at which some instance runs."""
        return self.theta.range()

    @cached_property
    def time_stamps(self) -> isl.Set:
        """The time stamps in use (the array's cycles). Projecting the PEs out leaves existential
        variables; making them explicit divisions keeps the successor map (a lexmin) fast."""
        return self.stamps.project_out(isl.dim_type.set, 0, len(self.df.space)).compute_divs().coalesce()

    @cached_property
    def next_time(self) -> isl.Map:
        """{ T[t] -> T[u] }: u is the time stamp in use right after t."""
        return self.time_stamps.lex_lt_set(self.time_stamps).lexmin()

    @cached_property
    def temporal_map(self) -> isl.Map:
        """M_D,D' for temporal reuse: (PE[p] | T[t]) -> (PE[p] | T[next t])."""
        ps = ", ".join(f"p{a}" for a in range(len(self.df.space)))
        return _stamp_map(isl.Map(f"{{ PE[{ps}] -> PE[{ps}] }}"), self.next_time)

    @cached_property
    def spatial_map(self) -> isl.Map:
        """M_D,D' for spatial reuse: (PE[p] | T[t]) -> (PE[q] | T[t + delay]) for each link p -> q,
        t + 1 being the next time stamp in use."""
        if self.array.interconnect.delay:
            time = self.next_time
        else:
            time = isl.Map.identity(self.time_stamps.get_space().map_from_set())
        return _stamp_map(links(self.array), time)

    @cached_property
    def neighbours(self) -> isl.Map:
        """M_D,D' = M_temporal ∪ M_spatial: the stamps that can take a value from a stamp."""
        return self.temporal_map.union(self.spatial_map)

    def assignment(self, tensor: str) -> isl.Map:
        """A_D,F = Θ⁻¹ · A_S,F: each stamp to the elements of ``tensor`` it touches."""
        return self.theta.reverse().apply_range(access(self.df.op, tensor, self.params))


def check_fits(df: Dataflow, array: PEArray) -> None:
    """Raise ``NotationError`` unless every instance runs on a PE of the array and no PE runs two
    instances in one stamp (one MAC per PE per stamp)."""
    if len(df.space) != len(array.shape):
        raise NotationError(f"dataflow {df} has {len(df.space)} space dimension(s) but the PE array "
                            f"{array.shape} has {len(array.shape)}")
    used = theta(df).range().project_out(isl.dim_type.set, len(df.space), len(df.time))
    used = used.set_tuple_name("PE")
    outside = used.subtract(pe_domain(array))
    if not outside.is_empty():
        pe = _coords(outside.sample_point(), len(df.space))
        raise NotationError(f"dataflow {df} places instances on PE{pe}, outside the {array.shape} array")
    th = theta(df)
    clash = th.apply_range(th.reverse()).subtract(isl.Map.identity(th.get_space().domain().map_from_set()))
    if not clash.is_empty():
        pair = _coords(clash.wrap().sample_point(), 2 * len(df.op.loops))
        n = len(df.op.loops)
        raise NotationError(f"dataflow {df} runs S{pair[:n]} and S{pair[n:]} on the same PE at the same "
                            "time stamp; a PE does one instance per stamp")


def _coords(point: isl.Point, n: int) -> list[int]:
    return [point.get_coordinate_val(isl.dim_type.set, i).to_python() for i in range(n)]
