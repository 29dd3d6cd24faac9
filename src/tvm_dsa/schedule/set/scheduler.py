"""The ``set`` schedule of the ``dsa`` pipeline: one SET-scheduled program for a module's layers.

``tvm.compile(mod, target="dsa/set-edge16-fp16", relax_pipeline=tvm_dsa.pipeline(schedule="set"))``
builds the layer graph of ``main`` (the batch is the leading dimension of its activation inputs),
finds a resource allocation tree by simulated annealing (or takes the one given in ``SetOptions``)
and hands kernel generation a kernel holding the layers the DSA runs; ``kernelgen.tree``
lowers the tree. The search's best LS and LP trees go with it as rivals: kernel generation
simulates the programs of the three (``search.Finalist``) and keeps the one of least cost. Pure
reshapes between those layers are views inside the program. Layers the DSA cannot run stay on the
host; where one sits between layers, the layers after it form another program with a tree of its
own (``program_groups``).
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm_dsa.schedule import register
from tvm_dsa.schedule.graph import OpGraph
from tvm_dsa.schedule.plan import KernelSpec, Lowering, Rival, TreePlan
from tvm_dsa.schedule.set.evaluate import Evaluator
from tvm_dsa.schedule.set.intra import working_set_bytes
from tvm_dsa.schedule.set.layers import LayerGraph
from tvm_dsa.schedule.set.search import OBJECTIVES, Anneal, SearchResult, anneal
from tvm_dsa.schedule.set.tree import Tree, validate


class SetScheduleError(ValueError):
    """A module the ``set`` schedule cannot run as one program (the message names the layer)."""


@dataclass(frozen=True)
class SetOptions:
    """Choices of the ``set`` schedule: the search's hyper-parameters, or a tree (its text, as
    ``Tree.text`` writes it) to use instead of searching."""

    anneal: Anneal = Anneal(beta=20.0)
    tree: str | None = None


def batch_of(graph: OpGraph) -> int:
    """The batch of ``main``: the leading dimension of its activation inputs (all must agree)."""
    dims = {t.name: t.shape[0] for t in graph.tensors.values()
            if t.producer is None and not t.constant and t.shape}
    if not dims:
        raise SetScheduleError("schedule 'set' needs an activation input with a leading (batch) dimension")
    if len(set(dims.values())) > 1:
        raise SetScheduleError(f"schedule 'set': the inputs disagree on the batch (leading dims {dims})")
    return next(iter(dims.values()))


def program_groups(mod, graph: OpGraph, supported) -> list[list]:
    """The calls of each SET program: the layers the DSA runs, split where a host call sits between
    them (group ``d`` holds the layers ``d`` host calls downstream of the inputs, so the programs and
    the host calls form a DAG), with the pure reshapes only their group reads (views inside the
    program). In program order."""
    from tvm import relax

    on_dsa = {n.index for n in graph.nodes if n.func in supported}
    views = {n.index for n in graph.nodes if n.index not in on_dsa
             and relax.analysis.has_reshape_pattern(mod[n.func])}
    while True:
        depth: dict = {}
        for n in graph.nodes:
            depth[n.index] = max((depth[p] + (p not in on_dsa and p not in views) for p in graph.producers(n.index)),
                                 default=0)
        inside = on_dsa | views
        leave = {v for v in views if not graph.consumers(v) or graph.nodes[v].output in graph.outputs
                 or any(c not in inside or depth[c] != depth[v] for c in graph.consumers(v))}
        if not leave:
            break
        views -= leave
    groups: dict = {}
    for n in graph.nodes:
        if n.index in on_dsa or n.index in views:
            groups.setdefault(depth[n.index], []).append(n)
    return [g for _, g in sorted(groups.items()) if any(n.index in on_dsa for n in g)]


# SET's layers are tiled to half the LB (the other half keeps data between layers), with tiles that
# divide their loops. A tuning record is tuned for the whole LB: replayed there, one took SET's
# ResNet-50 tree on set-edge16 from 2.9M to 5.9M simulated cycles, so SET replays none
@register("set", Lowering(lb_bytes=working_set_bytes, clamp=False, separable=""))
def set_schedule(mod, hw, supported, options: SetOptions | None = None) -> list[KernelSpec]:
    """One kernel per group of ``program_groups``, each scheduled by a resource allocation tree."""
    options = options if isinstance(options, SetOptions) else SetOptions()
    graph = OpGraph.from_relax(mod)
    groups = program_groups(mod, graph, supported)
    if options.tree is not None and len(groups) > 1:
        raise SetScheduleError(f"a given tree schedules one program, but host calls split the layers into "
                               f"{len(groups)}")
    batch = batch_of(graph) if groups else 1
    specs = []
    for k, nodes in enumerate(groups):
        names = {n.name for n in nodes}
        lg = LayerGraph.from_relax(mod, batch, frozenset(n.name for n in graph.nodes if n.name not in names))
        ev = Evaluator(lg, hw)
        if options.tree is not None:
            tree, search = Tree.parse(options.tree, lg), None
            if tree.batch != batch:
                raise SetScheduleError(f"the given tree has batch {tree.batch}, the module {batch}")
            validate(tree, lg, hw.cores)
        else:
            search = anneal(lg, hw, batch, options.anneal, evaluator=ev)
            tree = search.tree
        plan = TreePlan(lg, ev.schedule(tree), search, _rivals(search, lg, ev), OBJECTIVES[options.anneal.objective])
        specs.append(KernelSpec(f"set{k}", tuple(n.name for n in nodes), plan))
    return specs


def _rivals(search: SearchResult | None, lg: LayerGraph, ev: Evaluator) -> tuple[Rival, ...]:
    """The search's other finalists, each tree once and none the same as its best."""
    seen, rivals = {search.tree.text(lg)} if search else set(), []
    for f in search.finalists if search else ():
        if f.tree.text(lg) not in seen:
            seen.add(f.tree.text(lg))
            rivals.append(Rival(f.scheme, ev.schedule(f.tree), f.evaluation.latency))
    return tuple(rivals)
