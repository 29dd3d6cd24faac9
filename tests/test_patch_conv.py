"""A convolution whose stride is its kernel runs as a 1 x 1 convolution of the input's patches
(``relax_passes.patch_conv``): values against onnxruntime, all its MACs on the DSA, and which
convolutions it takes."""

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
from tvm_dsa.relax_passes.patch_conv import PatchConvAsMatmul

CONV2D = tvm.ir.Op.get("relax.nn.conv2d")


def _conv(shape, out_channels, kernel, stride, pads=(0, 0, 0, 0), groups=1, bias=True, seed=0):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((out_channels, shape[1] // groups, *kernel)) * 0.2).astype("float32")
    inits = [nh.from_array(w, "W")] + ([nh.from_array(rng.standard_normal(out_channels).astype("float32"), "B")]
                                       if bias else [])
    node = h.make_node("Conv", ["x", "W"] + (["B"] if bias else []), ["y"], kernel_shape=list(kernel),
                       strides=list(stride), pads=list(pads), group=groups)
    graph = h.make_graph([node, h.make_node("Relu", ["y"], ["z"])], "patch",
                         [h.make_tensor_value_info("x", TP.FLOAT, list(shape))],
                         [h.make_tensor_value_info("z", TP.FLOAT, None)], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=10)


def _kernels(mod) -> list[tuple[int, ...]]:
    """The (kh, kw) of each convolution in ``main``."""
    found = []
    tvm.relax.analysis.post_order_visit(mod["main"], lambda e: found.append(tuple(int(d) for d in e.args[1].ty.shape)[2:])
                                        if isinstance(e, relax.Call) and e.op.same_as(CONV2D) else None)
    return found


@pytest.mark.parametrize("schedule", ["layerwise", "graphturbo"])
@pytest.mark.parametrize("shape, out_channels, kernel", [((2, 3, 32, 32), 48, (8, 8)),
                                                         ((4, 5, 12, 18), 16, (2, 3))])
def test_a_patch_convolution_is_one_of_patches_and_matches_onnxruntime(shape, out_channels, kernel, schedule, rng):
    model = _conv(shape, out_channels, kernel, kernel)
    mod = rx_onnx.from_onnx(model, keep_params_in_input=False)
    assert _kernels(mod) == [kernel] and _kernels(PatchConvAsMatmul(mod)) == [(1, 1)]
    x = rng.standard_normal(shape).astype("float32")
    (want,) = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    ex = tvm.compile(mod, target="dsa/stcp920", relax_pipeline=tvm_dsa.pipeline(schedule=schedule))
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    assert got.shape == want.shape and np.abs(got - want).max() <= 2e-2 * np.abs(want).max()
    result = tvm_dsa.pipeline_result()
    macs = shape[0] * out_channels * (shape[2] // kernel[0]) * (shape[3] // kernel[1]) * shape[1] * kernel[0] * kernel[1]
    assert result.dsa_macs == macs and result.host_macs == 0


@pytest.mark.parametrize("kernel, stride, pads, groups", [((2, 2), (1, 1), (0, 0, 0, 0), 1),  # overlapping windows
                                                          ((2, 2), (2, 2), (1, 1, 1, 1), 1),  # padded
                                                          ((2, 2), (2, 2), (0, 0, 0, 0), 2),  # grouped
                                                          ((1, 1), (1, 1), (0, 0, 0, 0), 1),  # 1 x 1: a matmul already
                                                          ((3, 3), (3, 3), (0, 0, 0, 0), 1)])  # 3 does not divide 8
def test_other_convolutions_are_kept(kernel, stride, pads, groups):
    mod = rx_onnx.from_onnx(_conv((1, 4, 8, 8), 8, kernel, stride, pads, groups), keep_params_in_input=False)
    assert _kernels(PatchConvAsMatmul(mod)) == [kernel]
