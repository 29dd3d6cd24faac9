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
cluster's box is copied packed into its own GB instead, and its cores read it at their own port.
A kernel's promotion of a weight into the GBs (``emit.emitter``'s, a multicast DDR -> GBs) is
copied likewise, whole, into one place of the same GBs (a multicast too), and taken out: what
read the promoted bytes reads the copy. The copies are cut into pieces, each filling a stretch
of an earlier kernel where DDR and the cluster DMA queues idled (``IDLE_SHARE`` of it, at the
rate the GB's port had left then), the latest stretches first: it waits for the instruction that
ended last as the stretch began and sits in the cluster DMA queue before the transfers that
started after. The barrier between chained kernels orders the copies before the reads. A weight
the stretches cannot hold moves in part (the loads within the bytes copied). The kernels are
taken reader by reader, each reader's copies kept only where the kernels they change (timed
alone: kernels run one after another) take fewer cycles; repeated while one is kept (a reader
whose loads moved leaves DDR idle for the next); the readers last first and first to last, the
faster program kept (``_moved``). At batch 1 DenseNet-121 promotes every
weight, none loaded into the LBs from DDR: its block 4 (60 k cycles, 33 k of them DDR for its
weights) had nothing loaded ahead.
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass, replace

from tvm_dsa.hardware.model import Hardware
from tvm_dsa.isa import Dma, Kernel, Operand, Program
from tvm_dsa.isa.instructions import DTYPES, multicast_groups
from tvm_dsa.kernelgen.edits import GbTraffic, copy_readers, edited, plain_where_stuck
from tvm_dsa.runtime.cost import dma_demand
from tvm_dsa.runtime.timing import KernelTiming, ProgramTiming, simulate_kernel, simulate_program

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
    """Cycles ``[start, end)`` of a kernel where DDR and the cluster DMA queues idled; ``at``: per
    cluster, where its copies go (the position of its DMA queue's first transfer from then on)
    and the instruction they wait for (of those before, the one that ended last by ``start``;
    None where none had)."""

    start: int
    end: int
    at: dict[int, tuple[int, int | None]]
    rate: dict[int, float]  # per GB, bytes per cycle a copy into it may move: DDR's, or what its port has left


def loaded_ahead(program: Program, taken: list, timing: ProgramTiming | None = None) -> Program:
    """``program`` with its chained kernels' weights loaded ahead into the GBs (module docstring),
    or ``program`` itself where none is or that is not faster; ``taken``: the GB places (first
    kernel, last kernel, lo, hi, GB) other passes keep, which the copies avoid; ``timing``: the
    program's, written out, where a pass before has it."""
    hw = Hardware.from_dict(program.hardware)
    if len(program.kernels) < 2 or not hw.multicast_dma:
        return program
    written_out = program.expanded()
    timings = list((timing or simulate_program(written_out, hw, check_hazards=False)).kernels)
    weight = _weight_args(written_out)
    n = len(timings)
    kernels, _ = min((_moved(written_out, timings, taken, weight, hw, order)
                      for order in (range(n - 1, 0, -1), range(1, n))), key=lambda way: way[1])
    if all(new is old for new, old in zip(kernels, written_out.kernels)):
        return program
    # the kernels left as they were keep their replicas
    return replace(program, kernels=tuple(k if new is old else new
                                          for k, old, new in zip(program.kernels, written_out.kernels, kernels)))


def _moved(written_out: Program, timings: list[KernelTiming], taken: list, weight, hw: Hardware,
           order) -> tuple[list[Kernel], int]:
    """(kernels, their cycles) of ``written_out`` with the weights of the readers in ``order``
    loaded ahead, each reader's copies kept where the kernels they change take fewer cycles.
    Both orders are tried: last first, the late readers' copies take the stretches nearest them
    (DenseNet-121 at batch 1, 423,020 cycles against 424,394); first to last, each reader's copies
    take the stretches just before it ahead of a later, larger weight's (MobileNetV2, whose
    classifier's copies took the stretches its last blocks' weights needed: 111,735 against 113,914)."""
    kernels, timings = list(written_out.kernels), list(timings)
    state = _State(list(taken), [0] * hw.clusters, gb_used(kernels), {})
    for _ in range(ROUNDS):
        moved = False
        for reader in order:
            trial = _trial(kernels, timings, reader, weight, state, hw)
            if trial is None:
                continue
            edits, places = trial
            edits = {n: plain_where_stuck(k, hw.cores_per_cluster) for n, k in edits.items()}
            after = {n: simulate_kernel(k, hw, None, timings[n].start_cycle) for n, k in edits.items()}
            if sum(t.cycles for t in after.values()) >= sum(timings[n].cycles for n in edits):
                continue
            for n, k in edits.items():
                kernels[n], timings[n] = k, after[n]
                state.stretches.pop(n, None)
            for place in places:
                state.places.append(place)
                state.held[place[4]] += place[3] - place[2]
            moved = True
        if not moved:
            break
    return kernels, sum(t.cycles for t in timings)


