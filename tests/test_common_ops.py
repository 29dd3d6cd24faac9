"""Common patterns that used to leave kernels on the host run on the DSA under every schedule:
selects by the data (LeakyRelu, PRelu, Sign, Where of a comparison: compare ops give 1.0 / 0.0
masks, ``select`` picks by them, ``isa.VEC_OPS``; a fused kernel's bool mask is inlined,
``tir_passes.inline``), an average pooling that excludes the padding (``relax_passes.pool_divisor``),
a residual over the convolution that reads it and a concat of two functions of one tensor
(``tir_passes.scopes``' ``COPY_EACH``)."""

import numpy as np
import pytest
import tvm
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh
from tvm import relax
from tvm.relax.frontend import onnx as rx_onnx

import tvm_dsa
from tvm_dsa.relax_passes.pool_divisor import covered

CONV = h.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1])
PATTERNS = {
    "LeakyRelu": [CONV, h.make_node("LeakyRelu", ["c"], ["y"], alpha=0.1)],
    "PRelu": [CONV, h.make_node("PRelu", ["c", "slope"], ["y"])],
    "Sign": [CONV, h.make_node("Sign", ["c"], ["y"])],
    "Where": [CONV, h.make_node("Greater", ["c", "half"], ["m"]), h.make_node("Where", ["m", "c", "slope"], ["y"])],
    "Clip": [CONV, h.make_node("Clip", ["c", "lo", "hi"], ["y"])],
    "HardSigmoid": [CONV, h.make_node("HardSigmoid", ["c"], ["y"])],
    "avgpool_exclude_pad": [CONV, h.make_node("AveragePool", ["c"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
    "avgpool_exclude_pad_stride2": [CONV, h.make_node("AveragePool", ["c"], ["y"], kernel_shape=[3, 3],
                                                      strides=[2, 2], pads=[1, 1, 1, 1])],
    "residual_over_one_conv": [CONV, h.make_node("Add", ["c", "x"], ["y"])],
    "concat_of_two_functions": [h.make_node("Relu", ["x"], ["a"]), h.make_node("Sigmoid", ["x"], ["b"]),
                                h.make_node("Concat", ["a", "b"], ["y"], axis=1)],
}


def test_covered_counts_the_window_positions_on_the_input():
    # 8 inputs, 3-wide windows, stride 2, one pad before: windows [-1, 2), [1, 4), [3, 6), [5, 8)
    np.testing.assert_array_equal(covered(8, 4, 3, 2, 1), [2, 3, 3, 3])
    np.testing.assert_array_equal(covered(5, 5, 3, 1, 1), [2, 3, 3, 3, 2])


@pytest.mark.parametrize("schedule", ["layerwise", "graphturbo"])
@pytest.mark.parametrize("pattern", sorted(PATTERNS))
def test_pattern_runs_on_the_dsa(pattern, schedule, rng):
    nodes = PATTERNS[pattern]
    inits = [nh.from_array((rng.standard_normal((8, 8, 3, 3)) * 0.2).astype("float32"), "W"),
             nh.from_array(np.array(-0.5, "float32"), "lo"), nh.from_array(np.array(0.7, "float32"), "hi"),
             nh.from_array(np.array(0.5, "float32"), "half"),
             nh.from_array(np.linspace(0.1, 0.8, 8, dtype="float32").reshape(8, 1, 1), "slope")]
    used = {i for n in nodes for i in n.input}
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [1, 8, 8, 8])],
                         [h.make_tensor_value_info("y", TP.FLOAT, None)], [t for t in inits if t.name in used])
    mod = rx_onnx.from_onnx(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=10),
                            keep_params_in_input=False)
    x = rng.standard_normal((1, 8, 8, 8)).astype("float32")
    want = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    ex = tvm.compile(mod, target="dsa/stcp920", relax_pipeline=tvm_dsa.pipeline(schedule=schedule))
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    assert tvm_dsa.pipeline_result().host == {}
    assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max()
    if pattern == "Sign":  # a mask picks exact values: the signs agree but where |c| is near 0
        assert np.mean(got == want) > 0.95
    if pattern == "Where":  # the same branch taken but where c is near the threshold
        assert np.mean((got > 0.5) == (want > 0.5)) > 0.95


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_a_softmax_over_the_samples_is_not_split_by_sample(op, rng):
    """graphturbo splits stitched kernels, and the clusters, by the leading dim; a softmax over
    axis 0 mixes the samples, so it runs as a kernel of its own (``graphturbo.sample_wise``)."""
    graph = h.make_graph([h.make_node(op, ["x"], ["y"], axis=0)], "g",
                         [h.make_tensor_value_info("x", TP.FLOAT, [8, 4, 5])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [8, 4, 5])])
    mod = rx_onnx.from_onnx(h.make_model(graph, opset_imports=[h.make_opsetid("", 13)], ir_version=10))
    x = rng.standard_normal((8, 4, 5)).astype("float32")
    e = np.exp(x - x.max(axis=0, keepdims=True))
    want = e / e.sum(axis=0, keepdims=True)
    want = np.log(want) if op == "LogSoftmax" else want
    ex = tvm.compile(mod, target="dsa/stcp920", relax_pipeline=tvm_dsa.pipeline(schedule="graphturbo"))
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max()
    result = tvm_dsa.pipeline_result()
    assert not result.stitched and not result.host
