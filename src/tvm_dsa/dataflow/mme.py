"""The cost of an MME instruction from the MME's dataflow (the "tenet" MME model of the hardware).

An MME instruction computes ``batch`` products of an M x K and a K x N tile (``runtime.cost.mme_dims``).
Each product is the GEMM ``Y[i,j] += A[i,k] * B[k,j]`` with i < M, j < N, k < K, run with the MME's
dataflow (a standard dataflow of ``library``: M on the rows, N on the columns, K in time for
output-stationary) on its PE array and interconnect, fed by the LB's bandwidth; its latency,
max(compute, read, write), rounded up to whole cycles, is the product's cycles. The metrics come from
the stored closed forms (``closed``: microseconds) where the MME's dataflow has them, else from
counting the relations (milliseconds to a second, with barvinok: the optional extra ``tenet``); either
way they are cached per (MME, bandwidth, tile shape): a network has a few dozen distinct tile shapes.
Without barvinok, an MME with no stored closed forms is costed by the flat model (``cost_model``).
"""

from __future__ import annotations

import math
import warnings
from functools import lru_cache

from tvm_dsa.dataflow import closed, counting
from tvm_dsa.dataflow.library import BENCHMARKS, mme_bandwidth, standard_dataflows
from tvm_dsa.dataflow.metrics import DataflowMetrics, analyse
from tvm_dsa.dataflow.notation import PEArray, interconnect


def cost_model(hw) -> str:
    """How ``hw``'s MME instructions are costed: its ``mme.model``, except that "tenet" on an MME without
    stored closed forms needs barvinok to count them; without it, "flat", with a warning (once per chip)."""
    return _cost_model(hw.name, hw.mme)


@lru_cache(maxsize=None)
def _cost_model(chip: str, mme) -> str:
    if mme.model != "tenet" or _key(mme) in closed.stored():
        return mme.model
    problem = counting.missing()
    if problem is None:
        return "tenet"
    warnings.warn(f"chip {chip!r}: its MME ({mme.dataflow!r} on a {mme.rows}x{mme.cols} {mme.interconnect} array) "
                  f"has no stored closed forms and counting needs barvinok, but {problem}: its MME instructions "
                  f"are costed with the flat model instead ({counting.INSTALL} for TENET's cost)")
    return "flat"


def _key(mme) -> closed.Key:
    return mme.dataflow, mme.rows, mme.cols, mme.interconnect


def tile_metrics(hw, m: int, n: int, k: int) -> DataflowMetrics:
    """The metrics of one m x n x k product on ``hw``'s MME under its dataflow."""
    return _tile_metrics(hw.mme, mme_bandwidth(hw), m, n, k)


def tile_cycles(hw, m: int, n: int, k: int) -> int:
    """Cycles of one m x n x k product on ``hw``'s MME under its dataflow."""
    return _tile_cycles(hw.mme, mme_bandwidth(hw), m, n, k)


@lru_cache(maxsize=4096)
def _tile_cycles(mme, bandwidth: float, m: int, n: int, k: int) -> int:
    return math.ceil(_tile_metrics(mme, bandwidth, m, n, k).latency - 1e-9)


@lru_cache(maxsize=4096)
def _tile_metrics(mme, bandwidth: float, m: int, n: int, k: int) -> DataflowMetrics:
    key = _key(mme)
    if key in closed.stored():
        return closed.metrics(key, bandwidth, m, n, k)
    bench = BENCHMARKS["gemm"]
    shape = (mme.rows, mme.cols)
    df = standard_dataflows(bench, bench.op({"i": m, "j": n, "k": k}), shape)[mme.dataflow]
    return analyse(df, PEArray(shape, interconnect(mme.interconnect, 2), bandwidth))


def cache_info():
    """Hits and misses of the per-tile-shape cache of cycles."""
    return _tile_cycles.cache_info()
