"""The frame of a local Relax rewrite pass: a mutator over every Relax function of a module."""

from __future__ import annotations

import tvm
from tvm import relax


def rewrite_functions(mod: tvm.IRModule, mutator) -> tvm.IRModule:
    """A copy of ``mod`` (the caller's stays as it is) with every Relax function visited by
    ``mutator(mod)`` (a ``relax.PyExprMutator`` class) and the bindings it left unused dropped."""
    out = mod.clone()
    for gv, f in mod.functions.items():
        if isinstance(f, relax.Function):
            out[gv] = mutator(mod).visit_expr(f)
    return relax.transform.DeadCodeElimination()(out)
