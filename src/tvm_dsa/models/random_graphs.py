"""Random ONNX graphs: small seeded models for property tests and ``benchmarks/random_graphs.py``.

>>> from tvm_dsa.models.random_graphs import random_graph, random_inputs, op_types, blocks
>>> model = random_graph(7, kind="cnn")          # onnx.ModelProto, checked by onnx.checker
>>> op_types(model), blocks(model)               # ['BatchNormalization', 'Conv', ...], ['conv', ...]
>>> feeds = random_inputs(model)                 # {"x": float32 [N, C, H, W]}

A graph is a chain of building blocks drawn from a numpy ``Generator`` seeded by ``seed``, each
with random shapes and attributes, in the fusion contexts compilers get wrong: an activation after
a convolution or a pooling, a residual over one or two convolutions, branches meeting in a
``Concat``, a binary op between a tensor and a broadcast constant, another tensor or itself
(``Mul(x, x)``), intermediate tensors that are graph outputs as well.

* ``cnn``: on ``x`` [N, C, H, W]: Conv (kernel 1 or 3, stride 1 or 2, symmetric or asymmetric
  pads, groups 1, 2 or depthwise, with or without bias) with BatchNormalization and an
  activation (Relu, LeakyRelu, Clip with min and / or max, HardSigmoid, Sigmoid, Tanh);
  MaxPool, AveragePool (pads, ``count_include_pad`` 0 and 1); residual Adds; Concat; ConvTranspose;
  Mul / Add / Sub / Div; a GlobalAveragePool (+ Flatten + Gemm) head.
* ``transformer``: on ``x`` [N, S, D]: multi-head attention (MatMul + Add projections,
  Reshape / Transpose for the heads, scaled scores, Softmax); an MLP with Erf-GELU, Tanh-GELU
  (Pow), Relu or Swish; Gemm on the flattened tokens; LayerNormalization, RMS-norm (Pow,
  ReduceMean, Sqrt, Div) or a normalisation by ReduceMean; token mixing through a Transpose;
  Softmax; binary ops as above; a ReduceMean-over-tokens + MatMul head. Residuals throughout.
* ``any``: one of the two, or a hybrid (CNN blocks, then the feature map as tokens,
  ``Reshape`` + ``Transpose``, then transformer blocks), drawn from the seed.

Graphs are float32, opset 17, IR version 10 (onnxruntime runs them), weights as initializers with
std ``~1/sqrt(fan_in)`` (``sqrt(2/fan_in)`` before a rectifier), so activations stay O(1) and fp16
storage is accurate to the DSA's tolerance; divisors are kept at least 0.5 away from zero. Sizes
are small (inputs of at most 8 channels and 16 x 16 pixels, or 16 tokens of 32 features): a graph
compiles and runs in about a second. The seed, the kind and the blocks drawn are in the model's
metadata (``blocks``, ``models.model_config``).
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import numpy as np
import onnx

from tvm_dsa.models import example_inputs, model_config
from tvm_dsa.models.builder import GraphBuilder

KINDS = ("cnn", "transformer", "any")


class _T(NamedTuple):
    """A tensor of the graph being built: its name and static shape."""

    name: str
    shape: tuple


def random_graph(seed: int, kind: str = "any") -> onnx.ModelProto:
    """A random model of ``kind`` (``"cnn"``, ``"transformer"`` or ``"any"``), the same for the
    same ``seed``. Its single float input is ``x``, or ``x`` and ``x2`` of the same shape when the
    first block combines two inputs; its outputs are the last tensor and, sometimes, intermediate
    ones. Validated with ``onnx.checker`` (full check, shapes inferred)."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; kinds: {', '.join(KINDS)}")
    gen = _Generator(seed, kind)
    model = gen.build()
    onnx.checker.check_model(model, full_check=True)
    return model


def op_types(model: onnx.ModelProto) -> list[str]:
    """The distinct op types of ``model``'s nodes, sorted."""
    return sorted({node.op_type for node in model.graph.node})


def blocks(model: onnx.ModelProto) -> list[str]:
    """The building blocks ``random_graph`` drew for ``model``, in graph order."""
    return model_config(model)["blocks"]


def random_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs for ``model``'s graph inputs, in graph order: float32 ~ N(0, 1) from ``seed``."""
    return example_inputs(model, seed)


