"""Scratch kept in the GBs: the DDR bytes a launch's kernels write and read back (the tensors
between its kernels, a kernel's rows exchanged between clusters) moved into a GB.

A joined launch (``launch.launch_together``) keeps the tensors that only its own kernels read in
its DDR, past its args: each kernel writes its output there (in whole bursts, 14-byte rows of a
7 x 7 map taking 64) and the next promotes it back. ``kept_in_gbs`` moves each such region (the
DDR bytes past the args that the transfers touch, joined where they overlap) into a place of one
GB that no kernel from its first writer to its last reader uses, every transfer of it rewritten
alike: a store from an LB goes to the GB, a copy out of a cluster's GB or a promotion into it
becomes a copy between two GBs across the bus, a multicast from DDR one from the GB. The GB is
the one holding least of such regions so far. A region is moved only where every byte a transfer
reads of it was written before (DDR starts zeroed, a GB place holds what was there). Its
promotions are then dropped where every transfer reading the copy can read the region instead
(``_read_in_place``, ``edits.copy_readers``): a reader kernel's tiles load their rows from the
region's GB across the bus as soon as they start, where each cluster first copied the whole
tensor into its own GB. A region that is one of the run's tensors may then be split in bands
over the GBs, each cluster's rows in its own (``banded.banded``). Kept only where the program
times faster, with the promotions or without, whole or in bands.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace

import numpy as np

from tvm_dsa.hardware.model import Hardware
from tvm_dsa.isa import Dma, Operand, Program, TensorArg
from tvm_dsa.kernelgen.ahead import gb_high_water, gb_place
from tvm_dsa.kernelgen.banded import banded
from tvm_dsa.kernelgen.edits import GbTraffic, copy_readers, edited, plain_where_stuck
from tvm_dsa.runtime.timing import ProgramTiming, simulate_program


@dataclass
class _Region:
    """DDR bytes ``[lo, hi)`` past the args, touched by kernels ``first``..``last``."""

    lo: int
    hi: int
    first: int
    last: int


def kept_in_gbs(program: Program, places: list,
                tensors: tuple[TensorArg, ...] = ()) -> tuple[Program, ProgramTiming | None]:
    """(``program`` with its DDR scratch regions kept in the GBs (module docstring), or ``program``
    itself where none moves or that is not faster; its timing, written out, where it was timed:
    ``loaded_ahead`` starts from it). ``places`` grows by the GB places (first kernel, last
    kernel, lo, hi, GB) the regions take. ``tensors``: the run's own tensors in its DDR, which
    may be kept in bands over the GBs (``banded``)."""
    hw = Hardware.from_dict(program.hardware)
    if hw.interconnect == "mesh" or not hw.multicast_dma:
        return program, None
    written_out = program.expanded()
    regions = [r for r in _regions(written_out) if _written_first(written_out, r)]
    high = [gb_high_water(k) for k in written_out.kernels]
    held = [0] * hw.clusters
    moves, spans, taken = [], [], []  # (lo, hi, GB, offset) per region moved; its kernels; their places
    for r in regions:
        need = _owners(written_out, r, hw.cores_per_cluster)
        if len(need) > 1:
            continue
        owner = need.pop() if need else min(range(hw.clusters), key=lambda c: (held[c], c))
        at = gb_place(r.hi - r.lo, max(high[r.first:r.last + 1]), r.first, r.last, places + taken, owner,
                      hw.gb_bytes)
        if at is not None:
            taken.append((r.first, r.last, at, at + r.hi - r.lo, owner))
            held[owner] += r.hi - r.lo
            moves.append((r.lo, r.hi, owner, at))
            spans.append((r.first, r.last))
    if not moves:
        return program, None
    moved = _moved(written_out, moves)
    kept = [(moved, places + taken), (_read_in_place(moved, moves, hw.cores_per_cluster), places + taken)]
    if tensors:
        kept += [banded(p, moves, tensors, spans, places + taken, high, hw) for p, _ in kept]
    kept = [(replace(p, kernels=tuple(k if k is old else plain_where_stuck(k, hw.cores_per_cluster)
                                      for k, old in zip(p.kernels, written_out.kernels))), t) for p, t in kept]
    ways = [(p, t, simulate_program(p, hw, check_hazards=False)) for p, t in [(written_out, [])] + kept]
    out, mine, after = min(ways[1:], key=lambda way: way[2].cycles)
    before = ways[0][2]
    if after.cycles >= before.cycles:
        return program, before
    places[:] = mine
    # the kernels left as they were keep their replicas
    return replace(out, kernels=tuple(k if new is old else new for k, old, new in
                                      zip(program.kernels, written_out.kernels, out.kernels))), after


def _regions(program: Program) -> list[_Region]:
    """The DDR byte ranges past the args that the transfers of ``program`` (written out) touch,
    joined where they overlap, in address order; none where an operand lies across the end of
    the args (it would move in part)."""
    end = max((a.offset + a.nbytes for a in program.args), default=0)
    spans = sorted((lo, hi, k) for k, kernel in enumerate(program.kernels) for ins in kernel.instructions
                   if type(ins) is Dma for o in (ins.src, ins.dst) if o.mem == "ddr"
                   for lo, hi in [o.extent_bytes(ins.shape)] if hi > end)
    if spans and spans[0][0] < end:
        return []
    out: list[_Region] = []
    for lo, hi, k in spans:
        if out and lo < out[-1].hi:
            r = out[-1]
            r.hi, r.first, r.last = max(r.hi, hi), min(r.first, k), max(r.last, k)
        else:
            out.append(_Region(lo, hi, k, k))
    return out


def _written_first(program: Program, r: _Region) -> bool:
    """Whether every byte of region ``r`` a transfer reads was written by a transfer before it (in
    kernel and stream order: a read waits for the write it depends on, which comes first)."""
    written = np.zeros(r.hi - r.lo, dtype=bool)
    for kernel in program.kernels[r.first:r.last + 1]:
        for ins in kernel.instructions:
            if type(ins) is not Dma:
                continue
            if ins.src.mem == "ddr" and r.lo <= ins.src.offset < r.hi and \
                    not written[_bytes(ins.src, ins.shape) - r.lo].all():
                return False
            if ins.dst.mem == "ddr" and r.lo <= ins.dst.offset < r.hi:
                written[_bytes(ins.dst, ins.shape) - r.lo] = True
    return True


def _owners(program: Program, r: _Region, cores_per_cluster: int) -> set[int]:
    """The clusters whose GB must hold region ``r``: a cluster DMA reaches its own GB, and another
    cluster's only from its own; one that moves the region to or from DDR (or within it) needs it
    in its own."""
    out = set()
    for kernel in program.kernels[r.first:r.last + 1]:
        for ins in kernel.instructions:
            if type(ins) is not Dma or "lb" in (ins.src.mem, ins.dst.mem):
                continue
            inside = [r.lo <= o.offset < r.hi for o in (ins.src, ins.dst)]
            if any(inside) and not any(o.mem == "gb" for o in (ins.src, ins.dst)):
                out.add(ins.core // cores_per_cluster)
    return out


def _bytes(o: Operand, shape: tuple[int, ...]) -> np.ndarray:
    """The byte addresses operand ``o`` covers over the box ``shape``."""
    at = np.array([o.offset], dtype=np.int64)
    for n, s in zip(shape, o.strides):
        at = np.add.outer(at, np.arange(n, dtype=np.int64) * s * o.itemsize).ravel()
    return np.add.outer(at, np.arange(o.itemsize, dtype=np.int64)).ravel()


def _moved(program: Program, moves: list) -> Program:
    """``program`` (written out) with each DDR operand inside a region of ``moves`` (lo, hi, GB,
    offset) in that GB's place."""
    starts = [m[0] for m in moves]

    def operand(o: Operand) -> Operand:
        if o.mem != "ddr":
            return o
        i = bisect.bisect_right(starts, o.offset) - 1
        if i < 0 or o.offset >= moves[i][1]:
            return o
        lo, _, gb, at = moves[i]
        return replace(o, mem="gb", index=gb, offset=at + o.offset - lo)

    kernels = []
    for k in program.kernels:
        stream = list(k.instructions)
        for n, ins in enumerate(stream):
            if type(ins) is Dma and "ddr" in (ins.src.mem, ins.dst.mem):
                src, dst = operand(ins.src), operand(ins.dst)
                if src is not ins.src or dst is not ins.dst:
                    stream[n] = replace(ins, src=src, dst=dst)
        changed = any(new is not old for new, old in zip(stream, k.instructions))
        kernels.append(replace(k, instructions=tuple(stream)) if changed else k)
    return replace(program, kernels=tuple(kernels))


