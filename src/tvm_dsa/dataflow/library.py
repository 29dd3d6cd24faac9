"""Seed 003's benchmarks and the standard dataflows on a 2-D PE array.

A standard dataflow keeps one tensor's elements in place: two expressions of the loops (``space``)
choose the PE, tiled onto the array with ``%`` and ``//`` when they exceed it, and the remaining
loops (``time``) run in order inside each tile. Its systolic variant runs a tile's time loops as one
linear time dimension, skewed by the PE coordinates so that a value can hop one PE per stamp.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from time import perf_counter

import numpy as np

from tvm_dsa.dataflow.expr import NotationError, linear_form
from tvm_dsa.dataflow.metrics import DataflowMetrics, analyse
from tvm_dsa.dataflow.notation import Dataflow, Interconnect, PEArray, TensorOp, multicast, systolic_2d


@dataclass(frozen=True)
class Benchmark:
    """A seed 003 benchmark: its statement, loop sizes and which loops each stationary dataflow
    puts on the array (``stationary[name] = (space expressions, time loops)``)."""

    name: str
    statement: str
    sizes: dict[str, int]
    stationary: dict[str, tuple[tuple[str, str], tuple[str, ...]]] = field(default_factory=dict)

    def op(self, sizes: dict[str, int] | None = None) -> TensorOp:
        """The tensor operation at ``sizes`` (default: the benchmark's own)."""
        sizes = dict(sizes or self.sizes)
        if set(sizes) != set(self.sizes):
            raise NotationError(f"{self.name} has loops {', '.join(self.sizes)}; got sizes for {', '.join(sizes)}")
        return TensorOp.parse(self.name, self.statement, {v: sizes[v] for v in self.sizes})


BENCHMARKS = {b.name: b for b in (
    Benchmark("gemm", "Y[i,j] += A[i,k] * B[k,j]", {"i": 64, "j": 64, "k": 64}, {
        "output-stationary": (("i", "j"), ("k",)),
        "weight-stationary": (("k", "j"), ("i",)),
        "input-stationary": (("i", "k"), ("j",)),
    }),
    Benchmark("conv2d", "Y[k,ox,oy] += A[c, ox + rx, oy + ry] * B[k,c,rx,ry]",
              {"k": 32, "c": 32, "ox": 16, "oy": 16, "rx": 3, "ry": 3}, {
        "output-stationary": (("ox", "oy"), ("k", "c", "rx", "ry")),
        "weight-stationary": (("k", "c"), ("ox", "oy", "rx", "ry")),
        "input-stationary": (("c", "ox + rx"), ("k", "oy", "rx", "ry")),
    }),
    Benchmark("mttkrp", "Y[i,j] += A[i,k,l] * B[k,j] * C[l,j]", {"i": 32, "j": 32, "k": 16, "l": 16}, {
        "output-stationary": (("i", "j"), ("k", "l")),
        "weight-stationary": (("k", "j"), ("i", "l")),
        "input-stationary": (("i", "k"), ("j", "l")),
    }),
    Benchmark("mmc", "Y[i,j] += A[i,k] * B[k,l] * C[l,j]", {"i": 32, "j": 32, "k": 16, "l": 16}, {
        "output-stationary": (("i", "j"), ("k", "l")),
        "weight-stationary": (("k", "l"), ("i", "j")),
        "input-stationary": (("i", "k"), ("j", "l")),
    }),
    Benchmark("jacobi2d", "Y[i,j] = (A[i,j] + A[i-1,j] + A[i,j-1] + A[i+1,j] + A[i,j+1]) / 5",
              {"i": 64, "j": 64}, {
        "output-stationary": (("i", "j"), ()),
    }),
)}


def benchmark(name: str) -> Benchmark:
    if name not in BENCHMARKS:
        raise NotationError(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}")
    return BENCHMARKS[name]


def expression_range(op: TensorOp, expr: str) -> int:
    """How many consecutive values the affine expression ``expr`` of ``op``'s loops takes from its least
    (``ox + rx`` with ox < 16, rx < 3: 18)."""
    coefs, _ = linear_form(expr, op.loops)
    return sum(abs(c) * (op.sizes[v] - 1) for v, c in coefs.items()) + 1


def stationary(op: TensorOp, space: tuple[str, str], time: tuple[str, ...], shape: tuple[int, int],
               skew: bool = False, pipelined: bool = False, name: str = "", symbolic: bool = False) -> Dataflow:
    """``PE[s0 % R, s1 % C] | T[s0 // R, s1 // C, *time]``: the modulo and the tile dimension are left
    out where a space expression's values fit its array axis (kept with ``symbolic``, for sizes not
    known: where they fit, the tile index is 0 and the modulo the identity). With ``skew`` the time loops of a
    tile become one linear dimension delayed by ``s0 % R + s1 % C`` stamps (a systolic wavefront);
    ``pipelined`` folds the tile dimensions into it too, so a tile starts as soon as the previous one
    has fed its first PE and consecutive wavefronts overlap."""
    if symbolic and (pipelined or (skew and len(time) > 1)):
        raise NotationError(f"dataflow {name!r}: its time strides are loop sizes, so it has no symbolic form")
    pes, tiles = [], []  # tiles: (index expression, number of tiles)
    for expr, n in zip(space, shape):
        values = expression_range(op, expr)
        if values <= n and not symbolic:
            pes.append(expr)
            continue
        term = expr if expr.isidentifier() else f"({expr})"
        pes.append(f"{term} % {n}")
        tiles.append((f"{term} // {n}", -(-values // n)))
    if not skew:
        times = [t for t, _ in tiles] + list(time) or ["0"]
        return Dataflow.parse(op, f"PE[{', '.join(pes)}] | T[{', '.join(times)}]", name)
    linear = [(loop, op.sizes[loop]) for loop in time] + ([(f"({t})", n) for t, n in tiles] if pipelined else [])
    if pipelined:  # tiles outermost in the linear order
        linear = linear[len(time):] + linear[:len(time)]
    stride, terms = 1, []
    for term, count in reversed(linear):
        terms.insert(0, term if stride == 1 else f"{stride}*{term}")
        stride *= count
    times = ([] if pipelined else [t for t, _ in tiles]) + [" + ".join(terms + pes)]
    return Dataflow.parse(op, f"PE[{', '.join(pes)}] | T[{', '.join(times)}]", name)


VARIANTS = {"": {}, ", systolic": {"skew": True}, ", systolic, pipelined": {"skew": True, "pipelined": True}}


def standard_names(bench: Benchmark) -> tuple[str, ...]:
    """The names of ``bench``'s standard dataflows: each stationary kind, plain, skewed ("systolic"),
    and skewed with overlapping tiles ("systolic, pipelined")."""
    return tuple(kind + variant for kind in bench.stationary for variant in VARIANTS)


def standard_dataflows(bench: Benchmark, op: TensorOp, shape: tuple[int, int]) -> dict[str, Dataflow]:
    """Each standard dataflow of ``bench`` on a ``shape`` array (``standard_names``)."""
    out = {}
    for kind, (space, time) in bench.stationary.items():
        for variant, flags in VARIANTS.items():
            out[kind + variant] = stationary(op, space, time, shape, name=kind + variant, **flags)
    return out


def mme_bandwidth(hw) -> float:
    """What the core's LB feeds the MME, in MME elements per cycle."""
    return hw.lb_bytes_per_cycle / np.dtype(hw.mme.dtype).itemsize


@dataclass(frozen=True)
class Evaluated:
    """One dataflow's metrics and the seconds the model took to count them."""

    name: str
    metrics: DataflowMetrics
    seconds: float


def evaluate(name: str, df: Dataflow, array: PEArray) -> Evaluated:
    start = perf_counter()
    metrics = analyse(df, array)
    return Evaluated(name, metrics, perf_counter() - start)


def evaluate_standard(bench: Benchmark, op: TensorOp, shape: tuple[int, int], bandwidth: float,
                      interconnect: Interconnect | None = None) -> list[Evaluated]:
    """Every standard dataflow of ``bench`` on a ``shape`` array. Without an ``interconnect``, plain
    dataflows get row and column multicast buses (operands shared in the stamp they are used) and
    systolic ones a 2-D systolic array."""
    buses = multicast(max(max(shape) - 1, 1), 2, (0, 1))
    return [evaluate(name, df, PEArray(shape, interconnect or (systolic_2d() if "systolic" in name else buses),
                                       bandwidth))
            for name, df in standard_dataflows(bench, op, shape).items()]
