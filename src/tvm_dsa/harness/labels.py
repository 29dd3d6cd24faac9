"""Layers named after the model's own ONNX nodes, not after Relax temporaries (``lv6_1``, ``sg0_lv``).

TVM's ONNX importer keeps no node names (no spans; its variables are numbered ``lv``, ``lv1``,
...), and the passes before fusion renumber them again (batch-norm folding makes new
convolutions, ``FuseOps`` new variables). So the fused module's layers are matched to the ONNX
graph by their data flow: graph inputs are the same tensors in both, and each layer, in order, is
the sub-graph of nodes between the tensors it reads and one ONNX tensor of its output shape
computed from them alone (constants aside). Of several such tensors a layer takes one whose
nodes hold weights of its weights' sizes; then the one whose weights it holds by value (batch-norm
folding changes a convolution's, not a MatMul's: a transformer's Q and K), the one whose ops its
PrimFunc's name shows (``fused_conv2d_add_relu``), the earliest sub-graph, the longest (fusion
takes the elementwise ops after a contraction); and one its readers in the fused module can
follow. A layer the graph does not explain (a rewrite's own kernel) keeps its PrimFunc's name.
Each layer's constants are named by the initializers they hold (``Label.weights``); a dynamic
model's symbolic dims match any (``shape_text`` shows them by name), and its ``If`` branches are
matched to the ONNX ``If``'s (``layer_graphs``); a layer made of two (a depthwise and pointwise
pair) is ``joined``.

    labels = layer_labels(model, fused_module)      # Relax layer name -> Label
    str(labels["lv6_1"])                            # 'layer3.0.conv1.conv.Conv +2 1x64x2x2'
    kernel_label([labels[n] for n in offload.layers["sg0_lv"]])   # '... and 12 more layers'
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
from collections import Counter
from dataclasses import dataclass, field, replace

import numpy as np
import onnx
import tvm
from onnx import helper, numpy_helper

from tvm_dsa.schedule.graph import OpGraph

# ONNX ops whose node names a layer is labelled by when its sub-graph holds one (its anchor)
CONTRACTIONS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "Einsum", "QLinearConv", "QLinearMatMul",
                          "ConvInteger", "MatMulInteger"})
# ONNX ops a fused PrimFunc's name shows (``FuseOps`` names it after its Relax ops), by those names
SHOWN = {"Conv": ("conv",), "ConvTranspose": ("conv",), "MatMul": ("matmul",), "Gemm": ("matmul", "dense"),
         "LayerNormalization": ("layer_norm",), "Softmax": ("softmax",), "Transpose": ("transpose", "permute"),
         "MaxPool": ("max_pool",), "AveragePool": ("avg_pool",), "GlobalAveragePool": ("mean", "avg_pool"),
         "ReduceMean": ("mean",), "Concat": ("concat",), "Gather": ("take", "gather"), "Erf": ("erf",)}
# ONNX ops that only move or rename data, and those that only (de)quantize it: a layer is labelled by
# another op where it has one, by a move before a (de)quantization
MOVES = frozenset({"Identity", "Dropout", "Cast", "Reshape", "Flatten", "Squeeze", "Unsqueeze"})
QDQ = frozenset({"QuantizeLinear", "DequantizeLinear"})
SMALL = 1024  # elements of an initializer shape inference keeps (shapes, axes); larger ones are weights
# ONNX ops whose outputs are known when the model is compiled (static shapes): never a layer's
SHAPE_OPS = frozenset({"Shape", "Size", "Constant", "ConstantOfShape"})
# ONNX ops whose sub-graphs compute their results (Relax's If and its branches): never in a layer
BRANCHING = frozenset({"If", "Loop", "Scan"})


@dataclass(frozen=True)
class Label:
    """A layer of the fused module as the model names it: ``anchor`` (the contraction's node, else
    the last that does more than move data; its name, or its op type when it has none) of the
    ``nodes`` it computes, and its output ``shape``. ``name`` is the Relax variable (for
    debugging); a layer the ONNX graph does not explain has no nodes and its PrimFunc's name
    (``for`` the first reader the graph explains: ``fused_less_add_where for embeddings.gather``)."""

    name: str
    anchor: str
    op: str
    nodes: tuple[str, ...]
    shape: tuple[int, ...]
    # its constants: (Relax constant, the model's name of it: ``_Matcher._weight``)
    weights: tuple[tuple[str, str], ...] = ()
    anchors: int = 1  # nodes ``anchor`` names: 2 for a fused pair's layer (``joined``)

    def __str__(self) -> str:
        more = len(self.nodes) - self.anchors
        return f"{self.anchor}{f' +{more}' if more > 0 else ''} {shape_text(self.shape)}"

    def to_dict(self) -> dict:
        return {"relax": self.name, "label": str(self), "anchor": self.anchor, "op": self.op,
                "onnx_nodes": list(self.nodes), "shape": list(self.shape), "weights": dict(self.weights)}


def joined(name: str, parts: list[Label]) -> Label:
    """The layer ``name`` that computes the layers ``parts`` (in order) in one kernel: a depthwise
    and a pointwise convolution (``kernelgen.blocks``), ``dw + pw +3 8x16x16x16``; labelled by
    each part's anchor, its op and shape the last part's."""
    named = [p for p in parts if p.nodes] or parts
    return Label(name, " + ".join(p.anchor for p in named), parts[-1].op, tuple(n for p in parts for n in p.nodes),
                 parts[-1].shape, tuple(w for p in parts for w in p.weights), len(named))


def shape_text(shape: tuple) -> str:
    """``1x64x2x2``; with symbolic dims, by their names, one computed in brackets:
    ``batch x 8 x [(height - 1) // 2 + 1]``."""
    if not shape:
        return "scalar"
    if all(isinstance(d, int) for d in shape):
        return "x".join(map(str, shape))
    dims = [re.sub(r"T\.int(?:32|64)\((-?\d+)\)", r"\1", str(d)) for d in shape]
    return " x ".join(f"[{d}]" if " " in d else d for d in dims)


def layer_labels(model: onnx.ModelProto, fused) -> dict[str, Label]:
    """Each layer (``OpGraph`` node) of ``fused`` (``model`` imported and fused:
    ``relax_passes.fusion.fuse``), and of its ``If`` branches (``layer_graphs``), by name -> its
    ``Label``."""
    graphs = layer_graphs(fused)
    main = _Matcher(model)
    ifs = [n for n in model.graph.node if n.op_type == "If"]
    matched = len(ifs) == len(graphs[0].ifs)  # Relax's Ifs are ONNX's, in order
    known = {graphs[0].graph.names[var]: (n.output[0],) for var, n in zip(graphs[0].ifs, ifs)
             if var in graphs[0].graph.names} if matched else {}
    labels = main.match(graphs[0].graph, known)
    for g in graphs[1:]:
        if matched:
            onnx_if = ifs[g.where[0]]
            branch = next(a.g for a in onnx_if.attribute if a.name == ("then_branch", "else_branch")[g.where[1]])
            outer = {g.graph.names[v]: main.known[graphs[0].graph.names[v]] for v in g.params
                     if v in g.graph.names and graphs[0].graph.names.get(v) in main.known}
            found = _Matcher(_branch_model(model, branch, main.shapes)).match(g.graph, outer, inputs=False)
        else:
            found = {n.name: Label(n.name, f"{n.func} (in an If branch: the model's Ifs do not match Relax's)", "", (),
                                   g.graph.tensors[n.output].shape) for n in g.graph.nodes}
        labels |= {g.keys[name]: replace(label, name=g.keys[name]) for name, label in found.items()}
    return labels


@dataclass(frozen=True)
class ScopeGraph:
    """``main``'s layers or those of one branch of one of its ``If`` bindings (``where``: its
    index among them and 0 for the true branch, 1 the false; ``params`` the outer variables it
    reads); ``keys``: a layer's name -> its key among all graphs' (its own, ``@if<i><t|f>`` added
    where another graph has it), ``ifs``: ``main``'s ``If`` variables in order."""

    graph: OpGraph
    where: tuple = ()
    params: tuple = ()
    keys: dict = field(default_factory=dict)
    ifs: tuple = ()


def layer_graphs(fused) -> list[ScopeGraph]:
    """The layers of ``fused``'s ``main`` and of its ``If`` bindings' branches (a dynamic model's:
    ``OpGraph`` leaves them out), each as a graph of its own."""
    from tvm import relax

    graph = OpGraph.from_relax(fused, symbolic=True)
    bindings = [b for block in fused["main"].body.blocks for b in block.bindings]
    ifs = [b for b in bindings if isinstance(b.value, relax.If)]
    out = [ScopeGraph(graph, keys={n.name: n.name for n in graph.nodes}, ifs=tuple(b.var for b in ifs))]
    taken = set(graph.tensors)
    for i, b in enumerate(ifs):
        for side, branch in enumerate((b.value.true_branch, b.value.false_branch)):
            params = tuple(v for v in relax.analysis.free_vars(branch) if isinstance(v.ty, relax.TensorType))
            sub = OpGraph.from_relax(tvm.IRModule({"main": relax.Function(params, branch, branch.ty, True)}),
                                     symbolic=True)
            keys = {n.name: n.name if n.name not in taken else f"{n.name}@if{i}{'tf'[side]}" for n in sub.nodes}
            taken |= set(keys.values())
            out.append(ScopeGraph(sub, (i, side), params, keys))
    return out


def layer_funcs(fused) -> dict[str, tuple[str, ...]]:
    """Each PrimFunc ``fused``'s ``main`` and its ``If`` branches call -> the layers (``layer_labels``'
    keys) that call it."""
    runs: dict[str, tuple] = {}
    for g in layer_graphs(fused):
        for node in g.graph.nodes:
            runs[node.func] = runs.get(node.func, ()) + (g.keys[node.name],)
    return runs


def _branch_model(model: onnx.ModelProto, branch: onnx.GraphProto, shapes: dict) -> onnx.ModelProto:
    """An ONNX ``If`` node's ``branch`` as a model of its own: the outer tensors it reads its inputs
    (of the ``shapes`` inferred outside, a float's type), ``model``'s initializers its own."""
    inits = {t.name for t in model.graph.initializer}
    inner = {o for n in branch.node for o in n.output}
    outer = dict.fromkeys(i for n in branch.node for i in n.input if i and i not in inner and i not in inits)
    inputs = [helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT,
                                            [d if d is not None else "?" for d in shapes[name]]
                                            if shapes.get(name) is not None else None) for name in outer]
    graph = helper.make_graph(list(branch.node), branch.name or "branch", inputs, list(branch.output),
                              list(model.graph.initializer))
    return helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)


