"""StripEpilogue: run the stages after a contraction's chunk loop (its epilogue: bias, activation,
residual, the write-back) in strips of the tile's rows, one strip after another.

The epilogue's temporaries then hold a strip, not the tile. A GELU keeps two float32 places of the
tile's size (48 KB of a 64 KB LB for BERT's 64 x 96 FFN tiles), which left room for chunks of 16
only: two transfer set-ups per chunk were a third of the chunk loop's time. In strips, the LB has
room for chunks twice as deep, double-buffered. The strip loop is annotated
``dsa.loop = "strip"``; the epilogue's loads (a bias, a residual) stay at the tile level, loaded
once per tile.
"""

from __future__ import annotations

from tvm import s_tir

from tvm_dsa.kernel.analysis import (
    Unsupported, classify, int_value, sch_annotate, sch_compute_at, sch_get, sch_loops, sch_reorder, sch_split
)
from tvm_dsa.tir_passes.tile import leaf_blocks
from tvm_dsa.kernel.attrs import STRIP



def strip_epilogue(sch: s_tir.Schedule, strips: int) -> s_tir.Schedule:
    """Split the write-back's first loop longer than 1 into ``strips`` strips (the outer loop
    first under the tile loop) and move the vector stages it reads from, back to the chunk loop,
    under the strip loop. Raises ``Unsupported`` where the kernel has no such epilogue or the
    strips do not divide the loop."""
    if strips == 1:
        return sch
    blocks = leaf_blocks(sch)
    kinds = [[sch_get(sch, lp).annotations.get("dsa.loop") for lp in sch_loops(sch, b)] for b in blocks]
    store = blocks[-1]
    if "chunk" in kinds[-1] or classify(sch_get(sch, store)).kind != "copy":
        raise Unsupported("no write-back after the chunk loop to run in strips")
    loops = sch_loops(sch, store)
    own = loops[max(i for i, k in enumerate(kinds[-1]) if k is not None) + 1:]
    rows = next((lp for lp in own if int_value(sch_get(sch, lp).extent) > 1), None)
    extent = rows is not None and int_value(sch_get(sch, rows).extent)
    if not extent or extent % strips:
        raise Unsupported(f"{strips} strips do not divide the write-back's rows ({extent})")
    outer, _ = sch_split(sch, rows, [strips, extent // strips])
    sch_reorder(sch, outer, *own[:own.index(rows)])
    for b, k in zip(reversed(blocks[:-1]), reversed(kinds[:-1])):
        if "chunk" in k:
            break
        if classify(sch_get(sch, b)).kind != "vector":
            continue
        try:
            sch_compute_at(sch, b, outer, preserve_unit_loops=True)
        except s_tir.ScheduleError:
            break  # a stage read outside the strips: it and those before it stay whole
    sch_annotate(sch, outer, "dsa.loop", STRIP)
    return sch
