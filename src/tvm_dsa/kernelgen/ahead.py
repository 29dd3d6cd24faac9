"""Weights loaded ahead: a chained kernel's reads of weights from DDR, moved into a GB during the
kernels before it, while DDR idles there.

A launch of several kernels (``launch.launch_together``) runs them one after another and each
loads its own weights, so DDR idles while the early kernels compute and binds the late ones, whose
weights are large (a CNN's last stages, its classifier). ``loaded_ahead`` times the program and
copies, for each chained kernel's loads of a weight from DDR into the LBs (a read-only arg), the
bytes they read into a place of one GB that no kernel from the copy to the reader uses: of the
clusters whose cores read it, the one whose GB holds least of such copies. Every reader then
loads from there (one in another cluster across the bus, through both GBs); one GB is written,
not one per cluster, as the early kernels' own loads keep the GB ports busy. Where the clusters
read apart boxes of the weight (a classifier's columns dealt over them at batch 1), each
cluster's box is copied packed into its own GB instead, and its cores read it at their own port. The copies are cut
into pieces, each filling a stretch of an earlier kernel where DDR idled (``IDLE_SHARE`` of it,
at the rate the GB's port had left then): it waits for the instruction that ended last as the
stretch began and sits in the cluster DMA queue before the transfers that started after. The
barrier between chained kernels orders the copies before the reads. A weight the stretches
cannot hold moves in part (the loads within the bytes copied). Repeated while the program times
faster (a reader whose loads moved leaves DDR idle for the next); kept only where it does.
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass, replace

from tvm_dsa.emit.emitter import PROMOTE
from tvm_dsa.hardware.model import Hardware
from tvm_dsa.isa import Dma, Kernel, LayerMark, Operand, Program
from tvm_dsa.isa.instructions import DTYPES
from tvm_dsa.runtime.cost import dma_demand
from tvm_dsa.runtime.timing import KernelTiming, ProgramTiming, simulate_program

IDLE_SHARE = 0.75  # of an idle stretch of DDR, what a copy may take (the kernel's own transfers shift)
MIN_STRETCH = 256  # cycles: shorter idle stretches take no copy
PIECE_BYTES = 4096  # copies are cut at multiples of this
ROUNDS = 3


@dataclass(frozen=True)
class _Weight:
    """The box ``lo``..``hi`` (per dim of ``dims``) of a read-only arg that kernel ``reader`` loads
    into the LBs of ``clusters``, by its loads ``(stream position, box low, box high)``. ``dims``:
    the arg's element strides, ``dtype`` its elements', ``base`` its first byte. A span of DDR's
    bytes (the defaults) is copied as it lies, the loads' layout kept; a box of the arg's dims
    (``boxed``) is copied packed."""

    reader: int
    lo: tuple[int, ...]
    hi: tuple[int, ...]
    clusters: tuple[int, ...]
    loads: tuple[tuple[int, tuple[int, ...], tuple[int, ...]], ...]
    dims: tuple[int, ...] = (1,)
    dtype: str = "int8"
    base: int = 0
    boxed: bool = False

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype]

    @property
    def packed(self) -> tuple[int, ...]:
        """Element strides of the box copied packed."""
        out, n = [], 1
        for a, b in reversed(list(zip(self.lo, self.hi))):
            out.append(n)
            n *= b - a
        return tuple(reversed(out))

    def nbytes(self, first: int, end: int) -> int:
        """Bytes of the box's slices ``first``..``end`` along its first dim."""
        return (end - first) * self.packed[0] * self.itemsize

    def copy(self, first: int, end: int, owner: int, at: int) -> tuple[Operand, Operand, tuple[int, ...]]:
        """(source in DDR, destination in GB ``owner`` where the box starts at ``at``, shape) of a
        copy of the box's slices ``first``..``end`` along its first dim."""
        start = (first, *self.lo[1:])
        src = Operand("ddr", 0, self.base + sum(c * s for c, s in zip(start, self.dims)) * self.itemsize,
                      self.dtype, self.dims)
        dst = Operand("gb", owner, at + self.nbytes(self.lo[0], first), self.dtype, self.packed)
        return src, dst, (end - first, *(b - a for a, b in zip(self.lo[1:], self.hi[1:])))

    def moved(self, src: Operand, shape: tuple[int, ...], low: tuple[int, ...], owner: int, at: int) -> Operand:
        """A load's source ``src`` (of box ``shape``, starting at ``low``) read from the copy in GB
        ``owner``."""
        if not self.boxed:
            return replace(src, mem="gb", index=owner, offset=at + src.offset - self.lo[0])
        offset = sum((c - a) * p for c, a, p in zip(low, self.lo, self.packed)) * self.itemsize
        return replace(src, mem="gb", index=owner, offset=at + offset, strides=tuple(
            self.packed[self.dims.index(s)] if n > 1 else s for s, n in zip(src.strides, shape)))


