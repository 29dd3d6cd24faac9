"""AssignScopes: put every buffer a tile touches in its DSA memory, as TVM storage scopes.

Function parameters stay in DDR (``global``). Intermediate buffers of the kernel go to the local
buffer (``local.dsa_lb``). Compute stages (MME, vector, reduce) may only touch the LB, so their DDR
inputs get an LB copy (``cache_read``; one per stage with ``COPY_EACH``) loaded under the same tile/chunk loop, and their DDR outputs
an LB staging buffer written back after them (``cache_write``), once per tile (after the chunk
loop of a contraction). With ``resident`` a parameter read under a chunk loop alike in every tile
(a weight where the tiles split only rows) is copied whole under the tile loop instead: the
emitter loads it into the core's LB once (its tiles find it there), where a chunk's copy is
loaded again for every chunk of every tile, each a DMA set-up for a few hundred bytes.
Reductions are split into an init stage (a fill) and an update stage, the init placed before
the chunk loop for the anchor so partial sums accumulate across chunks (a contraction fused
before the anchor sums within a chunk: its init goes inside).
"""

from __future__ import annotations

import tvm_ffi
from tvm import s_tir
from tvm.ir.expr import Var
from tvm.s_tir import SBlockRealize

from tvm_dsa.kernel.analysis import (
    REDUCE_ITER, Unsupported, classify, sch_cache_read, sch_cache_write, sch_compute_at, sch_decompose_reduction,
    sch_get, sch_get_sblock, sch_loops, sch_reverse_compute_at, sch_set_scope
)
from tvm_dsa.tir_passes.tile import leaf_blocks
from tvm_dsa.kernel.attrs import COPY_EACH, LB_SCOPE



def read_twice(func) -> bool:
    """Whether two blocks of ``func`` read one of its parameters (where ``COPY_EACH`` may matter)."""
    readers: dict = {}

    def visit(realize):
        for region in realize.block.reads:
            if any(region.source.same_as(p) for p in func.params):
                readers.setdefault(region.source, set()).add(realize.block.name_hint)

    tvm_ffi.structural_walk(func.body, [(SBlockRealize, visit)])
    return any(len(blocks) > 1 for blocks in readers.values())


def attach_index(sch, block_rv) -> int:
    """Index (in ``get_loops``) of the innermost tile/chunk loop enclosing the block."""
    loops = sch_loops(sch, block_rv)
    marked = [i for i, lp in enumerate(loops) if "dsa.loop" in sch_get(sch, lp).annotations]
    if not marked:
        raise Unsupported(f"block {sch_get(sch, block_rv).name_hint} is not under a tile loop")
    return marked[-1]


def _tile_loop(sch, block_rv):
    """The innermost tile loop enclosing the block: a contraction's result is final after its last
    chunk, so it is written back once per tile, not after every chunk (DenseNet-121's bare 1x1
    convolutions stored their partial sums 32 times a tile)."""
    loops = sch_loops(sch, block_rv)
    tiles = [lp for lp in loops if sch_get(sch, lp).annotations.get("dsa.loop") == "tile"]
    if not tiles:
        raise Unsupported(f"block {sch_get(sch, block_rv).name_hint} is not under a tile loop")
    return tiles[-1]


def _bindings(sch, block_rv) -> dict:
    """The block's iterators -> the loop expressions its realize binds them to."""
    block, realize = sch_get(sch, block_rv), []
    tvm_ffi.structural_walk(sch_get(sch, sch_loops(sch, block_rv)[0]),
                            [(SBlockRealize, lambda r: realize.append(r) if r.block.same_as(block) else None)])
    return dict(zip([it.var for it in block.iter_vars], realize[0].iter_values))


def _uses(exprs, loop_vars) -> bool:
    """Whether any of ``exprs`` uses one of ``loop_vars``."""
    found = []
    for e in exprs:
        tvm_ffi.structural_walk(e, [(Var, lambda v: found.append(v) if any(v.same_as(x) for x in loop_vars) else None)])
    return bool(found)


