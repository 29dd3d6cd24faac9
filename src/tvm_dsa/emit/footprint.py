"""What each tile of a lowered layer reads and writes: the box of every tensor, from the kernel IR's
integer access patterns over the tile's chunk loops (the stitched kernels' instances, the tiling
search's load estimates and SET's residency all start from it)."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from tvm_dsa.emit.placement import Layer
from tvm_dsa.kernel.ir import Loop

Boxes = tuple[np.ndarray, np.ndarray]  # low and high corners, one row per tile


@dataclass(frozen=True)
class Footprint:
    """Per tile (``tiles``: tile-loop values, row order of the arrays): the box of the output it
    writes, the box of every parameter it reads, the tile's work (loop iterations of its
    stages) and its loads: each read from outside the LB as (param, box shape, times per tile:
    the iterations of the chunk loops around it). ``cut``: per param, per tile, where the
    tensor's start or end cut its box (the low corners, then the high; a window's padding).
    ``relative``: per tile, where each stage's LB operand sits in its buffer (its corner less the
    corner the buffer's writer gave it, the chunk loops at 0): two tiles whose boxes translate
    run one program moved only if these agree. A layer norm's tile of one row loads the whole
    sample and reads its own row of it: the rows' tiles load alike and read apart."""

    tiles: list[tuple[int, ...]]
    write: Boxes
    reads: dict  # param -> Boxes
    work: int  # per tile
    loads: tuple  # (param, shape, count) per tile
    cut: dict  # param -> bool array, tiles x 2 dims
    relative: np.ndarray  # tiles x (the dims of every LB operand)


def footprints(layer: Layer) -> Footprint:
    """Evaluated for all tiles at once: the access patterns are integer expressions of the loop
    slots, so they apply to arrays of slot values as well as to single values."""
    ir = layer.ir
    shapes = {name: shape for name, shape, _ in ir.params}
    out = ir.params[-1][0]
    tile_loops = ir.tile_loops()
    accesses, work = [], 0  # (param, access, is_write, stage, enclosing chunk loops)
    on_chip, writer = [], {}  # (LB operand, stage); LB buffer -> (the access, stage) its writer starts

    def walk(nodes, chunks):
        nonlocal work
        for n in nodes:
            if isinstance(n, Loop):
                walk(n.body, chunks + [(n.slot, n.extent)])
                continue
            work += math.prod(n.shape) * math.prod(e for _, e in chunks)
            for acc, w in [(n.dst, True)] + [(a, False) for a in n.reads()]:
                if not acc.lb and (acc.buffer == out or not w):
                    accesses.append((acc.buffer, acc, w, n, chunks))
                elif acc.lb:
                    on_chip.append((acc, n))
                    if w and layer.plan.buffers[acc.buffer].writer == n.name:
                        writer.setdefault(acc.buffer, (acc, n))

    walk(tile_loops[-1].body, [])
    grid = np.indices([lp.extent for lp in tile_loops]).reshape(len(tile_loops), -1)
    count = grid.shape[1]
    env: list = [0] * ir.slots
    for lp, values in zip(tile_loops, grid):
        env[lp.slot] = values
    boxes: dict = {}  # (param, is_write) -> Boxes
    cut: dict = {}  # param -> tiles x 2 dims: where the tensor's edges cut a box
    for name, acc, is_write, stage, chunks in accesses:
        ext = np.asarray(acc.extents(stage.shape), dtype=np.int64)
        limit = np.asarray(shapes[name], dtype=np.int64).reshape(-1, 1)
        for corner in itertools.product(*((0, e - 1) for _, e in chunks)):
            for (slot, _), v in zip(chunks, corner):
                env[slot] = v
            low = np.array([np.broadcast_to(x, (count,)) for x in acc.low_corner(env, stage.shape)],
                           dtype=np.int64).reshape(len(acc.const), count)
            high = np.minimum(low + ext.reshape(-1, 1), limit)
            edges = np.concatenate([low < 0, high < low + ext.reshape(-1, 1)]).T
            cut[name] = edges if name not in cut else cut[name] | edges
            low = np.maximum(low, 0)
            if stage.guard:  # tiles the stage skips: an empty box (high < low) that unions ignore
                skip = ~np.broadcast_to(np.logical_and.reduce([b.holds(env) for b in stage.guard]), (count,))
                low, high = np.where(skip, limit, low), np.where(skip, 0, high)
            box = (low.T, high.T)
            old = boxes.get((name, is_write))
            boxes[(name, is_write)] = box if old is None else (np.minimum(old[0], box[0]), np.maximum(old[1], box[1]))
    tile_slots = {lp.slot for lp in tile_loops}
    env = [v if slot in tile_slots else 0 for slot, v in enumerate(env)]  # the loops in a tile at 0
    relative = []
    for acc, st in on_chip:
        if acc.buffer in writer:
            origin, by = writer[acc.buffer]
            relative += [np.broadcast_to(np.asarray(a) - np.asarray(o), (count,))
                         for a, o in zip(acc.low_corner(env, st.shape), origin.low_corner(env, by.shape))]
    tiles = [tuple(t) for t in grid.T.tolist()]
    loads = tuple((name, tuple(acc.extents(stage.shape)), math.prod(e for _, e in chunks))
                  for name, acc, is_write, stage, chunks in accesses if not is_write)
    return Footprint(tiles, boxes[(out, True)], {n: b for (n, w), b in boxes.items() if not w}, work, loads, cut,
                     np.array(relative, dtype=np.int64).reshape(len(relative), count).T)
