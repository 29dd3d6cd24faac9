"""TIR passes that make a kernel fit the DSA (TIR -> TIR), and ``lower_with_plan``, which chains them
for one tiling plan (the tiling search, ``tvm_dsa.tiling``, chooses the plan).

    TileForLB    tile around the anchor so a tile's working set fits the LB   (tile.py)
    AssignScopes DDR / LB storage scopes, LB copies of compute operands      (scopes.py)
    StripEpilogue  a contraction's epilogue in strips of the tile's rows        (strip.py)
    LowerToDSA   mark each stage as one DSA operation                         (lower.py)
    ClampTiles   a tile that does not divide its extent: the last one moved back (clamp.py)
"""

from __future__ import annotations

import dataclasses
import functools
import json

import tvm
from tvm import s_tir

from tvm_dsa.tir_passes.clamp import clamp_tiles
from tvm_dsa.tir_passes.lower import lower_to_dsa
from tvm_dsa.tir_passes.scopes import assign_scopes
from tvm_dsa.tir_passes.strip import strip_epilogue
from tvm_dsa.tir_passes.tile import TilePlan, tile_schedule


def _as_pass(name: str, fn):
    def transform(func, _mod, _ctx):
        return fn(func)

    return tvm.tirx.transform.prim_func_pass(transform, opt_level=0, name=name)


def TileForLB(plan: TilePlan):  # noqa: N802 - TVM pass naming
    """Pass: tile every PrimFunc of the module with ``plan``."""
    return _as_pass("dsa.TileForLB", lambda f: tile_schedule(f, plan).mod["main"])


def AssignScopes():  # noqa: N802
    return _as_pass("dsa.AssignScopes", lambda f: assign_scopes(s_tir.Schedule(f)).mod["main"])


def StripEpilogue(strips: int):  # noqa: N802
    return _as_pass("dsa.StripEpilogue", lambda f: strip_epilogue(s_tir.Schedule(f), strips).mod["main"])


def LowerToDSA():  # noqa: N802
    return _as_pass("dsa.LowerToDSA", lambda f: lower_to_dsa(s_tir.Schedule(f)).mod["main"])


def ClampTiles():  # noqa: N802
    return _as_pass("dsa.ClampTiles", clamp_tiles)


PLAN_ATTR = "dsa.tile_plan"  # a lowered PrimFunc's plan (``plan_of``)


@functools.lru_cache(maxsize=1024)
def lower_with_plan(func, plan: TilePlan):
    """TileForLB -> AssignScopes -> StripEpilogue -> LowerToDSA -> ClampTiles on one PrimFunc,
    which records its plan (``plan_of``). Cached per function object and plan: the searches for
    the whole LB and for a share of it try many of the same plans."""
    sch = tile_schedule(func, plan)
    assign_scopes(sch, plan.resident)
    strip_epilogue(sch, plan.strips)
    lower_to_dsa(sch)
    return clamp_tiles(sch.mod["main"]).with_attr(PLAN_ATTR, json.dumps(dataclasses.asdict(plan)))


def plan_of(lowered) -> TilePlan | None:
    """The plan ``lower_with_plan`` lowered a PrimFunc with (None for one lowered otherwise)."""
    fields = lowered.attrs.get(PLAN_ATTR) if lowered.attrs is not None else None
    if fields is None:
        return None
    plan = json.loads(str(fields))
    return TilePlan(**{**plan, "tiles": tuple(plan["tiles"])})
