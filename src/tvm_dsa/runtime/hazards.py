"""Memory hazards: which earlier instructions each instruction must wait for, by list order.

List order is a program's meaning, so an instruction must not start before every earlier
instruction that writes bytes it reads (RAW), or reads or writes bytes it writes (WAR, WAW), has
finished. ``HazardTracker`` finds those predecessors in one pass in list order. Each memory is
cut into granules (64 bytes; coarser for a DDR larger than 256 MiB) holding the last writer and the
set of readers since that write. Per unit only the latest reader is kept: a unit runs its
instructions in order, so when its latest reader has finished all its earlier ones have too. A write
dominates what it conflicts with, so later instructions only need to wait for it.

Granules make the precomputed sets conservative; when the simulator finds one of them unfinished it
confirms the conflict byte-exactly (``exact_conflict``) before reporting a hazard, so disjoint
tensors sharing a granule are never flagged. The one imprecision left: when two unordered writers
share a granule without sharing bytes, the second hides the first from later readers of that
granule; a missing token there shows up as wrong bytes in the functional run instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..isa.instructions import Instruction, Operand, operands

GRANULE_SHIFT = 6  # 64-byte granules
MAX_GRANULES = 1 << 22  # per memory; larger memories get coarser granules


class HazardError(RuntimeError):
    """Two instructions whose memory accesses conflict were not ordered by dependency tokens."""


def _merge(o: Operand, shape: tuple[int, ...]) -> tuple[int, list[tuple[int, int]]]:
    """(elements per contiguous run, remaining (stride, extent) dims that place the runs): dims
    sorted by stride and merged from stride 1 while contiguous."""
    dims = sorted((s, n) for n, s in zip(shape, o.strides) if n > 1 and s)
    run, k = 1, 0
    while k < len(dims) and dims[k][0] == run:
        run *= dims[k][1]
        k += 1
    return run, dims[k:]


def runs(o: Operand, shape: tuple[int, ...]) -> tuple[np.ndarray, int]:
    """(start byte of each run, run length in bytes): the bytes ``o`` touches as equal-length
    contiguous runs (they may overlap, e.g. convolution windows)."""
    run, outer = _merge(o, shape)
    starts = np.array([o.offset // o.itemsize], dtype=np.int64)
    for s, n in outer:
        starts = (starts[:, None] + np.arange(n, dtype=np.int64) * s).ravel()
    return starts * o.itemsize, run * o.itemsize


def overlap(o1: Operand, shape1: tuple[int, ...], o2: Operand, shape2: tuple[int, ...]) -> bool:
    """True when the two operands touch a common byte (same memory assumed)."""
    lo1, hi1 = o1.extent_bytes(shape1)
    lo2, hi2 = o2.extent_bytes(shape2)
    if hi1 <= lo2 or hi2 <= lo1:
        return False
    a, la = runs(o1, shape1)
    b, lb = runs(o2, shape2)
    a = np.unique(a)
    # all runs of ``a`` have the same length, so the last one starting before a run of ``b`` ends
    # is the one reaching furthest
    k = np.searchsorted(a, b + lb, side="left") - 1
    return bool(np.any((k >= 0) & (a[np.maximum(k, 0)] + la > b)))


def exact_conflict(earlier: Instruction, later: Instruction) -> tuple[str, Operand] | None:
    """("RAW" | "WAR" | "WAW", operand of ``later``) for a byte-exact conflict, else None."""
    srcs_e, dst_e = operands(earlier)
    srcs_l, dst_l = operands(later)
    pairs = [("RAW", o, dst_e) for o in srcs_l] + [("WAW", dst_l, dst_e)] + [("WAR", dst_l, o) for o in srcs_e]
    for kind, mine, theirs in pairs:
        if mine.space() == theirs.space() and overlap(mine, later.shape, theirs, earlier.shape):
            return kind, mine
    return None


def granules(o: Operand, shape: tuple[int, ...], shift: int) -> slice | np.ndarray:
    """Granules ``o`` touches: a slice when they are consecutive, else a sorted index array."""
    span = points = 1
    for n, s in zip(shape, o.strides):
        if s:
            span += (n - 1) * s
            points *= n
    lo = o.offset
    hi = lo + span * o.itemsize
    if span != points and hi - lo > (1 << shift):  # not dense: gaps are possible
        starts, length = runs(o, shape)
        first = starts >> shift
        count = ((starts + length - 1) >> shift) - first + 1
        if count.max() == 1:
            g = first
        else:
            g = np.repeat(first - np.cumsum(count) + count, count) + np.arange(count.sum())
        g = np.unique(g)
        if g[-1] - g[0] + 1 != len(g):
            return g
    return slice(lo >> shift, ((hi - 1) >> shift) + 1)


def _distinct(values: np.ndarray) -> list[int]:
    """The distinct values of an array (usually all equal: a buffer written or read as a whole)."""
    if values.size <= 64:
        return list(set(values.tolist()))
    return [int(values.flat[0])] if values.min() == values.max() else np.unique(values).tolist()


@dataclass
class _Space:
    shift: int
    writer: np.ndarray  # last writer per granule (global instruction number, -1 = none)
    readers: np.ndarray  # id of the reader set since that write (0 = empty)


class HazardTracker:
    """Feed instructions in list order with ``add``; kernels are numbered consecutively so that
    instructions of earlier kernels (finished before the kernel launched) are ignored."""

    def __init__(self, sizes: dict[str, int]):
        self.sizes = sizes  # bytes per memory kind
        self.spaces: dict[tuple[str, int], _Space] = {}
        self.reader_sets: list[tuple[tuple[int, int], ...]] = [()]  # ((unit, instruction), ...)
        self.count = 0
        self.base = 0

    def begin_kernel(self) -> None:
        self.base = self.count

    def add(self, ins: Instruction, unit: int) -> tuple[int, ...]:
        """Kernel-local indices of the earlier instructions ``ins`` conflicts with."""
        me = self.count
        self.count += 1
        found: set[int] = set()
        srcs, dst = operands(ins)
        for o in srcs:
            space, g = self._locate(o, ins.shape)
            found.update(w for w in _distinct(space.writer[g]) if w >= self.base)
            ids = _distinct(space.readers[g])
            if len(ids) == 1:
                space.readers[g] = self._with_reader(ids[0], unit, me)
            else:
                ids, inverse = np.unique(space.readers[g], return_inverse=True)
                new = [self._with_reader(i, unit, me) for i in ids.tolist()]
                space.readers[g] = np.array(new, dtype=np.int32)[inverse]
        space, g = self._locate(dst, ins.shape)
        found.update(w for w in _distinct(space.writer[g]) if w >= self.base)
        for i in _distinct(space.readers[g]):
            found.update(r for _, r in self.reader_sets[i] if r >= self.base)
        space.writer[g] = me
        space.readers[g] = 0
        found.discard(me)
        return tuple(sorted(j - self.base for j in found))

    def _locate(self, o: Operand, shape) -> tuple[_Space, slice | np.ndarray]:
        space = self.spaces.get(o.space())
        if space is None:
            size = self.sizes[o.mem]
            shift = max(GRANULE_SHIFT, (size // MAX_GRANULES).bit_length())
            n = ((size - 1) >> shift) + 1
            space = _Space(shift, np.full(n, -1, dtype=np.int32), np.zeros(n, dtype=np.int32))
            self.spaces[o.space()] = space
        return space, granules(o, shape, space.shift)

    def _with_reader(self, set_id: int, unit: int, me: int) -> int:
        kept = tuple((u, r) for u, r in self.reader_sets[set_id] if u != unit and r >= self.base)
        self.reader_sets.append(kept + ((unit, me),))
        return len(self.reader_sets) - 1
