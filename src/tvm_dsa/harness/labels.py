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

    labels = layer_labels(model, fused_module)      # Relax layer name -> Label
    str(labels["lv6_1"])                            # 'layer3.0.conv1.conv.Conv +2 1x64x2x2'
    kernel_label([labels[n] for n in offload.layers["sg0_lv"]])   # '... and 12 more layers'
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from dataclasses import dataclass, replace

import numpy as np
import onnx
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

    def __str__(self) -> str:
        more = f" +{len(self.nodes) - 1}" if len(self.nodes) > 1 else ""
        return f"{self.anchor}{more} {'x'.join(map(str, self.shape)) or 'scalar'}"

    def to_dict(self) -> dict:
        return {"relax": self.name, "label": str(self), "anchor": self.anchor, "op": self.op,
                "onnx_nodes": list(self.nodes), "shape": list(self.shape)}


def layer_labels(model: onnx.ModelProto, fused) -> dict[str, Label]:
    """Each layer (``OpGraph`` node) of ``fused`` (``model`` imported and fused:
    ``relax_passes.fusion.fuse``) by name -> its ``Label``."""
    return _Matcher(model).match(OpGraph.from_relax(fused))


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
        self.size = {name: math.prod(d) for name, d in dims.items() if d is not None and _is_weight(d)}
        self.producer = {o: k for k, n in enumerate(self.nodes) for o in n.output if o}
        self.readers: list[set[int]] = [set() for _ in self.nodes]  # node -> the nodes reading its results
        for k, n in enumerate(self.nodes):
            for i in n.input:
                if i in self.producer:
                    self.readers[self.producer[i]].add(k)
        self.taken: set[int] = set()  # nodes some layer computes
        self.held: dict[str, str] = {}  # Relax constant -> the digest of its value
        self.sizes: dict[frozenset, Counter] = {}  # a sub-graph -> its weights' sizes

    def match(self, graph: OpGraph) -> dict[str, Label]:
        params = [t for t in graph.tensors.values() if t.producer is None and not t.constant]
        # Relax tensor -> the ONNX tensors it stands for: one, or for a layer the graph does not
        # explain (a Gather's index wrapping) those it reads, so that its readers still match
        known = {t.name: (onnx_name,) for t, onnx_name in zip(params, self.inputs)}
        labels = {}
        for node in graph.nodes:
            options = self._options(graph, node, known, self.taken)
            found = next((c for c in options if self._followed(graph, node, known, c)), options[0] if options else None)
            shape = graph.tensors[node.output].shape
            if found is None:
                labels[node.name] = Label(node.name, node.func, "", (), shape)
                if all(t in known for t in _data(graph, node.index)):
                    known[node.output] = tuple(dict.fromkeys(o for t in _data(graph, node.index) for o in known[t]))
                continue
            tensor, group = found
            self.taken |= group
            known[node.output] = (tensor,)
            names = tuple(_name(self.nodes[k]) for k in sorted(group))
            anchor = self._anchor(group)
            labels[node.name] = Label(node.name, _name(self.nodes[anchor]), self.nodes[anchor].op_type, names, shape)
        for node in graph.nodes:  # a layer the graph does not explain, by the first of its readers it does
            reader = next((labels[graph.nodes[r].name] for r in sorted(graph.consumers(node.index))
                           if labels[graph.nodes[r].name].nodes), None)
            if not labels[node.name].nodes and reader is not None:
                labels[node.name] = replace(labels[node.name], anchor=f"{node.func} for {reader.anchor}")
        return labels

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
        return sorted((c for c in found if self._weights(c[1]) == weights),
                      key=lambda c: (-len(held & self._digests(c[1])), self._unshown(c[1], node.func), min(c[1]),
                                     -self.producer[c[0]]))

    def _candidates(self, reads: list[str], shape: tuple, taken: set) -> list[tuple[str, frozenset[int]]]:
        """Each ONNX tensor of ``shape`` computed from all of ``reads`` and constants alone, by
        nodes no layer has ``taken`` and whose other results only they read, with those nodes."""
        reads = list(dict.fromkeys(reads))
        bit = {t: 1 << i for i, t in enumerate(reads)}
        depends: dict[str, int] = dict(bit)  # tensor -> the reads it is computed from (a bit each)
        group: dict[str, frozenset[int]] = {t: frozenset() for t in reads}  # tensor -> the nodes computing it
        found = []
        first = min(self.producer.get(t, -1) for t in reads) + 1  # nodes are in topological order
        for k, n in enumerate(self.nodes[first:], first):
            if k in taken or all(o in self.constant for o in n.output if o):
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
        dims = self.shapes.get(tensor)
        return dims is None or dims == tuple(shape)

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
        """The digests of the initializer weights ``nodes`` read."""
        return {self.digest[i] for k in nodes for i in self.nodes[k].input if i in self.digest}

    def _weights(self, nodes: frozenset[int]) -> Counter:
        """The sizes of the weights ``nodes`` read."""
        if nodes not in self.sizes:
            self.sizes[nodes] = Counter(self.size[i] for k in nodes for i in self.nodes[k].input if i in self.size)
        return self.sizes[nodes]


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


def _dims(vi: onnx.ValueInfoProto) -> tuple[int, ...] | None:
    """A value's static shape, None where a dim is symbolic or unknown."""
    dims = vi.type.tensor_type.shape.dim
    if not vi.type.tensor_type.HasField("shape") or any(not d.HasField("dim_value") for d in dims):
        return None
    return tuple(d.dim_value for d in dims)


def _data(graph: OpGraph, index: int) -> list[str]:
    """The tensors layer ``index`` reads that are not constants."""
    return [t for t in graph.nodes[index].inputs if not graph.tensors[t].constant]


def _digest(array: np.ndarray) -> str:
    """A fingerprint of a weight's values: its shape and some 4,096 of its values, evenly spaced."""
    flat = array.reshape(-1)
    sample = np.ascontiguousarray(flat[::max(1, flat.size // 4096)])
    return hashlib.blake2b(repr(array.shape).encode() + sample.tobytes(), digest_size=16).hexdigest()


def _is_weight(shape) -> bool:
    """A constant of two or more dimensions above 1: a weight, not a bias or a scale (broadcast to
    ``1 x C x 1 x 1`` in Relax, ``C`` in ONNX)."""
    return sum(d > 1 for d in shape) >= 2


def _name(node: onnx.NodeProto) -> str:
    return node.name or node.op_type
