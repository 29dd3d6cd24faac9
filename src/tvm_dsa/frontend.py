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

    mod = tvm_dsa.frontend.from_onnx(model)      # same arguments as relax.frontend.onnx.from_onnx
"""

from __future__ import annotations

import numpy as np
import onnx
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax, tirx
from tvm.relax.frontend.onnx import onnx_frontend


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


# op -> (converter returning the Relax expression, or None to let TVM's converter do it;
#        the inputs that are values a computed shape may feed)
CONVERTERS = {"TopK": (_topk, (1,))}


class _Importer(onnx_frontend.ONNXGraphImporter):
    def _convert_operator(self, op_name, inputs, attrs, opset):
        if op_name in CONVERTERS and opset >= 10:
            sym = CONVERTERS[op_name][0](self.bb, inputs, attrs, [self._nodes, self._params])
            if sym is not None:
                return self.bb.normalize(sym)
        return super()._convert_operator(op_name, inputs, attrs, opset)


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


def from_onnx(model: onnx.ModelProto, shape_dict: dict | None = None, dtype_dict="float32",
              keep_params_in_input: bool = False):
    """``relax.frontend.onnx.from_onnx`` with the converters above."""
    if model.ir_version < 3:
        raise ValueError(f"ONNX IR version {model.ir_version} is not supported (at least 3)")
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    importer = _Importer(shape_dict, dtype_dict, keep_params_in_input=keep_params_in_input)
    return importer.from_onnx(_values_as_tensors(_qoperators_as_qdq(model)).graph, opset)
