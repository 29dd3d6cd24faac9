"""ONNX import with the converters TVM's importer lacks for data-dependent shapes.

TVM's Relax importer refuses ``TopK`` unless ``k`` is a constant ("TopK k must be a constant";
with ``k`` computed from ``Shape``: "Node ... cannot handle ShapeExpr inputs"), because Relax's
``topk`` takes ``k`` as an attribute. Here ``TopK`` with a computed ``k`` becomes a sort and a
slice whose length is a symbol the program defines at run time::

    k_shape = tensor_to_shape(reshape(k, [1]));  match_cast(k_shape, R.Shape([topk_k]))
    indices = strided_slice(argsort(x, axis, descending=largest), [axis], [0], [topk_k])
    values  = gather_elements(x, indices, axis)

(an ISVDOS op whose value input RDP may determine, e.g. ``topk_k = n // 2`` from the shape,
else an execution-determined symbol: the graph is cut there). Everything else is TVM's importer,
unchanged: the converters are ours, consulted first by a subclass of TVM's ``ONNXGraphImporter``.
A computed ``k`` reaches the converter as a tensor: the ONNX graph's ``k`` goes through a
``Cast`` to int64 first (TVM's ``Cast`` turns a shape value into a tensor; no-op otherwise).

QOperator nodes (``QLinearConv``, ``QLinearMatMul``: onnxruntime's ``QuantFormat.QOperator``), which
TVM's importer lacks, are written as the QDQ nodes they stand for before the import
(``_qoperators_as_qdq``): DequantizeLinear of each input (the weights per output channel where
their scales are; a QLinearConv's int32 bias at the input's scale times the weights'), the float
Conv or MatMul, QuantizeLinear of the output: the pattern ``relax_passes.quantized`` lowers to an
integer kernel, as it does onnxruntime's QDQ models.

onnxruntime's dynamic quantization (``quantize_dynamic``: DynamicQuantizeLinear on the
activations, MatMulInteger / ConvInteger, the int32 products rescaled in float by the graph): each
DynamicQuantizeLinear that only those ops read is written in int8 (``_dynamic_as_int8``: its
scale's min / max reductions as ONNX ops, the zero point and the values 128 lower, the same real
values), and MatMulInteger / ConvInteger of int8 activations and int8 constant weights with zero
points 0 become one int8 x int8 -> int32 matmul or convolution (``_matmul_integer``,
``_conv_integer``), the activations' zero point folded into it as more int8 rows (or input
channels) of the contraction: exact in int32, all on the MME. TVM's importer would widen the
operands to int32 (and it has no ConvInteger).

    mod = tvm_dsa.frontend.from_onnx(model)      # same arguments as relax.frontend.onnx.from_onnx
"""

from __future__ import annotations

import numpy as np
import onnx
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax, tirx
from tvm.relax.frontend.onnx import onnx_frontend

from tvm_dsa.relax_passes.fold import constant_value


def _topk(bb, inputs, attr, params):
    """TopK (opset >= 10, ``k`` an input); TVM's converter where ``k`` is a constant."""
    data, k = inputs[0], inputs[1]
    if isinstance(k, tvm.ir.expr.Constant):
        return None
    if attr.get("sorted", 1) != 1:
        raise ValueError("TopK with sorted=0 is not supported (the order of unsorted results is unspecified)")
    axis = attr.get("axis", -1) % data.ty.ndim  # TOPI's argsort / gather_elements want it non-negative
    k_shape = bb.normalize(relax.op.tensor_to_shape(bb.normalize(relax.op.reshape(k, [1]))))
    k_var = tirx.Var("topk_k", "int64")
    bb.match_cast(k_shape, relax.ShapeType([k_var]))
    order = bb.normalize(relax.op.argsort(data, axis=axis, descending=bool(attr.get("largest", 1)), dtype="int64"))
    # in bounds: ONNX requires k <= n (the output is then [..., k, ...], no min(k, n) to carry)
    indices = bb.normalize(relax.op.strided_slice(order, axes=[axis], begin=[0], end=[k_var], assume_inbound=True))
    values = bb.normalize(relax.op.gather_elements(data, indices, axis=axis))
    return relax.Tuple([values, indices])


#: an int8 value's largest magnitude that is also a negation's
INT8_DIGIT = 127


