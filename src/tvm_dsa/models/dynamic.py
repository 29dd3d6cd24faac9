"""Dynamic models for SoD2 (seed 001): symbolic input dims, shape computations, control flow.

Written the way the PyTorch / Hugging Face exporters write dynamic graphs: reshapes take shapes
computed from ``Shape`` (``Shape → Gather / Slice → Unsqueeze → Concat → Reshape``), position
ids are ``Range(0, Shape(ids)[1])``, token types ``ConstantOfShape(Shape(ids))``, data-dependent
gates are ``If`` nodes (SkipNet / ConvNet-AIG: a block runs or is skipped).

>>> from tvm_dsa.models.dynamic import DYNAMIC
>>> model = DYNAMIC["bert"]()          # input_ids int64 [batch, seq]
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper

from tvm_dsa.models.builder import GraphBuilder


def _dims(b: GraphBuilder, x: str, start: int, end: int) -> str:
    """Shape(x)[start:end] as a 1-d int64 tensor."""
    s = b.op("Shape", [x])
    return b.op("Slice", [s, b.const(np.array([start], np.int64), "starts"),
                          b.const(np.array([end], np.int64), "ends")])


def _reshape_keep(b: GraphBuilder, x: str, keep: int, tail) -> str:
    """Reshape x to Shape(x)[:keep] + tail, the shape computed in the graph."""
    shape = b.op("Concat", [_dims(b, x, 0, keep), b.const(np.array(tail, np.int64), "tail")], axis=0)
    return b.op("Reshape", [x, shape])


def bert(layers: int = 2, hidden: int = 64, heads: int = 4, ffn: int = 256, vocab: int = 100,
         max_position: int = 64, seed: int = 0) -> onnx.ModelProto:
    """BERT encoder over ``input_ids`` int64 [batch, seq], batch and seq symbolic."""
    dh = hidden // heads
    b = GraphBuilder("bert_dynamic", seed)
    ids = b.input("input_ids", ["batch", "seq"], np.int64, value_range=(0, vocab))
    with b.scope("embeddings"):
        # HF: position_ids[:, :seq_length] of a registered buffer arange(max_position)
        pos = b.op("Slice", [b.const(np.arange(max_position, dtype=np.int64)[None], "position_ids"),
                             b.const(np.array([0], np.int64), "starts"), _dims(b, ids, 1, 2),
                             b.const(np.array([1], np.int64), "axes")])
        types = b.op("ConstantOfShape", [b.op("Shape", [ids])],
                     value=helper.make_tensor("zero", TensorProto.INT64, [1], [0]))
        x = b.gather(b.param("word_embeddings", [vocab, hidden], 1.0), ids)
        x = b.add(x, b.gather(b.param("token_type_embeddings", [2, hidden], 0.5), types))
        x = b.add(x, b.gather(b.param("position_embeddings", [max_position, hidden], 0.5), pos))
        x = b.layernorm(x, hidden, eps=1e-12, name="LayerNorm")
    for i in range(layers):
        with b.scope(f"encoder.layer.{i}"):
            heads_of = lambda t, perm: b.transpose(_reshape_keep(b, t, 2, [heads, dh]), perm)  # noqa: E731
            q = heads_of(b.linear(x, hidden, hidden, name="query"), [0, 2, 1, 3])
            k = heads_of(b.linear(x, hidden, hidden, name="key"), [0, 2, 3, 1])
            v = heads_of(b.linear(x, hidden, hidden, name="value"), [0, 2, 1, 3])
            s = b.op("Div", [b.op("MatMul", [q, k]), b.const(np.float32(math.sqrt(dh)), "sqrt_dh")])
            o = b.transpose(b.op("MatMul", [b.op("Softmax", [s], axis=-1), v]), [0, 2, 1, 3])
            o = b.linear(_reshape_keep(b, o, 2, [hidden]), hidden, hidden, name="output")
            x = b.layernorm(b.add(o, x), hidden, eps=1e-12, name="attention.LayerNorm")
            f = b.linear(b.gelu(b.linear(x, hidden, ffn, gain=2.0, name="fc1")), ffn, hidden, name="fc2")
            x = b.layernorm(b.add(f, x), hidden, eps=1e-12, name="output.LayerNorm")
    b.output(x, "last_hidden_state")
    return b.build(dict(layers=layers, hidden=hidden, heads=heads, ffn=ffn, vocab=vocab))


def _conv(b: GraphBuilder, x: str, cin: int, cout: int, stride: int = 1, act: bool = True,
          folded: bool = False, name: str = "conv") -> str:
    """3x3 convolution, then batch norm and ReLU; ``folded``: batch norm folded into the
    convolution's bias, as ``torch.onnx.export`` does in eval mode (TVM's importer cannot take a
    BatchNormalization inside an If branch: it returns the op's tuple where one tensor is due)."""
    if not folded:
        return b.conv_bn(x, cin, cout, 3, stride=stride, act="relu" if act else None, name=name)
    y = b.conv(x, cin, cout, 3, stride, 1, bias=True, gain=2.0 if act else 1.0, name=name)
    return b.relu(y) if act else y


