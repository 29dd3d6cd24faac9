"""Apply RDP's results to a Relax module: a symbol the program defines (a ``match_cast`` on a
computed shape, e.g. the length of ``Range(0, seq)``) that RDP proves equal to an expression of
the inputs' symbols is replaced by that expression; then what RDP knows of a tensor's shape and
Relax does not becomes a ``match_cast`` right after the binding, so every later op is inferred —
and can be legalized — with that shape. (Substituting symbols is the robust half: TVM's
``CanonicalizeBindings`` and ``ConvertToDataflow`` drop a ``match_cast`` that only asserts dims
already defined, so a later pass may lose such a cast; a substituted symbol stays.)

A dim RDP determined is written as its expression (in the inputs' symbols, or symbols the
program already defines); a dim it cannot determine (⊥, ⊤, or a name RDP made up) gets a fresh
symbol that the ``match_cast`` defines: the graph is cut there, as SoD2 partitions at nac points
(§4.3), and the rest is analysed and compiled in terms of that symbol. The cast is a checked
assertion at run time, never a silent assumption.

    mod = ApplyRDP()(mod)     # then tvm.compile(mod, target=...) compiles what Relax alone could not
"""

from __future__ import annotations

import tvm
from tvm import relax, tirx

from tvm_dsa.relax_passes.lattice import Kind
from tvm_dsa.relax_passes.rdp import RDPResult, analyze


def known_dims(result: RDPResult) -> dict:
    """Relax var -> its dims as RDP knows them, an expression the program can evaluate where
    RDP determined one, else None; for every tensor whose rank RDP knows."""
    in_scope = set(result.inputs) | (set(result.symbols) - set(result.named))
    out = {}
    for var, _ in result.order:
        fact = result.facts.get(var)
        if isinstance(var.ty, relax.TensorType) and fact is not None and fact.shape.known:
            out[var] = tuple(d.expr if d.kind in (Kind.KNOWN, Kind.SYMBOLIC, Kind.EXPR)
                             and set(tirx.analysis.undefined_vars(d.expr)) <= in_scope else None
                             for d in fact.shape)
    return out


def proven_symbols(result: RDPResult) -> dict:
    """Symbols the program defines -> the expression in the inputs' symbols RDP proves they equal."""
    out = {}
    for v, d in result.symbols.items():
        if (v not in result.inputs and v not in result.named and d.kind in (Kind.KNOWN, Kind.SYMBOLIC, Kind.EXPR)
                and not d.expr.same_as(v) and set(tirx.analysis.undefined_vars(d.expr)) <= set(result.inputs)):
            out[v] = d.expr
    return out


def refined_type(var, dims: tuple, analyzer, inputs: frozenset = frozenset()):
    """The TensorType to cast ``var`` to, or None if its struct info already says as much: RDP's
    dim where Relax has none or a different one not in terms of ``inputs`` (the parameters'
    symbols; two names of one value — a symbol a checked cast equates with an input's — keep the
    input's), Relax's otherwise, a fresh symbol where neither knows."""
    ty = var.ty
    have = list(ty.shape.values) if isinstance(ty.shape, relax.ShapeExpr) else [None] * len(dims)
    if len(have) != len(dims):
        return None
    new, better = [], False
    for k, (d, h) in enumerate(zip(dims, have)):
        if h is not None and (d is None or analyzer.can_prove_equal(d, h)
                              or set(tirx.analysis.undefined_vars(h)) <= inputs):
            new.append(h)
        elif d is not None:
            new.append(d)
            better = True
        else:
            new.append(tirx.Var(f"{var.name}_{k}", "int64"))
            better = True
    return relax.TensorType(relax.ShapeExpr(new), ty.dtype) if better else None


