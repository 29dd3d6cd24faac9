"""The cost of an MME instruction from the MME's dataflow (the "tenet" MME model of the hardware).

An MME instruction computes ``batch`` products of an M x K and a K x N tile (``runtime.cost.mme_dims``).
Each product is the GEMM ``Y[i,j] += A[i,k] * B[k,j]`` with i < M, j < N, k < K, run with the MME's
dataflow (a standard dataflow of ``library``: M on the rows, N on the columns, K in time for
output-stationary) on its PE array and interconnect, fed by the LB's bandwidth; its latency,
max(compute, read, write) counted on the relations, rounded up to whole cycles, is the product's
cycles. Counting costs milliseconds to a second, so latencies are cached per (MME, bandwidth, tile
shape): a network has a few dozen distinct tile shapes.
"""

from __future__ import annotations

import math
from functools import lru_cache

from ..hardware.model import MME, Hardware
from .library import BENCHMARKS, mme_bandwidth, standard_dataflows
from .metrics import analyse
from .notation import PEArray, interconnect


def tile_cycles(hw: Hardware, m: int, n: int, k: int) -> int:
    """Cycles of one m x n x k product on ``hw``'s MME under its dataflow."""
    return _tile_cycles(hw.mme, mme_bandwidth(hw), m, n, k)


@lru_cache(maxsize=4096)
def _tile_cycles(mme: MME, bandwidth: float, m: int, n: int, k: int) -> int:
    bench = BENCHMARKS["gemm"]
    op = bench.op({"i": m, "j": n, "k": k})
    shape = (mme.rows, mme.cols)
    df = standard_dataflows(bench, op, shape)[mme.dataflow]
    return math.ceil(analyse(df, PEArray(shape, interconnect(mme.interconnect, 2), bandwidth)).latency - 1e-9)


def cache_info():
    """Hits and misses of the per-tile-shape cache."""
    return _tile_cycles.cache_info()
