"""ReplaceWithDSACalls: ``main`` calls each generated kernel's program in place of its calls.

A kernel's ``call_tir`` calls become one ``call_dps_packed("tvm_dsa.execute", (program, info,
*inputs))`` returning its outputs. The program text lives in the VM bytecode, so
``export_library`` / ``load_module`` keep it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import tvm
from tvm import relax

from tvm_dsa.packed import EXECUTE
from tvm_dsa.schedule.graph import OpGraph
from tvm_dsa.schedule.plan import KernelSpec


@dataclass(frozen=True)
class DSACall:
    """What a generator made of a kernel: the program text, the tensors the call passes and
    returns (by name, in the program's argument order) and the names the program's args and
    layers have at this call (a sub-graph sharing an earlier one's program: ``renames``)."""

    spec: KernelSpec
    text: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    renames: dict = field(default_factory=dict)


def ReplaceWithDSACalls(calls: list[DSACall], graph: OpGraph, run_id: str) -> tvm.transform.Pass:  # noqa: N802
    """Pass: ``main`` (whose layer graph is ``graph``) with each kernel's calls replaced by its DSA
    call. Bindings are re-ordered topologically with each kernel as one unit, keeping the original
    order where they are free (a sub-graph is convex, so the units form a DAG)."""

    @tvm.transform.module_pass(opt_level=0, name="dsa.ReplaceWithDSACalls")
    def replace(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        func = mod["main"]
        owner = {c: k for k, call in enumerate(calls) for c in call.spec.calls}
        emitted = 0
        blocks = []
        for block in func.body.blocks:
            units: dict = {}  # unit id -> [position, bindings]
            for pos, b in enumerate(block.bindings):
                name = graph.names.get(b.var)
                uid = ("k", owner[name]) if name in owner and graph.tensors[name].expr.same_as(b.var) else ("b", pos)
                units.setdefault(uid, [pos, []])
                units[uid][0] = pos
                units[uid][1].append(b)
            where = {b.var: uid for uid, (_, bs) in units.items() for b in bs}
            needs = {uid: {where[v] for b in bs for v in relax.analysis.free_vars(b.value)
                           if v in where and where[v] != uid} for uid, (_, bs) in units.items()}
            done, out = set(), []
            while len(done) < len(units):
                ready = [u for u in units if u not in done and needs[u] <= done]
                uid = min(ready, key=lambda u: units[u][0])
                done.add(uid)
                if uid[0] == "k":
                    out += _bindings(calls[uid[1]], emitted, len(calls), block, graph, run_id)
                    emitted += 1
                else:
                    out += units[uid][1]
            cls = relax.DataflowBlock if isinstance(block, relax.DataflowBlock) else relax.BindingBlock
            blocks.append(cls(out))
        new_main = relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty, func.is_pure,
                                  func.attrs)
        mod = mod.clone()  # the caller's module is not modified
        mod["main"] = new_main
        return relax.transform.DeadCodeElimination(["main"])(mod)

    return replace


def _bindings(call: DSACall, index, count, block, graph, run_id):
    """The bindings of one DSA call. Sub-graphs of one form share the first's program text, and
    their call's info names what the program's args and layers are called here (``names``, read by
    ``execution.execute``): one text to compress, embed and parse for a model's repeated blocks."""
    info = json.dumps({"run": run_id, "kernel": call.spec.name, "index": index, "count": count,
                       **({"names": call.renames} if call.renames else {})})
    args = [tvm.ir.StringImm(call.text), tvm.ir.StringImm(info), *(graph.tensors[t].expr for t in call.inputs)]
    out_vars = [graph.tensors[t].expr for t in call.outputs]
    types = [v.ty for v in out_vars]
    if len(out_vars) == 1:
        return [relax.VarBinding(out_vars[0], relax.call_dps_packed(EXECUTE, args, out_ty=types[0]))]
    packed = relax.call_dps_packed(EXECUTE, args, out_ty=types)
    var_cls = relax.DataflowVar if isinstance(block, relax.DataflowBlock) else relax.Var
    tup = var_cls(f"{call.spec.name}_out", relax.TupleType(types))
    return [relax.VarBinding(tup, packed)] + [relax.VarBinding(v, relax.TupleGetItem(tup, j))
                                              for j, v in enumerate(out_vars)]
