"""RDP-aware fusion (seed 001 §4.2): let TVM's ``FuseOps`` fuse across dynamic shapes.

TVM fuses by each PrimFunc's pattern kind (``AnnotateTIROpPattern``) inside dataflow blocks.
On a dynamic model two things stop it where the shapes RDP proves would allow it:

- *Reshapes with symbolic dims are opaque.* ``AnnotateTIROpPattern`` cannot analyse the
  ``floordiv`` / ``floormod`` by symbolic extents of a legalized reshape and marks it opaque (8),
  so a reshape → transpose (BERT's head split and merge) stays two kernels, with the reshape's
  output in memory between them. ``AnnotateSymbolicReshapes`` marks such a PrimFunc injective
  (2) when it is a pure reshape (``has_reshape_pattern``) and the element counts of its input
  and output — the shapes RDP gave them — are provably equal: one fused kernel, one version
  for every shape ("I' = I": the symbols agree, Fig. 4's single version).
- *No dataflow blocks around control flow.* The importer emits a function with an ``If`` as
  plain binding blocks, where ``FuseOps`` does nothing (skipnet: every conv, add and ReLU its own
  kernel). ``ConvertToDataflow`` restores them but loses the If results' shapes; RDP (``ApplyRDP``
  after it) puts them back. The pipeline does that (``pipeline.py``).

Where RDP cannot prove the dims equal (a dim cut at an If that changes shape), the fused kernel
keeps a symbol, and its program is built per concrete shape at run time (``kernelgen.specialize``)
— the guarded multi-version case, with as many versions as shapes met.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import relax, tirx

OPAQUE, INJECTIVE = 8, 2  # TVM's OpPatternKind values


def _elements(ty):
    return math.prod(ty.shape.values) if isinstance(ty.shape, relax.ShapeExpr) else None


def symbolic_reshapes(mod: tvm.IRModule, func: str = "main") -> list:
    """GlobalVars of opaque pure-reshape PrimFuncs whose every call moves a provably equal
    number of elements."""
    op = tvm.ir.Op.get("relax.call_tir")
    analyzer = tvm.sym.Analyzer()
    verdict: dict = {}

    def visit(call):
        if not call.op.same_as(op):
            return
        gv = call.args[0]
        f = mod.functions.get(gv)  # None for a shape function the legalizer left unbound here
        if not (isinstance(f, tirx.PrimFunc) and f.attrs and int(f.attrs.get("op_pattern", -1)) == OPAQUE and relax.analysis.has_reshape_pattern(f)):
            return
        n_in, n_out = _elements(call.args[1].fields[0].ty), _elements(call.ty)
        equal = n_in is not None and n_out is not None and analyzer.can_prove_equal(n_in, n_out)
        verdict[gv] = verdict.get(gv, True) and equal

    tvm_ffi.structural_walk(mod[func].body, [(relax.Call, visit)])
    return [gv for gv, ok in verdict.items() if ok]


@tvm.transform.module_pass(opt_level=0, name="dsa.AnnotateSymbolicReshapes")
def AnnotateSymbolicReshapes(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass naming
    """Mark the reshapes ``symbolic_reshapes`` finds injective, so ``FuseOps`` fuses them."""
    gvs = symbolic_reshapes(mod)
    if not gvs:
        return mod
    mod = mod.clone()
    for gv in gvs:
        mod[gv] = mod[gv].with_attr("op_pattern", INJECTIVE)
    return mod


@dataclass(frozen=True)
class FusionCount:
    """Kernels of a fused module (every ``call_tir`` of ``main``, both ways of each If) and the
    bytes of their outputs at one input shape (None where a dim is only known at run time). A
    pure reshape is neither: the VM makes it a view of its input (``RewriteDataflowReshape``)."""

    layers: int
    intermediate_bytes: int | None


def count_kernels(mod: tvm.IRModule, sizes: dict[str, int], func: str = "main") -> FusionCount:
    """``sizes``: the value of each input symbol by name (e.g. ``{"batch": 2, "seq": 16}``)."""
    op = tvm.ir.Op.get("relax.call_tir")
    analyzer = tvm.sym.Analyzer()
    layers, total = 0, 0

    def value(d):
        imms = {v: tirx.IntImm(v.ty.dtype, sizes[v.name])
                for v in tirx.analysis.undefined_vars(d) if v.name in sizes}
        folded = analyzer.simplify(tvm_ffi.structural_map(d, [(tirx.Var, lambda v: imms.get(v, v))]))
        return int(folded) if isinstance(folded, tirx.IntImm) else None

    def visit(call):
        nonlocal layers, total
        if not call.op.same_as(op) or relax.analysis.has_reshape_pattern(mod[call.args[0]]):
            return
        layers += 1
        types = call.ty.fields if isinstance(call.ty, relax.TupleType) else [call.ty]
        for ty in types:
            dims = [value(d) for d in ty.shape.values] if isinstance(ty.shape, relax.ShapeExpr) else [None]
            if total is not None and None not in dims:
                total += math.prod(dims) * tvm.runtime.DataType(str(ty.dtype)).bits // 8
            else:
                total = None

    tvm_ffi.structural_walk(mod[func].body, [(relax.Call, visit)])
    return FusionCount(layers, total)
