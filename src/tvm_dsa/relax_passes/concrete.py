"""A dynamic model at one input: the graph the execution and memory planners work on.

SoD2 plans a dynamic model piecewise (§4.3): where every size is known, or once execution has
passed a nac point (an ``If``'s decision, a size only the data gives), the rest is planned with
what is then known. ``instantiate`` does that for one input of a fused module (what the DSA
pipeline offloads): the input's symbols bound, each ``If`` replaced by the branch the input takes,
and RDP applied again so the symbols cut at the If become the branch's sizes. ``planning_graph``
is then the module's dataflow graph with pure reshapes contracted: the VM makes a reshape a view
of its input, so it allocates nothing and keeps its input alive while it is read.
"""

from __future__ import annotations

from typing import Sequence

import tvm
from tvm import relax

from tvm_dsa.schedule.graph import OpGraph
from tvm_dsa.relax_passes.exec_plan import DataflowGraph
from tvm_dsa.relax_passes.rdp_apply import ApplyRDP


@relax.expr_functor.mutator
class _TakeBranches(relax.PyExprMutator):
    """Each If of the function, in program order, replaced by the bindings of the branch its
    decision names."""

    def __init__(self, decisions: Sequence[bool], mod=None):
        super().__init__(mod)
        self.decisions = list(decisions)

    def visit_var_binding_(self, binding):
        if not isinstance(binding.value, relax.If):
            return super().visit_var_binding_(binding)
        if not self.decisions:
            raise ValueError("more If nodes than decisions")
        branch = binding.value.true_branch if self.decisions.pop(0) else binding.value.false_branch
        for block in branch.blocks:
            for b in block.bindings:
                self.visit_binding(b)
        result = self.visit_expr(branch.body)
        if not isinstance(result, relax.Var):
            result = self.builder_.emit(result, name_hint=binding.var.name)
        self.set_var_remap(binding.var, result)


def instantiate(mod: tvm.IRModule, sizes: dict[str, int], decisions: Sequence[bool] = ()) -> tvm.IRModule:
    """``mod``'s ``main`` at one input: symbols by name from ``sizes``, If decisions in program
    order. Raises ValueError when the decisions do not match the Ifs."""
    mod = relax.transform.ToNonDataflow()(mod)  # branch bindings join main's blocks
    taker = _TakeBranches(decisions, mod)
    main = taker.visit_expr(mod["main"])
    if taker.decisions:
        raise ValueError(f"{len(taker.decisions)} decisions left over: fewer If nodes than decisions")
    out = mod.clone()
    out["main"] = relax.analysis.remove_all_unused(main)
    if sizes:
        out = relax.transform.BindSymbolicVars(sizes, "main")(out)
    return ApplyRDP()(out)


def without_views(g: DataflowGraph, views: set[int]) -> DataflowGraph:
    """``g`` with the ``views`` ops contracted: their readers read what they view."""
    def source(u):
        while u is not None and u in views:
            u = g.inputs[u][0] if g.inputs[u] else None
        return u

    keep = [v for v in range(len(g.sizes)) if v not in views]
    index = {v: i for i, v in enumerate(keep)}
    inputs = tuple(tuple(sorted({index[s] for u in g.inputs[v] if (s := source(u)) is not None})) for v in keep)
    outputs = frozenset(index[s] for o in g.outputs if (s := source(o)) is not None)
    return DataflowGraph(tuple(g.sizes[v] for v in keep), inputs, outputs)


def planning_graph(mod: tvm.IRModule) -> DataflowGraph:
    """The dataflow graph of a static fused module's kernels, pure reshapes contracted."""
    graph = OpGraph.from_relax(mod)
    views = {n.index for n in graph.nodes if relax.analysis.has_reshape_pattern(mod[n.func])}
    return without_views(DataflowGraph.from_opgraph(graph), views)
