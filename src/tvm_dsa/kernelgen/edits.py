"""Edits of a kernel's instruction stream (written out) that the launch passes share: transfers
re-sourced, instructions taken out and copies put in (``edited``), the transfers that read
what a copy wrote (``copy_readers``), which may read its source instead, and the multicasts an
edit left waiting for ever made plain (``plain_where_stuck``)."""

from __future__ import annotations

import bisect
import math
from dataclasses import replace

import numpy as np

from tvm_dsa.emit.emitter import PROMOTE, unstuck
from tvm_dsa.isa import Dma, Kernel, LayerMark, Operand


def edited(kernel: Kernel, inserts=(), sources: dict[int, Operand] | None = None,
           drop=frozenset()) -> Kernel:
    """``kernel`` (written out) with the transfers at ``sources`` (position -> operand) reading
    there, the instructions at ``drop`` taken out (what waited for one waits for what it waited
    for; a layer mark moves to the next instruction left) and each copy of ``inserts`` (position,
    Dma) placed before the instruction at its position, marked as a promotion. Positions and deps
    (the inserted copies' too) are the kernel's as it was."""
    old = list(kernel.instructions)
    for i, src in (sources or {}).items():
        old[i] = replace(old[i], src=src)
    before: dict[int, list[Dma]] = {}
    for p, d in sorted(inserts, key=lambda x: x[0]):
        before.setdefault(p, []).append(d)
    new_of, stream, runs = {}, [], []
    for i in range(len(old) + 1):
        if i in before:
            runs.append((len(stream), len(before[i]), i))
            stream += before[i]
        if i < len(old) and i not in drop:
            new_of[i] = len(stream)
            stream.append(old[i])

    def deps(d: int) -> tuple:
        return (new_of[d],) if d in new_of else tuple(x for e in old[d].deps for x in deps(e))

    stream = [replace(x, deps=tuple(dict.fromkeys(y for d in x.deps for y in deps(d)))) if x.deps else x
              for x in stream]
    kept = sorted(new_of)

    def next_kept(i: int) -> int | None:  # the first position from ``i`` not taken out
        k = bisect.bisect_left(kept, i)
        return kept[k] if k < len(kept) else None

    marks = {}
    for m in kernel.layers:
        at = next_kept(m.first)
        if at is not None:
            marks[new_of[at]] = replace(m, first=new_of[at])
    for first, n, i in runs:
        marks[first] = LayerMark(first, PROMOTE, ())
        at = next_kept(i)
        layer = next((m for m in reversed(kernel.layers) if m.first <= at), None) if at is not None else None
        if layer is not None and new_of[at] not in marks:
            marks[new_of[at]] = replace(layer, first=new_of[at])
    return replace(kernel, instructions=tuple(stream), layers=tuple(marks[k] for k in sorted(marks)))


def plain_where_stuck(kernel: Kernel, cores_per_cluster: int) -> Kernel:
    """``kernel`` (written out) with its multicasts that would never start made plain
    (``emit.emitter.unstuck``); ``kernel`` itself where none is. The edits re-source transfers and
    take out writes, so the n-th loads of one box (one transfer) pair anew: DenseNet-121's first
    dense block at batch 1, its input read in bands across the bus, paired a core's first load
    of a row with another cluster's load of it five layers on, and the core waited 22 k cycles
    for the simulator to move it alone."""
    out = unstuck(kernel.instructions, cores_per_cluster)
    if all(a is b for a, b in zip(out, kernel.instructions)):
        return kernel
    return replace(kernel, instructions=tuple(out))


class GbTraffic:
    """Per GB, the transfers of a kernel's stream (written out) that write it and that read it:
    their positions and byte ranges, so a copy's readers are found without walking the stream."""

    def __init__(self, stream):
        rows: dict[tuple[str, int], list] = {}
        for m, x in enumerate(stream):
            if type(x) is Dma:
                for side, o in (("w", x.dst), ("r", x.src)):
                    if o.mem == "gb":
                        rows.setdefault((side, o.index), []).append((m, *o.extent_bytes(x.shape)))
        self._rows = {key: np.array(r, dtype=np.int64) for key, r in rows.items()}

    def overlapping(self, side: str, gb: int, after: int, lo: int, hi: int) -> np.ndarray:
        """Positions after ``after`` of the transfers that write (``side`` "w") or read ("r") bytes
        ``[lo, hi)`` of GB ``gb``, in stream order."""
        r = self._rows.get((side, gb), np.zeros((0, 3), dtype=np.int64))
        return r[(r[:, 0] > after) & (r[:, 1] < hi) & (lo < r[:, 2]), 0]


def copy_readers(stream, n: int, cores_per_cluster: int, traffic: GbTraffic | None = None) -> dict[int, Operand] | None:
    """The transfers after copy ``n`` (GB to GB, one layout, no gaps) that read what it wrote,
    before a transfer writes there again, each reading the copy's source instead (position ->
    operand); None where one cannot (it reads past the copy, or copies into another cluster's
    GB), or where a transfer after it writes the source (which waited for the copy, not the
    reads). ``traffic``: the stream's, where the caller has it (the copy's own source aside)."""
    copy = stream[n]
    gb, (lo, hi) = copy.dst.index, copy.dst.extent_bytes(copy.shape)
    source, (first, end) = copy.src.index, copy.src.extent_bytes(copy.shape)
    if math.prod(copy.shape) * copy.dst.itemsize != hi - lo or any(
            s == 0 for s, e in zip(copy.dst.strides, copy.shape) if e > 1):
        return None  # with gaps (an exchange's halo rows), a read within its extent may read them
    traffic = traffic or GbTraffic(stream)
    again = traffic.overlapping("w", gb, n, lo, hi)
    stop = int(again[0]) if len(again) else len(stream)  # written there again
    written = traffic.overlapping("w", source, n, first, end)
    if len(written) and written[0] <= stop:
        return None  # the source is written again in the kernel: the copy kept what it held
    out = {}
    for m in traffic.overlapping("r", gb, n, lo, hi):
        if m >= stop:
            break
        x = stream[m]
        a, b = x.src.extent_bytes(x.shape)
        own = x.dst.mem == "lb" or x.dst.mem == "gb" and x.dst.index == x.core // cores_per_cluster
        if a < lo or hi < b or not own:
            return None
        out[int(m)] = replace(x.src, index=copy.src.index, offset=x.src.offset + copy.src.offset - copy.dst.offset)
    return out
