"""Rank and Dimension Propagation (seed 001 §4.1, Tables 3-4, Algorithm 1) on a Relax function.

    result = rdp.analyze(mod)          # main of an imported module
    print(result)                      # per tensor: producer, class, Relax's shape, RDP's facts
    result.summary()                   # tensors resolved by Relax's struct info and by RDP

RDP runs on Relax, after import, because every optimisation that uses it (fusion, planning,
DSA code) works on Relax, and because the ONNX importer already does the forward half of RDP for
shape chains (``Shape → Gather → Concat → Reshape`` become one ``ShapeExpr``): measured on
Relax, "resolved by RDP only" counts what RDP adds to what Relax knows, not what the importer
would have found anyway. What it adds: values of integer tensors the importer left as tensors
(``Range``'s length via ``tensor_to_shape`` + ``match_cast``), backward inference (Relax's is
forward only), and Merge at ``If`` (Relax forgets every dim where the branches differ in one).

Each binding is a node; the analysis keeps a ``Fact`` (S and V map, ``lattice.py``) per Relax
variable and a lattice value per TIR symbol a ``match_cast`` defines. Transfer functions are
chosen by the dynamism class of the op after constant propagation (``dynamism.py``):

============  ================================  =============================  ==================  ===================
class         forward shape                     forward value                  backward shape      backward value
============  ================================  =============================  ==================  ===================
ISDO          Relax's inference on RDP shapes    from the input shapes          by shape family     —
ISDOS         Relax's inference on RDP shapes    small-int evaluation           by shape family     shape ↔ tensor
ISVDOS        inference with RDP values put in   small-int evaluation           by shape family     value inputs ← shape
EDO           rank only, dims ⊥                  ⊥                              —                   —
============  ================================  =============================  ==================  ===================

Forward shape inference reuses each op's own ``FInferStructInfo`` (through
``BlockBuilder.normalize``) on inputs whose struct info is what RDP knows, ⊤ and ⊥ elements
standing in as fresh TIR variables: an output dim that mentions one is ⊤ (or ⊥). Backward
rules follow the op's shape family (same shape, broadcasting, concat, permutation, matmul,
reshape, shape ↔ value). ``If`` is Merge: forward the meet of both branches, backward the If's
fact into both. The worklist runs both directions until no fact changes (a fixed point: the
lattice has finite height and every update is a meet).
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.ir.expr import Constant

from tvm_dsa.relax_passes.dynamism import RELAX_IF, Dynamism
from tvm_dsa.relax_passes.lattice import (
    DIMS_NAC, DIMS_UNDEF, FACT_NAC, FACT_UNDEF, NAC, UNDEF, Dim, Dims, Fact, Kind, show
)
from tvm_dsa.relax_passes.rdp_transfer import MAX_TRACKED, backward, forward, op_class, tracks

# ------------------------------------------------------------------------------ results
@dataclass(frozen=True)
class Row:
    """One tensor of the analysed function, as the report prints it."""

    var: relax.Var
    producer: str
    dynamism: Dynamism | None
    relax_shape: str
    fact: Fact
    relax_resolved: bool
    rdp_resolved: bool


@dataclass(frozen=True)
class Resolution:
    """How many tensors (and dims) have a shape in terms of the function's inputs."""

    tensors: int
    relax: int
    rdp: int
    rdp_only: int
    dims: int
    relax_dims: int
    rdp_dims: int