@dataclass
class _Stretch:
    """Cycles ``[start, end)`` of a kernel where DDR idled; ``at``: per cluster, where its copies
    go (the position of its DMA queue's first transfer from then on) and the instruction they
    wait for (of those before, the one that ended last by ``start``)."""

    start: int
    end: int
    at: dict[int, tuple[int, int]]
    rate: dict[int, float]  # per GB, bytes per cycle a copy into it may move: DDR's, or what its port has left


def loaded_ahead(program: Program, taken: list, timing: ProgramTiming | None = None) -> Program:
    """``program`` with its chained kernels' weights loaded ahead into the GBs (module docstring),
    or ``program`` itself where none is or that is not faster; ``taken``: the GB places (first
    kernel, last kernel, lo, hi, GB) other passes keep, which the copies avoid; ``timing``: the
    program's, written out, where a pass before has it."""
    hw = Hardware.from_dict(program.hardware)
    if len(program.kernels) < 2 or not hw.multicast_dma:
        return program
    places = list(taken)  # (first kernel, last kernel, lo, hi, GB) of the GB places taken
    written_out = out = program.expanded()
    best = timing or simulate_program(written_out, hw, check_hazards=False)
    for _ in range(ROUNDS):
        changed = _round(out, best, places, hw)
        if changed is out:
            break
        timing = simulate_program(changed, hw, check_hazards=False)
        if timing.cycles >= best.cycles:
            break
        out, best = changed, timing
    if out is written_out:
        return program
    # the kernels left as they were keep their replicas
    return replace(out, kernels=tuple(k if new is old else new
                                      for k, old, new in zip(program.kernels, written_out.kernels, out.kernels)))


def _round(program: Program, timing, places: list, hw: Hardware) -> Program:
    """One pass of ``loaded_ahead`` over the weights still loaded from DDR, with the stretches of
    ``timing`` (the program's, written out); ``places`` grows by the GB places it takes."""
    weights = _weights(program, hw)
    if not weights:
        return program
    stretches = [_stretches(k, t, hw) for k, t in zip(program.kernels, timing.kernels)]
    high = [gb_high_water(k) for k in program.kernels]
    inserts: list[list[tuple[int, Dma]]] = [[] for _ in program.kernels]
    sources: dict[int, dict[int, Operand]] = {}  # reader -> load position -> its new source
    held = [0] * hw.clusters  # bytes of the copies each GB holds
    for w in weights:
        owner = min(w.clusters, key=lambda c: (held[c], c))  # a reader's GB, the one holding least
        pieces = _pieces(w, stretches, owner)
        end = pieces[-1][3] if pieces else w.lo[0]  # the copies end here: the loads within move
        loads = [(i, low) for i, low, high in w.loads if high[0] <= end]
        if not loads:
            continue
        first, size = pieces[0][0], w.nbytes(w.lo[0], end)
        at = gb_place(size, max(high[first:w.reader + 1]), first, w.reader, places, owner, hw.gb_bytes)
        if at is None:
            continue
        places.append((first, w.reader, at, at + size, owner))
        held[owner] += size
        for k, s, lo, hi in pieces:
            s.start += math.ceil(w.nbytes(lo, hi) / s.rate[owner] / IDLE_SHARE)
            src, dst, shape = w.copy(lo, hi, owner, at)
            inserts[k].append((s.at[owner][0], Dma(core=owner * hw.cores_per_cluster, shape=shape,
                                                   deps=(s.at[owner][1],), dst=dst, src=src)))
        reader = program.kernels[w.reader]
        for i, low in loads:
            load = reader.instructions[i]
            sources.setdefault(w.reader, {})[i] = w.moved(load.src, load.shape, low, owner, at)
    if not sources:
        return program
    return replace(program, kernels=tuple(_rewritten(k, inserts[n], sources.get(n, {}))
                                          for n, k in enumerate(program.kernels)))


