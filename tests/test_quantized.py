"""Quantized (QDQ) models on the int8 chips: each integer kernel against numpy's integer
reference, the requantisation's rounding at its edges, a CNN quantized by onnxruntime against
onnxruntime, QOperator models, and float models quantized by ``tvm_dsa.quantize`` / ``tvm-dsa run
--quantize`` with their calibration file's errors (docs/quantized.md)."""

import json
import re
import tempfile

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh
from tvm import relax

import tvm_dsa
from tvm_dsa import isa
from tvm_dsa.frontend import from_onnx

INT8 = np.iinfo(np.int8)


def _model(nodes, inputs, output, inits) -> onnx.ModelProto:
    """An opset-17 model (ir_version 10, for onnxruntime) of ``nodes``: int8 inputs ``name ->
    shape`` and the float output ``(name, shape)``."""
    graph = h.make_graph(nodes, "q", [h.make_tensor_value_info(n, TP.INT8, s) for n, s in inputs.items()],
                         [h.make_tensor_value_info(output[0], TP.FLOAT, output[1])], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def _dq(name: str, scale, zero, out: str, axis: int = 1) -> tuple:
    """DequantizeLinear of ``name`` and its initializers (int8 zero point, or int32 for a bias)."""
    zero = np.asarray(zero)
    inits = [nh.from_array(np.asarray(scale, np.float32), f"{out}_s"), nh.from_array(zero, f"{out}_z")]
    return h.make_node("DequantizeLinear", [name, f"{out}_s", f"{out}_z"], [out], axis=axis), inits


def _qdq_layer(x: str, y: str, sy: float, zy: int) -> tuple:
    """QuantizeLinear of ``x`` at (sy, zy) and DequantizeLinear back to the float output ``y``:
    the output's quantisation, and the float value the model gives."""
    inits = [nh.from_array(np.float32(sy), "ys"), nh.from_array(np.int8(zy), "yz")]
    return [h.make_node("QuantizeLinear", [x, "ys", "yz"], ["yq"]),
            h.make_node("DequantizeLinear", ["yq", "ys", "yz"], [y])], inits


def _on_dsa(model: onnx.ModelProto, feeds: dict, target: str = "dsa/set-edge16",
            schedule: str = "layerwise") -> tuple[np.ndarray, object]:
    """(the output of the chip's run, what the offload decided) of ``model`` compiled for
    ``target`` under ``schedule``."""
    mod = from_onnx(model, keep_params_in_input=False)  # TVM's importer, QOperator nodes as QDQ ones
    ex = tvm.compile(mod, target=target, relax_pipeline=tvm_dsa.pipeline(schedule=schedule))
    result = tvm_dsa.pipeline_result(ex)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(feeds[i.name]) for i in model.graph.input]).numpy()
    return out, result