def _residual(b: GraphBuilder, x: str, c: int, folded: bool = False) -> str:
    y = _conv(b, x, c, c, folded=folded, name="conv1")
    y = _conv(b, y, c, c, act=False, folded=folded, name="conv2")
    return b.relu(b.add(y, x))


def cnn(width: int = 8, num_classes: int = 10, seed: int = 0) -> onnx.ModelProto:
    """A small ResNet-like CNN over ``input`` [batch, 3, height, width], all three symbolic; the
    classifier flattens with ``x.view(x.size(0), -1)`` as exported."""
    b = GraphBuilder("cnn_dynamic", seed)
    x = b.input("input", ["batch", 3, "height", "width"])
    x = b.conv_bn(x, 3, width, 3, name="stem")
    x = b.maxpool(x, 3, 2, 1)
    with b.scope("layer1"):
        x = _residual(b, x, width)
    with b.scope("layer2"):
        x = b.conv_bn(x, width, 2 * width, 3, stride=2, name="down")
        x = _residual(b, x, 2 * width)
    x = b.op("GlobalAveragePool", [x])
    x = _reshape_keep(b, x, 1, [-1])
    b.output(b.gemm(x, 2 * width, num_classes, name="fc"), "logits")
    return b.build(dict(width=width, num_classes=num_classes))


