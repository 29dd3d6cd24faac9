"""The DSA simulator: functional and timing execution of a program, its report and trace.

Imports nothing from the compiler: only the program format (``tvm_dsa.isa``) and the hardware model.
"""

from .cost import (
    bandwidth, compute_cycles, ddr_effective_bytes, dma_cycles, dma_demand, dma_latency, instruction_cycles,
    mme_dims,
)
from .hazards import HazardError
from .report import Report
from .simulator import SimResult, simulate
from .trace import write_trace

__all__ = [
    "simulate", "SimResult", "Report", "HazardError", "write_trace",
    "bandwidth", "compute_cycles", "ddr_effective_bytes", "dma_cycles", "dma_demand", "dma_latency",
    "instruction_cycles", "mme_dims",
]
