"""Dependency tokens: an instruction waits for what the data flow implies.

The memory a kernel's instructions touch is divided into memory objects (``MemoryObjects``): a
tensor's region (or each piece of one moved in pieces), a copy of a tile buffer, a core's
scratch, each claimed when it takes its bytes. ``Space`` says which object owns each byte range
of one memory, ``Deps`` which instruction of each unit last wrote and last read each object; an
instruction's tokens follow from the objects its operands touch, including memory a later object
reuses (it inherits the accesses of the objects it displaces). Apart from the emitter because the
compression (``compress``) reads and moves the same tracker when it copies instructions: one
tracker, one interface for both.
"""

from __future__ import annotations

import bisect

from tvm_dsa import isa
from tvm_dsa.emit.placement import Region, row_major
from tvm_dsa.kernel.ir import CodegenError, align

PIECE = "piece"  # key of a piece of a memory object: (PIECE, the object's key, index)


class Deps:
    """Dependency tokens from the memory objects instructions touch.

    Per object: the last write and last read per unit. A tile buffer is rewritten tile after tile,
    so a write waits for the other units' reads and writes of it. A tensor (``ssa``) is written
    once, in disjoint pieces by many cores: its writes wait only for readers of what the memory
    held before (``inherit``), its reads for every unit's last write. Same-unit order is implied
    by the unit's in-order queue."""

    def __init__(self):
        self.writers: dict = {}
        self.readers: dict = {}
        self.ssa: set = set()
        self.before: dict = {}  # ssa object -> the accesses it inherited: what its writes wait for

    def deps(self, reads, writes, unit) -> set:
        # every recorded index belongs to the one unit that ran it: collect all, then drop ours
        tables = [self.writers.get(key) for key in reads]
        for key in writes:
            if key not in self.ssa:
                tables.append(self.writers.get(key))
                tables.append(self.readers.get(key))
            else:
                tables.append(self.before.get(key))
        out, mine = set(), set()
        for t in tables:
            if t:
                out.update(t.values())
                if unit in t:
                    mine.add(t[unit])
        return out - mine

    def record(self, idx, reads, writes, unit) -> None:
        for key in reads:
            self.readers.setdefault(key, {})[unit] = idx
        for key in writes:
            if key in self.ssa:
                self.writers.setdefault(key, {})[unit] = idx
            else:
                self.writers[key] = {unit: idx}
                self.readers[key] = {}

    def inherit(self, key, old_keys, ssa: bool) -> None:
        """``key`` now occupies the memory of ``old_keys``: its first writes wait for every access
        to them."""
        last: dict = {}
        for k in [*old_keys, key]:  # a re-claimed object keeps waiting for its own accesses
            for d in (self.writers.get(k, {}), self.readers.get(k, {})):
                for u, i in d.items():
                    last[u] = max(last.get(u, -1), i)
        self.writers[key], self.readers[key] = {}, last
        self.before[key] = dict(last)
        (self.ssa.add if ssa else self.ssa.discard)(key)


class Space:
    """Which memory object owns each byte range of one memory (a DDR, a GB, an LB)."""

    def __init__(self):
        self.ranges: list = []  # sorted (lo, hi, key)
        self.owners: dict = {}  # offset -> key, cleared when a range is assigned

    def assign(self, lo: int, hi: int, key) -> list:
        """Give [lo, hi) to ``key``; returns the keys that owned part of it (they keep the rest
        of their ranges, so a later object placed there still waits for them)."""
        keep, old = [], []
        for r in self.ranges:
            if r[2] == key:
                continue
            if r[0] < hi and lo < r[1]:
                old.append(r[2])
                keep += [p for p in ((r[0], lo, r[2]), (hi, r[1], r[2])) if p[0] < p[1]]
            else:
                keep.append(r)
        keep.append((lo, hi, key))
        keep.sort(key=lambda r: (r[0], r[1]))
        self.ranges = keep
        self.owners = {}
        return old

    def whole_owner(self, lo: int, hi: int):
        """The key owning all of [lo, hi), or None."""
        i = bisect.bisect_right(self.ranges, (lo, float("inf"))) - 1
        return self.ranges[i][2] if i >= 0 and self.ranges[i][0] <= lo and hi <= self.ranges[i][1] else None

    def owner(self, offset: int):
        key = self.owners.get(offset, self)
        if key is self:
            i = bisect.bisect_right(self.ranges, (offset, float("inf"))) - 1
            found = i >= 0 and self.ranges[i][0] <= offset < self.ranges[i][1]
            key = self.owners[offset] = self.ranges[i][2] if found else None
        return key