def _uint8_reference(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    """The output of ``model``, whose products multiply uint8 activations by int8 weights, by
    onnx's reference evaluator (exact integers). onnxruntime is no reference for these: on x86
    without VNNI its u8 x s8 kernels sum pairs of products in int16 (``vpmaddubsw``), which
    saturates (onnxruntime issues 16105, 19109); onnxruntime 1.32 on an AVX2 machine was off by
    up to 31,472 in 48 of a 4x16 MatMulInteger's 64 outputs. The evaluator implements
    (De)QuantizeLinear from opset 19 on, which compute the same for these types: the model is
    converted to opset 21 first."""
    from onnx.reference import ReferenceEvaluator
    from onnx.version_converter import convert_version

    return ReferenceEvaluator(convert_version(model, 21)).run(None, feeds)[0]


def _steps(y: np.ndarray, sy: float, zy: int) -> np.ndarray:
    """The int8 values a dequantized output holds."""
    return np.rint(y / np.float32(sy)).astype(np.int64) + zy


def _requantize(acc: np.ndarray, scale: np.ndarray, zy: int, low: int = INT8.min) -> np.ndarray:
    """The requantisation rule: float32(acc) * scale in float32, rounded half to even, plus the
    zero point, saturated to [low, 127]."""
    real = acc.astype(np.float32) * scale.astype(np.float32)
    return np.clip(np.rint(real).astype(np.int64) + zy, low, INT8.max)


def test_gemm_requantisation_edges():
    """A Gemm (per-channel weights, int32 bias) whose scales put the outputs on ties (x.5, both
    signs), beyond the int8 range both ways, with a negative output zero point: the chip's int8
    results are numpy's integer reference exactly."""
    rng = np.random.default_rng(1)
    k, n = 16, 6
    x = rng.integers(-128, 128, (4, k), dtype=np.int8)
    zx = 3
    w = rng.integers(-127, 128, (n, k), dtype=np.int8)
    sx, sw, sy, zy = 0.5, np.array([1, 0.5, 0.25, 2, 4, 1], np.float32), 1.0, -100
    bias = rng.integers(-2000, 2000, n).astype(np.int32)
    x[:, 0], w[:, 0] = 127, 1  # odd sums: ties where the scale is 0.5
    nodes, inits = [], [nh.from_array(w, "wq"), nh.from_array(bias, "bq")]
    for node, more in (_dq("x", sx, np.int8(zx), "xd"), _dq("wq", sw, np.zeros(n, np.int8), "wd", axis=0),
                       _dq("bq", sx * sw, np.zeros(n, np.int32), "bd", axis=0)):
        nodes.append(node)
        inits += more
    nodes.append(h.make_node("Gemm", ["xd", "wd", "bd"], ["g"], transB=1))
    tail, more = _qdq_layer("g", "y", sy, zy)
    model = _model(nodes + tail, {"x": [4, k]}, ("y", [4, n]), inits + more)
    y, result = _on_dsa(model, {"x": x})
    assert result.host == {} and result.dsa_macs == 4 * k * n
    acc = (x.astype(np.int64) - zx) @ w.T.astype(np.int64) + bias
    scale = np.float32(sx) * sw / np.float32(sy)
    expected = _requantize(acc, scale, zy)
    assert np.array_equal(_steps(y, sy, zy), expected)
    real = acc.astype(np.float32) * scale
    assert (np.abs(real - np.trunc(real)) == 0.5).any()  # ties were met
    assert (expected == INT8.max).any() and (expected == INT8.min).any()  # and saturation both ways


def _conv_model(x_shape, w, bias, sx, zx, sw, sy, zy, stride: int, relu: bool) -> onnx.ModelProto:
    """DQ(x) * DQ(w) 3x3 convolution, padding 1, + DQ(bias) [+ Relu], quantized at (sy, zy)."""
    cout = w.shape[0]
    nodes, inits = [], [nh.from_array(w, "wq"), nh.from_array(bias, "bq")]
    for node, more in (_dq("x", sx, np.int8(zx), "xd"), _dq("wq", sw, np.zeros(cout, np.int8), "wd", axis=0),
                       _dq("bq", np.float32(sx) * sw, np.zeros(cout, np.int32), "bd", axis=0)):
        nodes.append(node)
        inits += more
    nodes.append(h.make_node("Conv", ["xd", "wd", "bd"], ["c"], pads=[1, 1, 1, 1], strides=[stride, stride]))
    if relu:
        nodes.append(h.make_node("Relu", ["c"], ["r"]))
    tail, more = _qdq_layer("r" if relu else "c", "y", sy, zy)
    size = (x_shape[2] + 2 - 3) // stride + 1
    return _model(nodes + tail, {"x": list(x_shape)}, ("y", [x_shape[0], cout, size, size]), inits + more)


def _conv_reference(x, w, zx, stride) -> np.ndarray:
    """sum (x - zx) * w over 3x3 windows, the padding real zeros (x's zero point), in int64."""
    n, _, size, _ = x.shape
    padded = np.pad(x.astype(np.int64) - zx, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = (size + 2 - 3) // stride + 1
    acc = np.zeros((n, w.shape[0], out, out), np.int64)
    for i in range(3):
        for j in range(3):
            window = padded[:, :, i:i + stride * out:stride, j:j + stride * out:stride]
            acc += np.einsum("nchw,oc->nohw", window, w[:, :, i, j].astype(np.int64))
    return acc


@pytest.mark.parametrize("stride,relu", [(1, True), (2, False)])
def test_conv_integer_kernel(stride, relu):
    """A padded 3x3 convolution with a negative input zero point (its padding is that zero
    point), per-channel weight scales and a Relu folded into the lower bound: numpy's integer
    reference exactly, in one kernel on the DSA."""
    rng = np.random.default_rng(2)
    x = rng.integers(-128, 128, (1, 5, 9, 9), dtype=np.int8)
    w = rng.integers(-127, 128, (4, 5, 3, 3), dtype=np.int8)
    bias = rng.integers(-500, 500, 4).astype(np.int32)
    sx, zx, sw, sy, zy = 0.02, -128, np.array([0.01, 0.02, 0.005, 0.03], np.float32), 0.5, -20
    model = _conv_model(x.shape, w, bias, sx, zx, sw, sy, zy, stride, relu)
    y, result = _on_dsa(model, {"x": x})
    assert result.host == {} and len(result.dsa) == 1
    scale = (np.float32(sx) * sw / np.float32(sy)).reshape(1, -1, 1, 1)
    expected = _requantize(_conv_reference(x, w, zx, stride) + bias.reshape(1, -1, 1, 1), scale, zy,
                           zy if relu else INT8.min)
    assert np.array_equal(_steps(y, sy, zy), expected)


def test_add_and_maxpool_on_int8():
    """A residual Add of two int8 tensors (each rescaled to the output's scale in float32) and a
    MaxPool between a dequantize and a quantize of one scale (on the int8 values themselves)."""
    rng = np.random.default_rng(3)
    a, b = (rng.integers(-128, 128, (1, 4, 8, 8), dtype=np.int8) for _ in range(2))
    (sa, za), (sb, zb), (sy, zy) = (0.05, -7), (0.03, 12), (0.06, 5)
    nodes, inits = [], []
    for node, more in (_dq("a", sa, np.int8(za), "ad"), _dq("b", sb, np.int8(zb), "bd")):
        nodes.append(node)
        inits += more
    nodes += [h.make_node("Add", ["ad", "bd"], ["s"]), h.make_node("QuantizeLinear", ["s", "ys", "yz"], ["sq"]),
              h.make_node("DequantizeLinear", ["sq", "ys", "yz"], ["sd"]),
              h.make_node("MaxPool", ["sd"], ["p"], kernel_shape=[2, 2], strides=[2, 2])]
    tail, more = _qdq_layer("p", "y", sy, zy)
    model = _model(nodes + tail[:1] + [h.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])],
                   {"a": [1, 4, 8, 8], "b": [1, 4, 8, 8]}, ("y", [1, 4, 4, 4]), inits + more)
    y, result = _on_dsa(model, {"a": a, "b": b})
    assert result.host == {}
    f32 = np.float32
    real = (a.astype(f32) - f32(za)) * (f32(sa) / f32(sy)) + (b.astype(f32) - f32(zb)) * (f32(sb) / f32(sy))
    summed = np.clip(np.rint(real).astype(np.int64) + zy, INT8.min, INT8.max)
    expected = summed.reshape(1, 4, 4, 2, 4, 2).max(axis=(3, 5))
    assert np.array_equal(_steps(y, sy, zy), expected)