def _reduces_over(sch, block_rv, loop_rv) -> bool:
    """Whether a reduce iterator of the block is bound to ``loop_rv`` (the anchor's chunk loop): a
    contraction computed under another's chunk loop (a producer fused into it) sums over loops of
    its own, and its zero fill goes inside the chunk, before them."""
    bound = _bindings(sch, block_rv)
    reduced = [bound[it.var] for it in sch_get(sch, block_rv).iter_vars if int(it.iter_type) == REDUCE_ITER]
    return _uses(reduced, [sch_get(sch, loop_rv).loop_var])


def _is_param(buf, params) -> bool:
    return any(buf.same_as(p) for p in params)


def _tile_invariant(sch, block_rv, buf) -> bool:
    """Whether the block reads the same region of ``buf`` in every tile: no tile loop's variable
    in the indices of its reads of it."""
    tiles = [sch_get(sch, lp).loop_var for lp in sch_loops(sch, block_rv)
             if sch_get(sch, lp).annotations.get("dsa.loop") == "tile"]
    bound, starts = _bindings(sch, block_rv), []
    for region in sch_get(sch, block_rv).reads:
        if region.source.same_as(buf):
            for r in region.region:
                tvm_ffi.structural_walk(r.min, [(Var, lambda v: starts.append(bound.get(v, v)))])
    return not _uses(starts, tiles)


def assign_scopes(sch: s_tir.Schedule, resident: bool = False) -> s_tir.Schedule:
    params = list(sch.mod["main"].params)
    attrs = sch.mod["main"].attrs
    each = attrs is not None and bool(attrs.get(COPY_EACH, False))
    root_allocs = list(sch_get(sch, sch_get_sblock(sch, "root")).alloc_buffers)
    for block_rv in leaf_blocks(sch):
        block = sch_get(sch, block_rv)
        write = block.writes[0].source
        if any(write.same_as(b) for b in root_allocs):
            sch_set_scope(sch, block_rv, 0, LB_SCOPE)
    for block_rv in leaf_blocks(sch):
        block = sch_get(sch, block_rv)
        kind = classify(block).kind
        if kind == "copy":
            continue
        loop = sch_loops(sch, block_rv)[attach_index(sch, block_rv)]
        names = [r.source for r in block.reads]
        for buf in names:
            if not _is_param(buf, params):
                continue
            i = [j for j, r in enumerate(sch_get(sch, block_rv).reads) if r.source.same_as(buf)][0]
            cache = sch_cache_read(sch, block_rv, i, LB_SCOPE, [block_rv] if each else None)
            whole = resident and sch_get(sch, loop).annotations["dsa.loop"] == "chunk" and \
                _tile_invariant(sch, block_rv, buf)
            sch_compute_at(sch, cache, _tile_loop(sch, block_rv) if whole else loop, preserve_unit_loops=True)
        if _is_param(sch_get(sch, block_rv).writes[0].source, params):
            cache = sch_cache_write(sch, block_rv, 0, LB_SCOPE)
            sch_reverse_compute_at(sch, cache, _tile_loop(sch, block_rv), preserve_unit_loops=True)
    for block_rv in leaf_blocks(sch):
        block = sch_get(sch, block_rv)
        if block.init is None:
            continue
        loops = sch_loops(sch, block_rv)
        at = attach_index(sch, block_rv)
        if sch_get(sch, loops[at]).annotations["dsa.loop"] == "chunk" and _reduces_over(sch, block_rv, loops[at]):
            sch_decompose_reduction(sch, block_rv, loops[at])
        elif at + 1 < len(loops):
            sch_decompose_reduction(sch, block_rv, loops[at + 1])
        else:
            raise Unsupported(f"reduction {block.name_hint} has no loop of its own")
    return sch
