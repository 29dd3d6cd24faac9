"""The ``set`` schedule of the ``dsa`` pipeline: one SET-scheduled program for a module's layers.

``tvm.compile(mod, target="dsa/set-edge16-fp16", relax_pipeline=tvm_dsa.pipeline(schedule="set"))``
builds the layer graph of ``main`` (the batch is the leading dimension of its activation inputs),
finds a resource allocation tree by simulated annealing (or takes the one given in ``SetOptions``)
and hands kernel generation one kernel holding every layer the DSA runs; ``codegen.set_program``
lowers the tree. Pure reshapes between those layers are views inside the program. Layers the DSA
cannot run stay on the host, before or after the program: one between two of its layers is an
error (the program would need the host in its middle).
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import KernelSpec, register
from ..graph import OpGraph
from .analysis import Schedule
from .evaluate import Evaluator
from .layers import LayerGraph
from .search import Anneal, SearchResult, anneal
from .tree import Tree, validate


class SetScheduleError(ValueError):
    """A module the ``set`` schedule cannot run as one program (the message names the layer)."""


@dataclass(frozen=True)
class SetOptions:
    """Choices of the ``set`` schedule: the search's hyper-parameters, or a tree (its text, as
    ``Tree.text`` writes it) to use instead of searching."""

    anneal: Anneal = Anneal(beta=20.0)
    tree: str | None = None


@dataclass(frozen=True)
class SetPlan:
    """What the scheduler decided: the layer graph, the tree's schedule, the search (None for a
    given tree)."""

    graph: LayerGraph
    schedule: Schedule
    search: SearchResult | None


def batch_of(graph: OpGraph) -> int:
    """The batch of ``main``: the leading dimension of its activation inputs (all must agree)."""
    dims = {t.name: t.shape[0] for t in graph.tensors.values()
            if t.producer is None and not t.constant and t.shape}
    if not dims:
        raise SetScheduleError("schedule 'set' needs an activation input with a leading (batch) dimension")
    if len(set(dims.values())) > 1:
        raise SetScheduleError(f"schedule 'set': the inputs disagree on the batch (leading dims {dims})")
    return next(iter(dims.values()))


def program_calls(mod, graph: OpGraph, supported) -> tuple[list, list]:
    """(layers, views): the calls the DSA runs, and the pure reshapes among them that only they
    read (kept as views inside the program). Raises when a host call sits between two layers."""
    from tvm import relax

    on_dsa = {n.index for n in graph.nodes if n.func in supported}
    views = {n.index for n in graph.nodes if n.index not in on_dsa
             and relax.analysis.has_reshape_pattern(mod[n.func])}
    while True:  # a view stays inside when every reader is inside
        inside = on_dsa | views
        outside = {v for v in views if not graph.consumers(v) or not graph.consumers(v) <= inside
                   or graph.nodes[v].output in graph.outputs}
        if not outside:
            break
        views -= outside
    inside = on_dsa | views
    before = set()  # calls downstream of a DSA layer
    for n in graph.nodes:
        if n.index in on_dsa or graph.producers(n.index) & (on_dsa | before):
            before.add(n.index)
    for n in graph.nodes:
        if n.index not in inside and n.index in before and _feeds(graph, n.index, on_dsa):
            raise SetScheduleError(f"schedule 'set' runs the DSA's layers as one program, but {n.name} "
                                   f"({n.func}) runs on the host between them")
    return [graph.nodes[i] for i in sorted(on_dsa)], [graph.nodes[i] for i in sorted(views)]


def _feeds(graph: OpGraph, i: int, targets: set) -> bool:
    stack, seen = list(graph.consumers(i)), set()
    while stack:
        j = stack.pop()
        if j in targets:
            return True
        if j not in seen:
            seen.add(j)
            stack.extend(graph.consumers(j))
    return False


@register("set")
def set_schedule(mod, hw, supported, options: SetOptions | None = None) -> list[KernelSpec]:
    """One kernel of every layer the DSA runs, scheduled by a resource allocation tree."""
    options = options if isinstance(options, SetOptions) else SetOptions()
    graph = OpGraph.from_relax(mod)
    layers, views = program_calls(mod, graph, supported)
    if not layers:
        return []
    calls = {n.name for n in layers + views}
    batch = batch_of(graph)
    lg = LayerGraph.from_relax(mod, batch, frozenset(n.name for n in graph.nodes if n.name not in calls))
    ev = Evaluator(lg, hw)
    if options.tree is not None:
        tree, search = Tree.parse(options.tree, lg), None
        if tree.batch != batch:
            raise SetScheduleError(f"the given tree has batch {tree.batch}, the module {batch}")
        validate(tree, lg, hw.cores)
    else:
        search = anneal(lg, hw, batch, options.anneal, evaluator=ev)
        tree = search.tree
    names = tuple(n.name for n in graph.nodes if n.name in calls)
    return [KernelSpec("set", names, plan=SetPlan(lg, ev.schedule(tree), search))]
