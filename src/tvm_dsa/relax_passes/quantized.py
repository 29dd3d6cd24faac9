"""IntegerQDQ: the dequantize -> op -> quantize patterns of a QDQ model as integer computations.

onnxruntime's ``quantize_static`` (QDQ format) writes each quantized layer as
``QuantizeLinear(op(DequantizeLinear(x_q), DequantizeLinear(w_q)) + DequantizeLinear(b_q))``;
TVM's importer makes them ``relax.quantize`` / ``relax.dequantize`` around float ops. Here each
becomes the integer kernel an int8 accelerator runs (TFLite's reference kernels' arithmetic,
onnxruntime's float requantisation scale):

- **Conv / MatMul / Gemm** (+ bias, + Relu) between int8 tensors: ``acc = sum x_q * w_q`` in int32
  (a convolution's padding takes the input's zero point ``z_x``, so the padded taps are real
  zeros), then ``y_q = sat(round((acc + B) * M) + z_y)`` with ``B = b_q - z_x * sum w_q`` per output
  channel and ``M = s_x * s_w / s_y`` (float32, per channel for per-channel weights), computed in
  float32, rounded half to even (a Relu: the lower bound ``z_y``);
- **Add** of two int8 tensors: ``sat(round((a - z_a) * s_a / s_y + (b - z_b) * s_b / s_y) + z_y)``;
- **MaxPool, reshape, transpose** between a dequantize and a quantize of the same scale and zero
  point: the op itself on the int8 values (it only moves or selects them).

uint8 activations (``quantize_static``'s default) are made int8 first, their zero points 128
lower (``_Signed``: the same real values). Only int8 tensors with per-tensor activation scales, int8 weights with zero points 0 (per tensor or
per output channel) and int32 biases of scale ``s_x * s_w`` are matched; anything else keeps its
float ops. Run before constant folding (which would fold the weights' dequantize away).
``docs/numerics.md`` (quantized models) has the rounding rule and where it differs from onnxruntime.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax, te, tirx, topi

from tvm_dsa.kernel.analysis import EXACT_F32
from tvm_dsa.relax_passes.fold import constant_value, static_shape
from tvm_dsa.relax_passes.rewrite import rewrite_functions

INT8 = "int8"
UINT8 = "uint8"
INT8_RANGE = np.iinfo(INT8)
_OPS = {name: tvm.ir.Op.get(f"relax.{name}") for name in (
    "quantize", "dequantize", "nn.conv2d", "matmul", "add", "nn.relu", "reshape", "permute_dims",
    "nn.max_pool2d")}
#: ops that only move or select values: on int8 values they give the quantized result exactly
_MOVES = ("reshape", "permute_dims", "nn.max_pool2d")


@dataclass(frozen=True)
class Quantized:
    """An int8 tensor and the scale and zero point that give its real values (``dequantize``):
    ``value`` is a Relax expression, ``scale`` and ``zero`` numpy arrays (one value, or one per
    channel)."""

    value: relax.Expr
    scale: np.ndarray
    zero: np.ndarray

    def per_tensor(self) -> bool:
        return self.scale.size == 1 and self.zero.size == 1


@relax.expr_functor.mutator
class _Integer(relax.PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not (call.op.same_as(_OPS["quantize"]) and str(call.ty.dtype) == INT8):
            return call
        out = self._params(call.args[1], call.args[2])
        if out is None or out[0].size != 1 or out[1].size != 1:
            return call
        sy, zy = float(out[0].reshape(())), int(out[1].reshape(()))
        source = self._producer(call.args[0])
        if source is None:
            return call
        for rewrite in (self._moved, self._added, self._contracted):
            rewritten = rewrite(source, sy, zy)
            if rewritten is not None:
                return rewritten
        return call

    # -- reading the float graph
    def _producer(self, expr):
        """The call ``expr`` names (through variable bindings), else None."""
        while isinstance(expr, relax.Var):
            bound = self.lookup_binding(expr)
            if bound is None:
                return None
            expr = bound
        return expr if isinstance(expr, relax.Call) else None

    def _is(self, call, name: str) -> bool:
        return call is not None and call.op.same_as(_OPS[name])

    @staticmethod
    def _params(scale, zero):
        s, z = constant_value(scale), constant_value(zero)
        return None if s is None or z is None or s.dtype != np.float32 else (s, z)

    def _dequantized(self, expr) -> Quantized | None:
        """The int8 tensor ``expr`` dequantizes, else None."""
        call = self._producer(expr)
        if not self._is(call, "dequantize") or str(call.args[0].ty.dtype) != INT8:
            return None
        params = self._params(call.args[1], call.args[2])
        return None if params is None else Quantized(call.args[0], *params)

    # -- the integer computations
    def _moved(self, source, sy: float, zy: int):
        """``op(dequantize(q))`` quantized with q's own scale and zero point: ``op(q)``."""
        if not any(self._is(source, name) for name in _MOVES):
            return None
        q = self._dequantized(source.args[0])
        if q is None or not q.per_tensor() or float(q.scale.reshape(())) != sy or int(q.zero.reshape(())) != zy:
            return None
        return relax.Call(source.op, [q.value, *source.args[1:]], source.attrs, source.ty_args)

    def _added(self, source, sy: float, zy: int):
        """The sum of two dequantized int8 tensors of one shape (a residual), requantized, with a
        Relu after it: one elementwise block that reads both int8 tensors, as a float residual's
        add reads its two inputs."""
        relu = self._is(source, "nn.relu")
        add = self._producer(source.args[0]) if relu else source
        if not self._is(add, "add"):
            return None
        terms = [self._dequantized(a) for a in add.args]
        if any(t is None or not t.per_tensor() for t in terms) or static_shape(add.ty) is None:
            return None
        if any(static_shape(t.value.ty) != static_shape(add.ty) for t in terms):
            return None
        (ka, za), (kb, zb) = ((tirx.const(np.float32(t.scale.reshape(())) / np.float32(sy), "float32"),
                               tirx.const(float(t.zero.reshape(())), "float32")) for t in terms)
        low = max(INT8_RANGE.min, zy) if relu else INT8_RANGE.min

        def add_requantized(a, b):  # sat(round((a - z_a) * s_a / s_y + (b - z_b) * s_b / s_y) + z_y), in float32
            def value(*i):
                real = (a(*i).astype("float32") - za) * ka + (b(*i).astype("float32") - zb) * kb
                return _saturated(te.round(real) + tirx.const(float(zy), "float32"), low)
            return te.compute(a.shape, value, name="add_requantized")

        return self.builder_.call_te(add_requantized, terms[0].value, terms[1].value, primfunc_name_hint="add_int8")

    def _contracted(self, source, sy: float, zy: int):
        """A convolution or matmul of a dequantized int8 input and int8 constant weights, with its
        bias and Relu, as the int8 x int8 -> int32 contraction and its requantisation."""
        relu = self._is(source, "nn.relu")
        node = self._producer(source.args[0]) if relu else source
        bias = None
        if self._is(node, "add"):
            for i in (0, 1):
                core = self._producer(node.args[i])
                if self._is(core, "nn.conv2d") or self._is(core, "matmul"):
                    node, bias = core, node.args[1 - i]
                    break
        conv = self._is(node, "nn.conv2d")
        if not (conv or self._is(node, "matmul")):
            return None
        x = self._dequantized(node.args[0])
        w = self._weights(node.args[1], conv)
        if x is None or not x.per_tensor() or w is None or static_shape(node.ty) is None:
            return None
        if conv and [str(node.attrs.data_layout), str(node.attrs.kernel_layout), str(node.attrs.out_layout)] != [
                "NCHW", "OIHW", "NCHW"]:
            return None
        channels = static_shape(node.ty)[1 if conv else -1]
        sx, zx = np.float32(x.scale.reshape(())), int(x.zero.reshape(()))
        sw = np.broadcast_to(w.scale.astype(np.float32), (channels,))
        b_q = np.zeros(channels, np.int64) if bias is None else self._bias(bias, sx * sw, channels)
        if b_q is None:
            return None
        wq = constant_value(w.value).astype(np.int64)
        total = b_q - zx * (wq.reshape(channels, -1).sum(axis=1) if conv else wq.sum(axis=0))
        if np.abs(total).max(initial=0) >= EXACT_F32:
            return None
        emit = self.builder_.emit
        shape = (1, channels, 1, 1) if conv else (channels,)
        real = emit(relax.op.astype(emit(self._contraction(node, x, w.value, conv, zx)), "float32"))
        if total.any():
            real = emit(relax.op.add(real, _f32(total.reshape(shape))))
        real = relax.op.multiply(real, _f32((sx * sw / np.float32(sy)).reshape(shape)))
        return _requantized(self.builder_, real, zy, relu)

    def _weights(self, expr, conv: bool) -> Quantized | None:
        """The int8 constant weights of a convolution (OIHW, scales per O) or of a matmul ((K, N),
        scales per N; through the transpose a Gemm's ``transB`` makes): zero points 0."""
        call = self._producer(expr)
        transposed = not conv and self._is(call, "permute_dims")
        w = self._dequantized(call.args[0] if transposed else expr)
        if w is None or constant_value(w.value) is None or w.zero.any():
            return None
        dq = self._producer(call.args[0] if transposed else expr)
        values = constant_value(w.value)
        axis = int(dq.attrs.axis) % values.ndim
        if w.scale.size > 1 and axis != (0 if conv or transposed else values.ndim - 1):
            return None  # per-channel scales along another axis than the output channels
        if transposed:
            if values.ndim != 2 or [int(a) for a in call.attrs.axes] != [1, 0]:
                return None
            values = values.T
        elif not conv and values.ndim != 2:
            return None
        return Quantized(relax.const(np.ascontiguousarray(values), INT8), w.scale, w.zero)

    def _bias(self, expr, scale: np.ndarray, channels: int) -> np.ndarray | None:
        """The int32 values of a bias quantized at ``scale`` (the input's times the weights', as
        onnxruntime quantizes it), through the reshape that broadcasts it; else None."""
        call = self._producer(expr)
        if self._is(call, "reshape"):
            expr = call.args[0]
        b = self._producer(expr)
        if not self._is(b, "dequantize") or str(b.args[0].ty.dtype) != "int32":
            return None
        values, params = constant_value(b.args[0]), self._params(b.args[1], b.args[2])
        if values is None or params is None or params[1].any() or values.size != channels:
            return None
        if not np.allclose(np.broadcast_to(params[0], (channels,)), scale, rtol=1e-6, atol=0):
            return None
        return values.reshape(channels).astype(np.int64)

    def _contraction(self, node, x: Quantized, w: relax.Expr, conv: bool, zx: int):
        """``sum x_q * w_q`` in int32; a convolution's padding is the input's zero point."""
        if not conv:
            return relax.op.matmul(x.value, w, out_dtype="int32")
        a = node.attrs
        top, left, bottom, right = (int(p) for p in a.padding)

        def conv(data, weights):  # the padding, then TOPI's convolution (as LegalizeOps makes it)
            data = topi.nn.pad(data, (0, 0, top, left), (0, 0, bottom, right), pad_value=zx, name="pad_zero_point")
            return topi.nn.conv(data, weights, [int(s) for s in a.strides], 0, [int(d) for d in a.dilation],
                                int(a.groups), "NCHW", "OIHW", "int32")

        return self.builder_.call_te(conv, x.value, w, primfunc_name_hint="conv2d_int8")


