"""Apply the execution plan (seed 001 §4.3) to the executable: the bindings of every dataflow block
run in the order ``exec_plan.plan_order`` finds, when its peak of live bytes is lower than the
program order's (else the block is left as it is).

Each block is planned alone: control flow (an ``If``) and anything impure sit between blocks, so
the graph is partitioned there, as the seed partitions at nac points. Inside a block a binding
depends on the bindings whose variables it reads and on the ``match_cast`` that defines a symbol
its value or type mentions. Sizes are the bytes of each binding's tensors with every symbol at
``PROBE`` (the seed's rule 2 in its simplest form: one order for all sizes; where sizes grow
together, as in these models, the best order does not depend on their value).

    mod = ApplyExecutionPlan(mod)   # in the dsa pipeline: after fusion, before the offload
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax, tirx

from tvm_dsa.relax_passes.arena import tensor_bytes
from tvm_dsa.relax_passes.exec_plan import DataflowGraph, peak_of, plan_order
from tvm_dsa.kernelgen.symbolic import PROBE


def _nbytes(ty, analyzer) -> int:
    """Bytes of a binding's tensors, its symbols at the values ``analyzer`` binds them to."""
    if isinstance(ty, relax.TupleType):
        return sum(_nbytes(f, analyzer) for f in ty.fields)
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return 0
    size = tensor_bytes(ty.shape.values, ty.dtype, analyzer)
    return int(size) if isinstance(size, tirx.IntImm) else 0  # a dim no binding's type names


def _vars(node) -> list:
    """Every variable (Relax or TIR) ``node`` mentions."""
    out = []
    tvm_ffi.structural_walk(node, [(tvm.ir.Var, out.append)])
    return out


def block_graph(block: relax.DataflowBlock) -> DataflowGraph:
    """The block's bindings as a ``DataflowGraph`` (binding order kept)."""
    bindings = list(block.bindings)
    index = {b.var: i for i, b in enumerate(bindings)}
    defines: dict = {}  # symbol -> the match_cast binding that defines it
    analyzer, probed = tvm.sym.Analyzer(), set()
    inputs = []
    for i, b in enumerate(bindings):
        mentioned = _vars(b.value) + list(relax.analysis.tir_vars_in_type(b.var.ty))
        preds = {index[v] for v in mentioned if v in index} | {defines[v] for v in mentioned if v in defines}
        if isinstance(b, relax.MatchCast):
            for s in relax.analysis.definable_tir_vars_in_type(b.ty):
                defines.setdefault(s, i)
        inputs.append(tuple(sorted(p for p in preds if p != i)))
        for s in relax.analysis.tir_vars_in_type(b.var.ty):
            if s not in probed:
                probed.add(s)
                analyzer.bind(s, tirx.IntImm("int64", PROBE))
    sizes = tuple(_nbytes(b.var.ty, analyzer) for b in bindings)
    outputs = frozenset(i for i, b in enumerate(bindings) if not isinstance(b.var, relax.DataflowVar))
    return DataflowGraph(sizes, tuple(inputs), outputs)


# the exact search's budget at compile time: on the seven zoo models (full size and tiny) and the
# four dynamic ones 20k sets of ops give the orders 200k give; DLRM's eight embedding branches
# exceed both, and 200k spent 3 s finding that out before falling back to the greedy order
COMPILE_STATES = 20_000


def planned_order(block: relax.DataflowBlock) -> tuple[int, ...]:
    """The order to run the block's bindings in: the plan's where it lowers the peak."""
    g = block_graph(block)
    program = tuple(range(len(g.sizes)))
    plan = plan_order(g, COMPILE_STATES).order
    return plan if peak_of(g, plan) < peak_of(g, program) else program


@tvm.transform.module_pass(opt_level=0, name="dsa.ApplyExecutionPlan")
def ApplyExecutionPlan(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 (a pass, named like TVM's)
    mod = mod.clone()  # the caller's module stays as it is
    for gv, func in list(mod.functions.items()):
        if not isinstance(func, relax.Function):
            continue
        blocks = []
        for block in func.body.blocks:
            if isinstance(block, relax.DataflowBlock):
                order = planned_order(block)
                if list(order) != list(range(len(block.bindings))):
                    block = relax.DataflowBlock([block.bindings[i] for i in order])
            blocks.append(block)
        mod[gv] = relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty,
                                 func.is_pure, func.attrs, func.span)
    return mod