class MemoryObjects:
    """A kernel's memory objects: the owner of each byte range per memory (``spaces``: (mem,
    index) -> ``Space``), the range each key was claimed with (``claimed``: key -> (mem, index,
    lo, hi)), the objects claimed in pieces (``pieced``) and the tracker of their accesses
    (``deps``)."""

    def __init__(self):
        self.deps = Deps()
        self.spaces: dict = {}
        self.claimed: dict = {}
        # key -> (dim, slice width, lo, bytes per step along the dim, the dim's extent): an object
        # whose slices along one dim are memory objects of their own (``claim``'s ``pieces``)
        self.pieced: dict = {}

    def claim(self, region: Region, key, ssa: bool = True, pieces: tuple[int, int] | None = None) -> None:
        """``key`` (a tensor's region) now owns its bytes; its first writes wait for every access
        to what held them. ``ssa``: a tensor written once, in disjoint pieces (``Deps``); else a
        buffer rewritten again and again. ``pieces`` (dim, width): its slices of ``width`` along
        ``dim`` are objects of their own (``key``), each written by its own transfer, so a reader
        waits for the slice it reads, not the whole tensor."""
        lo = region.base
        space = self.spaces.setdefault((region.mem, region.index), Space())
        old = [k for o in [*space.assign(lo, lo + align(region.nbytes), key), key] for k in self.objects(o)]
        self.claimed[key] = (region.mem, region.index, lo, lo + align(region.nbytes))
        self.pieced.pop(key, None)
        if pieces is not None:
            dim, width = pieces
            self.pieced[key] = (dim, width, lo, isa.DTYPES[region.dtype] * row_major(region.extents)[dim],
                                region.extents[dim])
        for k in self.objects(key):
            self.deps.inherit(k, old, ssa)

    def objects(self, key) -> list:
        """The memory objects of ``key``: itself, or its pieces (``claim``)."""
        piece = self.pieced.get(key)
        return [key] if piece is None else [(PIECE, key, j) for j in range(-(-piece[4] // piece[1]))]

    def owner(self, region: Region):
        """The key of the object owning all of ``region``'s bytes, or None."""
        space = self.spaces.get((region.mem, region.index))
        return space and space.whole_owner(region.base, region.base + region.nbytes)

    def written_again(self, key) -> None:
        """``key``'s objects are no longer written once: a write of them waits for the other
        units' writes too (``Deps``)."""
        for k in self.objects(key):
            self.deps.ssa.discard(k)

    def key(self, o: isa.Operand, ins=None):
        """The memory object an operand of ``ins`` touches: a tensor's region, a tile buffer copy,
        scratch; of a tensor in pieces (``claim``), the piece of the transfer box's last element
        (one unit writes the pieces in order, so waiting for it waits for those before; any other
        instruction waits for the last piece)."""
        space = self.spaces.get((o.mem, o.index))
        key = space.owner(o.offset) if space else None
        if key is None:
            raise CodegenError(f"{o.mem}[{o.index}] offset {o.offset} belongs to no buffer")
        piece = self.pieced.get(key)
        if piece is None:
            return key
        _, width, lo, step, extent = piece
        if not isinstance(ins, isa.Dma):
            return PIECE, key, -(-extent // width) - 1
        last = o.offset + isa.DTYPES[o.dtype] * sum((n - 1) * st for n, st in zip(ins.shape, o.strides))
        return PIECE, key, (last - lo) // step % extent // width
