"""A tensor kept in the GBs split over them in bands: each band of its rows (or samples) in the GB
of the cluster that moves most of those bytes.

Kept whole in one GB (``resident.kept_in_gbs``), a tensor between a launch's kernels crosses that
GB's port for every byte each cluster stores and loads: at batch 1 every cluster computes rows of
every layer, and the one port serves all four clusters' stores at a kernel's end and their loads
at the next one's start. ``banded`` cuts such a tensor along a dim (its rows, or its samples) into
runs of slices, each run placed in the GB of the cluster whose transfers move most of its bytes;
a transfer that reads or writes across two runs is cut there into one per run (its deps and
dependents kept). Each run lies packed in its own place, so a transfer's box maps to one affine
operand in it; a tensor whose transfers do not (a box that a run's cut crosses along two dims, a
named multicast group cut apart) stays whole.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from tvm_dsa.hardware.model import Hardware
from tvm_dsa.isa import Dma, Kernel, Operand, Program, TensorArg
from tvm_dsa.isa.instructions import DTYPES
from tvm_dsa.kernelgen.ahead import gb_place


def banded(program: Program, moves: list, tensors: tuple[TensorArg, ...], spans: list, places: list,
           high: list[int], hw: Hardware) -> tuple[Program, list]:
    """(``program`` (written out, its regions in their GBs) with each region of ``moves`` (lo, hi,
    GB, offset; DDR bytes of one of the run's ``tensors``, kept over kernels ``spans``' (first,
    last)) cut into bands where more of its bytes then move at their own cluster's GB port, the
    GB places taken: ``places`` (first, last, lo, hi, GB) with the bands' instead of the regions'
    they replace). ``high``: per kernel, the GB bytes it uses for itself."""
    cuts: dict[tuple[int, int], list[Dma]] = {}  # (kernel, position) -> the transfers replacing it
    places = list(places)
    for (lo, hi, gb, at), (first, last) in zip(moves, spans):
        tensor = next((t for t in tensors if t.offset <= lo and hi <= t.offset + t.nbytes), None)
        if tensor is None:
            continue
        whole = (first, last, at, at + hi - lo, gb)
        others = [p for p in places if p != whole]
        plan = _plan(program, tensor, lo, hi, gb, at, first, last, others, high, hw)
        if plan is None or cuts.keys() & plan[0].keys():
            continue
        cuts.update(plan[0])
        places = others + plan[1]
    if not cuts:
        return program, places
    kernels = tuple(_split(k, {i: parts for (n, i), parts in cuts.items() if n == kn}) if
                    any(n == kn for n, _ in cuts) else k for kn, k in enumerate(program.kernels))
    return replace(program, kernels=kernels), places


def _shape(tensor: TensorArg, lo: int, hi: int) -> tuple[int, ...] | None:
    """The region ``[lo, hi)`` of ``tensor`` as a box: whole slices of one dim of it (the dims
    before fixed), its shape from that dim on; None where it is not one."""
    size = DTYPES[tensor.dtype]
    if (lo - tensor.offset) % size or (hi - lo) % size:
        return None
    e0, e1 = (lo - tensor.offset) // size, (hi - tensor.offset) // size
    shape = tensor.shape
    for j in range(len(shape)):
        stride = math.prod(shape[j + 1:])
        if e0 % stride == 0 and e1 % stride == 0:
            i0, count = e0 // stride % shape[j], (e1 - e0) // stride
            if i0 + count <= shape[j]:
                return (count, *shape[j + 1:])
    return None


def _elements(o: Operand, shape: tuple[int, ...], at: int) -> np.ndarray:
    """Element positions (from ``at``) that ``o`` covers over ``shape``, in box order."""
    size = o.itemsize
    pos = np.array([(o.offset - at) // size], dtype=np.int64)
    for n, s in zip(shape, o.strides):
        pos = np.add.outer(pos, np.arange(n, dtype=np.int64) * s).ravel()
    return pos.reshape(shape)


def _plan(program: Program, tensor: TensorArg, lo: int, hi: int, gb: int, at: int, first: int, last: int,
          places: list, high: list[int], hw: Hardware):
    """(the transfers replacing each cut or moved one, the bands' places) for the region, or None
    where no cut moves more of its bytes at their own port."""
    shape = _shape(tensor, lo, hi)
    size = DTYPES[tensor.dtype]
    if shape is None or len(shape) < 3 or (at % size):
        return None
    cpc = hw.cores_per_cluster
    accesses = []  # (kernel, position, side, element positions, cluster)
    for kn in range(first, last + 1):
        for i, x in enumerate(program.kernels[kn].instructions):
            if type(x) is not Dma:
                continue
            for side in ("src", "dst"):
                o = getattr(x, side)
                if o.mem != "gb" or o.index != gb:
                    continue
                a, b = o.extent_bytes(x.shape)
                if b <= at or at + hi - lo <= a:
                    continue
                if a < at or at + hi - lo < b or (a - at) % size or o.itemsize != size:
                    return None
                other = x.dst if side == "src" else x.src
                cluster = other.index if other.mem == "gb" else x.core // cpc
                accesses.append((kn, i, side, _elements(o, x.shape, at), cluster))
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    best = None
    for d in dict.fromkeys((0, len(shape) - 2)):
        if shape[d] < 2:
            continue
        votes = np.zeros((shape[d], hw.clusters), dtype=np.int64)
        for *_, pos, cluster in accesses:
            votes[:, cluster] += np.bincount((pos // strides[d] % shape[d]).ravel(), minlength=shape[d])
        owner = votes.argmax(axis=1)
        local = int(votes[np.arange(shape[d]), owner].sum())
        if best is None or local > best[0]:
            best = (local, d, owner)
    if best is None or best[0] <= sum(int((c == gb) * p.size) for *_, p, c in accesses):
        return None
    _, d, owner = best
    runs: list[list[int]] = []  # [first slice, end, cluster] per band
    for s, c in enumerate(owner.tolist()):
        if runs and runs[-1][2] == c:
            runs[-1][1] = s + 1
        else:
            runs.append([s, s + 1, c])
    taken = []
    for s, e, c in runs:
        nbytes = (e - s) * math.prod(shape) // shape[d] * size
        where = gb_place(nbytes, max(high[first:last + 1]), first, last, places + taken, c, hw.gb_bytes)
        if where is None:
            return None
        taken.append((first, last, where, where + nbytes, c))
    band_of = np.zeros(shape[d], dtype=np.int64)
    for n, (s, e, _) in enumerate(runs):
        band_of[s:e] = n
    out: dict[tuple[int, int], list[Dma]] = {}
    for kn, i, side, pos, _ in accesses:
        x = out.get((kn, i), [program.kernels[kn].instructions[i]])
        if len(x) > 1:
            return None  # both sides in the region: left whole
        parts = _parts(x[0], side, pos, d, shape, strides, runs, band_of, taken, size)
        if parts is None or any(not _reaches(y, cpc) for y in parts):
            return None
        out[(kn, i)] = parts
    return out, taken


def _parts(x: Dma, side: str, pos: np.ndarray, d: int, shape: tuple, strides: list, runs: list,
           band_of: np.ndarray, taken: list, size: int) -> list[Dma] | None:
    """Transfer ``x`` cut where its ``side``'s box (element positions ``pos`` in the region) crosses
    from one band into the next, along one box dim, each part's operand in its band's place (band
    ``n``: slices ``runs[n]`` of dim ``d``, at ``taken[n]``); None where it cannot be."""
    band = band_of[pos // strides[d] % shape[d]]
    along = [k for k in range(band.ndim) if not (band == band.take([0], axis=k)).all()]
    if len(along) > 1 or (along and x.multicast and (x.group or side == "dst")):
        return None
    edges = [0, x.shape[along[0]]] if along else [0, 1]
    if along:
        line = band[tuple(slice(None) if a == along[0] else 0 for a in range(band.ndim))]
        edges[1:1] = [n for n in range(1, len(line)) if line[n] != line[n - 1]]
    own, other = getattr(x, side), x.dst if side == "src" else x.src
    out = []
    for start, end in zip(edges, edges[1:]):
        sel = tuple(slice(start, end) if along and a == along[0] else slice(None) for a in range(pos.ndim))
        p, n = pos[sel], int(band[sel].flat[0])
        s, e, cluster = runs[n]
        coord = p // strides[d] % shape[d]
        rel = (p // (strides[d] * shape[d]) * (e - s) + coord - s) * strides[d] + p % strides[d]
        origin = int(rel.flat[0])
        steps = tuple(int(rel[tuple(1 if b == a else 0 for b in range(rel.ndim))]) - origin if rel.shape[a] > 1
                      else own.strides[a] for a in range(rel.ndim))
        grid = origin + sum(np.arange(m, dtype=np.int64).reshape([-1 if b == a else 1 for b in range(rel.ndim)]) * t
                            for a, (m, t) in enumerate(zip(rel.shape, steps)))
        if not np.array_equal(grid, rel):
            return None  # not one affine box in the band's place
        shift = start * other.strides[along[0]] * other.itemsize if along else 0
        mine = replace(own, index=cluster, offset=taken[n][2] + origin * size, strides=steps)
        out.append(replace(x, shape=p.shape, **{side: mine, ("dst" if side == "src" else "src"):
                                                 replace(other, offset=other.offset + shift)}))
    return out


def _reaches(x: Dma, cores_per_cluster: int) -> bool:
    """Whether a transfer can run as placed: a core's reaches every GB, a cluster DMA its own GB
    (and another's only from or into its own)."""
    if "lb" in (x.src.mem, x.dst.mem):
        return True
    own = x.core // cores_per_cluster
    return any(o.mem == "gb" and o.index == own for o in (x.src, x.dst))


def _split(kernel: Kernel, parts: dict[int, list[Dma]]) -> Kernel:
    """``kernel`` (written out) with each instruction at ``parts`` replaced by its parts in order:
    each part waits for what it waited for, and what waited for it waits for every part."""
    new_of: list[list[int]] = []
    stream: list = []
    for i, ins in enumerate(kernel.instructions):
        mine = parts.get(i, [ins])
        new_of.append(list(range(len(stream), len(stream) + len(mine))))
        stream += mine
    stream = [replace(x, deps=tuple(dict.fromkeys(n for d in x.deps for n in new_of[d]))) if x.deps else x
              for x in stream]
    marks = tuple(replace(m, first=new_of[m.first][0]) if m.first < len(new_of) else m for m in kernel.layers)
    return replace(kernel, instructions=tuple(stream), layers=marks)