def kernel_label(labels: list[Label]) -> str:
    """A kernel of the layers ``labels`` as the model names it: its first layer holding a
    contraction (else its first), and how many more it runs."""
    if not labels:
        return ""
    first = next((label for label in labels if label.op in CONTRACTIONS), labels[0])
    more = len(labels) - 1
    return str(first) + (f" and {more} more layer{'s' * (more > 1)}" if more else "")


class _Matcher:
    def __init__(self, model: onnx.ModelProto):
        self.model = model
        g = model.graph
        self.nodes = list(g.node)
        self.shapes = _shapes(model)
        inits = {t.name: tuple(t.dims) for t in g.initializer}
        # the weights' values, to tell apart layers of one weight shape (a transformer's Q and K)
        self.digest = {t.name: _digest(numpy_helper.to_array(t)) for t in g.initializer if _is_weight(t.dims)}
        self.inputs = [vi.name for vi in g.input if vi.name not in inits]
        self.constant = set(inits)
        for node in self.nodes:  # constant folding, as the import and SimplifyInference do
            if node.op_type in SHAPE_OPS or all(i in self.constant for i in node.input if i):
                self.constant.update(node.output)
        dims = {name: self.shapes.get(name) for name in self.constant} | inits
        self.size = {name: math.prod(d) for name, d in dims.items()
                     if d is not None and None not in d and _is_weight(d)}
        # a constant of a shape not known statically (a dynamic model's slice of a table: Relax keeps
        # the table and slices it in the kernel) -> the weight initializers it is computed from
        self.origins: dict[str, tuple[str, ...]] = {}
        for node in self.nodes:
            if all(o in self.constant for o in node.output if o):
                ins = [i for i in node.input if i]
                found = tuple(dict.fromkeys(x for i in ins for x in ((i,) if i in self.digest else self.origins.get(i, ()))))
                for o in node.output:
                    dims_o = self.shapes.get(o)
                    if o and found and (dims_o is None or None in dims_o):
                        self.origins[o] = found
        self.producer = {o: k for k, n in enumerate(self.nodes) for o in n.output if o}
        self.readers: list[set[int]] = [set() for _ in self.nodes]  # node -> the nodes reading its results
        for k, n in enumerate(self.nodes):
            for i in n.input:
                if i in self.producer:
                    self.readers[self.producer[i]].add(k)
        self.taken: set[int] = set()  # nodes some layer computes
        self.held: dict[str, str] = {}  # Relax constant -> the digest of its value
        self.sizes: dict[frozenset, Counter] = {}  # a sub-graph -> its weights' sizes

    def match(self, graph: OpGraph, known: dict | None = None, inputs: bool = True) -> dict[str, Label]:
        """The labels of ``graph``'s layers: its inputs the model's (``inputs``), and ``known``
        the ONNX tensors of other Relax tensors no layer computes (an ``If``'s result, a branch's
        outer inputs)."""
        params = [t for t in graph.tensors.values() if t.producer is None and not t.constant]
        # Relax tensor -> the ONNX tensors it stands for: one, or for a layer the graph does not
        # explain (a Gather's index wrapping) those it reads, so that its readers still match
        self.known = known = ({t.name: (o,) for t, o in zip(params, self.inputs)} if inputs else {}) | (known or {})
        labels, groups = {}, {}
        for node in graph.nodes:
            options = self._options(graph, node, known, self.taken)
            indexing = not options and self._indexing(graph, node, known)
            options = options or indexing
            found = next((c for c in options if self._followed(graph, node, known, c)), options[0] if options else None)
            shape = graph.tensors[node.output].shape
            if found is None:
                labels[node.name] = Label(node.name, node.func, "", (), shape)
                if all(t in known for t in _data(graph, node.index)):
                    known[node.output] = tuple(dict.fromkeys(o for t in _data(graph, node.index) for o in known[t]))
                continue
            tensor, group = found
            self.taken |= group
            groups[node.name] = group
            known[node.output] = () if indexing else (tensor,)  # computed from no data, as ONNX has it
            names = tuple(_name(self.nodes[k]) for k in sorted(group))
            anchor = self._anchor(group)
            labels[node.name] = Label(node.name, _name(self.nodes[anchor]), self.nodes[anchor].op_type, names, shape)
        explained: dict[str, str] = {}  # a layer -> the anchor of the first layer the graph explains it leads to
        for node in reversed(graph.nodes):  # one the graph does not explain, by that reader's
            readers = [graph.nodes[r].name for r in sorted(graph.consumers(node.index))]
            explained[node.name] = labels[node.name].anchor if labels[node.name].nodes else next(
                (explained[r] for r in readers if explained.get(r)), None)
            if not labels[node.name].nodes and explained[node.name] is not None:
                labels[node.name] = replace(labels[node.name], anchor=f"{node.func} for {explained[node.name]}")
        for node in graph.nodes:
            label, group = labels[node.name], groups.get(node.name, frozenset())
            consts = [t for t in dict.fromkeys(node.inputs) if graph.tensors[t].constant]
            labels[node.name] = replace(label, weights=tuple((t, self._weight(graph.tensors[t], group, label.anchor))
                                                             for t in consts))
        return labels

    def _weight(self, tensor, group: frozenset[int], anchor: str) -> str:
        """The model's name of the Relax constant ``tensor`` that a layer computing the nodes
        ``group``, labelled ``anchor``, reads: the initializer (or ``Constant`` node's value) it
        holds, by value (a reshape's, a matrix's transpose too), of those the layer's nodes read
        first; else the one initializer of its size they read, ``(folded)`` (batch-norm folding
        scales a convolution's weights), or of several the batch norm's bias (the folded bias,
        ``B - mean * scale / sqrt(var)``); else the layer's (``conv1's weight``)."""
        value = tensor.expr.value.numpy()
        digests = {_value_digest(value)}
        if value.squeeze().ndim == 2:
            digests.add(_value_digest(value.squeeze().T))
        read = list(dict.fromkeys(i for k in sorted(group) for i in self.nodes[k].input if i in self.values))
        held = [i for i in read if self.values[i][0] in digests]
        if held:
            return held[0]
        anywhere = next((i for i, (d, _) in self.values.items() if d in digests), None)
        if anywhere is not None:
            return anywhere
        sized = [i for i in read if self.values[i][1] == value.size]
        if len(sized) == 1:
            return f"{sized[0]} (folded)"
        norms = [self.nodes[k] for k in sorted(group) if self.nodes[k].op_type == "BatchNormalization"]
        if len(norms) == 1 and norms[0].input[2] in sized:  # a convolution's bias, of the norm's four
            return f"{norms[0].input[2]} (folded)"
        return f"{anchor}'s {'weight' if _is_weight(value.shape) else 'constant'}"

    @functools.cached_property
    def values(self) -> dict[str, tuple[str, int]]:
        """Each initializer's and ``Constant`` node's value by name -> (``_value_digest``, size)."""
        arrays = {t.name: t for t in self.model.graph.initializer}
        arrays |= {n.output[0]: a.t for n in self.nodes if n.op_type == "Constant" for a in n.attribute if a.name == "value"}
        return {name: (_value_digest(numpy_helper.to_array(t)), math.prod(t.dims)) for name, t in arrays.items()}

    def _indexing(self, graph: OpGraph, node, known: dict) -> list[tuple[str, frozenset[int]]]:
        """For a layer that reads only layers computed from no data (``known`` empty: a dynamic
        model's positions or zeros), the ONNX node that indexes a weight it holds by value with
        them: ONNX computes it from constants (its output's shape symbolic, ``origins``), Relax
        in a layer (``take`` of a position table)."""
        data = _data(graph, node.index)
        if not data or any(known.get(t) != () for t in data):
            return []
        held = {self._held(graph.tensors[t]) for t in node.inputs
                if graph.tensors[t].constant and _is_weight(graph.tensors[t].shape)}
        return [(n.output[0], frozenset({k})) for k, n in enumerate(self.nodes)
                if k not in self.taken and n.output and n.output[0] in self.origins
                and any(self.digest.get(i) in held for i in n.input)]

    def _followed(self, graph: OpGraph, node, known: dict, option: tuple[str, frozenset[int]]) -> bool:
        """Whether each reader of layer ``node`` whose other inputs are matched still has options
        once ``node`` computes ``option`` (a 1 x 1 pooling after a layer's last op has its shape,
        but is the next layer)."""
        tensor, group = option
        after = known | {node.output: (tensor,)}
        readers = [graph.nodes[r] for r in graph.consumers(node.index)]
        return all(self._options(graph, r, after, self.taken | group) for r in readers
                   if all(t in after for t in _data(graph, r.index)))

    def _anchor(self, group: frozenset[int]) -> int:
        """The node a layer computing ``group`` is labelled by: its first contraction, else its last
        op that computes, else its last move, else its last node."""
        def rank(k: int) -> tuple:
            op = self.nodes[k].op_type
            kind = 0 if op in CONTRACTIONS else 1 if op not in MOVES | QDQ else 2 if op in MOVES else 3
            return kind, k if kind == 0 else -k

        return min(group, key=rank)

    def _options(self, graph: OpGraph, node, known: dict, taken: set) -> list[tuple[str, frozenset[int]]]:
        """The (ONNX tensor, its sub-graph's nodes) that layer ``node`` may compute, best first,
        given the ONNX tensors of the Relax ones ``known`` and the nodes ``taken`` by layers: its
        weights' sizes those of the sub-graph's; the most of its weights' values the layer holds,
        the fewest of its ops the PrimFunc's name does not show, the earliest sub-graph, the
        longest."""
        data = _data(graph, node.index)
        if not data or any(t not in known for t in data):
            return []
        consts = [graph.tensors[t] for t in node.inputs
                  if graph.tensors[t].constant and _is_weight(graph.tensors[t].shape)]
        weights = Counter(math.prod(t.shape) for t in consts)
        held = {self._held(t) for t in consts}
        found = self._candidates([o for t in data for o in known[t]], graph.tensors[node.output].shape, taken)
        # inputs computed from no data (a dynamic model's positions, Range, or zeros, ConstantOfShape,
        # which ONNX computes from constants, and the tables they index: ``origins``)
        unseen = sum(not known[t] for t in data)
        return sorted((c for c in found if self._holds(c[1], weights)),
                      key=lambda c: (-len(held & self._digests(c[1])), abs(self._unheld(c[1], weights) - unseen),
                                     self._unshown(c[1], node.func), min(c[1]), -self.producer[c[0]]))

    def _candidates(self, reads: list[str], shape: tuple, taken: set) -> list[tuple[str, frozenset[int]]]:
        """Each ONNX tensor of ``shape`` computed from all of ``reads`` and constants alone, by
        nodes no layer has ``taken`` and whose other results only they read, with those nodes."""
        reads = list(dict.fromkeys(reads))
        if not reads:  # it reads only layers computed from no data (a dynamic model's positions: Range)
            return []
        bit = {t: 1 << i for i, t in enumerate(reads)}
        depends: dict[str, int] = dict(bit)  # tensor -> the reads it is computed from (a bit each)
        group: dict[str, frozenset[int]] = {t: frozenset() for t in reads}  # tensor -> the nodes computing it
        found = []
        first = min(self.producer.get(t, -1) for t in reads) + 1  # nodes are in topological order
        for k, n in enumerate(self.nodes[first:], first):
            if k in taken or n.op_type in BRANCHING or all(o in self.constant for o in n.output if o):
                continue
            ins = [i for i in n.input if i and i not in self.constant]
            if not ins or any(i not in depends for i in ins):
                continue
            mask, nodes = 0, frozenset({k})
            for i in ins:
                mask |= depends[i]
                nodes |= group[i]
            for o in n.output:
                if o and o not in bit:
                    depends[o], group[o] = mask, nodes
                    if mask == (1 << len(reads)) - 1 and self._fits(o, shape) and self._closed(o, nodes):
                        found.append((o, nodes))
        return found

    def _fits(self, tensor: str, shape: tuple) -> bool:
        """Whether ONNX's ``tensor`` may have the Relax ``shape``: each dim known to both the same (a
        symbolic one, a name in Relax and None in ONNX, fits any)."""
        dims = self.shapes.get(tensor)
        return dims is None or len(dims) == len(shape) and all(
            a is None or not isinstance(b, int) or a == b for a, b in zip(dims, shape))

    def _closed(self, tensor: str, nodes: frozenset[int]) -> bool:
        """Whether the tensors ``nodes`` compute, but for those of ``tensor``'s node, are read
        only inside them: a fused layer hides its intermediates."""
        own = self.producer[tensor]
        return all(self.readers[k] <= nodes for k in nodes if k != own)

    def _unshown(self, nodes: frozenset[int], func: str) -> int:
        """How many of ``nodes`` are ops a PrimFunc named ``func`` would show, and does not."""
        return sum(not any(op in func for op in SHOWN.get(self.nodes[k].op_type, (func,))) for k in nodes)

    def _held(self, tensor) -> str:
        """The digest of a Relax constant's value (once per constant)."""
        if tensor.name not in self.held:
            self.held[tensor.name] = _digest(tensor.expr.value.numpy())
        return self.held[tensor.name]

    def _digests(self, nodes: frozenset[int]) -> set[str]:
        """The digests of the initializer weights ``nodes`` read, directly or through constants of
        shapes not known statically (``origins``)."""
        return {self.digest[x] for k in nodes for i in self.nodes[k].input
                for x in self.origins.get(i, (i,)) if x in self.digest}

    def _weights(self, nodes: frozenset[int]) -> tuple[Counter, Counter]:
        """The sizes of the weights ``nodes`` read: those a layer computing them must hold, and
        those it may (a dynamic model's table that Relax slices in the kernel, or in a layer of
        its own: ``origins``)."""
        if nodes not in self.sizes:
            ins = [i for k in nodes for i in self.nodes[k].input]
            self.sizes[nodes] = (Counter(self.size[i] for i in ins if i in self.size),
                                 Counter(self.size[x] for i in ins for x in self.origins.get(i, ()) if x in self.size))
        return self.sizes[nodes]

    def _unheld(self, nodes: frozenset[int], weights: Counter) -> int:
        """How many of the weights ``nodes`` may hold (``_weights``) a layer of constants of the sizes
        ``weights`` does not: each was computed by a layer of its own from no data."""
        must, may = self._weights(nodes)
        return sum((may - (weights - must)).values())

    def _holds(self, nodes: frozenset[int], weights: Counter) -> bool:
        """Whether a layer of constants of the sizes ``weights`` may compute ``nodes``."""
        must, may = self._weights(nodes)
        return must <= weights and weights - must <= may


