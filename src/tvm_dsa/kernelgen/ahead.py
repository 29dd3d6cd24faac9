"""Weights loaded ahead: a chained kernel's reads of weights from DDR, moved into a GB during the
kernels before it, while DDR idles there.

A launch of several kernels (``launch.launch_together``) runs them one after another and each
loads its own weights, so DDR idles while the early kernels compute and binds the late ones, whose
weights are large (a CNN's last stages, its classifier). ``loaded_ahead`` times the program and
copies, for each chained kernel's loads of a weight from DDR into the LBs (a read-only arg), the
bytes they read into a place of one GB that no kernel from the copy to the reader uses: of the
clusters whose cores read it, the one whose GB holds least of such copies. Every reader then
loads from there (one in another cluster across the bus, through both GBs); one GB is written,
not one per cluster, as the early kernels' own loads keep the GB ports busy. The copies are cut
into pieces, each filling a stretch of an earlier kernel where DDR idled (``IDLE_SHARE`` of it,
at the rate the GB's port had left then): it waits for the instruction that ended last as the
stretch began and sits in the cluster DMA queue before the transfers that started after. The
barrier between chained kernels orders the copies before the reads. A weight the stretches
cannot hold moves in part (the loads within the bytes copied). Repeated while the program times
faster (a reader whose loads moved leaves DDR idle for the next); kept only where it does.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, replace

from tvm_dsa.emit.emitter import PROMOTE
from tvm_dsa.hardware.model import Hardware
from tvm_dsa.isa import Dma, Kernel, LayerMark, Operand, Program
from tvm_dsa.runtime.cost import dma_demand
from tvm_dsa.runtime.timing import KernelTiming, ProgramTiming, simulate_program

IDLE_SHARE = 0.75  # of an idle stretch of DDR, what a copy may take (the kernel's own transfers shift)
MIN_STRETCH = 256  # cycles: shorter idle stretches take no copy
PIECE_BYTES = 4096  # copies are cut at multiples of this
ROUNDS = 3


@dataclass(frozen=True)
class _Weight:
    """The bytes ``[lo, hi)`` of a read-only arg that kernel ``reader`` loads into the LBs of
    ``clusters``, by its loads ``(stream position, first byte, end)``."""

    reader: int
    lo: int
    hi: int
    clusters: tuple[int, ...]
    loads: tuple[tuple[int, int, int], ...]


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
    kernel, last kernel, lo, hi) other passes keep, which the copies avoid; ``timing``: the
    program's, written out, where a pass before has it."""
    hw = Hardware.from_dict(program.hardware)
    if len(program.kernels) < 2 or not hw.multicast_dma:
        return program
    places = list(taken)  # (first kernel, last kernel, lo, hi) of the GB places taken
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
        end = pieces[-1][3] if pieces else w.lo  # the copies end here: the loads within move
        loads = [i for i, lo, hi in w.loads if hi <= end]
        if not loads:
            continue
        first = pieces[0][0]
        at = gb_place(end - w.lo, max(high[first:w.reader + 1]), first, w.reader, places, hw.gb_bytes)
        if at is None:
            continue
        places.append((first, w.reader, at, at + end - w.lo))
        held[owner] += end - w.lo
        for k, s, lo, hi in pieces:
            s.start += math.ceil((hi - lo) / s.rate[owner] / IDLE_SHARE)
            inserts[k].append((s.at[owner][0], Dma(core=owner * hw.cores_per_cluster,
                                                   shape=(hi - lo,), deps=(s.at[owner][1],),
                                                   dst=Operand("gb", owner, at + lo - w.lo, "int8", (1,)),
                                                   src=Operand("ddr", 0, lo, "int8", (1,)))))
        reader = program.kernels[w.reader]
        for i in loads:
            src = reader.instructions[i].src
            sources.setdefault(w.reader, {})[i] = replace(src, mem="gb", index=owner, offset=at + src.offset - w.lo)
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
            lo, hi = ins.src.extent_bytes(ins.shape)
            found.setdefault(a.name, []).append((i, lo, hi, ins.core // hw.cores_per_cluster))
        for loads in found.values():
            out.append(_Weight(n, min(x[1] for x in loads), max(x[2] for x in loads),
                               tuple(sorted({x[3] for x in loads})), tuple(x[:3] for x in loads)))
    return out


def _stretches(kernel: Kernel, timing: KernelTiming, hw: Hardware) -> list[_Stretch]:
    """The stretches of at least ``MIN_STRETCH`` cycles where no transfer of ``kernel`` (written
    out) used DDR, in time order."""
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
    out, n = [], 0
    for (a, b), gb in zip(idle, used):
        while n < len(by_end) and timing.end[by_end[n]] <= a:
            latest.add(by_end[n], timing.end[by_end[n]])
            n += 1
        at = {}
        for c in range(hw.clusters):
            # the cluster's copies go before its queue's first transfer that started in the stretch or
            # later, and wait for the instruction before them that ended last as it began
            q = queues.get(c, [])
            k = bisect.bisect_left(starts.get(c, []), a)
            nxt = q[k] if k < len(q) else len(ins)
            after = latest.before(nxt)
            if after is None:
                break
            at[c] = (nxt, after)
        else:
            rate = {c: min(hw.ddr_bytes_per_cycle, hw.gb_bytes_per_cycle - gb.get(c, 0) / (b - a))
                    for c in range(hw.clusters)}
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
    """The weight's bytes cut into copies (of bytes: ``int8``) into GB ``owner`` over idle stretches of the kernels
    before its reader, earliest first, as far as they go: (kernel, stretch, lo, hi)."""
    out, lo = [], w.lo
    for k in range(w.reader):
        for s in stretches[k]:
            room = int((s.end - s.start) * IDLE_SHARE * s.rate[owner]) // PIECE_BYTES * PIECE_BYTES
            if room <= 0:
                continue
            hi = min(w.hi, lo + room)
            out.append((k, s, lo, hi))
            lo = hi
            if lo == w.hi:
                return out
    return out


def gb_place(size: int, floor: int, first: int, last: int, places: list, gb_bytes: int) -> int | None:
    """The lowest GB offset (64-byte aligned) from ``floor`` where ``size`` bytes overlap no place
    taken over kernels ``first``..``last``, or None where none fits."""
    at = math.ceil(floor / 64) * 64
    for a, b, lo, hi in sorted(places, key=lambda p: p[2]):
        if b < first or a > last or hi <= at:
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