def _int8_digits(sums: np.ndarray, per_row: int = 1) -> np.ndarray:
    """int8 values ``d`` of shape ``[J * per_row, *sums.shape]``, each in [-127, 127], whose sum
    over the first axis is ``sums`` (J the fewest rows of ``per_row`` values that hold them)."""
    mag, sign = np.abs(sums.astype(np.int64)), np.sign(sums)
    rows = max(1, -(-int(mag.max(initial=0)) // INT8_DIGIT))
    rows = -(-rows // per_row) * per_row
    steps = np.arange(rows).reshape(-1, *[1] * sums.ndim) * INT8_DIGIT
    return (sign * np.clip(mag - steps, 0, INT8_DIGIT)).astype(np.int8)


def _integer_operands(bb, inputs, weight_ndim: int):
    """(a, the int8 constant weights, a's zero point or None) of a MatMulInteger / ConvInteger whose
    ``a`` is int8 with one zero point (a constant or a computed scalar) and whose weights are an
    int8 constant of ``weight_ndim`` dimensions with zero points 0; else None."""
    a, b = bb.normalize(inputs[0]), inputs[1]
    za = bb.normalize(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else None
    zb = inputs[3] if len(inputs) > 3 else None
    w = constant_value(b)
    if str(a.ty.dtype) != "int8" or w is None or w.dtype != np.int8 or w.ndim != weight_ndim:
        return None
    if zb is not None and (constant_value(zb) is None or constant_value(zb).any()):
        return None
    if za is not None:
        if str(za.ty.dtype) != "int8" or za.ty.ndim is None or int(np.prod([int(d) for d in za.ty.shape])) != 1:
            return None
        if constant_value(za) is not None and not constant_value(za).any():
            za = None
    return a, w, za


def _matmul_integer(bb, inputs, attr, params):
    """MatMulInteger of an int8 ``a`` (zero point ``z_a``) and int8 constant weights ``b`` (zero
    points 0) as one int8 x int8 -> int32 matmul, the zero point's term ``- z_a * sum_k b`` in it
    too: ``[a, z_a ... z_a] @ [[b], [-d]]`` where the J rows ``d`` (int8) sum to ``b``'s column
    sums. Exact in int32 (the MME's accumulator): ``sum_k (a - z_a) * b``."""
    operands = _integer_operands(bb, inputs, 2)
    if operands is None:
        return None
    a, w, za = operands
    if za is None:
        return relax.op.matmul(a, relax.const(w), out_dtype="int32")
    d = _int8_digits(w.astype(np.int64).sum(axis=0))
    shape = [int(s) for s in a.ty.shape]
    points = bb.normalize(relax.op.broadcast_to(relax.op.reshape(za, [1] * len(shape)), [*shape[:-1], len(d)]))
    a = bb.normalize(relax.op.concat([a, points], axis=-1))
    return relax.op.matmul(a, relax.const(np.concatenate([w, -d])), out_dtype="int32")


def _conv_integer(bb, inputs, attr, params):
    """ConvInteger (2-d, NCHW, any groups) of an int8 ``x`` (zero point ``z_x``, which pads it:
    the padded taps are real zeros) and int8 constant weights (zero points 0) as one int8 x int8
    -> int32 convolution, the zero point's term ``- z_x * sum w[o]`` in it too: J more input
    channels a group, each all ``z_x``, with weights ``-d`` (int8) that sum to each output
    channel's weights. Exact in int32: ``sum (x - z_x) * w``."""
    operands = _integer_operands(bb, inputs, 4)
    if operands is None or attr.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return None
    x, w, zx = operands
    groups = int(attr.get("group", 1))
    if x.ty.ndim != 4:
        return None
    top, left, bottom, right = attr.get("pads", (0, 0, 0, 0))
    conv = {"strides": attr.get("strides", (1, 1)), "dilation": attr.get("dilations", (1, 1)), "groups": groups,
            "out_dtype": "int32"}
    if zx is None:
        return relax.op.nn.conv2d(x, relax.const(w), padding=(top, left, bottom, right), **conv)
    n, channels, height, width = (int(s) for s in x.ty.shape)
    kh, kw = w.shape[2:]
    zero = relax.op.reshape(zx, [1, 1, 1, 1])
    if left or right:  # the padding is the zero point: x between columns, then rows, of z_x (copies)
        x = relax.op.concat([*([relax.op.broadcast_to(zero, [n, channels, height, left])] if left else []), x,
                             *([relax.op.broadcast_to(zero, [n, channels, height, right])] if right else [])], axis=3)
        width += left + right
    if top or bottom:
        x = relax.op.concat([*([relax.op.broadcast_to(zero, [n, channels, top, width])] if top else []), x,
                             *([relax.op.broadcast_to(zero, [n, channels, bottom, width])] if bottom else [])], axis=2)
        height += top + bottom
    d = _int8_digits(w.astype(np.int64).sum(axis=(1, 2, 3)), kh * kw)  # [J * kh * kw, O]
    d = d.reshape(-1, kh, kw, w.shape[0]).transpose(3, 0, 1, 2)  # [O, J, kh, kw]
    j = d.shape[1]
    if groups == 1:
        x = relax.op.concat([x, relax.op.broadcast_to(zero, [n, j, height, width])], axis=1)
    else:  # each group's channels, then its J channels of z_x
        x = relax.op.reshape(x, [n, groups, channels // groups, height, width])
        x = relax.op.concat([x, relax.op.broadcast_to(relax.op.reshape(zx, [1] * 5), [n, groups, j, height, width])],
                            axis=2)
        x = relax.op.reshape(x, [n, groups * (channels // groups + j), height, width])
    return relax.op.nn.conv2d(bb.normalize(x), relax.const(np.concatenate([w, -d], axis=1)), **conv)


# op -> (converter returning the Relax expression, or None to let TVM's converter do it;
#        the inputs that are values a computed shape may feed)
CONVERTERS = {"TopK": (_topk, (1,)), "MatMulInteger": (_matmul_integer, ()), "ConvInteger": (_conv_integer, ())}


class _Importer(onnx_frontend.ONNXGraphImporter):
    def _convert_operator(self, op_name, inputs, attrs, opset):
        if op_name in CONVERTERS and opset >= 10:
            sym = CONVERTERS[op_name][0](self.bb, inputs, attrs, [self._nodes, self._params])
            if sym is not None:
                return self.bb.normalize(sym)
            if op_name not in onnx_frontend._get_convert_map():
                raise tvm.error.OpNotImplemented(f"{op_name} is supported with int8 inputs with one zero point, "
                                                 "int8 constant weights with zero points 0, explicit pads")
        return super()._convert_operator(op_name, inputs, attrs, opset)

    def _check_for_unsupported_ops(self, graph):  # ops of CONVERTERS that TVM lacks are ours
        super()._check_for_unsupported_ops(onnx.GraphProto(node=[n for n in graph.node if n.op_type not in CONVERTERS]))


def _values_as_tensors(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` in which the value inputs of the ops in ``CONVERTERS`` (other than
    initializers) pass through ``Cast(to=INT64)``."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    constant = {t.name for t in model.graph.initializer}
    nodes = []
    for node in model.graph.node:
        for i in CONVERTERS.get(node.op_type, (None, ()))[1]:
            if i < len(node.input) and node.input[i] and node.input[i] not in constant:
                cast = f"{node.input[i]}__as_tensor_{len(nodes)}"
                nodes.append(helper.make_node("Cast", [node.input[i]], [cast], to=TensorProto.INT64))
                node.input[i] = cast
        nodes.append(node)
    model.graph.ClearField("node")
    model.graph.node.extend(nodes)
    return model


#: QOperator op -> (the float op, its attributes kept)
QOPERATORS = {"QLinearConv": ("Conv", ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")),
              "QLinearMatMul": ("MatMul", ())}


def _qoperators_as_qdq(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with each ``QOPERATORS`` node as DequantizeLinear, the float op and
    QuantizeLinear (a QLinearConv's bias dequantized at ``x_scale * w_scale``: constants)."""
    if not any(n.op_type in QOPERATORS for n in model.graph.node):
        return model
    model = onnx.ModelProto.FromString(model.SerializeToString())
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    nodes = []
    for k, node in enumerate(model.graph.node):
        if node.op_type not in QOPERATORS:
            nodes.append(node)
            continue
        op, kept = QOPERATORS[node.op_type]
        (a, sa, za, b, sb, zb, sy, zy), bias = node.input[:8], node.input[8:9]
        prefix = f"{node.name or node.op_type}_{k}_qdq"
        weight_axis = {"axis": 0} if node.op_type == "QLinearConv" else {"axis": 1}
        nodes += [helper.make_node("DequantizeLinear", [a, sa, za], [f"{prefix}_a"]),
                  helper.make_node("DequantizeLinear", [b, sb, zb], [f"{prefix}_b"], **weight_axis)]
        inputs = [f"{prefix}_a", f"{prefix}_b"]
        if bias and bias[0]:
            if sa not in inits or sb not in inits:
                raise ValueError(f"{node.op_type} {node.name!r}: a bias needs constant input and weight scales")
            scale = (inits[sa].astype(np.float32) * inits[sb].astype(np.float32)).astype(np.float32)
            model.graph.initializer.extend([numpy_helper.from_array(scale, f"{prefix}_bias_scale"),
                                            numpy_helper.from_array(np.zeros(scale.shape, np.int32),
                                                                    f"{prefix}_bias_zero")])
            nodes.append(helper.make_node("DequantizeLinear", [bias[0], f"{prefix}_bias_scale", f"{prefix}_bias_zero"],
                                          [f"{prefix}_bias"], axis=0))
            inputs.append(f"{prefix}_bias")
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name in kept}
        nodes += [helper.make_node(op, inputs, [f"{prefix}_y"], **attrs),
                  helper.make_node("QuantizeLinear", [f"{prefix}_y", sy, zy], [node.output[0]])]
    model.graph.ClearField("node")
    model.graph.node.extend(nodes)
    return model


#: ops that read DynamicQuantizeLinear's uint8 output as input 0 and its zero point as input 2
INTEGER_OPS = ("MatMulInteger", "ConvInteger")


def _dynamic_as_int8(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` in which each DynamicQuantizeLinear whose uint8 output ``y`` and zero
    point ``z`` only MatMulInteger / ConvInteger nodes read (as their ``a`` and its zero point)
    is written as the ONNX ops it stands for, in int8: ``scale = (max(x, 0) - min(x, 0)) / 255``
    (its output), ``z8 = QuantizeLinear(-min(x, 0) / scale, 1, -128)`` and ``y8 =
    QuantizeLinear(x, scale, z8)``: ``z - 128`` and ``y - 128``, rounded half to even and
    saturated as onnxruntime computes ``z`` and ``y``, the same real values; those nodes read them,
    so that their products are int8 x int8 (``_matmul_integer``, ``_conv_integer``)."""
    readers = {}
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            readers.setdefault(name, []).append((node.op_type, i))
    outputs = {o.name for o in model.graph.output}
    shifted = {n.output[0] for n in model.graph.node if n.op_type == "DynamicQuantizeLinear"
               and n.output[0] not in outputs and n.output[2] not in outputs and readers.get(n.output[0])
               and all(op in INTEGER_OPS and i == 0 for op, i in readers[n.output[0]])
               and all(op in INTEGER_OPS and i == 2 for op, i in readers.get(n.output[2], []))}
    if not shifted:
        return model
    model = onnx.ModelProto.FromString(model.SerializeToString())
    model.graph.initializer.extend([numpy_helper.from_array(np.float32(0), "dynamic_int8_zero"),
                                    numpy_helper.from_array(np.float32(255), "dynamic_int8_range"),
                                    numpy_helper.from_array(np.float32(1), "dynamic_int8_one"),
                                    numpy_helper.from_array(np.int8(-128), "dynamic_int8_shift")])
    nodes, renamed = [], {}
    for node in model.graph.node:
        if node.op_type in INTEGER_OPS:
            for i, name in enumerate(node.input):
                node.input[i] = renamed.get(name, name)
        if node.op_type != "DynamicQuantizeLinear" or node.output[0] not in shifted:
            nodes.append(node)
            continue
        x, (y, scale, z) = node.input[0], node.output
        renamed.update({y: f"{y}_int8", z: f"{z}_int8"})
        t = f"{y}_dynamic"
        nodes += [helper.make_node("ReduceMax", [x], [f"{t}_max"], keepdims=0),
                  helper.make_node("Max", [f"{t}_max", "dynamic_int8_zero"], [f"{t}_hi"]),
                  helper.make_node("ReduceMin", [x], [f"{t}_min"], keepdims=0),
                  helper.make_node("Min", [f"{t}_min", "dynamic_int8_zero"], [f"{t}_lo"]),
                  helper.make_node("Sub", [f"{t}_hi", f"{t}_lo"], [f"{t}_span"]),
                  helper.make_node("Div", [f"{t}_span", "dynamic_int8_range"], [scale]),
                  helper.make_node("Neg", [f"{t}_lo"], [f"{t}_neg"]),
                  helper.make_node("Div", [f"{t}_neg", scale], [f"{t}_zero"]),
                  helper.make_node("QuantizeLinear", [f"{t}_zero", "dynamic_int8_one", "dynamic_int8_shift"],
                                   [f"{z}_int8"]),
                  helper.make_node("QuantizeLinear", [x, scale, f"{z}_int8"], [f"{y}_int8"])]
    model.graph.ClearField("node")
    model.graph.node.extend(nodes)
    return model


def from_onnx(model: onnx.ModelProto, shape_dict: dict | None = None, dtype_dict="float32",
              keep_params_in_input: bool = False):
    """``relax.frontend.onnx.from_onnx`` with the converters above."""
    if model.ir_version < 3:
        raise ValueError(f"ONNX IR version {model.ir_version} is not supported (at least 3)")
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    importer = _Importer(shape_dict, dtype_dict, keep_params_in_input=keep_params_in_input)
    return importer.from_onnx(_values_as_tensors(_dynamic_as_int8(_qoperators_as_qdq(model))).graph, opset)