def _f32(values) -> relax.Constant:
    return relax.const(np.asarray(values, np.float32))


def _saturated(value, low: int):
    """``value`` (an integer in float32) clipped to ``[low, 127]`` and cast to int8."""
    clipped = te.max(te.min(value, tirx.const(float(INT8_RANGE.max), "float32")), tirx.const(float(low), "float32"))
    return clipped.astype(INT8)


def _requantized(builder, real, zy: int, relu: bool) -> relax.Expr:
    """``sat(round(real) + z_y)`` as int8, rounded half to even (a Relu first: no lower than
    ``z_y``): relax's quantize at scale 1, one block whose cast takes an integer in range."""
    if relu:
        real = relax.op.nn.relu(builder.emit(real))
    return relax.op.quantize(builder.emit(real), _f32(1.0), relax.const(zy, INT8), 0, INT8)


def _signed_calls(func: relax.Function) -> set:
    """The quantize calls to uint8 whose results only dequantize calls read, with those readers;
    their zero points constants (none in a function with branches: their reads are not walked)."""
    bound, readers = {}, {}
    for block in func.body.blocks:
        for b in block.bindings:
            if isinstance(b.value, relax.If):
                return set()
            bound[b.var] = b.value
            for a in b.value.args if isinstance(b.value, relax.Call) else [b.value]:
                readers.setdefault(a, []).append(b.value)
    calls = set()
    for var, value in bound.items():
        users = readers.get(var, [])
        if (isinstance(value, relax.Call) and value.op.same_as(_OPS["quantize"]) and str(value.ty.dtype) == UINT8
                and users and not var.same_as(func.body.body)
                and all(isinstance(u, relax.Call) and u.op.same_as(_OPS["dequantize"]) for u in users)
                and all(constant_value(c.args[2]) is not None for c in [value, *users])):
            calls.update([value, *users])
    return calls


@relax.expr_functor.mutator
class _Signed(relax.PyExprMutator):
    """uint8 activations (``quantize_static``'s default) as int8, their zero points 128 lower: the
    same real values, the same rounding and saturation, in the chip's type."""

    def __init__(self, mod):
        super().__init__(mod)
        self.signed = set().union(*[_signed_calls(f) for f in mod.functions.values() if isinstance(f, relax.Function)])

    def visit_call_(self, call):
        signed = call in self.signed
        call = super().visit_call_(call)
        if not signed:
            return call
        zero = relax.const((constant_value(call.args[2]).astype(np.int16) - 128).astype(np.int8))
        if call.op.same_as(_OPS["quantize"]):
            return relax.op.quantize(call.args[0], call.args[1], zero, int(call.attrs.axis), INT8)
        return relax.op.dequantize(call.args[0], call.args[1], zero, int(call.attrs.axis), str(call.attrs.out_dtype))


@tvm.transform.module_pass(opt_level=0, name="dsa.IntegerQDQ")
def IntegerQDQ(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 (a pass, named like TVM's)
    return rewrite_functions(rewrite_functions(mod, _Signed), _Integer, keep_added=True)
