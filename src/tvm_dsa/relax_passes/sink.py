"""SinkIntoBranches: a kernel whose result only one branch of an ``If`` uses runs in that branch.

TVM's ONNX importer converts the nodes of an ``If``'s branch subgraphs into the enclosing block
and keeps only the last one in the branch: skipnet's gated block computes both convolutions of
its residual block before the gate is even read, whichever way it goes — what the seed calls
executing every path and discarding the results not taken ("通常需要执行所有可能的路径,并剥离无效
结果"). Moving each such kernel into the branch that uses it makes the other path skip its work
and its memory, and lets a branch's tensors share bytes with what dies in that branch
(``arena.PlanArena``'s in-place outputs).

A binding moves when it is a ``call_tir`` (pure: it only computes its output) and every use of
its variable is inside one branch of one later ``If`` of the same sequence of bindings (uses by
bindings that move there count as there); bindings are taken last first, so chains move
together. They go, in program order, into a new dataflow block at the start of the branch;
nested ``If``s are treated the same way.

    mod = SinkIntoBranches(mod)   # after fusion, before the execution plan
"""

from __future__ import annotations

import tvm
from tvm import relax

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


def _uses(var, expr) -> bool:
    return any(v.same_as(var) for v in relax.analysis.free_vars(expr))


def _sink(seq: relax.SeqExpr) -> relax.SeqExpr:
    bindings = [b for block in seq.blocks for b in block.bindings]
    if not any(isinstance(b.value, relax.If) for b in bindings):
        return seq  # nowhere to sink to (ViT-B/16's 17k use tests were 0.1 s of its build)
    place: dict = {}  # index of a binding that moves -> (index of its If, branch 0 / 1)
    for k in reversed(range(len(bindings))):
        b = bindings[k]
        if not (isinstance(b, relax.VarBinding) and isinstance(b.value, relax.Call) and b.value.op.same_as(_CALL_TIR)):
            continue
        where = {"result"} if _uses(b.var, seq.body) else set()
        for j in range(k + 1, len(bindings)):
            u = bindings[j].value
            if j in place:
                if _uses(b.var, u):
                    where.add(place[j])
            elif isinstance(u, relax.If):
                where |= {(j, n) for n, part in enumerate((u.true_branch, u.false_branch)) if _uses(b.var, part)}
                if _uses(b.var, u.cond):
                    where.add("top")
            elif _uses(b.var, u):
                where.add("top")
        if len(where) == 1 and isinstance(next(iter(where)), tuple):
            place[k] = where.pop()
    blocks = []
    for block in seq.blocks:
        kept = []
        for b in block.bindings:
            k = next(i for i, x in enumerate(bindings) if x.same_as(b))
            if k in place:
                continue
            if isinstance(b.value, relax.If):
                branches = []
                for n, part in enumerate((b.value.true_branch, b.value.false_branch)):
                    moved = [bindings[i] for i in sorted(place) if place[i] == (k, n)]
                    head = [relax.DataflowBlock(moved)] if moved else []
                    branches.append(_sink(relax.SeqExpr(head + list(part.blocks), part.body)))
                b = relax.VarBinding(b.var, relax.If(b.value.cond, *branches))
            kept.append(b)
        if kept:
            blocks.append(relax.DataflowBlock(kept) if isinstance(block, relax.DataflowBlock) else relax.BindingBlock(kept))
    return relax.SeqExpr(blocks, seq.body)


@tvm.transform.module_pass(opt_level=0, name="dsa.SinkIntoBranches")
def SinkIntoBranches(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 (a pass, named like TVM's)
    out = mod.clone()  # the caller's module stays as it is
    for gv, f in mod.functions.items():
        if isinstance(f, relax.Function):
            out[gv] = relax.Function(f.params, _sink(f.body), f.ret_ty, f.is_pure, f.attrs, f.span)
    return relax.transform.Normalize()(out)  # the rebuilt Ifs and branches get their types
