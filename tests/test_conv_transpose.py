"""ConvTranspose runs on the DSA as a convolution of the zero-dilated input with flipped weights
(``relax_passes.conv_transpose``): values against onnxruntime over strides, pads, output pads,
groups and kernel sizes."""

import numpy as np
import onnxruntime as ort
import pytest
import tvm
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh
from tvm import relax
from tvm.relax.frontend import onnx as rx_onnx

import tvm_dsa
from tvm_dsa.relax_passes.conv_transpose import flipped_weights

CASES = [  # (kernel, stride, pads, output_padding, groups)
    (3, 2, [1, 1, 1, 1], [1, 1], 1),
    (3, 1, [1, 1, 1, 1], [0, 0], 1),
    (2, 2, [0, 0, 0, 0], [0, 0], 1),
    (4, 2, [1, 1, 1, 1], [0, 0], 2),
    (3, 3, [0, 2, 1, 0], [2, 1], 1),
    (5, 2, [0, 0, 0, 0], [1, 0], 1),
    (2, 2, [0, 0, 0, 1], [0, 0], 1),  # the zeros before each pixel along the width
    (3, 3, [1, 1, 1, 1], [0, 0], 1),  # negative pads both ways: the output cropped
]


def test_flipped_weights_turn_each_kernel_and_swap_its_channels(rng):
    w = rng.standard_normal((4, 3, 2, 2)).astype("float32")  # I = 4, O / g = 3, groups 2
    f = flipped_weights(w, 2)
    assert f.shape == (6, 2, 2, 2)
    # output channel 4 is group 1's second (o = 1); its inputs are group 1's, 2 and 3
    np.testing.assert_array_equal(f[4, 1], w[3, 1, ::-1, ::-1])


@pytest.mark.parametrize("schedule", ["layerwise", "graphturbo"])
@pytest.mark.parametrize("kernel, stride, pads, out_pad, groups", CASES)
def test_conv_transpose_matches_onnxruntime(kernel, stride, pads, out_pad, groups, schedule, rng):
    w = (rng.standard_normal((4, 6 // groups, kernel, kernel)) * 0.3).astype("float32")
    node = h.make_node("ConvTranspose", ["x", "W"], ["y"], strides=[stride] * 2, pads=pads,
                       output_padding=out_pad, group=groups)
    graph = h.make_graph([node], "ct", [h.make_tensor_value_info("x", TP.FLOAT, [2, 4, 5, 6])],
                         [h.make_tensor_value_info("y", TP.FLOAT, None)], [nh.from_array(w, "W")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=10)
    x = rng.standard_normal((2, 4, 5, 6)).astype("float32")
    (want,) = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    mod = rx_onnx.from_onnx(model, keep_params_in_input=False)
    ex = tvm.compile(mod, target="dsa/stcp920", relax_pipeline=tvm_dsa.pipeline(schedule=schedule))
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max()
    result = tvm_dsa.pipeline_result()
    assert all("reshape" in reason for reason in result.host.values()) and result.dsa_macs > 0