def test_integer_arithmetic_stays_on_the_host():
    """An int32 sum, which the vector units would compute in float32 (inexact beyond 2**24),
    runs on the host, with the reason."""
    bb = relax.BlockBuilder()
    x, z = (relax.Var(n, relax.TensorType((4, 32), "int32")) for n in ("x", "z"))
    with bb.function("main", [x, z]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.add(x, z)))
        bb.emit_func_output(out)
    ex = tvm.compile(bb.get(), target="dsa/set-edge16", relax_pipeline=tvm_dsa.pipeline(schedule="layerwise"))
    (reason,) = tvm_dsa.pipeline_result(ex).host.values()
    assert "integer arithmetic" in reason
    big = np.full((4, 32), 2 ** 30 + 1, np.int32)
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(big), tvm.runtime.tensor(big)).numpy()
    assert (out == big + big).all()


# -- a CNN quantized by onnxruntime
def _float_cnn() -> onnx.ModelProto:
    """Conv-Relu, a residual Conv-Relu + Add, a strided Conv-Relu, MaxPool, Flatten, Gemm."""
    rng = np.random.default_rng(4)

    def init(name, *shape):
        return nh.from_array((rng.standard_normal(shape) * (2 / np.prod(shape[1:])) ** 0.5).astype(np.float32), name)

    nodes = [
        h.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c1"], ["r1"]),
        h.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c2"], ["r2"]),
        h.make_node("Add", ["r1", "r2"], ["s"]),
        h.make_node("Conv", ["s", "w3", "b3"], ["c3"], pads=[1, 1, 1, 1], strides=[2, 2]),
        h.make_node("Relu", ["c3"], ["r3"]),
        h.make_node("MaxPool", ["r3"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        h.make_node("Flatten", ["p"], ["f"]),
        h.make_node("Gemm", ["f", "w4", "b4"], ["y"], transB=1),
    ]
    inits = [init("w1", 16, 3, 3, 3), init("b1", 16), init("w2", 16, 16, 3, 3), init("b2", 16),
             init("w3", 32, 16, 3, 3), init("b3", 32), init("w4", 10, 32 * 4 * 4), init("b4", 10)]
    graph = h.make_graph(nodes, "cnn", [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, 16, 16])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [1, 10])], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 10
    return model


#: its MACs: three convolutions and the Gemm
CNN_MACS = 16 * 3 * 9 * 16 * 16 + 16 * 16 * 9 * 16 * 16 + 32 * 16 * 9 * 8 * 8 + 512 * 10


@pytest.fixture(scope="module")
def quantize_cnn(tmp_path_factory):
    """The QDQ model onnxruntime's quantize_static makes of the CNN with activations of the given
    ``QuantType`` name: per-channel int8 weights, calibrated on four inputs."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Inputs(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(5)
            self.feeds = iter([{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.feeds, None)

    folder = tmp_path_factory.mktemp("qdq")
    onnx.save(_float_cnn(), str(folder / "cnn.onnx"))

    def quantize(activations: str) -> onnx.ModelProto:
        path = str(folder / f"cnn_{activations}.onnx")
        quantize_static(str(folder / "cnn.onnx"), path, Inputs(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=getattr(QuantType, activations), weight_type=QuantType.QInt8)
        return onnx.load(path)

    return quantize


@pytest.fixture(scope="module")
def quantized_cnn(quantize_cnn):
    """(the CNN quantized with int8 activations, a test input)."""
    return quantize_cnn("QInt8"), np.random.default_rng(6).standard_normal((1, 3, 16, 16)).astype(np.float32)


def _output_scale(model: onnx.ModelProto) -> float:
    """The scale of the quantization the model's output is dequantized from."""
    (last,) = [n for n in model.graph.node if n.output[0] == model.graph.output[0].name]
    inits = {i.name: nh.to_array(i) for i in model.graph.initializer}
    return float(inits[last.input[1]])


@pytest.mark.parametrize("target", ["dsa/set-edge16", "dsa/stcp920"])
def test_quantized_cnn_against_onnxruntime(quantized_cnn, target):
    """onnxruntime's QDQ CNN on the chip: every convolution and the Gemm on the DSA (int8 x int8
    -> int32 on set-edge16; the same integers in fp16 with float32 sums on stcp920), and the
    output within one quantisation step of onnxruntime's."""
    import onnxruntime as ort

    model, x = quantized_cnn
    y, result = _on_dsa(model, {"x": x}, target)
    assert result.dsa_macs == CNN_MACS and result.host_kernels == 0
    expected = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    assert np.abs(y - expected).max() <= _output_scale(model) * 1.001


