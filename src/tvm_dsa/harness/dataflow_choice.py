"""The MME's dataflow chosen from the model: the standard dataflow with the fewest cycles on a workload.

The exploration (``explore``) searches affine dataflows for one operation at one size; an MME runs one
dataflow for every instruction, whatever its tile shape. The choice here ranks the standard GEMM
dataflows whose closed forms are stored for the MME's array and interconnect (``closed``) by the cycles
the "tenet" model would charge the workload's MME products, Σ products × ⌈latency⌉, each evaluated from
the closed forms (microseconds a shape, so a whole model's tile shapes cost milliseconds).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Iterable

from tvm_dsa.hardware.model import Hardware
from tvm_dsa.isa.instructions import Mme
from tvm_dsa.isa.program import Program
from tvm_dsa.dataflow import closed
from tvm_dsa.dataflow.library import mme_bandwidth
from tvm_dsa.runtime.cost import mme_dims

Shape = tuple[int, int, int]  # (M, N, K) of one product


@dataclass(frozen=True)
class Ranked:
    """One dataflow's cycles on the workload and the MME's MAC utilisation over them."""

    dataflow: str
    cycles: int
    utilisation: float


def mme_products(programs: Iterable[Program]) -> Counter[Shape]:
    """How many M x N x K products the programs' MME instructions compute, per shape (a batched
    instruction counts its batch)."""

    products: Counter[Shape] = Counter()
    for program in programs:
        for kernel in program.kernels:
            for ins in kernel.instructions:
                if isinstance(ins, Mme):
                    batch, m, n, k = mme_dims(ins)
                    products[(m, n, k)] += batch
    return products


def model_products(model: str, target: str, tiny: bool = False) -> Counter[Shape]:
    """The MME products of a built-in model (or .onnx file) compiled for ``target`` and run timing-only."""
    from tvm_dsa.harness import Compiled, check_target, import_onnx, load_model, timing_run

    onnx_model = load_model(model, tiny=tiny)
    check_target(target, onnx_model, timing_only=True)
    run = timing_run(Compiled.build(import_onnx(onnx_model), target), onnx_model, check_hazards=False)
    return mme_products(k.program for k in run.kernels)


def rank(hw: Hardware, products: Counter[Shape]) -> list[Ranked]:
    """The standard dataflows with stored closed forms for ``hw``'s MME, fewest cycles on ``products``
    first (ties: the order of ``closed.stored()``)."""
    if not products:
        raise ValueError("the workload has no MME products to choose a dataflow for")
    mme, bandwidth = hw.mme, mme_bandwidth(hw)
    keys = [key for key in closed.stored() if key[1:] == (mme.rows, mme.cols, mme.interconnect)]
    if not keys:
        raise ValueError(f"no closed forms are stored for a {mme.rows}x{mme.cols} {mme.interconnect} MME; "
                         "closed.write() derives them")
    macs = sum(times * m * n * k for (m, n, k), times in products.items())
    out = []
    for key in keys:
        cycles = sum(times * math.ceil(closed.metrics(key, bandwidth, *shape).latency - 1e-9)
                     for shape, times in products.items())
        out.append(Ranked(key[0], cycles, macs / (cycles * mme.rows * mme.cols)))
    return sorted(out, key=lambda r: r.cycles)
