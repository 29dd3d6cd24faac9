"""Relax-level passes of the DSA pipeline."""

from .offload import EXECUTE, OffloadResult, offload
from .simplify import SimplifyInference
from .stats import kernel_macs

__all__ = ["EXECUTE", "OffloadResult", "offload", "SimplifyInference", "kernel_macs"]
