"""The cost of an MME instruction from the MME's dataflow (the "tenet" MME model of the hardware).

An MME instruction computes ``batch`` products of an M x K and a K x N tile (``runtime.cost.mme_dims``).
Each product is the GEMM ``Y[i,j] += A[i,k] * B[k,j]`` with i < M, j < N, k < K, run with the MME's
dataflow (a standard dataflow of ``library``: M on the rows, N on the columns, K in time for
output-stationary) on its PE array and interconnect, fed by the LB's bandwidth; its latency,
max(compute, read, write), rounded up to whole cycles, is the product's cycles. The metrics come from
the stored closed forms (``closed``: microseconds) where the MME's dataflow has them, else from
counting the relations (milliseconds to a second); either way they are cached per (MME, bandwidth,
tile shape): a network has a few dozen distinct tile shapes.
"""

from __future__ import annotations

import math
from functools import lru_cache

from ..hardware.model import MME, Hardware
from . import closed
from .library import BENCHMARKS, mme_bandwidth, standard_dataflows
from .metrics import DataflowMetrics, analyse
from .notation import PEArray, interconnect


def tile_metrics(hw: Hardware, m: int, n: int, k: int) -> DataflowMetrics:
    """The metrics of one m x n x k product on ``hw``'s MME under its dataflow."""
    return _tile_metrics(hw.mme, mme_bandwidth(hw), m, n, k)


def tile_cycles(hw: Hardware, m: int, n: int, k: int) -> int:
    """Cycles of one m x n x k product on ``hw``'s MME under its dataflow."""
    return _tile_cycles(hw.mme, mme_bandwidth(hw), m, n, k)


@lru_cache(maxsize=4096)
def _tile_cycles(mme: MME, bandwidth: float, m: int, n: int, k: int) -> int:
    return math.ceil(_tile_metrics(mme, bandwidth, m, n, k).latency - 1e-9)


@lru_cache(maxsize=4096)
def _tile_metrics(mme: MME, bandwidth: float, m: int, n: int, k: int) -> DataflowMetrics:
    key = (mme.dataflow, mme.rows, mme.cols, mme.interconnect)
    if key in closed.stored():
        return closed.metrics(key, bandwidth, m, n, k)
    bench = BENCHMARKS["gemm"]
    shape = (mme.rows, mme.cols)
    df = standard_dataflows(bench, bench.op({"i": m, "j": n, "k": k}), shape)[mme.dataflow]
    return analyse(df, PEArray(shape, interconnect(mme.interconnect, 2), bandwidth))


def cache_info():
    """Hits and misses of the per-tile-shape cache of cycles."""
    return _tile_cycles.cache_info()