def test_cli_runs_a_qdq_model_with_numerics_on_an_int8_chip(quantized_cnn):
    """``tvm-dsa run`` refuses a float model's numerics on an int8 preset, not a QDQ model's."""
    from tvm_dsa.harness import InputError, check_target

    check_target("dsa/set-edge16", quantized_cnn[0])
    with pytest.raises(InputError, match="float model"):
        check_target("dsa/set-edge16", _float_cnn())


def test_uint8_activations_run_as_int8(quantize_cnn, quantized_cnn):
    """quantize_static's default uint8 activations are int8 on the chip, zero points 128 lower:
    the same real values, so the same kernels on the DSA and the reference evaluator's output."""
    model, x = quantize_cnn("QUInt8"), quantized_cnn[1]
    y, result = _on_dsa(model, {"x": x})
    assert result.dsa_macs == CNN_MACS and result.host_kernels == 0
    expected = _uint8_reference(model, {"x": x})
    assert np.abs(y - expected).max() <= _output_scale(model) * 1.001


def _scheduled_cnn(quantized_cnn, target: str, schedule: str):
    """What the offload decided for the quantized CNN under ``schedule`` on ``target``, having
    checked what every schedule gives: no sub-graph or tree run layer by layer, every MAC on the
    DSA, the output the layerwise build's bit for bit (the same integer arithmetic), so within one
    step of onnxruntime's."""
    import onnxruntime as ort

    model, x = quantized_cnn
    layerwise, _ = _on_dsa(model, {"x": x}, target)
    y, result = _on_dsa(model, {"x": x}, target, schedule)
    assert result.unstitched == {} and result.dsa_macs == CNN_MACS and result.host_kernels == 0
    assert np.array_equal(y, layerwise)
    expected = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    assert np.abs(y - expected).max() <= _output_scale(model) * 1.001
    return result


@pytest.mark.parametrize("target", ["dsa/set-edge16", "dsa/set-cloud144"])
def test_graphturbo_stitches_the_quantized_cnn(quantized_cnn, target):
    """GraphTurbo stitches the quantized CNN as it does a float one: the Flatten before the Gemm
    is a view on the host, so two sub-graphs (the input's quantisation, the three convolutions and
    the MaxPool; the Gemm with the output's dequantisation), each one kernel with its int8
    tensors, float32 tables and float32 model input or output at their own types, its output the
    layerwise build's (``_scheduled_cnn``)."""
    result = _scheduled_cnn(quantized_cnn, target, "graphturbo")
    assert sorted(result.dsa) == sorted(result.stitched) and len(result.stitched) == 2


@pytest.mark.parametrize("target", ["dsa/set-edge16", "dsa/set-cloud144"])
def test_set_runs_the_quantized_cnn_as_one_tree(quantized_cnn, target):
    """SET schedules the quantized CNN as one tree (the Flatten a view inside it) whose program
    holds every tensor at its own type: the float32 input and output, int8 weights, float32
    tables, and int8 feature maps kept in the LBs between layers (moved core to core as int8);
    its output the layerwise build's (``_scheduled_cnn``)."""
    result = _scheduled_cnn(quantized_cnn, target, "set")
    assert result.dsa == list(result.trees) and len(result.trees) == 1
    (_, tree), = result.trees.values()
    args = tree.program.args
    assert all(a.dtype == a.host_dtype for a in args) and {a.dtype for a in args} == {"int8", "float32"}
    assert tree.residency["chunks on chip"] > 0
    assert any(isinstance(i, isa.Dma) and (i.src.mem, i.dst.mem, i.src.dtype) == ("lb", "lb", "int8")
               for k in tree.program.kernels for i in k.instructions)


def test_a_tensor_stored_at_two_types_runs_its_sub_graph_layer_by_layer():
    """On stcp920 a DequantizeLinear's kernel (an integer kernel: its float32 output at its own
    type) feeds a Softmax (a float layer: the same tensor in the chip's fp16). A stitched kernel
    holds each tensor at one type, so the sub-graph runs its two layers one kernel each, the host
    converting between them as layerwise, with that reason; the output is the layerwise build's."""
    rng = np.random.default_rng(12)
    x = rng.integers(-128, 128, (8, 16), dtype=np.int8)
    dq, inits = _dq("x", 0.05, np.int8(3), "xd")
    tail, more = _qdq_layer("s", "y", 1 / 256, -128)
    model = _model([dq, h.make_node("Softmax", ["xd"], ["s"], axis=-1)] + tail, {"x": [8, 16]}, ("y", [8, 16]),
                   inits + more)
    layerwise, _ = _on_dsa(model, {"x": x}, "dsa/stcp920")
    y, result = _on_dsa(model, {"x": x}, "dsa/stcp920", "graphturbo")
    (why,) = result.unstitched.values()
    assert re.fullmatch(r"tensor \w+ is stored as float32 by layer \w+ and as float16 by \w+", why), why
    assert len(result.dsa) == 2 and result.host == {} and not result.stitched
    assert np.array_equal(y, layerwise)


# -- a float model quantized for the int8 chip: tvm_dsa.quantize, tvm-dsa run --quantize
@pytest.fixture(scope="module")
def float_cnn_file(tmp_path_factory):
    """The float CNN saved as an .onnx file: (path, model)."""
    path = tmp_path_factory.mktemp("float") / "cnn.onnx"
    onnx.save(_float_cnn(), str(path))
    return str(path), _float_cnn()