def _shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...] | None]:
    """Each value's shape as ONNX infers it, on a copy of ``model`` whose large initializers are
    inputs of their shape (inference copies the model: a model's weights cost seconds there)."""
    inputs = {vi.name for vi in model.graph.input}
    large = [t for t in model.graph.initializer if math.prod(t.dims) > SMALL]
    light = _without(model, {t.name for t in large})
    light.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, t.dims) for t in large
                             if t.name not in inputs)
    try:
        light = onnx.shape_inference.infer_shapes(light)
    except Exception:  # noqa: BLE001 - shapes are a check only: without them any shape is accepted
        pass
    return {vi.name: _dims(vi) for vi in [*light.graph.input, *light.graph.value_info, *light.graph.output]}


def _without(model: onnx.ModelProto, names: set[str]) -> onnx.ModelProto:
    """A copy of ``model`` without the initializers ``names`` (their data is never copied)."""
    kept = [t for t in model.graph.initializer if t.name not in names]
    graph = helper.make_graph(list(model.graph.node), model.graph.name, list(model.graph.input),
                              list(model.graph.output), kept, value_info=list(model.graph.value_info))
    return helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)


def _dims(vi: onnx.ValueInfoProto) -> tuple[int | None, ...] | None:
    """A value's shape, None where it is unknown, a dim None where it is symbolic or unknown."""
    if not vi.type.tensor_type.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim)


