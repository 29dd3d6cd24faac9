"""A small ONNX graph builder plus the layer helpers shared by all model families.

Every model in the zoo is written with :class:`GraphBuilder`: it creates nodes and
initializers with unique, scoped names (``layer1.0.conv1.weight``), draws seeded random
weights and knows the standard layer patterns, emitted the way the PyTorch / Hugging Face
ONNX exporters emit them (``Conv`` + ``BatchNormalization``, ``MatMul`` + ``Add``,
Erf-based GELU, ``LayerNormalization`` ...).

Weight initialisation keeps activations O(1) through the depth, so the models stay
well-conditioned in fp16:

* convolutions / linears followed by ReLU-like activations: He, ``std = sqrt(2 / fan_in)``;
* linears not followed by a rectifier: LeCun, ``std = sqrt(1 / fan_in)``;
* BatchNorm: ``gamma ~ 1 + N(0, 0.1)``, ``beta ~ N(0, 0.05)``, ``mean ~ N(0, 0.05)``,
  ``var ~ U(0.8, 1.2)`` (the residual branch's last BatchNorm gets a smaller gamma so the
  residual stream does not double its variance at every block);
* LayerNorm: ``gamma ~ 1 + N(0, 0.02)``, ``beta ~ N(0, 0.02)``.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections import Counter
from typing import Iterator, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

OPSET = 17
IR_VERSION = 10

#: metadata_props key holding ``{input_name: [low, high]}`` for integer inputs (high exclusive;
#: ``high`` may be a list giving one bound per index along the last axis).
META_INPUT_RANGES = "tvm_dsa.input_ranges"
META_MODEL = "tvm_dsa.model"
META_CONFIG = "tvm_dsa.config"

_NP_TO_ONNX = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.int64): TensorProto.INT64,
}


class GraphBuilder:
    """Accumulates nodes, initializers and graph inputs/outputs of one ONNX graph."""

    def __init__(self, name: str, seed: int = 0):
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        # Initializers are written straight into the final ModelProto: copying ~100 M
        # weights between protobuf messages would dominate the build time of BERT/ViT.
        self.model = onnx.ModelProto()
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[str] = []
        self.input_ranges: dict[str, list] = {}
        self._used: Counter[str] = Counter()
        self._scope: list[str] = []

    # ------------------------------------------------------------------ naming
    @contextlib.contextmanager
    def scope(self, name: str) -> Iterator[None]:
        """Prefix every name created inside the ``with`` block with ``name.``."""
        self._scope.append(name)
        try:
            yield
        finally:
            self._scope.pop()

    def unique(self, base: str) -> str:
        full = ".".join([*self._scope, base])
        n = self._used[full]
        self._used[full] += 1
        return full if n == 0 else f"{full}_{n}"

    # ------------------------------------------------------- graph inputs/outputs
    def input(self, name: str, shape: Sequence[int], dtype=np.float32,
              value_range: tuple | None = None) -> str:
        """Declare a graph input; ``value_range`` = (low, high) for integer index inputs."""
        elem = _NP_TO_ONNX[np.dtype(dtype)]
        self.inputs.append(helper.make_tensor_value_info(name, elem, list(shape)))
        self._used[name] += 1
        if value_range is not None:
            self.input_ranges[name] = list(value_range)
        return name

    def output(self, value: str, name: str | None = None) -> str:
        if name is not None and name != value:
            value = self.op("Identity", [value], name=name)
        self.outputs.append(value)
        return value

    # ----------------------------------------------------------- initializers
    def const(self, value, name: str = "const", dtype=None) -> str:
        arr = np.asarray(value, dtype=dtype)
        if arr.dtype == np.float64:
            arr = arr.astype(np.float32)
        full = self.unique(name)
        t = self.model.graph.initializer.add()
        t.name = full
        t.data_type = _NP_TO_ONNX[arr.dtype]
        t.dims.extend(arr.shape)
        t.raw_data = np.ascontiguousarray(arr).tobytes()
        return full

    def param(self, name: str, shape: Sequence[int], std: float, mean: float = 0.0) -> str:
        """A random-normal float32 initializer ``N(mean, std^2)``."""
        arr = self.rng.standard_normal(tuple(shape), dtype=np.float32)
        arr *= np.float32(std)
        if mean:
            arr += np.float32(mean)
        return self.const(arr, name)

    def uniform(self, name: str, shape: Sequence[int], low: float, high: float) -> str:
        return self.const(self.rng.uniform(low, high, tuple(shape)).astype(np.float32), name)

    # ------------------------------------------------------------------- nodes
    def op(self, op_type: str, inputs: Sequence[str], name: str | None = None,
           outputs: int = 1, **attrs):
        """Append one node; returns its output name (or a list when ``outputs > 1``)."""
        node_name = self.unique(name or op_type.lower())
        outs = [node_name] if outputs == 1 else [f"{node_name}:{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=node_name, **attrs))
        return outs[0] if outputs == 1 else outs

    # ----------------------------------------------------------------- model
    def build(self, metadata: dict | None = None) -> onnx.ModelProto:
        outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in self.outputs]
        model, self.model = self.model, onnx.ModelProto()
        model.graph.name = self.name
        model.graph.node.extend(self.nodes)
        model.graph.input.extend(self.inputs)
        model.graph.output.extend(outs)
        model.producer_name = "tvm_dsa.models"
        model.opset_import.append(helper.make_opsetid("", OPSET))
        model.ir_version = IR_VERSION
        # Fill in the graph outputs' element types and static shapes.
        inferred = infer_shapes(model)
        model.graph.ClearField("output")
        model.graph.output.extend(inferred.graph.output)
        meta = {META_MODEL: self.name}
        if metadata:
            meta[META_CONFIG] = json.dumps(metadata, sort_keys=True)
        if self.input_ranges:
            meta[META_INPUT_RANGES] = json.dumps(self.input_ranges)
        helper.set_model_props(model, meta)
        return model

    # ============================================================ layer helpers
    # --- elementwise / activations
    def add(self, a: str, b: str) -> str:
        return self.op("Add", [a, b])

    def mul(self, a: str, b: str) -> str:
        return self.op("Mul", [a, b])

    def scale(self, x: str, factor: float) -> str:
        return self.op("Mul", [x, self.const(np.float32(factor), "scale")])

    def relu(self, x: str) -> str:
        return self.op("Relu", [x])

    def relu6(self, x: str) -> str:
        """ReLU6 as exported by PyTorch: Clip with constant min/max inputs."""
        lo = self.const(np.float32(0.0), "clip_min")
        hi = self.const(np.float32(6.0), "clip_max")
        return self.op("Clip", [x, lo, hi], name="relu6")

    def sigmoid(self, x: str) -> str:
        return self.op("Sigmoid", [x])

    def swish(self, x: str) -> str:
        """Swish / SiLU: x * Sigmoid(x)."""
        return self.op("Mul", [x, self.sigmoid(x)], name="swish")

    def gelu(self, x: str) -> str:
        """Exact GELU as exported: x * 0.5 * (1 + Erf(x / sqrt(2)))."""
        with self.scope("gelu"):
            t = self.op("Div", [x, self.const(np.float32(math.sqrt(2.0)), "sqrt2")])
            t = self.op("Erf", [t])
            t = self.op("Add", [t, self.const(np.float32(1.0), "one")])
            t = self.op("Mul", [x, t])
            return self.op("Mul", [t, self.const(np.float32(0.5), "half")])

    # --- shape ops
    def reshape(self, x: str, shape: Sequence[int]) -> str:
        return self.op("Reshape", [x, self.const(np.array(shape, np.int64), "shape")])

    def transpose(self, x: str, perm: Sequence[int]) -> str:
        return self.op("Transpose", [x], perm=list(perm))

    def concat(self, xs: Sequence[str], axis: int) -> str:
        return xs[0] if len(xs) == 1 else self.op("Concat", list(xs), axis=axis)

    def gather(self, data: str, indices, axis: int = 0) -> str:
        """Gather with ``indices`` either a tensor name or a constant (array / int)."""
        if not isinstance(indices, str):
            indices = self.const(np.asarray(indices, np.int64), "indices")
        return self.op("Gather", [data, indices], axis=axis)

    # --- convolution layers
    def conv(self, x: str, cin: int, cout: int, kernel, stride=1, padding=0, groups: int = 1,
             bias: bool = False, gain: float = 2.0, name: str = "conv") -> str:
        """N-d Conv (1-d or 2-d by the length of ``kernel``) with He-style init."""
        kernel = _tuple(kernel, 2)
        nd = len(kernel)
        stride, padding = _tuple(stride, nd), _tuple(padding, nd)
        fan_in = cin // groups * math.prod(kernel)
        with self.scope(name):
            w = self.param("weight", [cout, cin // groups, *kernel], math.sqrt(gain / fan_in))
            ins = [x, w]
            if bias:
                ins.append(self.param("bias", [cout], 0.02))
            return self.op("Conv", ins, name="Conv", kernel_shape=list(kernel),
                           strides=list(stride), pads=list(padding) * 2,
                           dilations=[1] * nd, group=groups)

    def batchnorm(self, x: str, c: int, gamma: float = 1.0, eps: float = 1e-5,
                  name: str = "bn") -> str:
        """Inference BatchNormalization, params near identity (gamma scaled by ``gamma``)."""
        with self.scope(name):
            g = self.param("weight", [c], 0.1 * gamma, mean=gamma)
            b = self.param("bias", [c], 0.05)
            m = self.param("running_mean", [c], 0.05)
            v = self.uniform("running_var", [c], 0.8, 1.2)
            return self.op("BatchNormalization", [x, g, b, m, v], name="BatchNormalization",
                           epsilon=eps, momentum=0.9)

    def conv_bn(self, x: str, cin: int, cout: int, kernel, stride=1, padding=None,
                groups: int = 1, act: str | None = "relu", bn_gamma: float = 1.0,
                name: str = "conv") -> str:
        """Conv (no bias) -> BatchNorm -> optional activation ('relu' / 'relu6' / None)."""
        if padding is None:
            padding = tuple(k // 2 for k in _tuple(kernel, 2))
        with self.scope(name):
            y = self.conv(x, cin, cout, kernel, stride, padding, groups,
                          gain=2.0 if act else 1.0)
            y = self.batchnorm(y, cout, gamma=bn_gamma)
            return self._act(y, act)

    def _act(self, x: str, act: str | None) -> str:
        if act is None:
            return x
        return {"relu": self.relu, "relu6": self.relu6, "swish": self.swish,
                "gelu": self.gelu}[act](x)

    # --- pooling / classifier head
    def maxpool(self, x: str, kernel: int, stride: int, padding: int = 0) -> str:
        return self.op("MaxPool", [x], kernel_shape=[kernel] * 2, strides=[stride] * 2,
                       pads=[padding] * 4)

    def avgpool(self, x: str, kernel: int, stride: int, padding: int = 0) -> str:
        return self.op("AveragePool", [x], kernel_shape=[kernel] * 2, strides=[stride] * 2,
                       pads=[padding] * 4)

    def gap_flatten(self, x: str) -> str:
        """GlobalAveragePool + Flatten: [N, C, H, W] -> [N, C]."""
        return self.op("Flatten", [self.op("GlobalAveragePool", [x])], axis=1)

    # --- dense layers
    def gemm(self, x: str, din: int, dout: int, gain: float = 1.0, name: str = "fc") -> str:
        """2-d Linear as exported from torch.nn.Linear: Gemm(x, W[out, in], b, transB=1)."""
        with self.scope(name):
            w = self.param("weight", [dout, din], math.sqrt(gain / din))
            b = self.param("bias", [dout], 0.02)
            return self.op("Gemm", [x, w, b], name="Gemm", alpha=1.0, beta=1.0, transB=1)

    def linear(self, x: str, din: int, dout: int, gain: float = 1.0, bias: bool = True,
               name: str = "linear") -> str:
        """N-d Linear as exported: MatMul(x, W[in, out]) + Add(bias)."""
        with self.scope(name):
            w = self.param("weight", [din, dout], math.sqrt(gain / din))
            y = self.op("MatMul", [x, w], name="MatMul")
            if bias:
                y = self.op("Add", [y, self.param("bias", [dout], 0.02)], name="Add")
            return y

    def layernorm(self, x: str, d: int, eps: float = 1e-5, name: str = "ln") -> str:
        with self.scope(name):
            g = self.param("weight", [d], 0.02, mean=1.0)
            b = self.param("bias", [d], 0.02)
            return self.op("LayerNormalization", [x, g, b], name="LayerNormalization",
                           axis=-1, epsilon=eps)

    def mlp(self, x: str, dims: Sequence[int], act: str = "relu", final_act: bool = False,
            name: str = "mlp") -> str:
        """Stack of 2-d Gemm layers dims[0] -> dims[1] -> ... with ``act`` in between."""
        with self.scope(name):
            for i, (din, dout) in enumerate(zip(dims[:-1], dims[1:])):
                last = i == len(dims) - 2
                use_act = final_act or not last
                x = self.gemm(x, din, dout, gain=2.0 if use_act else 1.0, name=str(i))
                if use_act:
                    x = self._act(x, act)
            return x

    # --- transformer pieces
    def attention(self, x: str, batch: int, seq: int, hidden: int, heads: int,
                  mask: str | None = None, out_gain: float = 1.0,
                  name: str = "attention") -> str:
        """Multi-head self-attention over x [B, S, D] (no positional terms).

        ``mask`` is an optional additive float tensor broadcastable to [B, H, S, S].
        ``out_gain`` scales the output projection's init variance (pre-LN residual depth).
        """
        if hidden % heads:
            raise ValueError(f"hidden={hidden} is not divisible by heads={heads}")
        dh = hidden // heads
        with self.scope(name):
            q = self.linear(x, hidden, hidden, name="query")
            k = self.linear(x, hidden, hidden, name="key")
            v = self.linear(x, hidden, hidden, name="value")
            split = [batch, seq, heads, dh]
            q = self.transpose(self.reshape(q, split), [0, 2, 1, 3])       # [B, H, S, dh]
            k = self.transpose(self.reshape(k, split), [0, 2, 3, 1])       # [B, H, dh, S]
            v = self.transpose(self.reshape(v, split), [0, 2, 1, 3])       # [B, H, S, dh]
            s = self.op("MatMul", [q, k], name="scores")                  # [B, H, S, S]
            s = self.op("Div", [s, self.const(np.float32(math.sqrt(dh)), "sqrt_dh")])
            if mask is not None:
                s = self.add(s, mask)
            p = self.op("Softmax", [s], axis=-1)
            o = self.op("MatMul", [p, v], name="context")                 # [B, H, S, dh]
            o = self.reshape(self.transpose(o, [0, 2, 1, 3]), [batch, seq, hidden])
            return self.linear(o, hidden, hidden, gain=out_gain, name="output")


def infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Strict ONNX shape inference, fast for models with large weights: it runs on a
    skeleton in which every large initializer is replaced by a graph input of the same
    type and shape (small ones, e.g. Reshape shapes, keep their values). The returned
    model has no weights; only its graph inputs/outputs/value_info are meant to be read."""
    g = model.graph
    small = [t for t in g.initializer if math.prod(t.dims) <= _SKELETON_MAX_ELEMS]
    large = [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
             for t in g.initializer if math.prod(t.dims) > _SKELETON_MAX_ELEMS]
    init_names = {t.name for t in g.initializer}
    inputs = [vi for vi in g.input if vi.name not in init_names] + large
    skel_graph = helper.make_graph(g.node, g.name, inputs, g.output, small)
    skel = helper.make_model(skel_graph, opset_imports=model.opset_import)
    skel.ir_version = model.ir_version
    return onnx.shape_inference.infer_shapes(skel, strict_mode=True)


_SKELETON_MAX_ELEMS = 64


def _tuple(v, n: int) -> tuple:
    if isinstance(v, int):
        return (v,) * n
    return tuple(v)
