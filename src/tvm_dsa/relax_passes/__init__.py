"""Relax-level passes of the DSA pipeline."""

from tvm_dsa.kernelgen.offload import OffloadResult, OffloadToDSA
from tvm_dsa.packed import EXECUTE
from tvm_dsa.relax_passes.simplify import SimplifyInference
from tvm_dsa.kernel.macs import kernel_macs

__all__ = ["EXECUTE", "OffloadResult", "OffloadToDSA", "SimplifyInference", "kernel_macs"]
