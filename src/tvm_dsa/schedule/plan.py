"""What a scheduler hands kernel generation: ``KernelSpec``s, each with a typed plan.

Kernel generation builds a kernel with the generator for its plan's type, so a plan holds all a
generator reads of the scheduler's decisions: ``LayerPlan`` (one layer, layerwise), ``StitchPlan``
(a GraphTurbo sub-graph), ``TreePlan`` (a SET tree). ``Lowering`` says how a scheduler's layers are
lowered before it is asked for kernels. Schedulers and generators both import this module, and it
imports neither.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from tvm_dsa.hardware import Hardware
    from tvm_dsa.schedule.set.analysis import Schedule
    from tvm_dsa.schedule.set.layers import LayerGraph
    from tvm_dsa.schedule.set.search import SearchResult


@dataclass(frozen=True)
class LayerPlan:
    """One layer, every tensor in DDR: a layerwise kernel, or a layer another plan leaves alone."""


RECOMPUTE_LIMIT = 1.25  # assumed (the seed gives no number): at most 25 % of a stitched kernel's work computed twice


@dataclass(frozen=True)
class StitchPlan:
    """A GraphTurbo sub-graph run instance by instance, the tensors between its layers on chip and
    its weights promoted to the GB: ``split`` is Algorithm 1's best split (output dimension,
    factor) that cuts it into instances; ``rows``: its instances may split a sample's rows over
    the clusters (fewer samples than clusters, and MACs enough to pay for spreading them);
    ``rows_if_faster``: with or without, whichever program runs faster (a piece of a sub-graph
    cut to split rows, which pays its launch either way); ``exchange``: where the rows are split,
    the positions (among its calls) of the layers whose outputs the instances pass each other
    through DDR, each computing its own rows and reading the others' halo rows from there, where
    a window would otherwise make every instance compute its halo again in all the layers before."""

    split: tuple[int, int]
    rows: bool = False
    rows_if_faster: bool = False
    exchange: tuple[int, ...] = ()


@dataclass(frozen=True)
class Rival:
    """A schedule measured against a ``TreePlan``'s own: the best tree of another space's search
    (``scheme``: ``ls`` or ``lp``) and the evaluator's latency for it (cycles)."""

    scheme: str
    schedule: Schedule
    latency: float


@dataclass(frozen=True)
class TreePlan:
    """A SET program: the layer graph (layer ``i`` is the call ``graph.layers[i].node``), the
    tree's schedule (tile groups, batches, chunks, pinned weights) and the search that found the
    tree (None for a given tree). ``rivals``: schedules kernel generation lowers and simulates
    too, keeping the program of least ``E^n * D^m`` (``objective``: ``(n, m)``) in the simulator."""

    graph: LayerGraph
    schedule: Schedule
    search: SearchResult | None
    rivals: tuple[Rival, ...] = ()
    objective: tuple[float, float] = (1, 1)


Plan = LayerPlan | StitchPlan | TreePlan


@dataclass(frozen=True)
class KernelSpec:
    """One DSA kernel: the ``call_tir`` calls it runs (by the Relax variables they bind, in
    program order) and the plan kernel generation builds it with."""

    name: str
    calls: tuple[str, ...]
    plan: Plan = LayerPlan()


@dataclass(frozen=True)
class Lowering:
    """How kernel generation lowers the layers of a scheduler's kernels, before the scheduler hears
    which of them the DSA runs (pure reshapes are never lowered: they stay on the host as views,
    no data moves). ``lb_bytes(hw)``: the bytes of the LB a layer's tiles get, None for all of it; only then are tuning records replayed, as they are tuned for the whole LB. ``clamp``:
    a tile may overlap the end of its loop (``lower_kernel``; False: tiles divide their loops).
    ``separable``: how a depthwise convolution and the pointwise one reading it are timed to
    decide whether they run as one kernel (``kernelgen.blocks``): ``"layer"`` as one-layer
    kernels, ``"stitched"`` as a stitched kernel's layers, ``""`` never fused (SET's layer graph
    models each layer alone)."""

    lb_bytes: Callable[[Hardware], int] | None = None
    clamp: bool = True
    separable: str = "layer"
