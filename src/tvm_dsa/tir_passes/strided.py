"""CompactStridedWindows: a contraction whose stride skips pixels loads only the pixels it reads.

A 1x1 stride-2 convolution reads ``x[2 y, 2 x]``: the tile's input box (``TileForLB`` computes
the producer of its input on the region the tile reads) spans ``2 R - 1`` rows of ``2 W - 1``
pixels of which it uses ``R x W``, so a tile loads about 4x the bytes it needs (ResNet-50's
projection shortcuts were DMA-bound for it). Here each such dimension of the producer's buffer
is split into (pixel // s, pixel % s), in the buffer and in the producer's iteration space: the
contraction then reads ``[y, 0, x, 0]``, the tile's box is ``R x 1 x W x 1`` and its load a DMA
whose source steps over the skipped rows and columns. The last dimension is split only where
the input is in the GB (``on_chip``), where a load costs its bytes: its pixels are contiguous in
DDR, where every other one costs a burst each (ResNet-50's 1x1 stride-2 layers alone from DDR
took 3-6x the cycles with it split); from DDR only the rows are skipped. Numerics do not
change: the same values move.

A dimension is split where the contraction indexes it as ``s * spatial + window`` with no
offset, a window (its reduction iterators' reach) narrower than ``s`` (pixels skipped), and an
extent that ``s`` divides. The producer must be the buffer's only writer, write it at its own
iterators (before ``tile.simplify_indices``, which compacts first: a simplified batch of one is
written at index 0, and its iterator bound to 0 is no loop's), and the contraction its only
reader.
"""

from __future__ import annotations

import functools

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir import SBlock

from tvm_dsa.kernel.analysis import REDUCE_ITER, Unsupported, contraction, copy_func, int_value, linear_form


def _step(index, extents: dict, reduced: set, size: int) -> int:
    """The stride ``s`` by which ``index`` skips pixels of a dimension of ``size`` (1: none)."""
    try:
        coeffs, const = linear_form(index, set(extents))
    except Unsupported:
        return 1
    moving = [(v, c) for v, c in coeffs.items() if v not in reduced]
    reach = 1 + sum(abs(c) * (extents[v] - 1) for v, c in coeffs.items() if v in reduced)
    if const or len(moving) != 1 or any(c < 0 for c in coeffs.values()):
        return 1
    s = moving[0][1]
    return s if s > reach and size % s == 0 else 1


def _splits(func, on_chip: frozenset) -> list[tuple[str, tuple[int, ...]]]:
    """(producer block name, per dimension the stride to split by) for each buffer a contraction
    reads with pixels skipped; the last dimension too where the producer reads only parameters at
    the positions ``on_chip``."""
    on_chip_bufs = [p for i, p in enumerate(func.params) if i in on_chip]
    writers: dict = {}
    readers: dict = {}
    blocks: list[SBlock] = []

    def visit(block):
        if block.name_hint == "root":
            return
        blocks.append(block)
        for w in block.writes:
            writers.setdefault(w.source, []).append(block)
        for r in block.reads:
            readers.setdefault(r.source, set()).add(block.name_hint)

    tvm_ffi.structural_walk(func.body, [(SBlock, visit)])
    out = []
    for block in blocks:
        loads = contraction(block)
        if loads is None:
            continue
        extents = {it.var: int_value(it.dom.extent) for it in block.iter_vars}
        reduced = {it.var for it in block.iter_vars if int(it.iter_type) == REDUCE_ITER}
        for ld in loads:
            producer = writers.get(ld.source, [])
            if len(producer) != 1 or readers.get(ld.source) != {block.name_hint} or None in extents.values():
                continue
            p = producer[0]
            own = [it.var for it in p.iter_vars]
            store = p.body
            if not isinstance(store, tirx.BufferStore) or any(int(it.iter_type) == REDUCE_ITER for it in p.iter_vars) \
                    or len(own) != len(store.indices) or any(not i.same_as(v) for i, v in zip(store.indices, own)):
                continue
            sources = [r.source for r in p.reads]
            last = len(ld.indices) - (not all(any(b.same_as(x) for x in on_chip_bufs) for b in sources))
            steps = tuple(_step(i, extents, reduced, int_value(n)) for i, n in zip(ld.indices[:last], ld.source.shape))
            steps += (1,) * (len(ld.indices) - last)
            if any(s > 1 for s in steps):
                out.append((p.name_hint, steps))
    return out


def _split_map(steps: tuple[int, ...]) -> tirx.IndexMap:
    """The index map splitting dimension ``d`` into ``(i // s, i % s)`` where ``steps[d] = s > 1``."""
    return tirx.IndexMap.from_func(
        lambda *dims: [part for d, s in zip(dims, steps) for part in ((d // s, d % s) if s > 1 else (d,))],
        ndim=len(steps))


@functools.lru_cache(maxsize=256)
def compact_strided_windows(func, on_chip: frozenset = frozenset()):
    """``func`` with the buffers its contractions read with pixels skipped split per stride (see
    the module), the last dimension too where they are loaded from the parameters at the
    positions ``on_chip`` (in the GB); ``func`` itself where there are none. Cached per function
    object."""
    splits = _splits(func, on_chip)
    if not splits:
        return func
    sch = s_tir.Schedule(copy_func(func))
    for name, steps in splits:
        index_map = _split_map(steps)
        block = sch.get_sblock(name)
        sch.transform_layout(block, ("write", 0), index_map)
        sch.transform_block_layout(block, index_map)
    # the contraction's ``(s y + r) // s`` and ``% s`` become ``y`` and ``r`` under r's range
    return s_tir.transform.StmtSimplify()(tvm.IRModule({"main": sch.mod["main"]}))["main"]