def _weights(program: Program, hw: Hardware) -> list[_Weight]:
    """The weights each chained kernel (written out) loads from DDR into the LBs, in kernel order:
    per kernel and read-only arg, the bytes its loads span."""
    spans = sorted((a.offset, a.offset + a.nbytes, a) for a in program.args)
    starts = [lo for lo, _, _ in spans]

    def arg_of(o: Operand, shape: tuple[int, ...]):
        lo, hi = o.extent_bytes(shape)
        i = bisect.bisect_right(starts, lo) - 1
        return spans[i][2] if i >= 0 and hi <= spans[i][1] else None

    written = {arg_of(ins.dst, ins.shape) for k in program.kernels for ins in k.instructions
               if type(ins) is Dma and ins.dst.mem == "ddr"}
    out = []
    for n, k in enumerate(program.kernels):
        if n == 0:
            continue
        found: dict[str, list] = {}
        for i, ins in enumerate(k.instructions):
            if type(ins) is not Dma or ins.src.mem != "ddr" or ins.dst.mem != "lb":
                continue
            a = arg_of(ins.src, ins.shape)
            if a is None or a.role != "input" or a in written:
                continue
            found.setdefault(a, []).append((i, ins, ins.core // hw.cores_per_cluster))
        for a, loads in found.items():
            extents = [(i, *ins.src.extent_bytes(ins.shape)) for i, ins, _ in loads]
            span = _Weight(n, (min(x[1] for x in extents),), (max(x[2] for x in extents),),
                           tuple(sorted({c for _, _, c in loads})), tuple((i, (lo,), (hi,)) for i, lo, hi in extents))
            out += _boxes(n, a, loads, span.hi[0] - span.lo[0]) or [span]
    return out


def _boxes(reader: int, arg, loads: list, span: int) -> list[_Weight] | None:
    """Per cluster, the box of ``arg`` its ``loads`` (position, Dma, cluster) read, where the
    clusters' boxes do not overlap and hold no more than the ``span`` of bytes all read, less where
    one cluster reads (the columns of a classifier dealt over the clusters): each cluster's copied
    into its own GB, not every reader's through one GB's port, and none copies the others'
    columns. None otherwise."""
    dims = tuple(math.prod(arg.shape[d + 1:]) for d in range(len(arg.shape)))
    itemsize = DTYPES[arg.dtype]
    boxes: dict[int, list] = {}
    for i, ins, c in loads:
        src, (element, rest) = ins.src, divmod(ins.src.offset - arg.offset, itemsize)
        if src.dtype != arg.dtype or rest:
            return None
        low = [element // d % e for d, e in zip(dims, arg.shape)]
        high = [x + 1 for x in low]
        for stride, n in zip(src.strides, ins.shape):
            if n == 1:
                continue
            if stride not in dims or high[dims.index(stride)] - low[dims.index(stride)] > 1:
                return None  # a load dim that is none of the arg's, or two on one
            d = dims.index(stride)
            high[d] += n - 1
            if high[d] > arg.shape[d]:
                return None
        boxes.setdefault(c, []).append((i, tuple(low), tuple(high)))
    hulls = {c: (tuple(min(b[1][d] for b in bs) for d in range(len(dims))),
                 tuple(max(b[2][d] for b in bs) for d in range(len(dims)))) for c, bs in boxes.items()}
    volume = sum(math.prod(b - a for a, b in zip(*h)) for h in hulls.values()) * itemsize
    overlap = any(all(a1 < b2 and a2 < b1 for a1, b1, a2, b2 in zip(*h, *g))
                  for h, g in itertools.combinations(hulls.values(), 2))
    if overlap or volume > span or len(boxes) == 1 and volume == span:
        return None
    return [_Weight(reader, *hulls[c], (c,), tuple(bs), dims, arg.dtype, arg.offset, boxed=True)
            for c, bs in sorted(boxes.items())]


def _stretches(kernel: Kernel, timing: KernelTiming, hw: Hardware) -> list[_Stretch]:
    """The stretches of at least ``MIN_STRETCH`` cycles where no transfer of ``kernel`` (written
    out) used DDR, in time order, each with the clusters of the kernel's cores whose DMA queues
    may take a copy then."""
    ins = kernel.instructions
    busy = sorted((timing.start[i], timing.end[i]) for i, x in enumerate(ins)
                  if type(x) is Dma and "ddr" in (x.src.mem, x.dst.mem))
    idle, t = [], 0
    for a, b in busy + [(timing.cycles, timing.cycles)]:
        if a - t >= MIN_STRETCH:
            idle.append((t, a))
        t = max(t, b)
    queues: dict[int, list[int]] = {}  # cluster -> its DMA queue's transfers
    for i, (unit, c) in enumerate(timing.units):
        if unit == "cdma":
            queues.setdefault(c, []).append(i)
    starts = {c: [timing.start[i] for i in q] for c, q in queues.items()}
    by_end = sorted(range(len(ins)), key=timing.end.__getitem__)
    latest = _PrefixMax(len(ins))  # over stream positions: the instruction that ended last so far
    used = _gb_bytes(kernel, timing, idle, hw)
    clusters = sorted({c // hw.cores_per_cluster for c in kernel.cores})  # whose DMAs the kernel runs
    out, n = [], 0
    for (a, b), gb in zip(idle, used):
        while n < len(by_end) and timing.end[by_end[n]] <= a:
            latest.add(by_end[n], timing.end[by_end[n]])
            n += 1
        at = {}
        for c in clusters:
            # the cluster's copies go before its queue's first transfer that started in the stretch or
            # later, and wait for the instruction before them that ended last as it began
            q = queues.get(c, [])
            k = bisect.bisect_left(starts.get(c, []), a)
            nxt = q[k] if k < len(q) else len(ins)
            after = latest.before(nxt)
            if after is not None:
                at[c] = (nxt, after)
        if at:
            rate = {c: min(hw.ddr_bytes_per_cycle, hw.gb_bytes_per_cycle - gb.get(c, 0) / (b - a)) for c in at}
            out.append(_Stretch(a, b, at, rate))
    return out


class _PrefixMax:
    """Positions with values, added one by one; the position of the largest value before a given
    position (a Fenwick tree of maxima)."""

    def __init__(self, n: int):
        self.tree = [(-1, -1)] * (n + 1)

    def add(self, position: int, value: int) -> None:
        k = position + 1
        while k < len(self.tree):
            self.tree[k] = max(self.tree[k], (value, position))
            k += k & -k

    def before(self, position: int) -> int | None:
        best, k = (-1, -1), position
        while k > 0:
            best = max(best, self.tree[k])
            k -= k & -k
        return best[1] if best[1] >= 0 else None


def _gb_bytes(kernel: Kernel, timing: KernelTiming, stretches: list, hw: Hardware) -> list[dict]:
    """Per stretch (disjoint, in time order), per cluster, the bytes the kernel's transfers moved
    through its GB port then (each transfer's spread evenly over its time)."""
    out = [{} for _ in stretches]
    firsts = [a for a, _ in stretches]
    for i, x in enumerate(kernel.instructions):
        s, e = timing.start[i], timing.end[i]
        if type(x) is not Dma or e <= s or i in timing.riders or "gb" not in (x.src.mem, x.dst.mem):
            continue
        k = max(bisect.bisect_right(firsts, s) - 1, 0)
        while k < len(stretches) and stretches[k][0] < e:
            a, b = stretches[k]
            if b > s:
                share = (min(e, b) - max(s, a)) / (e - s)
                for r, n in dma_demand(x, hw).items():
                    if r[0] == "gb":
                        out[k][r[1]] = out[k].get(r[1], 0) + n * share
            k += 1
    return out


def gb_high_water(kernel: Kernel) -> int:
    """The end of the highest GB bytes a kernel (written out) touches, in any GB."""
    top = 0
    for ins in kernel.instructions:
        if type(ins) is Dma:
            for o in (ins.src, ins.dst):
                if o.mem == "gb":
                    top = max(top, o.extent_bytes(ins.shape)[1])
    return top


def _pieces(w: _Weight, stretches: list[list[_Stretch]], owner: int) -> list:
    """The weight's box cut along its first dim into copies into GB ``owner`` over idle stretches of
    the kernels before its reader, earliest first, as far as they go: (kernel, stretch, lo, hi); a
    span of bytes at multiples of ``PIECE_BYTES``, a box at whole slices."""
    out, lo, end = [], w.lo[0], w.hi[0]
    unit = w.nbytes(0, 1)
    step = 1 if w.boxed else PIECE_BYTES
    for k in range(w.reader):
        for s in stretches[k]:
            if owner not in s.at:
                continue
            room = int((s.end - s.start) * IDLE_SHARE * s.rate[owner] / unit) // step * step
            if room <= 0:
                continue
            hi = min(end, lo + room)
            out.append((k, s, lo, hi))
            lo = hi
            if lo == end:
                return out
    return out


def gb_place(size: int, floor: int, first: int, last: int, places: list, gb: int, gb_bytes: int) -> int | None:
    """The lowest offset (64-byte aligned) of GB ``gb`` from ``floor`` where ``size`` bytes overlap
    no place of it taken over kernels ``first``..``last``, or None where none fits."""
    at = math.ceil(floor / 64) * 64
    for a, b, lo, hi, index in sorted(places, key=lambda p: p[2]):
        if index != gb or b < first or a > last or hi <= at:
            continue
        if lo >= at + size:
            break
        at = math.ceil(hi / 64) * 64
    return at if at + size <= gb_bytes else None


def _rewritten(kernel: Kernel, inserts: list[tuple[int, Dma]], sources: dict[int, Operand]) -> Kernel:
    """``kernel`` (written out) with each copy of ``inserts`` placed before the instruction at its
    position (its deps, and every other, renumbered; marked as promotions) and its loads at
    ``sources`` reading there."""
    if not inserts and not sources:
        return kernel
    old = list(kernel.instructions)
    for i, src in sources.items():
        old[i] = replace(old[i], src=src)
    if not inserts:
        return replace(kernel, instructions=tuple(old))
    before: dict[int, list[Dma]] = {}
    for p, d in sorted(inserts, key=lambda x: x[0]):
        before.setdefault(p, []).append(d)
    new_of, stream, runs = [], [], []
    for i in range(len(old) + 1):
        if i in before:
            runs.append((len(stream), len(before[i]), i))
            stream += before[i]
        if i < len(old):
            new_of.append(len(stream))
            stream.append(old[i])
    stream = [replace(x, deps=tuple(new_of[d] for d in x.deps)) if x.deps else x for x in stream]
    marks = list(kernel.layers)
    for first, n, i in runs:
        mark = next((m for m in reversed(kernel.layers) if m.first <= i), None)
        marks.append(LayerMark(first, PROMOTE, ()))
        if i < len(old) and mark is not None:
            marks.append(LayerMark(first + n, mark.name, mark.shape))
    moved = [replace(m, first=new_of[m.first]) if m.first < len(old) else m for m in kernel.layers]
    marks = sorted(moved + marks[len(kernel.layers):], key=lambda m: m.first)
    return replace(kernel, instructions=tuple(stream), layers=tuple(_unique(marks)))


def _unique(marks: list[LayerMark]) -> list[LayerMark]:
    """Marks by position, the last of several at one position kept."""
    out: dict[int, LayerMark] = {}
    for m in marks:
        out[m.first] = m
    return list(out.values())