@relax.expr_functor.mutator
class _Refine(relax.PyExprMutator):
    """Re-emits every binding (so later types are inferred from the casts before them) and casts
    a tensor where RDP knows more than its re-inferred struct info. Dataflow blocks stay: a cast
    is a dataflow variable, re-emitted as the block's output where the original was one."""

    def __init__(self, result: RDPResult, mod=None):
        super().__init__(mod)
        self.result = result
        self.dims, self.inputs = known_dims(result), frozenset(result.inputs)
        self.analyzer = tvm.sym.Analyzer()

    def visit_var_binding_(self, binding):
        var = self.builder_.emit(self.visit_expr(binding.value), name_hint=binding.var.name)
        self._cast(binding.var, var)

    def visit_match_cast_(self, binding):
        value = self.visit_expr(binding.value)
        name = binding.var.name
        if not self._proven(binding, value):
            var = self.builder_.match_cast(value, binding.ty, name_hint=name)
        else:  # an assertion already proven: gone (and what computed a proven shape with it)
            var = value if isinstance(value, relax.Var) else self.builder_.emit(value, name_hint=name)
        self._cast(binding.var, var)

    def _proven(self, binding, value) -> bool:
        """Whether a cast asserts only what is known: a tensor's dims its struct info already
        has, or a shape value RDP proves (``Range``'s length cast to ``seq`` once substituted)."""
        pattern = binding.ty
        if isinstance(pattern, relax.TensorType):
            have = value.ty
            if not (isinstance(have, relax.TensorType) and have.dtype == pattern.dtype
                    and isinstance(have.shape, relax.ShapeExpr)):
                return False
            if pattern.shape is None:  # a rank-only pattern (ConvertToDataflow's "_with_dyn" casts)
                return pattern.ndim in (-1, len(have.shape.values))
            return (isinstance(pattern.shape, relax.ShapeExpr) and len(have.shape.values) == len(pattern.shape.values)
                    and all(self.analyzer.can_prove_equal(a, b) for a, b in zip(have.shape.values, pattern.shape.values)))
        fact = self.result.facts.get(binding.value) if isinstance(binding.value, relax.Var) else None
        if not (isinstance(pattern, relax.ShapeType) and pattern.values is not None and fact is not None
                and fact.value.known and len(fact.value) == len(pattern.values)):
            return False
        return all(d.kind in (Kind.KNOWN, Kind.SYMBOLIC, Kind.EXPR) and self.analyzer.can_prove_equal(d.expr, p)
                   and set(tirx.analysis.undefined_vars(p)) <= self.inputs for d, p in zip(fact.value, pattern.values))

    def _cast(self, old, new) -> None:
        """Use ``new`` (or its cast to what RDP knows) wherever ``old`` was used."""
        if old in self.dims:
            ty = refined_type(new, self.dims[old], self.analyzer, self.inputs)
            if ty is not None:
                new = self.builder_.match_cast(new, ty, name_hint=old.name)
        if self.builder_.current_block_is_dataflow() and not isinstance(old, relax.DataflowVar):
            new = self.builder_.emit_output(new, name_hint=old.name)
        self.set_var_remap(old, new)


def refine(mod: tvm.IRModule, func: str = "main") -> tvm.IRModule:
    """``mod`` with ``func``'s proven symbols substituted and its tensors cast to the shapes RDP
    finds."""
    symbols = proven_symbols(analyze(mod[func]))
    if symbols:
        mod = relax.transform.BindSymbolicVars(symbols, func)(mod)
    new = _Refine(analyze(mod[func]), mod).visit_expr(mod[func])
    out = tvm.IRModule(dict(mod.functions.items()), attrs=mod.attrs)
    out[func] = relax.analysis.remove_all_unused(new)
    return out


def ApplyRDP() -> tvm.transform.Pass:  # noqa: N802 - TVM pass naming
    """Every Relax function of the module, refined by its RDP fixed point."""
    def transform(mod: tvm.IRModule, ctx) -> tvm.IRModule:
        for gv, f in list(mod.functions.items()):
            if isinstance(f, relax.Function):
                mod = refine(mod, gv.name_hint)
        return mod
    return tvm.transform.module_pass(transform, opt_level=0, name="dsa.ApplyRDP")
