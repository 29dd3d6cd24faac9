"""Counting work in a kernel: multiply-accumulates of its contraction blocks."""

from __future__ import annotations

import tvm_ffi
from tvm import tirx
from tvm.s_tir import SBlockRealize

from ..tir_passes.analysis import Unsupported, classify


def kernel_macs(func: tirx.PrimFunc) -> int:
    """MACs of a PrimFunc: the iteration-space size of each contraction block."""
    total = 0

    def visit(realize):
        nonlocal total
        block = realize.block
        try:
            if classify(block).kind != "mme":
                return
        except Unsupported:
            if block.init is None:
                return
        n = 1
        for it in block.iter_vars:
            ext = it.dom.extent
            n *= int(ext.value) if hasattr(ext, "value") else 0
        total += n

    tvm_ffi.structural_walk(func.body, [(SBlockRealize, visit)])
    return total
