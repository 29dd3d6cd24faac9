"""The DSA simulator: functional and timing execution of a program, its report and trace.

Imports nothing from the compiler: only the program format (``tvm_dsa.isa``) and the hardware model.
"""

from tvm_dsa.runtime.cost import (
    bandwidth, compute_cycles, ddr_effective_bytes, dma_cycles, dma_demand, dma_latency, instruction_cycles,
    mme_dims
)
from tvm_dsa.runtime.hazards import HazardError
from tvm_dsa.runtime.report import Report
from tvm_dsa.runtime.simulator import SimResult, holds_values, simulate, timing_cycles
from tvm_dsa.runtime.trace import write_trace

__all__ = [
    "simulate", "timing_cycles", "holds_values", "SimResult", "Report", "HazardError", "write_trace",
    "bandwidth", "compute_cycles", "ddr_effective_bytes", "dma_cycles", "dma_demand", "dma_latency",
    "instruction_cycles", "mme_dims",
]
