"""Inter-layer schedulers: decide which kernels run on the DSA, where, and with which scopes.

A scheduler ``(mod, hw, supported, options) -> [KernelSpec]`` returns data, not TIR: kernels, each
with a typed plan (``schedule.plan``) that kernel generation builds it from. ``supported`` names
the PrimFuncs the DSA can run (the rest stay on the host), lowered as the scheduler's ``Lowering``
says; ``options`` are the pipeline's (``set``: ``SetOptions``; the others ignore them).
``layerwise`` is the baseline GraphTurbo calls "TVM": one kernel per fused group from TVM's own
fusion rules (``FuseOps``), inputs and outputs in DDR. ``graph`` holds what the coarser schedulers
work on: the layer graph of a fused module and its partition into sub-graphs with GraphTurbo's
merge patterns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from tvm_dsa.schedule.plan import Lowering


@dataclass(frozen=True)
class Scheduler:
    """A registered scheduler: the function giving a module's ``KernelSpec``s, how its layers are
    lowered before it is asked, and whether its consecutive kernels are launched together
    (``kernelgen.launch``; not the baseline's, one launch per fused group)."""

    schedule: Callable
    lowering: Lowering
    launch_together: bool = True


SCHEDULERS: dict[str, Scheduler] = {}


def register(name: str, lowering: Lowering = Lowering(), launch_together: bool = True):
    def wrap(fn):
        SCHEDULERS[name] = Scheduler(fn, lowering, launch_together)
        return fn

    return wrap


def get(name: str) -> Scheduler:
    if name not in SCHEDULERS:
        raise ValueError(f"unknown schedule {name!r}; known: {sorted(SCHEDULERS)}")
    return SCHEDULERS[name]


from tvm_dsa.schedule import graphturbo, layerwise  # noqa: E402,F401  (register "graphturbo", "layerwise")
from tvm_dsa.schedule.set import scheduler  # noqa: E402,F401  (registers "set")