class _Generator:
    """Draws one graph: ``build`` picks the blocks, each block method adds its nodes."""

    ACTIVATIONS = ("Relu", "LeakyRelu", "Clip", "HardSigmoid", "Sigmoid", "Tanh")
    BINARY = ("Mul", "Add", "Sub", "Div")

    def __init__(self, seed: int, kind: str):
        self.seed, self.kind = seed, kind
        self.rng = np.random.default_rng(seed)
        self.b = GraphBuilder(f"random_{kind}_{seed}", seed)
        self.blocks: list[str] = []
        self.outputs: list[str] = []

    # ---------------------------------------------------------------- draws
    def coin(self, p: float = 0.5) -> bool:
        return bool(self.rng.random() < p)

    def pick(self, options):
        return options[int(self.rng.integers(len(options)))]

    def weight(self, shape, fan_in: int, gain: float = 1.0) -> str:
        return self.b.param("w", shape, math.sqrt(gain / fan_in))

    def bias(self, n: int) -> str:
        return self.b.param("bias", [n], 0.1)

    # ---------------------------------------------------------------- graph
    def build(self) -> onnx.ModelProto:
        kind = self.pick(["cnn", "transformer", "hybrid"]) if self.kind == "any" else self.kind
        if kind == "transformer":
            x = self.tokens_input()
        else:
            x = self.image_input()
            for _ in range(int(self.rng.integers(2, 5)) - (kind == "hybrid")):
                x = self.cnn_block(x)
            if kind == "hybrid":
                x = self.to_tokens(x)
        if kind != "cnn":
            for _ in range(int(self.rng.integers(2, 4))):
                x = self.transformer_block(x)
        x = self.head(x, kind)
        outputs = [*dict.fromkeys([*self.outputs, x.name])]
        for name in outputs:
            self.b.output(name)
        return self.b.build({"seed": self.seed, "kind": self.kind, "blocks": self.blocks})

    def use(self, block: str, x: _T) -> _T:
        """Record ``block`` and, now and then, make its result a graph output too."""
        self.blocks.append(block)
        if self.coin(0.15):
            self.outputs.append(x.name)
        return x

    def image_input(self) -> _T:
        shape = (self.pick([1, 2]), self.pick([3, 4, 8]), *[self.pick([6, 8, 11, 16])] * 2)
        return self.two_inputs(_T(self.b.input("x", shape), shape))

    def tokens_input(self) -> _T:
        shape = (self.pick([1, 2]), self.pick([4, 7, 8, 16]), self.pick([8, 16, 32]))
        return self.two_inputs(_T(self.b.input("x", shape), shape))

    def two_inputs(self, x: _T) -> _T:
        """Sometimes a second input ``x2`` of ``x``'s shape, combined with ``x`` by a binary op."""
        if not self.coin(0.2):
            return x
        x2 = _T(self.b.input("x2", x.shape), x.shape)
        op = self.pick(["Mul", "Add", "Sub"])
        return self.use(f"inputs:{op}", _T(self.b.op(op, [x.name, x2.name]), x.shape))

    # ------------------------------------------------------------------ CNN
    def cnn_block(self, x: _T) -> _T:
        choices: list[Callable[[_T], _T]] = [self.conv_stage, self.residual, self.concat, self.binary,
                                             self.activation, self.batchnorm, self.conv_transpose]
        if min(x.shape[2:]) >= 4:
            choices.append(self.pool)
        return self.pick(choices)(x)

    def conv(self, x: _T, cout: int | None = None, kernel: int | None = None, same: bool = False,
             gain: float = 2.0) -> _T:
        """A Conv node with random kernel, stride, pads, groups and bias; ``same``: stride 1 and
        pads keeping the spatial shape."""
        n, cin, hgt, wid = x.shape
        k = kernel or self.pick([1, 3])
        s = 1 if same or min(hgt, wid) < 4 else self.pick([1, 1, 2])
        if same or self.coin(0.6):
            pads = [k // 2] * 4
        else:
            pads = [int(p) for p in self.rng.integers(0, k // 2 + 1, 4)]
        cout = cout or min(32, self.pick([4, 8, 12, 16]) * (1 + (cin >= 16)))
        groups = self.pick([g for g in (1, 1, 2, cin) if cin % g == 0 and cout % g == 0])
        fan_in = cin // groups * k * k
        inputs = [x.name, self.weight([cout, cin // groups, k, k], fan_in, gain)]
        if self.coin():
            inputs.append(self.bias(cout))
        y = self.b.op("Conv", inputs, kernel_shape=[k, k], strides=[s, s], pads=pads, group=groups)
        out_h = (hgt + pads[0] + pads[2] - k) // s + 1
        out_w = (wid + pads[1] + pads[3] - k) // s + 1
        return _T(y, (n, cout, out_h, out_w))

    def conv_stage(self, x: _T) -> _T:
        """Conv, then BatchNormalization and an activation, each or both sometimes."""
        y = self.conv(x)
        if self.coin():
            y = self.batchnorm(y, record=False)
        if self.coin(0.7):
            y = self.act(y)
        return self.use("conv", y)

    def batchnorm(self, x: _T, record: bool = True) -> _T:
        c = x.shape[1]
        params = [self.b.param("gamma", [c], 0.1, mean=1.0), self.b.param("beta", [c], 0.1),
                  self.b.param("mean", [c], 0.1), self.b.uniform("var", [c], 0.5, 1.5)]
        y = _T(self.b.op("BatchNormalization", [x.name, *params], epsilon=1e-5), x.shape)
        return self.use("batchnorm", y) if record else y

    def act(self, x: _T, op: str | None = None) -> _T:
        """A random activation (or ``op``) with random attributes."""
        op = op or self.pick(self.ACTIVATIONS)
        if op == "LeakyRelu":
            y = self.b.op(op, [x.name], alpha=float(self.rng.uniform(0.01, 0.3)))
        elif op == "HardSigmoid":
            y = self.b.op(op, [x.name], alpha=float(self.rng.uniform(0.1, 0.3)), beta=float(self.rng.uniform(0.3, 0.7)))
        elif op == "Clip":
            low, high = self.rng.uniform(-1.0, 0.0), self.rng.uniform(0.5, 6.0)
            bounds = self.pick([[low, high], [low, None], [None, high]])
            y = self.b.op(op, [x.name, *(self.b.const(np.float32(v), "clip") if v is not None else "" for v in bounds)])
        else:
            y = self.b.op(op, [x.name])
        return _T(y, x.shape)

    def activation(self, x: _T) -> _T:
        op = self.pick(self.ACTIVATIONS)
        return self.use(f"activation:{op}", self.act(x, op))

    def pool(self, x: _T) -> _T:
        """MaxPool or AveragePool (``count_include_pad`` 0 or 1) with random kernel, stride, pads."""
        n, c, hgt, wid = x.shape
        k, s = self.pick([2, 3]), self.pick([1, 2])
        pads = [int(p) for p in self.rng.integers(0, k // 2 + 1, 4)] if self.coin(0.6) else [0] * 4
        op = self.pick(["MaxPool", "AveragePool"])
        attrs = {"count_include_pad": int(self.coin())} if op == "AveragePool" else {}
        y = self.b.op(op, [x.name], kernel_shape=[k, k], strides=[s, s], pads=pads, **attrs)
        out = (n, c, (hgt + pads[0] + pads[2] - k) // s + 1, (wid + pads[1] + pads[3] - k) // s + 1)
        tag = f"{op}(pads)" if any(pads) else op
        if op == "AveragePool" and any(pads):
            tag += f",count_include_pad={attrs['count_include_pad']}"
        return self.use(f"pool:{tag}", _T(y, out))

    def residual(self, x: _T) -> _T:
        """``x + f(x)``, f one same-shape Conv (with BatchNormalization sometimes) or two with an
        activation between; an activation after the Add sometimes."""
        convs = self.pick([1, 2])
        y = self.conv(x, cout=x.shape[1], same=True, gain=1.0 if convs == 1 else 2.0)
        if convs == 2:
            y = self.conv(self.act(y, "Relu"), cout=x.shape[1], same=True, gain=0.5)
        if self.coin():
            y = self.batchnorm(y, record=False)
        operands = [x.name, y.name] if self.coin() else [y.name, x.name]
        out = _T(self.b.op("Add", operands), x.shape)
        if self.coin():
            out = self.act(out)
        return self.use(f"residual:{convs}conv", out)

    def concat(self, x: _T) -> _T:
        """Two or three branches of ``x`` (an activation, a binary op, a 1x1 Conv to the same
        channels, or ``x`` itself) concatenated along channels or a spatial axis."""
        branches = []
        for _ in range(self.pick([2, 3])):
            branch = self.pick(["act", "binary", "conv", "identity"])
            if branch == "act":
                branches.append(self.act(x))
            elif branch == "binary":
                branches.append(self.binary_op(x)[0])
            elif branch == "conv":
                branches.append(self.conv(x, cout=x.shape[1], kernel=1, same=True, gain=1.0))
            else:
                branches.append(x)
        axis = self.pick([1, 1, 2, 3])
        shape = list(x.shape)
        shape[axis] *= len(branches)
        return self.use(f"concat:axis{axis}", _T(self.b.op("Concat", [t.name for t in branches], axis=axis),
                                                 tuple(shape)))

    def conv_transpose(self, x: _T) -> _T:
        """ConvTranspose with random kernel, stride, pads (and output_padding), groups 1 or 2, bias."""
        n, cin, hgt, wid = x.shape
        k, s = self.pick([2, 3]), self.pick([1, 2])
        pads = [int(p) for p in self.rng.integers(0, k // 2 + 1, 4)]
        out_pad = [int(p) for p in self.rng.integers(0, s, 2)]
        cout = self.pick([4, 8, 16])
        groups = self.pick([g for g in (1, 2) if cin % g == 0 and cout % g == 0])
        fan_in = max(1, cin // groups * k * k // (s * s))
        inputs = [x.name, self.weight([cin, cout // groups, k, k], fan_in)]
        if self.coin():
            inputs.append(self.bias(cout))
        y = self.b.op("ConvTranspose", inputs, kernel_shape=[k, k], strides=[s, s], pads=pads,
                      output_padding=out_pad, group=groups)
        out_h = s * (hgt - 1) + out_pad[0] + k - pads[0] - pads[2]
        out_w = s * (wid - 1) + out_pad[1] + k - pads[1] - pads[3]
        out = _T(y, (n, cout, out_h, out_w))
        if self.coin():
            out = self.act(out)
        if min(out.shape[2:]) > 16:  # keep the maps small: back down with a stride-2 pooling
            out = _T(self.b.op("MaxPool", [out.name], kernel_shape=[2, 2], strides=[2, 2]),
                     (n, cout, out.shape[2] // 2, out.shape[3] // 2))
        return self.use(f"convtranspose:s{s}g{groups}", out)

    # ------------------------------------------------------------ binary ops
    def binary_op(self, x: _T) -> tuple[_T, str]:
        """A binary op of ``x`` with a broadcast constant, another tensor computed from ``x`` or
        ``x`` itself; divisors lie in [0.5, 2] in magnitude, and ``x - x`` and ``p / p`` are added
        to ``x`` (what follows would be constant). Returns the result and a tag."""
        op = self.pick(self.BINARY)
        other = self.pick(["const", "tensor", "same"])
        if other == "const":
            shape = self.pick(self.broadcast_shapes(x.shape))
            value = self.rng.uniform(0.5, 2.0, shape) * self.rng.choice([-1.0, 1.0], shape)
            y = self.b.op(op, [x.name, self.b.const(value.astype(np.float32), "c")])
        elif op == "Div":  # x / p or p / p with p = Sigmoid(x) + 0.5 in [0.5, 1.5]
            p = self.b.op("Add", [self.b.op("Sigmoid", [x.name]), self.b.const(np.float32(0.5), "half")])
            y = self.b.op(op, [x.name if other == "tensor" else p, p])
        elif other == "tensor":
            t = self.act(x, self.pick(["Relu", "Sigmoid", "Tanh"]))
            y = self.b.op(op, [x.name, t.name] if self.coin() else [t.name, x.name])
        else:
            y = self.b.op(op, [x.name, x.name])
        if other == "same" and op in ("Sub", "Div"):  # x - x = 0, p / p = 1: added to x, not the rest of the graph
            y = self.b.op("Add", [x.name, y])
        return _T(y, x.shape), f"{op}:{other}"

    @staticmethod
    def broadcast_shapes(shape: tuple) -> list[tuple]:
        """Constant shapes that broadcast to ``shape`` without changing it."""
        out = [(), (1,), (shape[-1],)]
        if len(shape) == 4:
            out += [(shape[1], 1, 1), (1, shape[1], 1, 1), (1, 1, *shape[2:])]
        else:
            out += [(shape[1], 1), (1, *shape[1:])]
        return out

    def binary(self, x: _T) -> _T:
        y, tag = self.binary_op(x)
        return self.use(f"binary:{tag}", y)

    # ----------------------------------------------------------- transformer
    def to_tokens(self, x: _T) -> _T:
        """[N, C, H, W] -> [N, H*W, C] (Reshape + Transpose); a stride-2 pooling first while
        there are more than 16 pixels."""
        while x.shape[2] * x.shape[3] > 16:
            n, c, hgt, wid = x.shape
            x = _T(self.b.op("AveragePool", [x.name], kernel_shape=[2, 2], strides=[2, 2]),
                   (n, c, hgt // 2, wid // 2))
        n, c, hgt, wid = x.shape
        y = self.b.transpose(self.b.reshape(x.name, [n, c, hgt * wid]), [0, 2, 1])
        return self.use("to_tokens", _T(y, (n, hgt * wid, c)))

    def transformer_block(self, x: _T) -> _T:
        return self.pick([self.attention, self.mlp, self.gemm, self.norm, self.token_mixer, self.softmax,
                          self.binary])(x)

    def linear(self, x: _T, dout: int, gain: float = 1.0, bias: bool = True) -> _T:
        """MatMul by a [D, dout] weight (+ Add of a bias)."""
        din = x.shape[-1]
        y = self.b.op("MatMul", [x.name, self.weight([din, dout], din, gain)])
        if bias:
            y = self.b.op("Add", [y, self.bias(dout)] if self.coin() else [self.bias(dout), y])
        return _T(y, (*x.shape[:-1], dout))

    def residual_add(self, x: _T, y: _T) -> _T:
        return _T(self.b.op("Add", [x.name, y.name]), x.shape)

    def pre_norm(self, x: _T) -> _T:
        """LayerNormalization, RMS-norm or nothing."""
        choice = self.pick(["layernorm", "rmsnorm", "none"])
        return self.layernorm(x) if choice == "layernorm" else self.rmsnorm(x) if choice == "rmsnorm" else x

    def layernorm(self, x: _T) -> _T:
        d = x.shape[-1]
        params = [self.b.param("gamma", [d], 0.1, mean=1.0), self.b.param("beta", [d], 0.1)]
        return _T(self.b.op("LayerNormalization", [x.name, *params], axis=-1,
                            epsilon=float(self.pick([1e-5, 1e-6]))), x.shape)

    def rmsnorm(self, x: _T) -> _T:
        """x / Sqrt(ReduceMean(Pow(x, 2)) + eps) * gamma."""
        b, d = self.b, x.shape[-1]
        ms = b.op("ReduceMean", [b.op("Pow", [x.name, b.const(np.float32(2.0), "two")])], axes=[-1], keepdims=1)
        rms = b.op("Sqrt", [b.op("Add", [ms, b.const(np.float32(1e-5), "eps")])])
        return _T(b.op("Mul", [b.op("Div", [x.name, rms]), b.param("gamma", [d], 0.1, mean=1.0)]), x.shape)

    def attention(self, x: _T) -> _T:
        """Pre-norm multi-head self-attention with a residual: Q, K, V projections, heads by
        Reshape + Transpose, scores scaled by a Div or a Mul, Softmax, output projection."""
        n, s, d = x.shape
        heads = self.pick([h for h in (1, 2, 4) if d % h == 0])
        dh = d // heads
        y = self.pre_norm(x)
        q, k, v = (self.linear(y, d).name for _ in range(3))
        split = [n, s, heads, dh]
        q = self.b.transpose(self.b.reshape(q, split), [0, 2, 1, 3])
        k = self.b.transpose(self.b.reshape(k, split), [0, 2, 3, 1])
        v = self.b.transpose(self.b.reshape(v, split), [0, 2, 1, 3])
        scores = self.b.op("MatMul", [q, k])
        if self.coin():
            scores = self.b.op("Div", [scores, self.b.const(np.float32(math.sqrt(dh)), "sqrt_dh")])
        else:
            scores = self.b.op("Mul", [scores, self.b.const(np.float32(1 / math.sqrt(dh)), "scale")])
        o = self.b.op("MatMul", [self.b.op("Softmax", [scores], axis=-1), v])
        o = self.b.reshape(self.b.transpose(o, [0, 2, 1, 3]), [n, s, d])
        return self.use(f"attention:{heads}heads", self.residual_add(x, self.linear(_T(o, x.shape), d, gain=0.5)))

    def gelu(self, x: _T, form: str) -> _T:
        """GELU, Erf form (as exported) or Tanh form (with ``Pow(x, 3)``)."""
        b = self.b
        if form == "erf":
            t = b.op("Erf", [b.op("Div", [x.name, b.const(np.float32(math.sqrt(2.0)), "sqrt2")])])
        else:
            cube = b.op("Mul", [b.op("Pow", [x.name, b.const(np.float32(3.0), "three")]),
                                b.const(np.float32(0.044715), "c")])
            inner = b.op("Mul", [b.op("Add", [x.name, cube]), b.const(np.float32(math.sqrt(2 / math.pi)), "k")])
            t = b.op("Tanh", [inner])
        t = b.op("Mul", [b.op("Mul", [x.name, b.op("Add", [t, b.const(np.float32(1.0), "one")])]),
                         b.const(np.float32(0.5), "half")])
        return _T(t, x.shape)

    def mlp(self, x: _T) -> _T:
        """Pre-norm MLP with a residual: linear (x1, x2 or x4), activation, linear."""
        d = x.shape[-1]
        act = self.pick(["gelu_erf", "gelu_tanh", "relu", "swish"])
        y = self.linear(self.pre_norm(x), d * self.pick([1, 2, 4]), gain=2.0)
        if act.startswith("gelu"):
            y = self.gelu(y, act[5:])
        elif act == "relu":
            y = self.act(y, "Relu")
        else:
            y = _T(self.b.op("Mul", [y.name, self.b.op("Sigmoid", [y.name])]), y.shape)
        return self.use(f"mlp:{act}", self.residual_add(x, self.linear(y, d, gain=0.5)))

    def gemm(self, x: _T) -> _T:
        """Gemm on the tokens flattened to 2-d (transB, alpha, beta random), reshaped back."""
        n, s, d = x.shape
        dout = self.pick([d, 2 * d])
        trans_b = int(self.coin())
        w = self.weight([dout, d] if trans_b else [d, dout], d)
        y = self.b.op("Gemm", [self.b.reshape(x.name, [n * s, d]), w, self.bias(dout)], transB=trans_b,
                      alpha=float(self.rng.uniform(0.5, 1.5)), beta=float(self.rng.uniform(0.5, 1.5)))
        return self.use(f"gemm:transB={trans_b}", _T(self.b.reshape(y, [n, s, dout]), (n, s, dout)))

    def norm(self, x: _T) -> _T:
        """LayerNormalization, RMS-norm or ``x - ReduceMean(x)`` (over the features)."""
        choice = self.pick(["layernorm", "rmsnorm", "center"])
        if choice == "center":
            mean = self.b.op("ReduceMean", [x.name], axes=[-1], keepdims=1)
            return self.use("norm:center", _T(self.b.op("Sub", [x.name, mean]), x.shape))
        return self.use(f"norm:{choice}", self.layernorm(x) if choice == "layernorm" else self.rmsnorm(x))

    def token_mixer(self, x: _T) -> _T:
        """MLP-Mixer's token mixing: Transpose to [N, D, S], a linear over the tokens, back, residual."""
        y = self.b.transpose(x.name, [0, 2, 1])
        y = self.linear(_T(y, (x.shape[0], x.shape[2], x.shape[1])), x.shape[1], gain=0.5)
        return self.use("mixer", self.residual_add(x, _T(self.b.transpose(y.name, [0, 2, 1]), x.shape)))

    def softmax(self, x: _T) -> _T:
        """Softmax over the features or the tokens, times ``x``."""
        axis = self.pick([-1, 1])
        y = self.b.op("Mul", [self.b.op("Softmax", [x.name], axis=axis), x.name])
        return self.use(f"softmax:axis{axis}", _T(y, x.shape))

    # ------------------------------------------------------------------ head
    def head(self, x: _T, kind: str) -> _T:
        """Nothing, or a pooling over space or tokens, then (sometimes) a classifier."""
        if not self.coin(0.6):
            return x
        if kind == "cnn":
            n, c = x.shape[:2]
            y = _T(self.b.op("GlobalAveragePool", [x.name]), (n, c, 1, 1))
            if self.coin():
                flat = self.b.op("Flatten", [y.name], axis=1)
                y = _T(self.b.op("Gemm", [flat, self.weight([10, c], c), self.bias(10)], transB=1), (n, 10))
            return self.use("head:gap", y)
        n, s, d = x.shape
        y = _T(self.b.op("ReduceMean", [x.name], axes=[1], keepdims=0), (n, d))
        if self.coin():
            y = self.linear(y, 10)
        return self.use("head:mean", y)
