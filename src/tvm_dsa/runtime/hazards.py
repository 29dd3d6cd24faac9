"""Memory hazards: which earlier instructions each instruction must wait for, by list order.

List order is a program's meaning, so an instruction must not start before every earlier
instruction that writes bytes it reads (RAW), or reads or writes bytes it writes (WAR, WAW), has
finished. ``HazardTracker`` finds those predecessors in one pass in list order. Each memory is
cut into granules (64 bytes; coarser for a DDR larger than 256 MiB) holding the last writer and the
set of readers since that write. Per unit only the latest reader is kept: a unit runs its
instructions in order, so when its latest reader has finished all its earlier ones have too. A write
dominates what it conflicts with, so later instructions only need to wait for it.

The granule states are stored run-length encoded: a memory is a sorted list of pieces (runs of
consecutive granules in the same state), so an access costs a binary search plus the pieces it
covers, whatever its size. A kernel starts after the previous one finished on all cores, so the
states are reset at each kernel.

Granules make the precomputed sets conservative; when the simulator finds one of them unfinished it
confirms the conflict byte-exactly (``exact_conflict``) before reporting a hazard, so disjoint
tensors sharing a granule are never flagged. The one imprecision left: when two unordered writers
share a granule without sharing bytes, the second hides the first from later readers of that
granule; a missing token there shows up as wrong bytes in the functional run instead.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

import numpy as np

from tvm_dsa.isa.instructions import DTYPES, Dma, Fill, Instruction, Mme, Operand, Vector, operands

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


def granule_ranges(o: Operand, shape: tuple[int, ...], shift: int) -> list[tuple[int, int]]:
    """Granules ``o`` touches, as sorted disjoint, non-adjacent [first, last) ranges (one range
    when they are consecutive)."""
    span = points = 1
    for n, s in zip(shape, o.strides):
        if s:
            span += (n - 1) * s
            points *= n
    lo = o.offset
    hi = lo + span * o.itemsize
    if span != points and hi - lo > (1 << shift):  # not dense: gaps are possible
        starts, length = runs(o, shape)
        starts = np.unique(starts)
        first = starts >> shift
        last = (starts + (length - 1)) >> shift  # non-decreasing too: the runs have equal lengths
        # a new range begins where a run starts beyond the granule after the previous run's last
        new = np.flatnonzero(first[1:] > last[:-1] + 1) + 1
        begin = np.concatenate(([0], new))
        end = np.concatenate((new - 1, [len(first) - 1]))
        return list(zip(first[begin].tolist(), (last[end] + 1).tolist()))
    return [(lo >> shift, ((hi - 1) >> shift) + 1)]


_EMPTY = (-1, ())  # granule state: (last writer, ((unit, reader), ...) since that write)


class _Space:
    """One memory's granule states, run-length encoded: piece ``p`` covers granules
    [starts[p], starts[p + 1]) (the last one up to ``size``) and is in state ``states[p]``."""

    __slots__ = ("shift", "size", "starts", "states")

    def __init__(self, shift: int, size: int):
        self.shift, self.size = shift, size
        self.starts: list[int] = [0]
        self.states: list[tuple] = [_EMPTY]


class HazardTracker:
    """Feed instructions in list order with ``add``; call ``begin_kernel`` before each kernel
    (instructions of earlier kernels finished before the kernel launched, so they are forgotten)."""

    def __init__(self, sizes: dict[str, int]):
        self.sizes = sizes  # bytes per memory kind
        self.shifts = {m: max(GRANULE_SHIFT, (size // MAX_GRANULES).bit_length()) for m, size in sizes.items()}
        self.spaces: dict[tuple[str, int], _Space] = {}
        self.count = 0  # instructions added in the current kernel
        # per-geometry caches: (strides, shape) -> (elements spanned, dense);
        # (strides, shape, dtype, offset within a granule, shift) -> granule ranges from offset 0
        self._geometry: dict = {}
        self._ranges: dict = {}

    def begin_kernel(self) -> None:
        self.spaces.clear()
        self.count = 0

    def add(self, ins: Instruction, unit: int) -> tuple[int, ...]:
        """Kernel-local indices of the earlier instructions ``ins`` conflicts with."""
        me = self.count
        self.count += 1
        found: set[int] = set()
        shape = ins.shape
        kind = type(ins)
        if kind is Dma:
            self._access(ins.src, shape, unit, me, found, False)
        elif kind is Mme:
            self._access(ins.a, shape, unit, me, found, False)
            self._access(ins.b, shape, unit, me, found, False)
            if ins.accumulate:
                self._access(ins.dst, shape, unit, me, found, False)
        elif kind is Vector:
            for s in ins.srcs:
                if isinstance(s, Operand):
                    self._access(s, shape, unit, me, found, False)
        elif kind is not Fill:  # Reduce
            self._access(ins.src, shape, unit, me, found, False)
            if ins.accumulate:
                self._access(ins.dst, shape, unit, me, found, False)
        self._access(ins.dst, shape, unit, me, found, True)
        found.discard(me)
        return tuple(sorted(found))

    def _locate(self, o: Operand, shape) -> tuple[_Space, list[tuple[int, int]]]:
        key = (o.mem, o.index)
        space = self.spaces.get(key)
        if space is None:
            shift = self.shifts[o.mem]
            space = self.spaces[key] = _Space(shift, ((self.sizes[o.mem] - 1) >> shift) + 1)
        shift = space.shift
        key = (o.strides, shape)
        geometry = self._geometry.get(key)
        if geometry is None:
            span = points = 1  # elements from the first to the last touched; elements touched
            for n, s in zip(shape, o.strides):
                if s:
                    span += (n - 1) * s
                    points *= n
            geometry = self._geometry[key] = (span, span == points)
        span, dense = geometry
        lo = o.offset
        nbytes = span * DTYPES[o.dtype]
        if dense or nbytes <= (1 << shift):  # one range: most operands
            return space, [(lo >> shift, ((lo + nbytes - 1) >> shift) + 1)]
        mask = (1 << shift) - 1
        key = (o.strides, shape, o.dtype, lo & mask, shift)
        rel = self._ranges.get(key)
        if rel is None:
            rel = self._ranges[key] = granule_ranges(Operand(o.mem, o.index, lo & mask, o.dtype, o.strides),
                                                     shape, shift)
        base = lo >> shift
        return space, [(a + base, b + base) for a, b in rel]

    def _access(self, o: Operand, shape, unit: int, me: int, found: set, write: bool) -> None:
        """Record a read (or write) of ``o`` by instruction ``me`` on ``unit``, adding the earlier
        instructions it conflicts with to ``found``."""
        space, ranges = self._locate(o, shape)
        starts, states = space.starts, space.states
        last = len(starts) - 1
        size = space.size
        i = bisect_right(starts, ranges[0][0]) - 1
        j = bisect_left(starts, ranges[-1][1], i)  # pieces i .. j-1 are touched
        if j == i + 1 and len(ranges) == 1:  # fast path: one range inside one piece
            lo, hi = ranges[0]
            old = states[i]
            w, readers = old
            if w >= 0:
                found.add(w)
            if write:
                for _, r in readers:
                    found.add(r)
                state = (me, ())
            else:
                state = (w, tuple(ur for ur in readers if ur[0] != unit) + ((unit, me),))
            first = starts[i]
            end = starts[j] if j <= last else size
            if first < lo:
                if hi < end:
                    starts[j:j] = (lo, hi)
                    states[j:j] = (state, old)
                else:
                    starts.insert(j, lo)
                    states.insert(j, state)
            elif hi < end:
                states[i] = state
                starts.insert(j, hi)
                states.insert(j, old)
            else:
                states[i] = state
            return
        out_starts: list[int] = []
        out_states: list[tuple] = []
        written = (me, ())
        memo: dict[int, tuple] = {}  # id(old state) -> new state of a read
        p, x = i, starts[i]
        for lo, hi in ranges:
            if x < lo:  # untouched part before the range: copied piece by piece at C speed
                k = bisect_left(starts, lo, p + 1, j)  # pieces p + 1 .. k - 1 start before ``lo``
                out_starts.append(x)
                out_states.append(states[p])
                out_starts += starts[p + 1:k]
                out_states += states[p + 1:k]
                p = k if k < j and starts[k] == lo else k - 1  # the piece holding ``lo``
                x = lo
            end = starts[p + 1] if p < last else size  # end of piece p
            if write:
                out_starts.append(lo)
                out_states.append(written)
            while x < hi:  # touched part
                old = states[p]
                w, readers = old
                if write:
                    if w >= 0:
                        found.add(w)
                    for _, r in readers:
                        found.add(r)
                else:
                    state = memo.get(id(old))
                    if state is None:
                        if w >= 0:
                            found.add(w)
                        state = memo[id(old)] = (w, tuple(ur for ur in readers if ur[0] != unit) + ((unit, me),))
                    out_starts.append(x)
                    out_states.append(state)
                if end <= hi:
                    x = end
                    p += 1
                    end = starts[p + 1] if p < last else size
                else:
                    x = hi
        if p < j:  # untouched rest of the last touched piece
            out_starts.append(x)
            out_states.append(states[p])
        starts[i:j] = out_starts
        states[i:j] = out_states