def _input_quantisation(model: onnx.ModelProto) -> tuple[float, int]:
    """(scale, zero point) of the QuantizeLinear that reads the graph's input."""
    (node,) = [n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == model.graph.input[0].name]
    inits = {i.name: nh.to_array(i) for i in model.graph.initializer}
    return float(inits[node.input[1]]), int(inits[node.input[2]])


def test_quantize_a_float_model_runs_it_on_the_int8_chip():
    """tvm_dsa.quantize: onnxruntime's QDQ model of the float CNN, calibrated on four example
    inputs other than seed 0's; on set-edge16 every MAC on the DSA and the output within one step
    of onnxruntime's session of the same QDQ model."""
    import onnxruntime as ort

    from tvm_dsa.models import example_inputs

    q = tvm_dsa.quantize(_float_cnn())
    assert (q.samples, q.calibration) == (4, "the example inputs")
    ops = {n.op_type for n in q.model.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear", "Conv", "Gemm"} <= ops
    x = example_inputs(q.model)["x"]
    y, result = _on_dsa(q.model, {"x": x})
    assert result.dsa_macs == CNN_MACS and result.host_kernels == 0
    expected = ort.InferenceSession(q.model.SerializeToString()).run(None, {"x": x})[0]
    assert np.abs(y - expected).max() <= _output_scale(q.model) * 1.001
    # MinMax calibration of int8 activations: the input's range over the samples, 0 included, in 255 steps
    samples = np.stack([example_inputs(_float_cnn(), seed)["x"] for seed in range(1, 5)])
    scale, _ = _input_quantisation(q.model)
    assert scale == pytest.approx((max(samples.max(), 0) - min(samples.min(), 0)) / 255, rel=1e-6)


def test_cli_quantize_reports_the_distance_from_the_float_model(float_cnn_file, capsys):
    """``tvm-dsa run --quantize`` on set-edge16: numerics against the quantized model on llvm, and
    the quantized output's distance from the float model, the distance onnxruntime's own QDQ and
    float sessions give on the same input within one output step."""
    import onnxruntime as ort

    from tvm_dsa.cli import main
    from tvm_dsa.models import example_inputs

    path, model = float_cnn_file
    assert main(["run", path, "--target", "dsa/set-edge16", "--quantize", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    quantized = data["quantized"]
    assert (quantized["samples"], quantized["calibration"], quantized["method"]) == (4, "the example inputs", "MinMax")
    assert data["numerics"]["ok"] and data["offload"]["host_macs"] == 0 and data["offload"]["dsa_macs"] == CNN_MACS
    qdq = tvm_dsa.quantize(model).model
    x = {"x": example_inputs(model)["x"]}
    float_out = ort.InferenceSession(model.SerializeToString()).run(None, x)[0]
    on_ort = np.abs(ort.InferenceSession(qdq.SerializeToString()).run(None, x)[0] - float_out).max()
    step = _output_scale(qdq) * 1.001
    assert on_ort > step  # the quantisation's own error, beyond the chip's rounding
    assert quantized["max_abs_error"] == pytest.approx(on_ort, abs=step)
    relative = quantized["max_abs_error"] / np.abs(float_out).max()
    assert quantized["max_relative_error"] == pytest.approx(relative, rel=1e-4)
    assert main(["run", path, "--target", "dsa/set-edge16", "--quantize"]) == 0
    out = capsys.readouterr().out
    assert "(the quantized model on llvm)" in out
    assert "quantized: int8 QDQ by onnxruntime's quantize_static (per-channel weights), calibrated (MinMax) on 4" in out
    assert f"against the float model on llvm, max |dsa - float| = {quantized['max_abs_error']:.3e}" in out


def test_cli_quantize_calibrates_on_the_npz_file(float_cnn_file, tmp_path, capsys):
    """``--calibration FILE.npz``: its N samples, stacked, are what the quantizer calibrates on
    (the input's scale is their range over 255 steps)."""
    from tvm_dsa.cli import main

    path, _ = float_cnn_file
    samples = np.random.default_rng(8).uniform(-3, 5, (3, 1, 3, 16, 16)).astype(np.float32)
    npz = tmp_path / "cal.npz"
    np.savez(npz, x=samples)
    assert main(["run", path, "--target", "dsa/set-edge16", "--quantize", "--calibration", str(npz), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["quantized"]["samples"] == 3 and data["quantized"]["calibration"] == str(npz)
    scale, _ = _input_quantisation(tvm_dsa.quantize(_float_cnn(), tvm_dsa.load_calibration(npz, _float_cnn())).model)
    assert scale == pytest.approx((samples.max() - min(samples.min(), 0)) / 255, rel=1e-6)


@pytest.mark.parametrize("case, expected", [
    ("missing_input", "calibration file {npz} has no array for input 'x' (it has 'image')"),
    ("wrong_shape", "calibration array 'x' has shape [2, 3, 8, 8]: the input is [1, 3, 16, 16] "
                    "(or [N, 1, 3, 16, 16] for N samples)"),
    ("extra_array", "calibration file {npz} has an array 'y' that is no input of the model (inputs: 'x')"),
    ("wrong_dtype", "calibration array 'x' is complex64: the input is float32"),
    ("not_npz", "cannot read the calibration file {npz}: "),
    ("without_quantize", "--calibration and --calibrate-method say how --quantize calibrates: pass --quantize too"),
    ("already_quantized", "the model is already quantized (it has QuantizeLinear, QLinear or Integer nodes)"),
    ("no_onnxruntime", "quantizing a float model needs onnxruntime: pip install onnxruntime"),
])
def test_cli_quantize_bad_input_exits_2_with_one_line(case, expected, float_cnn_file, quantized_cnn, tmp_path,
                                                      monkeypatch, capsys):
    import sys

    from tvm_dsa.cli import main

    path, npz = float_cnn_file[0], tmp_path / "cal.npz"
    x = np.zeros((1, 3, 16, 16), np.float32)
    arrays = {"missing_input": {"image": x}, "wrong_shape": {"x": x[:, :, :8, :8].repeat(2, 0)},
              "extra_array": {"x": x, "y": x}, "wrong_dtype": {"x": x.astype(np.complex64)}}.get(case, {"x": x})
    np.savez(npz, **arrays)
    if case == "not_npz":
        npz.write_bytes(b"not a zip file")
    if case == "already_quantized":
        path = str(tmp_path / "qdq.onnx")
        onnx.save(quantized_cnn[0], path)
    if case == "no_onnxruntime":
        monkeypatch.setitem(sys.modules, "onnxruntime.quantization", None)  # import fails as if not installed
    argv = ["run", path, "--target", "dsa/set-edge16"] + ["--quantize"] * (case != "without_quantize")
    argv += ["--calibration", str(npz)] * (case not in ("already_quantized", "no_onnxruntime"))
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("tvm-dsa: error: " + expected.format(npz=npz))
    assert captured.err.count("\n") == 1


def test_quantize_keeps_a_softmax_and_its_mask_in_float():
    """A Softmax and the elementwise ops that compute its input (the scaled scores plus the
    attention mask, -10000 where masked) are left float: in int8 the mask's range leaves the scores
    no resolution."""
    from tvm_dsa.harness.quantize import softmax_inputs

    rng = np.random.default_rng(9)
    nodes = [h.make_node("MatMul", ["x", "wq"], ["q"], name="query"),
             h.make_node("MatMul", ["q", "kt"], ["scores"], name="scores"),
             h.make_node("Div", ["scores", "sqrt_d"], ["scaled"], name="scale"),
             h.make_node("Sub", ["one", "m"], ["inverted"], name="invert"),
             h.make_node("Mul", ["inverted", "big"], ["mask"], name="mask"),
             h.make_node("Add", ["scaled", "mask"], ["masked"], name="add_mask"),
             h.make_node("Softmax", ["masked"], ["p"], axis=-1, name="softmax"),
             h.make_node("MatMul", ["p", "x"], ["y"], name="context")]
    inits = [nh.from_array(rng.standard_normal((8, 8)).astype(np.float32), "wq"),
             nh.from_array(rng.standard_normal((8, 4)).astype(np.float32), "kt"),
             nh.from_array(np.float32(8 ** 0.5), "sqrt_d"), nh.from_array(np.float32(1), "one"),
             nh.from_array(np.float32(-10000), "big")]
    graph = h.make_graph(nodes, "attention", [h.make_tensor_value_info("x", TP.FLOAT, [4, 8]),
                                              h.make_tensor_value_info("m", TP.FLOAT, [4, 4])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [4, 8])], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 10
    assert sorted(softmax_inputs(model)) == ["add_mask", "invert", "mask", "scale", "softmax"]
    q = tvm_dsa.quantize(model).model
    quantized = {n.input[0] for n in q.graph.node if n.op_type == "QuantizeLinear"}
    # the matmuls' inputs are quantized (the Softmax's output too, as the context matmul's input), the
    # Softmax's input and what it is computed from are not
    assert {"x", "q", "p"} <= quantized and not quantized & {"scaled", "mask", "masked"}


def test_quantize_converts_an_old_opset_for_per_channel_weights():
    """A model of opset 11 (DequantizeLinear has no axis before 13) is converted to opset 13 and
    quantized with per-channel weights."""
    model = _float_cnn()
    model.opset_import[0].version = 11
    q = tvm_dsa.quantize(model).model
    assert next(o.version for o in q.opset_import if o.domain in ("", "ai.onnx")) >= 13
    inits = {i.name: nh.to_array(i) for i in q.graph.initializer}
    weight = next(n for n in q.graph.node if n.op_type == "DequantizeLinear" and inits[n.input[0]].ndim == 4)
    assert inits[weight.input[1]].shape == (16,)  # a scale per output channel of the first convolution


def test_percentile_calibration_clips_an_outlier():
    """Calibrated on 400 inputs with one outlier (1000 among 307,200 N(0, 1) values), MinMax spreads
    the input's 255 steps over [min, 1000]; Percentile (the 99.999th: the top 3 values) clips the
    outlier: a scale below a tenth of MinMax's, still above what the largest other value needs."""
    rng = np.random.default_rng(10)
    samples = [{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(400)]
    samples[2]["x"][0, 1, 5, 5] = 1000
    values = np.concatenate([s["x"].ravel() for s in samples])
    minmax = tvm_dsa.quantize(_float_cnn(), samples, "outlier")
    percentile = tvm_dsa.quantize(_float_cnn(), samples, "outlier", method="Percentile")
    assert (minmax.method, percentile.method) == ("MinMax", "Percentile")
    assert _input_quantisation(minmax.model)[0] == pytest.approx((1000 - min(values.min(), 0)) / 255, rel=1e-6)
    assert _input_quantisation(percentile.model)[0] < _input_quantisation(minmax.model)[0] / 10
    second = np.sort(np.abs(values))[-2]
    assert _input_quantisation(percentile.model)[0] > second / 255


def test_qoperator_model_runs_its_qlinear_ops_on_the_dsa():
    """onnxruntime's QOperator format (QLinearConv with a bias, QLinearMatMul, uint8 activations):
    imported as the QDQ nodes they stand for, each an integer kernel on the DSA, the output the
    reference evaluator's within one step."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    rng = np.random.default_rng(11)

    def init(name, *shape):
        return nh.from_array((rng.standard_normal(shape) * (2 / np.prod(shape[1:])) ** 0.5).astype(np.float32), name)

    nodes = [h.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c1"], ["r1"]),
             h.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
             h.make_node("Flatten", ["c2"], ["f"]), h.make_node("MatMul", ["f", "w3"], ["y"])]
    graph = h.make_graph(nodes, "qop", [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, 8, 8])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [1, 10])],
                         [init("w1", 8, 3, 3, 3), init("b1", 8), init("w2", 8, 8, 3, 3), init("w3", 128, 10)])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 10

    class Inputs(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter([{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.feeds, None)

    with tempfile.TemporaryDirectory() as tmp:
        onnx.save(model, f"{tmp}/float.onnx")
        quantize_static(f"{tmp}/float.onnx", f"{tmp}/qop.onnx", Inputs(), quant_format=QuantFormat.QOperator,
                        per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        op_types_to_quantize=["Conv", "MatMul"])
        qop = onnx.load(f"{tmp}/qop.onnx")
    ops = [n.op_type for n in qop.graph.node]
    assert ops.count("QLinearConv") == 2 and ops.count("QLinearMatMul") == 1
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    y, result = _on_dsa(qop, {"x": x})
    assert result.dsa_macs == 8 * 3 * 9 * 8 * 8 + 8 * 8 * 9 * 4 * 4 + 128 * 10 and result.host_kernels == 0
    expected = _uint8_reference(qop, {"x": x})
    assert np.abs(y - expected).max() <= _output_scale(qop) * 1.001


# -- onnxruntime's dynamic quantization: MatMulInteger, ConvInteger, DynamicQuantizeLinear
def _integer_model(op: str, a_shape, w: np.ndarray, out_shape, zero, **attrs) -> onnx.ModelProto:
    """``op`` (MatMulInteger or ConvInteger) of an int8 input ``a`` and the int8 constant weights
    ``w`` (zero points 0); ``a``'s zero point a constant, or the int8 scalar input ``za`` (None)."""
    inits = [nh.from_array(w, "w"), nh.from_array(np.int8(0), "wz")]
    inputs = [h.make_tensor_value_info("a", TP.INT8, a_shape)]
    if zero is None:
        inputs.append(h.make_tensor_value_info("za", TP.INT8, []))
    else:
        inits.append(nh.from_array(np.int8(zero), "za"))
    graph = h.make_graph([h.make_node(op, ["a", "w", "za", "wz"], ["y"], **attrs)], "integer", inputs,
                         [h.make_tensor_value_info("y", TP.INT32, out_shape)], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("zero", [None, -128, 0])
def test_matmulinteger_kernel(zero):
    """MatMulInteger of int8 activations with a zero point (a computed scalar, the int8 minimum,
    none) and int8 weights whose column sums need several int8 rows for the zero point's term
    (weights of one sign): one int8 x int8 -> int32 matmul on the DSA, numpy's integer reference
    exactly."""
    rng = np.random.default_rng(12)
    m, k, n = 6, 40, 8
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    w = rng.integers(-127, 128, (k, n), dtype=np.int8)
    w[:, 0] = 127  # a column sum of 5,080: 40 rows of int8
    za = np.int8(-77 if zero is None else zero)
    model = _integer_model("MatMulInteger", [m, k], w, [m, n], zero)
    feeds = {"a": a} if zero is not None else {"a": a, "za": za}
    y, result = _on_dsa(model, feeds)
    assert result.host_macs == 0 and result.dsa_macs >= m * k * n
    if zero == 0:
        assert result.dsa_macs == m * k * n  # no zero point term
    expected = (a.astype(np.int64) - za) @ w.astype(np.int64)
    assert y.dtype == np.int32 and np.array_equal(y, expected)


@pytest.mark.parametrize("zero,stride,groups", [(None, 1, 1), (-128, 2, 1), (None, 1, 5)])
def test_convinteger_kernel(zero, stride, groups):
    """ConvInteger (3x3, padding 1; one group, or depthwise) of int8 activations with a zero
    point, which is also the padding's value (the padded taps are real zeros): one int8 x int8 ->
    int32 convolution on the DSA, numpy's integer reference exactly."""
    rng = np.random.default_rng(13)
    x = rng.integers(-128, 128, (1, 5, 9, 9), dtype=np.int8)
    w = rng.integers(-127, 128, (4 if groups == 1 else 5, 5 // groups, 3, 3), dtype=np.int8)
    w[1] = 100  # one group: its weights sum to 4,500, more than the 127 x 9 of one channel of z_x
    zx = np.int8(37 if zero is None else zero)
    size = (9 + 2 - 3) // stride + 1
    model = _integer_model("ConvInteger", [1, 5, 9, 9], w, [1, len(w), size, size], zero, pads=[1, 1, 1, 1],
                           strides=[stride, stride], kernel_shape=[3, 3], group=groups)
    y, result = _on_dsa(model, {"a": x} if zero is not None else {"a": x, "za": zx})
    assert result.host_macs == 0 and result.dsa_macs >= w.size * size * size
    per_group = len(w) // groups
    expected = np.concatenate([_conv_reference(x[:, g * (5 // groups):(g + 1) * (5 // groups)],
                                               w[g * per_group:(g + 1) * per_group], int(zx), stride)
                               for g in range(groups)], axis=1)
    assert np.array_equal(y, expected)


def _dynamic_quantized(nodes, x_shape, y_shape, inits, per_channel: bool) -> onnx.ModelProto:
    """The float model of ``nodes`` quantized by onnxruntime's ``quantize_dynamic`` (int8 weights,
    per channel or not)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    graph = h.make_graph(nodes, "float", [h.make_tensor_value_info("x", TP.FLOAT, x_shape)],
                         [h.make_tensor_value_info("y", TP.FLOAT, y_shape)], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 10
    with tempfile.TemporaryDirectory() as tmp:
        onnx.save(model, f"{tmp}/float.onnx")
        quantize_dynamic(f"{tmp}/float.onnx", f"{tmp}/dynamic.onnx", weight_type=QuantType.QInt8,
                         per_channel=per_channel)
        return onnx.load(f"{tmp}/dynamic.onnx")


@pytest.mark.parametrize("kind", ["matmul", "conv"])
def test_dynamic_quantized_model_against_the_reference(kind):
    """A model quantized by ``quantize_dynamic`` (DynamicQuantizeLinear on the activations, then
    MatMulInteger or ConvInteger, the int32 products rescaled in float): its products on the DSA's
    MME as int8 x int8 -> int32 under each schedule, the output the reference evaluator's."""
    rng = np.random.default_rng(14)

    def init(name, *shape):
        return nh.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)

    if kind == "matmul":
        nodes = [h.make_node("MatMul", ["x", "w1"], ["m"]), h.make_node("Add", ["m", "b1"], ["a"]),
                 h.make_node("Relu", ["a"], ["r"]), h.make_node("MatMul", ["r", "w2"], ["y"])]
        model = _dynamic_quantized(nodes, [4, 32], [4, 16], [init("w1", 32, 64), init("b1", 64), init("w2", 64, 16)],
                                   per_channel=True)  # the rescale a run-time vector: ScaleApart
        x_shape, macs, op = (4, 32), 4 * 32 * 64 + 4 * 64 * 16, "MatMulInteger"
    else:
        nodes = [h.make_node("Conv", ["x", "w1", "b1"], ["c"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c"], ["r"]),
                 h.make_node("Conv", ["r", "w2"], ["y"], strides=[2, 2])]
        model = _dynamic_quantized(nodes, [1, 3, 8, 8], [1, 4, 3, 3],
                                   [init("w1", 8, 3, 3, 3), init("b1", 8), init("w2", 4, 8, 3, 3)], per_channel=False)
        x_shape, macs, op = (1, 3, 8, 8), 8 * 3 * 9 * 64 + 4 * 8 * 9 * 9, "ConvInteger"
    assert [n.op_type for n in model.graph.node].count(op) == 2
    for seed, schedule in enumerate(("layerwise", "graphturbo", "set")):
        x = np.random.default_rng(seed).standard_normal(x_shape).astype(np.float32)
        y, result = _on_dsa(model, {"x": x}, schedule=schedule)
        assert result.host_macs == 0 and result.dsa_macs >= macs
        expected = _uint8_reference(model, {"x": x})
        assert np.abs(y - expected).max() <= 1e-6 * np.abs(expected).max()


def test_a_vector_of_a_run_time_scalar_is_not_fused_into_a_matmul():
    """A float matmul rescaled by a run-time scalar times a constant vector (a dynamically
    quantized MatMul's per-channel scale): the vector is a kernel of its own (``ScaleApart``) and
    the matmul with its epilogue runs on the DSA; fused, no tiling of it emitted."""
    rng = np.random.default_rng(15)
    bb = relax.BlockBuilder()
    x, s = relax.Var("x", relax.TensorType((4, 37), "float32")), relax.Var("s", relax.TensorType((), "float32"))
    w, v, b = (rng.standard_normal(shape).astype(np.float32) for shape in ((37, 64), (64,), (64,)))
    with bb.function("main", [x, s]):
        with bb.dataflow():
            m = bb.emit(relax.op.matmul(x, relax.const(w)))
            y = bb.emit(relax.op.multiply(m, bb.emit(relax.op.multiply(s, relax.const(v)))))
            out = bb.emit_output(bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(y, relax.const(b))))))
        bb.emit_func_output(out)
    ex = tvm.compile(bb.get(), target="dsa/stcp920", relax_pipeline=tvm_dsa.pipeline(schedule="layerwise"))
    result = tvm_dsa.pipeline_result(ex)
    assert result.host == {} and result.dsa_macs == 4 * 37 * 64
    xv = rng.standard_normal((4, 37)).astype(np.float32)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(xv), tvm.runtime.tensor(np.float32(0.5))).numpy()
    expected = np.maximum((xv @ w) * (np.float32(0.5) * v) + b, 0)
    assert np.abs(out - expected).max() <= 2e-2 * np.abs(expected).max()