@dataclass
class _State:
    """What ``loaded_ahead``'s trials share: the GB places taken (first kernel, last kernel, lo,
    hi, GB), the bytes of copies each GB holds, the GB bytes each kernel used before any copy
    (``gb_used``), and the idle stretches of the kernels as they stand (computed when first asked
    for)."""

    places: list
    held: list[int]
    used: list
    stretches: dict[int, list[_Stretch]]


def _trial(kernels: list[Kernel], timings: list[KernelTiming], reader: int, weight, state: _State,
           hw: Hardware) -> tuple[dict[int, Kernel], list] | None:
    """The kernels changed (index -> kernel) where kernel ``reader``'s weights still loaded or
    promoted from DDR (the read-only args of ``weight``) are copied into the GBs over idle
    stretches of the kernels before it, latest first, and the GB places the copies take; None
    where none is."""
    weights = _weights(kernels[reader], reader, weight, hw)
    promotions = _promotions(kernels[reader], reader, weight, state.places, hw)
    if not weights and not promotions:
        return None
    for n in range(reader):
        if n not in state.stretches:
            state.stretches[n] = _stretches(kernels[n], timings[n], hw)
    stretches = [[replace(s) for s in state.stretches[n]] for n in range(reader)]
    inserts: list[list[tuple[int, int, Dma]]] = [[] for _ in range(reader)]  # (position, stretch end, copy)
    sources: dict[int, Operand] = {}  # the reader's transfers' new sources, by position
    drops: set[int] = set()  # the promotions copied ahead
    places: list = []
    traffic = GbTraffic(kernels[reader].instructions) if promotions else None

    def copy(pieces: list, w: _Weight, owners: tuple[int, ...], at: int) -> None:
        first, end = min(k for k, *_ in pieces), max(hi for *_, hi in pieces)
        for k, s, lo, hi in pieces:
            s.start += math.ceil(w.nbytes(lo, hi) / min(s.rate[c] for c in owners) / IDLE_SHARE)
            for c in owners:
                src, dst, shape = w.copy(lo, hi, c, at)
                wait = s.at[c][1]
                inserts[k].append((s.at[c][0], s.end, Dma(core=c * hw.cores_per_cluster, shape=shape, dst=dst,
                                                          src=src, deps=() if wait is None else (wait,),
                                                          multicast=len(owners) > 1)))
        places.extend((first, reader, at, at + w.nbytes(w.lo[0], end), c) for c in owners)

    for w in weights:
        held = list(state.held)
        for place in places:
            held[place[4]] += place[3] - place[2]
        owner = min(w.clusters, key=lambda c: (held[c], c))  # a reader's GB, the one holding least
        pieces = _pieces(w, stretches, (owner,))
        end = max((hi for *_, hi in pieces), default=w.lo[0])  # the copies end here: the loads within move
        loads = [(i, low) for i, low, high in w.loads if high[0] <= end]
        if not loads:
            continue
        first = min(k for k, *_ in pieces)
        at = gb_place(w.nbytes(w.lo[0], end), 0, first, reader, state.places + state.used + places, owner,
                      hw.gb_bytes)
        if at is None:
            continue
        copy(pieces, w, (owner,), at)
        for i, low in loads:
            load = kernels[reader].instructions[i]
            sources[i] = w.moved(load.src, load.shape, low, owner, at)
    for p in promotions:
        w = _Weight(reader, (p.lo,), (p.hi,), p.clusters, ())
        pieces = _pieces(w, stretches, p.clusters)
        if max((hi for *_, hi in pieces), default=p.lo) < p.hi:
            continue  # copied whole or not at all
        first = min(k for k, *_ in pieces)
        at = _place_in_all(p.hi - p.lo, first, reader, state.places + state.used + places, p.clusters,
                           hw.gb_bytes)
        readers = _promotion_readers(kernels[reader], p, at, hw.cores_per_cluster, traffic)
        if at is None or readers is None or readers.keys() & sources.keys():
            continue
        copy(pieces, w, p.clusters, at)
        sources.update(readers)
        drops.update(p.positions)
    if not sources:
        return None
    # at one queue position, the copies in stretch order: each cluster's queue takes a multicast's
    # pieces in one order (else each waits at its queue's head for another's)
    edits = {n: edited(kernels[n], [(at, d) for at, _, d in sorted(inserts[n], key=lambda x: x[:2])])
             for n in range(reader) if inserts[n]}
    edits[reader] = edited(kernels[reader], (), sources, drops)
    return edits, places


