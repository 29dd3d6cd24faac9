"""ClampTiles: tiles that overlap instead of a partial last tile.

``tile_schedule`` may split a spatial loop of extent E by a tile T that does not divide it (a
prime extent such as ViT's 197 tokens has no tile between 1 and E); TVM then guards the last
tile's rows past E with block predicates, and the tile loop is annotated ``dsa.clamp = (T, E)``.
This pass moves the last tile back so that it ends at E: every block's binding of the tile's
origin t·T becomes min(t·T, E − T), and the predicates that then always hold are dropped. Every
tile keeps the one shape the codegen needs; the last tile recomputes the rows it shares with the
one before (197 in tiles of 66: one row of 198). Those rows are written twice with the same
values, so a kernel whose stage adds into a tensor outside the LB cannot be clamped.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx

from tvm_dsa.kernel.analysis import Unsupported, expr_dtype, linear_form, uses_var
from tvm_dsa.kernel.attrs import LB_SCOPE
from tvm_dsa.kernel.attrs import CLAMP

SBlockRealize = tvm.s_tir.stmt.SBlockRealize


def clamp_tiles(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` (lowered: tile loops annotated) with each ``dsa.clamp`` tile loop's last tile moved
    back to end at the loop's extent. Raises ``Unsupported`` where a block adds into a tensor
    outside the LB, or binds a clamped tile loop in an index that is not affine."""
    clamps, extents = {}, {}

    def visit(loop):
        extents[loop.loop_var] = loop.extent
        if CLAMP in loop.annotations:
            tile, extent = (int(x) for x in loop.annotations[CLAMP])
            clamps[loop.loop_var] = (tile, extent)

    tvm_ffi.structural_walk(func.body, [(tirx.For, visit)])
    if not clamps:
        return func
    analyzer = tvm.sym.Analyzer()
    for var, extent in extents.items():
        analyzer.bind(var, tvm.ir.Range(0, extent))

    def const(var, value):
        return tirx.IntImm(expr_dtype(var), value)

    def origin(var):
        tile, extent = clamps[var]
        return tirx.Min(var * const(var, tile), const(var, extent - tile))

    def clamped(expr):
        """``expr`` with every c·t of a clamped tile loop t as (c / T)·min(t·T, E − T)."""
        try:
            coeffs, _ = linear_form(expr, set(extents))
        except Unsupported:
            if any(uses_var(expr, var) for var in clamps):
                raise Unsupported(f"index {expr} of a clamped tile loop is not affine") from None
            return expr
        for var, c in coeffs.items():
            if var in clamps:
                tile = clamps[var][0]
                if c % tile:
                    raise Unsupported(f"index {expr} moves by {c} per tile of {tile}")
                expr = expr - var * const(var, c) + origin(var) * const(var, c // tile)
        return expr

    def compare(cmp):
        return type(cmp)(clamped(cmp.a), clamped(cmp.b))

    def rewrite(realize):
        block = realize.block
        read = {r.source for r in block.reads}
        for w in block.writes:
            if w.source.scope() != LB_SCOPE and w.source in read:
                raise Unsupported(f"stage {block.name_hint} adds into {w.source.name}: "
                                  "overlapping tiles would add twice")
        values = [clamped(v) for v in realize.iter_values]
        comparisons = (tirx.LT, tirx.LE, tirx.GT, tirx.GE, tirx.EQ)
        predicate = tvm_ffi.structural_map(realize.predicate, [(comparisons, compare)])
        return SBlockRealize(values, analyzer.simplify(predicate), block)

    return func.with_body(tvm_ffi.structural_map(func.body, [(SBlockRealize, rewrite)]))