@dataclass
class RDPResult:
    func: relax.Function
    facts: dict          # Relax Var -> Fact
    symbols: dict        # TIR Var defined by a match_cast or named by RDP -> Dim
    named: frozenset     # the TIR Vars RDP named (values only execution knows), not in the program
    inputs: frozenset    # TIR Vars of the parameters' shapes
    order: list          # (Var, bound expression; the MatchCast for a match_cast), in program order
    visits: int          # nodes processed until the fixed point

    def __getitem__(self, var) -> Fact:
        return self.facts[var]

    def find(self, name: str) -> Fact:
        """The fact of the one variable called ``name``."""
        hits = [v for v in self.facts if v.name == name]
        if len(hits) != 1:
            raise KeyError(f"{len(hits)} variables are called {name!r}")
        return self.facts[hits[0]]

    def rows(self) -> list[Row]:
        """The parameters, then every binding of a tensor, in program order."""
        rows = []
        for var, expr in [(p, None) for p in self.func.params] + self.order:
            if not isinstance(var.ty, relax.TensorType):
                continue
            dyn, producer = None, "param"
            if isinstance(expr, relax.MatchCast):
                producer = "match_cast"
            elif isinstance(expr, relax.If):
                dyn, producer = RELAX_IF.dynamism, "if"
            elif isinstance(expr, relax.Call):
                dyn = op_class(expr).dynamism
                producer = expr.op.name.removeprefix("relax.") if isinstance(expr.op, tvm.ir.Op) else str(expr.op)
            elif expr is not None:
                producer = type(expr).__name__
            fact = self.facts.get(var, FACT_UNDEF)
            rows.append(Row(var, producer, dyn, _relax_shape(var.ty), fact,
                            _relax_resolved(var.ty, self.inputs), _resolved(fact.shape, self.inputs)))
        return rows

    def summary(self) -> Resolution:
        rows = self.rows()
        dims = rdp_dims = relax_dims = 0
        for r in rows:
            if r.fact.shape.known:
                rdp_dims += sum(_dim_resolved(d, self.inputs) for d in r.fact.shape)
            ty = r.var.ty
            if isinstance(ty.shape, relax.ShapeExpr):
                relax_dims += sum(_expr_resolved(e, self.inputs) for e in ty.shape.values)
            dims += max(ty.ndim, len(r.fact.shape) if r.fact.shape.known else 0, 0)
        return Resolution(len(rows), sum(r.relax_resolved for r in rows), sum(r.rdp_resolved for r in rows),
                          sum(r.rdp_resolved and not r.relax_resolved for r in rows), dims, relax_dims, rdp_dims)

    def table(self) -> str:
        rows = self.rows()
        head = ("tensor", "op", "class", "Relax", "RDP", "")
        body = [(r.var.name, r.producer, r.dynamism.name if r.dynamism else "", r.relax_shape, str(r.fact),
                 "RDP only" if r.rdp_resolved and not r.relax_resolved else "") for r in rows]
        widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [head, *body]]
        s = self.summary()
        lines.append(f"{s.tensors} tensors: {s.relax} resolved by Relax, {s.rdp} by RDP ({s.rdp_only} by RDP only); "
                     f"dims {s.relax_dims} / {s.rdp_dims} of {s.dims}; {self.visits} node visits")
        return "\n".join(lines)

    __str__ = table


def _relax_shape(ty) -> str:
    if isinstance(ty.shape, relax.ShapeExpr):
        return "(" + ", ".join(show(e) for e in ty.shape.values) + ("," if ty.ndim == 1 else "") + ")"
    return f"ndim={ty.ndim}" if ty.ndim >= 0 else "?"


def _expr_resolved(expr, inputs) -> bool:
    return all(v in inputs for v in tirx.analysis.undefined_vars(expr))


def _dim_resolved(d: Dim, inputs) -> bool:
    return d.determined and _expr_resolved(d.expr, inputs)


def _resolved(dims: Dims, inputs) -> bool:
    """Rank and every dim known, in terms of the function's input symbols."""
    return dims.known and all(_dim_resolved(d, inputs) for d in dims)


def _relax_resolved(ty, inputs) -> bool:
    return isinstance(ty.shape, relax.ShapeExpr) and all(_expr_resolved(e, inputs) for e in ty.shape.values)


# ------------------------------------------------------------------------------- analysis
def analyze(mod, func: str = "main") -> RDPResult:
    """Run RDP on ``mod[func]`` (or on a ``relax.Function``) to its fixed point."""
    f = mod[func] if isinstance(mod, tvm.IRModule) else mod
    if not isinstance(f, relax.Function):
        raise TypeError(f"RDP analyses a Relax function, not {type(f).__name__}")
    return _Solver(f).run()


@dataclass(frozen=True)
class _Node:
    var: relax.Var
    value: object            # the bound expression
    pattern: object = None   # a match_cast's struct info
    cast: object = None      # the MatchCast binding
    defines: tuple = ()      # TIR vars the match_cast defines


