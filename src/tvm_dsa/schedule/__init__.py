"""Inter-layer schedulers: decide which kernels run on the DSA, where, and with which scopes.

A scheduler returns data (``KernelSpec``s), not TIR; kernel generation consumes it. ``layerwise``
is the baseline GraphTurbo calls "TVM": one kernel per fused group from TVM's own fusion rules
(``FuseOps``), inputs and outputs in DDR. ``graph`` holds what the coarser schedulers work on: the
layer graph of a fused module and its partition into sub-graphs with GraphTurbo's merge patterns.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KernelSpec:
    """One DSA kernel: the PrimFunc it runs and where its tensors live."""

    name: str  # global symbol of the fused PrimFunc
    arg_scopes: tuple[str, ...]  # "ddr" | "gb" | "lb" per PrimFunc parameter
    order: int


SCHEDULERS = {}


def register(name: str):
    def wrap(fn):
        SCHEDULERS[name] = fn
        return fn

    return wrap


def get(name: str):
    if name not in SCHEDULERS:
        raise ValueError(f"unknown schedule {name!r}; known: {sorted(SCHEDULERS)}")
    return SCHEDULERS[name]


from . import layerwise  # noqa: E402,F401  (registers "layerwise")
