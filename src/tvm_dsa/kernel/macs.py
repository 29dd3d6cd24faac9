"""Counting work in a kernel: multiply-accumulates of its contraction blocks."""

from __future__ import annotations

import tvm_ffi
from tvm import tirx
from tvm.s_tir import SBlockRealize

from tvm_dsa.kernel.analysis import Unsupported, contraction, int_value


def kernel_macs(func: tirx.PrimFunc, annotation: str | None = None) -> int:
    """MACs of a PrimFunc: the iteration-space size of each contraction block (``acc += a * b``),
    whether or not the DSA can run it; with ``annotation``, of those it marks (a lowered kernel's
    contractions on the vector units, ``VECTOR_CONTRACTION``)."""
    total = 0

    def visit(realize):
        nonlocal total
        block = realize.block
        if contraction(block) is None or annotation is not None and not int(block.annotations.get(annotation, 0)):
            return
        n = 1
        for it in block.iter_vars:
            extent = int_value(it.dom.extent)
            if extent is None:
                raise Unsupported(f"block {block.name_hint}: symbolic extent {it.dom.extent}; MACs unknown")
            n *= extent
        total += n

    tvm_ffi.structural_walk(func.body, [(SBlockRealize, visit)])
    return total