def _read_in_place(program: Program, moves: list, cores_per_cluster: int) -> Program:
    """``program`` (written out, the regions of ``moves`` in their GBs) with each copy of a region
    into a kernel's own GB space (a promotion; not into a region, which later kernels read) dropped
    where every transfer that reads the copy before it is written again can read the region
    instead: a core's load (from any GB, across the bus) or a cluster DMA's copy into its own GB.
    The kernel's first tiles then wait for no copy of its whole input, and the region's GB port
    moves each byte once instead of copying it into every GB first."""
    places = [(gb, at, at + hi - lo) for lo, hi, gb, at in moves]

    def in_region(o: Operand, shape) -> bool:
        a, b = o.extent_bytes(shape)
        return o.mem == "gb" and any(o.index == gb and lo <= a and b <= hi for gb, lo, hi in places)

    kernels = []
    for k in program.kernels:
        stream, drop, sources, traffic = k.instructions, set(), {}, None
        for n, ins in enumerate(stream):
            if not (type(ins) is Dma and ins.dst.mem == "gb" and in_region(ins.src, ins.shape)
                    and not in_region(ins.dst, ins.shape) and ins.src.strides == ins.dst.strides):
                continue
            traffic = traffic or GbTraffic(stream)
            readers = copy_readers(stream, n, cores_per_cluster, traffic)
            if readers is not None and not readers.keys() & sources.keys():
                drop.add(n)
                sources.update(readers)
        kernels.append(edited(k, sources=sources, drop=drop) if drop else k)
    return replace(program, kernels=tuple(kernels))