def _weight_args(program: Program):
    """A function of a DDR operand and its box: the read-only arg (an input no transfer of
    ``program``, written out, writes) holding the box, or None."""
    spans = sorted((a.offset, a.offset + a.nbytes, a) for a in program.args)
    starts = [lo for lo, _, _ in spans]

    def arg_of(o: Operand, shape: tuple[int, ...]):
        lo, hi = o.extent_bytes(shape)
        i = bisect.bisect_right(starts, lo) - 1
        return spans[i][2] if i >= 0 and hi <= spans[i][1] else None

    written = {arg_of(ins.dst, ins.shape) for k in program.kernels for ins in k.instructions
               if type(ins) is Dma and ins.dst.mem == "ddr"}

    def weight(o: Operand, shape: tuple[int, ...]):
        a = arg_of(o, shape) if o.mem == "ddr" else None
        return a if a is not None and a.role == "input" and a not in written else None

    return weight


def _weights(kernel: Kernel, n: int, weight, hw: Hardware) -> list[_Weight]:
    """The weights chained kernel ``n`` (written out) loads from DDR into the LBs (the read-only
    args of ``weight``): per arg, the bytes its loads span, or per cluster its box."""
    found: dict[str, list] = {}
    for i, ins in enumerate(kernel.instructions):
        if type(ins) is not Dma or ins.dst.mem != "lb":
            continue
        a = weight(ins.src, ins.shape)
        if a is not None:
            found.setdefault(a, []).append((i, ins, ins.core // hw.cores_per_cluster))
    out = []
    for a, loads in found.items():
        extents = [(i, *ins.src.extent_bytes(ins.shape)) for i, ins, _ in loads]
        span = _Weight(n, (min(x[1] for x in extents),), (max(x[2] for x in extents),),
                       tuple(sorted({c for _, _, c in loads})), tuple((i, (lo,), (hi,)) for i, lo, hi in extents))
        out += _boxes(n, a, loads, span.hi[0] - span.lo[0]) or [span]
    return out


@dataclass(frozen=True)
class _Promotion:
    """A chained kernel ``reader``'s copy of a weight's DDR bytes ``[lo, hi)``, in one layout with
    no gaps, to offset ``to`` of the GBs of ``clusters``: its DMAs at ``positions``, one per GB
    (a multicast where several)."""

    reader: int
    lo: int
    hi: int
    to: int
    clusters: tuple[int, ...]
    positions: tuple[int, ...]


def _promotions(kernel: Kernel, n: int, weight, places: list, hw: Hardware) -> list[_Promotion]:
    """The promotions of weights (the read-only args of ``weight``) into the GBs of chained kernel
    ``n`` (written out), in stream order: not a copy into one of the GB ``places`` held across
    kernels (a later kernel's weight copied ahead: its readers are not this kernel's)."""
    groups = multicast_groups(kernel.instructions)
    out, seen = [], set()
    for i, ins in enumerate(kernel.instructions):
        if type(ins) is not Dma or ins.dst.mem != "gb" or i in seen or weight(ins.src, ins.shape) is None:
            continue
        members = groups.get(i, (i,))
        seen.update(members)
        dmas = [kernel.instructions[m] for m in members]
        lo, hi = ins.src.extent_bytes(ins.shape)
        if any(d.src != ins.src or d.shape != ins.shape or d.dst.offset != ins.dst.offset
               or d.dst.strides != ins.src.strides or d.dst.index != d.core // hw.cores_per_cluster
               for d in dmas) or math.prod(ins.shape) * ins.src.itemsize != hi - lo:
            continue
        to, gbs = ins.dst.offset, tuple(d.dst.index for d in dmas)
        if any(first <= n <= last and gb in gbs and a < to + hi - lo and to < b for first, last, a, b, gb in places):
            continue
        out.append(_Promotion(n, lo, hi, to, gbs, tuple(members)))
    return out


def _promotion_readers(kernel: Kernel, p: _Promotion, at: int | None, cores_per_cluster: int,
                       traffic: GbTraffic) -> dict | None:
    """The transfers of ``kernel`` (written out; ``traffic``: its GB traffic) reading what
    promotion ``p`` wrote, each reading its copy at ``at`` of the same GB instead
    (``edits.copy_readers``); None where one cannot."""
    if at is None:
        return None
    stream, out = list(kernel.instructions), {}
    for m in p.positions:
        promotion = stream[m]
        stream[m] = replace(promotion, src=replace(promotion.dst, offset=at))
        readers = copy_readers(stream, m, cores_per_cluster, traffic)
        stream[m] = promotion
        if not readers:  # none in the kernel: what the promotion wrote may be read later
            return None
        out.update(readers)
    return out


def _place_in_all(size: int, first: int, last: int, places: list, gbs: tuple[int, ...],
                  gb_bytes: int) -> int | None:
    """The lowest offset where ``size`` bytes fit in each of GBs ``gbs`` over kernels
    ``first``..``last`` (``gb_place``), or None."""
    at = 0
    while True:
        spots = [gb_place(size, at, first, last, places, g, gb_bytes) for g in gbs]
        if None in spots:
            return None
        if min(spots) == max(spots):
            return spots[0]
        at = max(spots)


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
    out) used DDR or a cluster's DMA queue (which a copy would hold up), in time order, each with
    the clusters of the kernel's cores whose DMA queues may take a copy then."""
    ins = kernel.instructions
    busy = sorted((timing.start[i], timing.end[i]) for i, x in enumerate(ins)
                  if type(x) is Dma and ("ddr" in (x.src.mem, x.dst.mem) or timing.units[i][0] == "cdma"))
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
            at[c] = (nxt, latest.before(nxt))
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


def gb_used(kernels: list[Kernel]) -> list[tuple[int, int, int, int, int]]:
    """The GB bytes each kernel (written out) touches, as places (kernel, kernel, lo, hi, GB): per
    GB, the ranges its transfers touch, joined where they overlap."""
    out = []
    for n, k in enumerate(kernels):
        ranges: dict[int, list] = {}
        for ins in k.instructions:
            if type(ins) is Dma:
                for o in (ins.src, ins.dst):
                    if o.mem == "gb":
                        ranges.setdefault(o.index, []).append(o.extent_bytes(ins.shape))
        for gb, spans in ranges.items():
            joined: list[list[int]] = []
            for lo, hi in sorted(spans):
                if joined and lo <= joined[-1][1]:
                    joined[-1][1] = max(joined[-1][1], hi)
                else:
                    joined.append([lo, hi])
            out += [(n, n, lo, hi, gb) for lo, hi in joined]
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


def _pieces(w: _Weight, stretches: list[list[_Stretch]], owners: tuple[int, ...]) -> list:
    """The weight's box cut along its first dim into copies into GBs ``owners`` over idle stretches
    of the kernels before its reader, latest first (the GB places then held for the shortest
    time), as far as they go: (kernel, stretch, lo, hi); a span of bytes at multiples of
    ``PIECE_BYTES``, a box at whole slices."""
    out, lo, end = [], w.lo[0], w.hi[0]
    unit = w.nbytes(0, 1)
    step = 1 if w.boxed else PIECE_BYTES
    for k in reversed(range(w.reader)):
        for s in reversed(stretches[k]):
            if any(c not in s.at for c in owners):
                continue
            room = int((s.end - s.start) * IDLE_SHARE * min(s.rate[c] for c in owners) / unit) // step * step
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