def _data(graph: OpGraph, index: int) -> list[str]:
    """The tensors layer ``index`` reads that are not constants."""
    return [t for t in graph.nodes[index].inputs if not graph.tensors[t].constant]


def _digest(array: np.ndarray) -> str:
    """A fingerprint of a weight's values: its shape and some 4,096 of its values, evenly spaced."""
    flat = array.reshape(-1)
    sample = np.ascontiguousarray(flat[::max(1, flat.size // 4096)])
    return hashlib.blake2b(repr(array.shape).encode() + sample.tobytes(), digest_size=16).hexdigest()


def _value_digest(array: np.ndarray) -> str:
    """A fingerprint of an array's values whatever its shape (a weight reshaped by the import
    keeps it): its dtype, size and some 4,096 of its values, evenly spaced."""
    flat = np.ascontiguousarray(array).reshape(-1)
    sample = np.ascontiguousarray(flat[::max(1, flat.size // 4096)])
    return hashlib.blake2b(f"{array.dtype} {flat.size}".encode() + sample.tobytes(), digest_size=16).hexdigest()


def _is_weight(shape) -> bool:
    """A constant of two or more dimensions above 1: a weight, not a bias or a scale (broadcast to
    ``1 x C x 1 x 1`` in Relax, ``C`` in ONNX)."""
    return sum(d > 1 for d in shape) >= 2


def _name(node: onnx.NodeProto) -> str:
    return node.name or node.op_type