def shape_chain(hidden: int = 64, heads: int = 4, max_position: int = 64, seed: int = 0) -> onnx.ModelProto:
    """Positions and a multi-head split and merge over ``x`` [batch, seq, hidden]: the positions
    are ``Range(0, Shape(x)[1])``, the split and merge shapes Shape → Gather → Unsqueeze → Concat
    → Reshape, as exported from ``x.view(x.size(0), x.size(1), h, d)``."""
    b = GraphBuilder("shape_chain", seed)
    x = b.input("x", ["batch", "seq", hidden])
    # batch, seq = x.shape[:2], read once at the top (the importer needs the Shape of a tensor
    # whose dims it knows: after the positional add below, Relax no longer does)
    sizes = [b.op("Gather", [b.op("Shape", [x]), b.const(np.int64(i), "index")], axis=0) for i in (0, 1)]
    # positions as arange(seq): Range(0, seq, 1), an embedding lookup, broadcast
    pos = b.op("Range", [b.const(np.int64(0), "zero"), sizes[1], b.const(np.int64(1), "step")])
    x = b.add(x, b.gather(b.param("position_embeddings", [max_position, hidden], 0.5), pos))
    dims = [b.op("Unsqueeze", [d, b.const(np.array([0], np.int64), "axes")]) for d in sizes]
    split = b.op("Concat", [*dims, b.const(np.array([heads, hidden // heads], np.int64), "heads")], axis=0)
    y = b.transpose(b.op("Reshape", [b.linear(x, hidden, hidden), split]), [0, 2, 1, 3])
    y = b.transpose(b.op("Softmax", [y], axis=-1), [0, 2, 1, 3])
    merge = b.op("Concat", [*dims, b.const(np.array([hidden], np.int64), "hidden")], axis=0)
    b.output(b.linear(b.op("Reshape", [y, merge]), hidden, hidden), "y")
    return b.build(dict(hidden=hidden, heads=heads, max_position=max_position))


def _branch(b: GraphBuilder, name: str, build: Callable[[], str]) -> onnx.GraphProto:
    """An If branch: the nodes ``build`` appends, taken out of the main graph."""
    start = len(b.nodes)
    out = build()
    nodes = b.nodes[start:]
    del b.nodes[start:]
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)])


def _gate(b: GraphBuilder, x: str, threshold: float) -> str:
    """A data-dependent gate, one decision per run: the block runs when the mean activation
    exceeds ``threshold``. (SkipNet learns its gate, GlobalAveragePool → Linear → Sigmoid; a
    fixed rule takes both ways for inputs of different scales, which tests need.)"""
    return b.op("Greater", [b.op("ReduceMean", [x], keepdims=0), b.const(np.float32(threshold), "threshold")])


def skipnet(width: int = 8, num_classes: int = 10, seed: int = 0) -> onnx.ModelProto:
    """An If-gated CNN over ``input`` [batch, 3, height, width]: the first gated block is run or
    skipped (same shape either way), the second downsamples either by a strided conv block or
    by average pooling (the two differ in shape for odd sizes)."""
    b = GraphBuilder("skipnet", seed)
    x = b.input("input", ["batch", 3, "height", "width"])
    x = b.conv_bn(x, 3, width, 3, name="stem")
    with b.scope("block1"):
        cond = _gate(b, x, 0.5)
        run = _branch(b, "run", lambda: _residual(b, x, width, folded=True))
        skip = _branch(b, "skip", lambda: b.op("Identity", [x]))
        x = b.op("If", [cond], then_branch=run, else_branch=skip)
    with b.scope("block2"):
        cond = _gate(b, x, 0.5)
        run = _branch(b, "run", lambda: _conv(b, x, width, width, stride=2, folded=True, name="down"))
        skip = _branch(b, "skip", lambda: b.avgpool(x, 2, 2))
        x = b.op("If", [cond], then_branch=run, else_branch=skip)
    # global pooling as a mean over H, W (the importer's GlobalAveragePool needs the dims that
    # Relax lost at the If)
    x = b.op("ReduceMean", [x], axes=[2, 3], keepdims=0)
    b.output(b.gemm(x, width, num_classes, name="fc"), "logits")
    return b.build(dict(width=width, num_classes=num_classes))


def nonzero(features: int = 16, out: int = 32, seed: int = 0) -> onnx.ModelProto:
    """Select rows, then a linear layer: ``x`` [rows, features] keeps the rows whose sum is
    positive (``NonZero`` → ``Gather``: how many is known only at run time), ``Relu(x W + b)``."""
    b = GraphBuilder("nonzero", seed)
    x = b.input("x", ["rows", features])
    total = b.op("ReduceSum", [x, b.const(np.array([1], np.int64), "axes")], keepdims=0)
    keep = b.op("NonZero", [b.op("Greater", [total, b.const(np.float32(0), "zero")])])  # [1, count]
    rows = b.op("Gather", [x, b.op("Squeeze", [keep, b.const(np.array([0], np.int64), "axes")])], axis=0)
    b.output(b.relu(b.linear(rows, features, out, name="fc")), "y")
    return b.build(dict(features=features, out=out))


def topk(seed: int = 0) -> onnx.ModelProto:
    """``TopK`` with ``k`` computed from the shape, ``k = n // 2`` of ``x`` [batch, n] (TVM's
    importer refuses it): ``Sigmoid(2 values)`` and the indices (as floats)."""
    b = GraphBuilder("topk", seed)
    x = b.input("x", ["batch", "n"])
    n = b.op("Gather", [b.op("Shape", [x]), b.const(np.int64(1), "one")], axis=0)
    k = b.op("Unsqueeze", [b.op("Div", [n, b.const(np.int64(2), "two")]), b.const(np.array([0], np.int64), "axes")])
    values, indices = b.op("TopK", [x, k], outputs=2, axis=-1)
    b.output(b.op("Sigmoid", [b.op("Mul", [values, b.const(np.float32(2), "two_f")])]), "y")
    b.output(b.op("Cast", [indices], to=TensorProto.FLOAT), "indices")
    return b.build()


def topk_data(seed: int = 0) -> onnx.ModelProto:
    """``TopK`` with a data-dependent ``k``: the most positive entries of any row of ``x``
    [batch, n] (``ReduceMax(ReduceSum(Cast(x > 0)))``); an execution-determined output shape."""
    b = GraphBuilder("topk_data", seed)
    x = b.input("x", ["batch", "n"])
    positive = b.op("Cast", [b.op("Greater", [x, b.const(np.float32(0), "zero")])], to=TensorProto.INT64)
    counts = b.op("ReduceSum", [positive, b.const(np.array([1], np.int64), "axes")], keepdims=0)
    k = b.op("ReduceMax", [counts], keepdims=1)  # [1]
    values, _ = b.op("TopK", [x, k], outputs=2, axis=-1)
    b.output(b.op("Sigmoid", [values]), "y")
    return b.build()


def range_shape(features: int = 16, out: int = 8, seed: int = 0) -> onnx.ModelProto:
    """``Range`` from ``Shape``: position weights ``Range(0, 2 seq, 2) / (2 seq)`` over ``x``
    [batch, seq, features], the limit computed from the shape (TVM's importer loses the length;
    RDP proves it is ``seq``), then a linear layer."""
    b = GraphBuilder("range_shape", seed)
    x = b.input("x", ["batch", "seq", features])
    seq = b.op("Gather", [b.op("Shape", [x]), b.const(np.int64(1), "one")], axis=0)
    limit = b.op("Mul", [seq, b.const(np.int64(2), "two")])
    r = b.op("Range", [b.const(np.int64(0), "zero"), limit, b.const(np.int64(2), "step")])
    w = b.op("Div", [b.op("Cast", [r], to=TensorProto.FLOAT), b.op("Cast", [limit], to=TensorProto.FLOAT)])
    y = b.op("Mul", [x, b.op("Unsqueeze", [w, b.const(np.array([1], np.int64), "axes")])])
    b.output(b.op("Tanh", [b.linear(y, features, out, name="fc")]), "y")
    return b.build(dict(features=features, out=out))


DYNAMIC: dict[str, Callable[..., onnx.ModelProto]] = {
    "bert": bert, "cnn": cnn, "shape_chain": shape_chain, "skipnet": skipnet,
}
# data-dependent shapes (seed 001's EDO and ISVDOS ops with computed inputs); these need
# ``tvm_dsa.frontend.from_onnx`` where TVM's importer refuses them (TopK)
DATA_DEPENDENT: dict[str, Callable[..., onnx.ModelProto]] = {
    "nonzero": nonzero, "topk": topk, "topk_data": topk_data, "range_shape": range_shape,
}

__all__ = ["DATA_DEPENDENT", "DYNAMIC", "bert", "cnn", "nonzero", "range_shape", "shape_chain", "skipnet",
           "topk", "topk_data"]
