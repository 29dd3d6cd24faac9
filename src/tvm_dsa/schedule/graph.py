"""The graph the inter-layer schedulers work on: layers (fused ops) and the tensors between them.

Built from ``main`` of a module after ``FuseOps`` + ``FuseTIR``: every ``call_tir`` of one output
(a kernel of several, a Split, stays on the host) is a node (a
"layer" in GraphTurbo's sense, seed 000 §1: a straight run of ops with at most one op holding
learned parameters — exactly what TVM's fusion rules produce around a conv or matmul). Tensors are
the Relax variables between nodes; constants (weights) are inputs that no node produces.

``SubGraphs`` is a partition of the nodes into sub-graphs (SGs) with the edges between them, and
the three merge patterns of GraphTurbo's grouping (seed 000 §3.2, Fig. 4) as queries on it.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace

import tvm
from tvm import relax



@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]
    dtype: str
    producer: int | None  # node index; None for graph inputs and constants
    constant: bool = False
    expr: object = field(default=None, compare=False, repr=False)  # the Relax variable or constant

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * tvm.runtime.DataType(self.dtype).bits // 8


@dataclass(frozen=True)
class Node:
    index: int
    name: str  # the Relax variable it binds
    func: str  # the PrimFunc it calls
    inputs: tuple[str, ...]  # tensor names, in argument order
    output: str


@dataclass(frozen=True)
class OpGraph:
    nodes: tuple[Node, ...]
    tensors: dict  # name -> Tensor
    outputs: tuple[str, ...]  # produced tensors used other than by a node (returned, host ops, tuples)
    names: dict = field(default_factory=dict, compare=False, repr=False)  # Relax variable -> tensor
    params: tuple[str, ...] = ()  # the tensors ``main`` takes (the others no layer makes come from other bindings)

    def producers(self, i: int) -> set[int]:
        return {self.tensors[t].producer for t in self.nodes[i].inputs if self.tensors[t].producer is not None}

    def consumers(self, i: int) -> set[int]:
        return set(self._readers.get(self.nodes[i].output, ()))

    def boundary(self, nodes) -> tuple[list[str], list[str]]:
        """(inputs, outputs) of a group of nodes: tensors they read from outside, tensors they
        produce that something outside reads or ``main`` returns."""
        members = {n.output for n in nodes}
        inputs, outputs = [], []
        for n in nodes:
            for t in n.inputs:
                if t not in members and t not in inputs:
                    inputs.append(t)
            consumers = [m for m in self.nodes if n.output in m.inputs and m.output not in members]
            if consumers or n.output in self.outputs:
                outputs.append(n.output)
        return inputs, outputs

    @functools.cached_property
    def _readers(self) -> dict:
        """Tensor -> indices of the nodes that read it."""
        out: dict = {}
        for n in self.nodes:
            for t in n.inputs:
                out.setdefault(t, set()).add(n.index)
        return out

    @classmethod
    def from_relax(cls, mod: tvm.IRModule, func: str = "main", symbolic: bool = False) -> "OpGraph":
        """The graph of ``call_tir`` nodes of ``mod[func]`` (after FuseOps/FuseTIR). Tensors are
        named after their Relax variables, made unique (Relax allows two variables one name).
        ``symbolic``: a dynamic model's, a symbolic dim kept as its expression's text (``batch``,
        ``seq * 64``; a shape Relax does not know is ``("?",)``); else every dim must be known."""
        f = mod[func]
        tensors: dict[str, Tensor] = {}
        names: dict = {}  # Relax variable -> tensor name

        def name_of(var) -> str:
            if var not in names:
                base, k = var.name, 1
                name = base
                while name in tensors or name in names.values():
                    name, k = f"{base}_{k}", k + 1
                names[var] = name
            return names[var]

        def tensor_of(expr) -> str:
            if isinstance(expr, tvm.ir.expr.Constant):
                name = f"const{len(tensors)}"
                tensors[name] = Tensor(name, _shape(expr, symbolic), _dtype(expr), None, True, expr)
                return name
            if isinstance(expr, relax.Var):
                name = name_of(expr)
                if name not in tensors:
                    tensors[name] = Tensor(name, _shape(expr, symbolic), _dtype(expr), None, expr=expr)
                return name
            raise ValueError(f"argument {expr} is neither a variable nor a constant")

        params = tuple(tensor_of(p) for p in f.params)
        call_tir = tvm.ir.Op.get("relax.call_tir")
        nodes: list[Node] = []
        escaping: list = []
        for block in f.body.blocks:
            for binding in block.bindings:
                value, var = binding.value, binding.var
                if isinstance(value, relax.Call) and value.op.same_as(call_tir) and isinstance(var.ty, relax.TensorType):
                    # scalar arguments (a dynamic kernel's symbols) are not tensors
                    inputs = tuple(tensor_of(a) for a in value.args[1].fields if isinstance(a.ty, relax.TensorType))
                    name = name_of(var)
                    tensors[name] = Tensor(name, _shape(var, symbolic), _dtype(var), len(nodes), expr=var)
                    nodes.append(Node(len(nodes), name, value.args[0].name_hint, inputs, name))
                elif isinstance(value, relax.Var):
                    names[var] = name_of(value)  # an alias names the same tensor
                else:  # any other use (a tuple, a host op, a kernel of several outputs) takes the
                    # tensor off the layer graph
                    escaping += [v for v in relax.analysis.free_vars(value)]
        escaping += list(relax.analysis.free_vars(f.body.body))
        outputs = list(dict.fromkeys(names[v] for v in escaping if v in names and names[v] in tensors
                                     and tensors[names[v]].producer is not None))
        return cls(tuple(nodes), tensors, tuple(outputs), names, params)

    @property
    def batch(self) -> int | None:
        """The leading dimension the non-constant graph inputs share (None when they disagree)."""
        inputs = [t for t in self.tensors.values() if t.producer is None and not t.constant]
        batch = {t.shape[0] if t.shape else None for t in inputs}
        return batch.pop() if len(batch) == 1 else None

    def per_cluster(self, clusters: int) -> tuple["OpGraph", int]:
        """The graph one of ``clusters`` clusters runs when the batch is split across them
        (GraphTurbo's data parallelism, seed 000 §2.1), and the divisor applied (1 when it is not).
        The batch is the leading dimension the non-constant graph inputs share; an activation
        whose leading dimension is a multiple of it (``N``, or ``N * S`` after a batch-major
        reshape) gets that dimension divided by ``clusters``. Other activations keep their shape,
        which over-states their share. Not split when the inputs disagree on a batch or the
        batch does not divide by ``clusters``."""
        n = self.batch
        if clusters <= 1 or not n or n % clusters:
            return self, 1
        tensors = {name: t if t.constant or not t.shape or t.shape[0] % n
                   else replace(t, shape=(t.shape[0] // clusters, *t.shape[1:]))
                   for name, t in self.tensors.items()}
        return replace(self, tensors=tensors), clusters


def _shape(expr, symbolic: bool = False) -> tuple:
    if symbolic:
        if expr.ty.shape is None:
            return ("?",)
        return tuple(int(s) if isinstance(s, tvm.tirx.IntImm) else str(s) for s in expr.ty.shape)
    return tuple(int(s) for s in expr.ty.shape)


def _dtype(expr) -> str:
    return str(expr.ty.dtype)


class SubGraphs:
    """A partition of an ``OpGraph``'s nodes into sub-graphs, kept in topological order."""

    def __init__(self, graph: OpGraph, groups: list[frozenset[int]] | None = None):
        self.graph = graph
        self.groups = groups or [frozenset({n.index}) for n in graph.nodes]
        self._index()

    def _index(self) -> None:
        self.groups.sort(key=min)  # nodes are in topological order, so is each SG's first node
        self.owner = {n: g for g, members in enumerate(self.groups) for n in members}

    def producers(self, g: int) -> set[int]:
        return {self.owner[p] for n in self.groups[g] for p in self.graph.producers(n)} - {g}

    def consumers(self, g: int) -> set[int]:
        return {self.owner[c] for n in self.groups[g] for c in self.graph.consumers(n)} - {g}

    def merge(self, members: set[int]) -> int:
        """Fuse the SGs ``members`` into one; returns its new index."""
        fused = frozenset().union(*(self.groups[g] for g in members))
        self.groups = [grp for g, grp in enumerate(self.groups) if g not in members] + [fused]
        self._index()
        return self.owner[min(fused)]

    # -- the merge patterns of Fig. 4: each yields the SGs that the pattern fuses --------------
    def straight(self):
        """(a) SG1 is SG2's only producer and SG2 is SG1's only consumer: fuse {SG1, SG2}."""
        for g in range(len(self.groups)):
            cons = self.consumers(g)
            if len(cons) == 1:
                (c,) = cons
                if self.producers(c) == {g}:
                    yield {g, c}

    def diamond(self):
        """(b) An entry SG1 feeding SG2 and SG3, both consumed only by the exit SG4 (which may
        also read SG1): two paths from entry to exit. Fuse {SG2, SG3, SG4}."""
        for exit_ in range(len(self.groups)):
            mids = [p for p in self.producers(exit_) if self.consumers(p) == {exit_}]
            for i, a in enumerate(mids):
                for b in mids[i + 1:]:
                    entry = self.producers(a)
                    if len(entry) == 1 and entry == self.producers(b):
                        yield {a, b, exit_}

    def branch(self):
        """(c) Three SGs with one exit SG3 reached by several paths: SG3 reads SG2 and SG1, SG2 is
        consumed only by SG3, and SG1 may (but need not) also feed SG2. Fuse {SG2, SG3}.

        Which producer plays SG2 is not fixed by the seed (docs/graphturbo.md, §2 [AMBIG]); every
        producer consumed only by the exit is offered, latest first (the block's shortcut)."""
        for exit_ in range(len(self.groups)):
            producers = self.producers(exit_)
            if len(producers) + self._reads_graph_input(exit_) < 2:
                continue
            for b in sorted(producers, reverse=True):
                if self.consumers(b) == {exit_}:
                    yield {b, exit_}

    def _reads_graph_input(self, g: int) -> int:
        """1 when the SG reads an activation that no node produces (a graph input), else 0."""
        for n in self.groups[g]:
            for t in self.graph.nodes[n].inputs:
                tensor = self.graph.tensors[t]
                if tensor.producer is None and not tensor.constant:
                    return 1
        return 0
