"""Inter-layer schedulers: decide which kernels run on the DSA, where, and with which scopes.

A scheduler ``(mod, hw, supported, options) -> [KernelSpec]`` returns data, not TIR; kernel
generation consumes it. ``supported`` names the PrimFuncs the DSA can run (the rest stay on the
host); ``options`` are the pipeline's (``set``: ``SetOptions``; the others ignore them). ``layerwise``
is the baseline GraphTurbo calls "TVM": one kernel per fused group from TVM's own fusion rules
(``FuseOps``), inputs and outputs in DDR. ``graph`` holds what the coarser schedulers work on: the
layer graph of a fused module and its partition into sub-graphs with GraphTurbo's merge patterns.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KernelSpec:
    """One DSA kernel: the ``call_tir`` calls it runs (by the Relax variables they bind, in
    program order) and how kernel generation treats them.

    ``stitched`` kernels run their layers instance by instance with the tensors between layers on
    chip and weights promoted to the GB (GraphTurbo); others run one layer with every tensor in DDR.
    ``split`` is Algorithm 1's best split (output dimension, factor) for the instances; ``plan`` a
    scheduler's own decisions that kernel generation lowers (``set``: a ``SetPlan``)."""

    name: str
    calls: tuple[str, ...]
    stitched: bool = False
    split: tuple[int, int] | None = None
    plan: object = None


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


from tvm_dsa.schedule import graphturbo, layerwise  # noqa: E402,F401  (register "graphturbo", "layerwise")
from tvm_dsa.schedule.set import scheduler  # noqa: E402,F401  (registers "set")