class _Solver:
    def __init__(self, func: relax.Function):
        self.func = func
        self.analyzer = tvm.sym.Analyzer()
        self.nodes: list[_Node] = []
        self.facts: dict = {}
        self.symbols: dict = {}       # TIR var -> Dim (params' symbols map to themselves)
        self.users: dict = {}         # Relax var -> node indices reading it
        self.symbol_users: dict = {}  # TIR var -> node indices whose expressions mention it
        self.producer: dict = {}      # Relax var -> node index
        self.required: dict = {}      # Relax var -> meet of the backward contributions only
        self.named: dict = {}         # (node, i) -> TIR var naming a value RDP cannot compute
        self.fresh = itertools.count()
        self.bb = relax.BlockBuilder()
        self.current = -1  # the node being visited
        inputs = set()
        for p in func.params:
            inputs.update(relax.analysis.tir_vars_in_type(p.ty))
        self.inputs = frozenset(inputs)
        for v in inputs:
            self._bound(v)
            self.symbols[v] = Dim.of(v)
        for p in func.params:
            self.facts[p] = self._param_fact(p.ty)
        self._collect(func.body)

    # ---------------------------------------------------------------- graph
    def _collect(self, seq) -> None:
        for block in seq.blocks:
            for b in block.bindings:
                if isinstance(b.value, relax.If):
                    self._collect(b.value.true_branch)
                    self._collect(b.value.false_branch)
                defines = ()
                if isinstance(b, relax.MatchCast):
                    defines = tuple(v for v in relax.analysis.definable_tir_vars_in_type(b.ty)
                                    if v not in self.symbols)
                    for v in defines:
                        self._bound(v)
                        self.symbols[v] = UNDEF
                cast = b if isinstance(b, relax.MatchCast) else None
                node = _Node(b.var, b.value, b.ty if cast else None, cast, defines)
                i = len(self.nodes)
                self.nodes.append(node)
                self.producer[b.var] = i
                self.facts[b.var] = FACT_UNDEF
                for v in self._reads(node):
                    self.users.setdefault(v, []).append(i)
                for v in self._mentions(node):
                    self.symbol_users.setdefault(v, []).append(i)

    def _reads(self, node: _Node) -> list:
        roots = [node.value.cond, node.value.true_branch.body, node.value.false_branch.body] \
            if isinstance(node.value, relax.If) else [node.value]
        out = []
        for r in roots:
            tvm_ffi.structural_walk(r, [(relax.Var, lambda v: out.append(v) if v in self.facts else None)])
        return out

    def _mentions(self, node: _Node) -> list:
        out = []
        roots = [node.value, *node.value.ty_args] if isinstance(node.value, relax.Call) else [node.value]
        if node.pattern is not None:
            roots.append(node.pattern)
        if isinstance(node.value, relax.If):
            roots = [node.value.cond]
        for r in roots:
            tvm_ffi.structural_walk(r, [(tirx.Var, lambda v: out.append(v) if v in self.symbols else None)])
        return out

    def _bound(self, v) -> None:
        """Dims and the names RDP gives are never negative."""
        self.analyzer.update(v, tvm.sym.ConstIntBound(0, tvm.sym.ConstIntBound.POS_INF), True)

    def _param_fact(self, ty) -> Fact:
        if isinstance(ty, relax.TensorType):
            if isinstance(ty.shape, relax.ShapeExpr):
                shape = Dims.of(ty.shape.values, self.analyzer)
            else:
                shape = Dims((UNDEF,) * ty.ndim) if ty.ndim >= 0 else DIMS_UNDEF
            # an input's value is data; a small integer one is ⊤ until its consumers require one
            return Fact(shape, DIMS_UNDEF if tracks(ty, shape) else DIMS_NAC)
        if isinstance(ty, relax.TupleType):
            return Fact(DIMS_NAC, DIMS_NAC, tuple(self._param_fact(t) for t in ty.fields))
        if isinstance(ty, relax.ShapeType) and ty.values is not None:
            return Fact(Dims.of([len(ty.values)]), Dims.of(ty.values, self.analyzer))
        return FACT_NAC

    # -------------------------------------------------- lattice <-> expressions
    def to_expr(self, d: Dim):
        """A TIR expression for an element; ⊤ and ⊥ become fresh variables named so."""
        if d.determined:
            return d.expr
        return tirx.Var(f"{'⊤' if d.kind is Kind.UNDEF else '⊥'}{next(self.fresh)}", "int64")

    def from_expr(self, expr) -> Dim:
        names = [v.name for v in tirx.analysis.undefined_vars(expr)]
        if any(n.startswith("⊥") for n in names):
            return NAC
        if any(n.startswith("⊤") for n in names):
            return UNDEF
        return Dim.of(expr, self.analyzer)

    def substitute(self, node):
        """``node`` (an expression or a type) with the symbols RDP knows replaced by their values."""
        def swap(v):
            d = self.symbols.get(v)
            if d is None or (d.kind is Kind.SYMBOLIC and d.expr.same_as(v)):
                return v
            return self.to_expr(d)
        return tvm_ffi.structural_map(node, (tirx.Var, swap))

    def name(self, node_index: int, i: int) -> Dim:
        """A symbolic constant for element ``i`` of a node's value that only execution knows
        (Algorithm 1, lines 16-18), the same variable at every visit."""
        key = (node_index, i)
        if key not in self.named:
            v = tirx.Var(f"{self.nodes[node_index].var.name}_{i}", "int64")
            self._bound(v)
            self.named[key] = v
        return Dim.of(self.named[key])

    # ------------------------------------------------------------------ facts
    def fact_of(self, expr) -> Fact:
        """Forward evaluation of a (possibly nested) expression to its fact."""
        if isinstance(expr, relax.Var) and expr in self.facts:
            return self.facts[expr]
        if isinstance(getattr(expr, "ty", None), tvm.ir.PrimType):  # an integer, a symbol, an expression
            return Fact(Dims(()), Dims((self.from_expr(self.substitute(expr)),)))
        if isinstance(expr, Constant):
            return self._constant_fact(expr)
        if isinstance(expr, relax.ShapeExpr):
            values = Dims(tuple(self.from_expr(self.substitute(e)) for e in expr.values))
            return Fact(Dims.of([len(expr.values)]), values)
        if isinstance(expr, relax.Tuple):
            return Fact(DIMS_NAC, DIMS_NAC, tuple(self.fact_of(f) for f in expr.fields))
        if isinstance(expr, relax.TupleGetItem):
            t = self.fact_of(expr.tuple_value)
            if t.undef:
                return FACT_UNDEF
            return t.fields[expr.index] if t.fields is not None else FACT_NAC
        if isinstance(expr, relax.Call):
            if isinstance(expr.op, tvm.ir.Op):
                return forward(self, expr)
            return self.fact_of_type(expr.ty)
        return FACT_NAC

    def _constant_fact(self, c) -> Fact:
        data = c.value.numpy()
        value = DIMS_NAC
        if data.dtype.kind in "iu" and data.ndim <= 1 and data.size <= MAX_TRACKED:
            value = Dims.of(int(x) for x in data.reshape(-1))
        return Fact(Dims.of(data.shape), value)

    def fact_of_type(self, ty) -> Fact:
        """What a struct info (with RDP's symbols substituted) says; unknown dims are ⊥."""
        ty = self.substitute(ty)
        if isinstance(ty, relax.TensorType):
            if isinstance(ty.shape, relax.ShapeExpr):
                shape = Dims(tuple(self.from_expr(e) for e in ty.shape.values))
            else:
                shape = Dims((NAC,) * ty.ndim) if ty.ndim >= 0 else DIMS_NAC
            return Fact(shape, DIMS_NAC)
        if isinstance(ty, relax.ShapeType):
            rank = Dims.of([ty.ndim]) if ty.ndim >= 0 else DIMS_NAC
            if ty.values is not None:
                return Fact(rank, Dims(tuple(self.from_expr(e) for e in ty.values)))
            return Fact(rank, Dims((NAC,) * ty.ndim) if ty.ndim >= 0 else DIMS_NAC)
        if isinstance(ty, tvm.ir.PrimType):
            return Fact(Dims(()), Dims((NAC,)))
        if isinstance(ty, relax.TupleType):
            return Fact(DIMS_NAC, DIMS_NAC, tuple(self.fact_of_type(t) for t in ty.fields))
        return FACT_NAC

    # ---------------------------------------------------------------- solving
    def run(self) -> RDPResult:
        work = deque(range(len(self.nodes)))
        queued = set(work)
        visits = 0
        while work:
            i = work.popleft()
            queued.discard(i)
            visits += 1
            for j in self._visit(i):
                if j not in queued:
                    queued.add(j)
                    work.append(j)
        order = [(n.var, n.cast or n.value) for n in self.nodes]
        symbols = {v: d for v, d in self.symbols.items() if v not in self.inputs}
        symbols.update({v: Dim.of(v) for v in self.named.values()})
        return RDPResult(self.func, dict(self.facts), symbols, frozenset(self.named.values()), self.inputs,
                         order, visits)

    def _visit(self, i: int) -> set[int]:
        node = self.nodes[i]
        self.current = i
        changed: set = set()
        if isinstance(node.value, relax.If):  # Merge
            branches = (node.value.true_branch.body, node.value.false_branch.body)
            self._update(node.var, self.fact_of(branches[0]).meet(self.fact_of(branches[1])), changed)
            # only what the If's consumers require holds in both branches, not what one computes
            for body in branches:
                self.contribute(body, self.required.get(node.var, FACT_UNDEF), changed)
        elif node.pattern is not None:
            self._match_cast(node, changed)
        else:
            self._update(node.var, self.fact_of(node.value), changed)
            self.contribute(node.value, self.facts[node.var], changed)
        return changed

    def _update(self, var, fact: Fact, changed: set, required: bool = False) -> None:
        if required:
            self.required[var] = self.required.get(var, FACT_UNDEF).meet(fact)
        old = self.facts.get(var, FACT_UNDEF)
        new = old.meet(fact)
        if new != old:
            self.facts[var] = new
            changed.update(self.users.get(var, ()))
            if var in self.producer:
                changed.add(self.producer[var])

    def contribute(self, expr, fact: Fact, changed: set) -> None:
        """Backward: meet ``fact`` into what ``expr`` computes (into a variable's fact, a tuple's
        fields, or through a nested call into its arguments)."""
        fact = fact.opened()  # a ⊥ says nothing about what computed it
        if fact.undef:
            return
        if isinstance(expr, relax.Var) and expr in self.facts:
            self._update(expr, fact, changed, required=True)
        elif isinstance(expr, relax.Tuple) and fact.fields is not None:
            for f, sub in zip(expr.fields, fact.fields):
                self.contribute(f, sub, changed)
        elif isinstance(expr, relax.TupleGetItem) and isinstance(expr.tuple_value.ty, relax.TupleType):
            n = len(expr.tuple_value.ty.fields)
            fields = tuple(fact if k == expr.index else FACT_UNDEF for k in range(n))
            self.contribute(expr.tuple_value, Fact(DIMS_UNDEF, DIMS_UNDEF, fields), changed)
        elif isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
            for arg, sub in backward(self, expr, fact):
                self.contribute(arg, sub, changed)

    def _match_cast(self, node: _Node, changed: set) -> None:
        """``match_cast`` asserts a pattern: its static dims hold afterwards (and flow back into
        the value); the symbols it defines take the value's dims, or name them when only
        execution knows them."""
        value = self.fact_of(node.value)
        for v in node.defines:
            d = self._defined_dim(node.pattern, v, value)
            new = Dim.of(v) if d.kind is Kind.NAC else d  # name what only execution knows
            old = self.symbols[v]
            merged = new if old.kind is Kind.UNDEF else old if old == new else Dim.of(v)
            if merged != old:
                self.symbols[v] = merged
                changed.update(self.symbol_users.get(v, ()))
        pattern = self.fact_of_type(node.pattern)
        self.contribute(node.value, pattern, changed)
        self._update(node.var, _prefer(pattern, value), changed)

    def _defined_dim(self, pattern, v, value: Fact) -> Dim:
        """The value's element at the position where the pattern defines ``v``."""
        if isinstance(pattern, relax.TensorType) and isinstance(pattern.shape, relax.ShapeExpr):
            positions, dims = pattern.shape.values, value.shape
        elif isinstance(pattern, relax.ShapeType) and pattern.values is not None:
            positions, dims = pattern.values, value.value
        elif isinstance(pattern, tvm.ir.PrimType):
            return value.value[0] if value.value.known else UNDEF if value.value.undef else NAC
        else:
            return NAC
        if not dims.known:
            return UNDEF if dims.undef else NAC
        for e, d in zip(positions, dims):
            if isinstance(e, tirx.Var) and e.same_as(v):
                return d
        return NAC


def _prefer(pattern: Fact, value: Fact) -> Fact:
    """After a match_cast: the pattern's element where it has one, else the value's."""
    def pick(p: Dims, v: Dims) -> Dims:
        if not p.known:
            return v
        if not v.known:
            return p
        return Dims(tuple(a if a.determined else b for a, b in zip(p, v)))
    return Fact(pick(pattern.shape, value.shape), pick(pattern.value, value.value))

