"""The frames of local Relax rewrite passes: a mutator over every Relax function of a module, and
calls given copies of their PrimFuncs with an attribute."""

from __future__ import annotations

import tvm
from tvm import relax


def rewrite_functions(mod: tvm.IRModule, mutator, keep_added: bool = False) -> tvm.IRModule:
    """A copy of ``mod`` (the caller's stays as it is) with every Relax function visited by
    ``mutator(mod)`` (a ``relax.PyExprMutator`` class) and the bindings it left unused dropped;
    with ``keep_added``, one mutator visits them all and the functions it added to its builder
    (``call_te``'s PrimFuncs) join the module."""
    if keep_added:
        visitor = mutator(mod)
        for gv, f in mod.functions_items():
            if isinstance(f, relax.Function):
                visitor.builder_.update_func(gv, visitor.visit_expr(f))
        return relax.transform.DeadCodeElimination()(visitor.builder_.get())
    out = mod.clone()
    for gv, f in mod.functions.items():
        if isinstance(f, relax.Function):
            out[gv] = mutator(mod).visit_expr(f)
    return relax.transform.DeadCodeElimination()(out)


def with_copies(mod: tvm.IRModule, attrs: dict, suffix: str) -> tvm.IRModule:
    """``mod`` with each ``call_tir`` in ``attrs`` (call -> (attribute, value)) calling a copy of its
    PrimFunc with that attribute (``NAME_suffix``, one per PrimFunc and value): the other calls of
    the PrimFunc keep it as it is."""
    return _Copies(mod, attrs, suffix).run() if attrs else mod


@relax.expr_functor.mutator
class _Copies(relax.PyExprMutator):
    def __init__(self, mod, attrs: dict, suffix: str):
        super().__init__(mod)
        self.attrs = attrs
        self.copies: dict = {}  # (PrimFunc name, attribute, value) -> the copy's GlobalVar
        for call, (key, value) in attrs.items():
            name = call.args[0].name_hint
            if (name, key, str(value)) not in self.copies:
                self.copies[(name, key, str(value))] = self.builder_.add_func(mod[name].with_attr(key, value),
                                                                             f"{name}_{suffix}")

    def visit_call_(self, call):
        attr = self.attrs.get(call)
        call = super().visit_call_(call)
        if attr is None:
            return call
        copy = self.copies[(call.args[0].name_hint, attr[0], str(attr[1]))]
        return relax.Call(call.op, [copy, *call.args[1:]], call.attrs, call.ty_args)

    def run(self) -> tvm.IRModule:
        for gv, func in self.builder_.get().functions_items():
            if isinstance(func, relax.Function):
                self.builder_.update_func(gv, self.visit_expr(func))
        return self.builder_.get()
