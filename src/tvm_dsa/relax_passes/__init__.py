"""Relax-level passes of the DSA pipeline."""

from tvm_dsa.relax_passes.offload import EXECUTE, OffloadResult, offload
from tvm_dsa.relax_passes.simplify import SimplifyInference
from tvm_dsa.relax_passes.stats import kernel_macs

__all__ = ["EXECUTE", "OffloadResult", "offload", "SimplifyInference", "kernel_macs"]
