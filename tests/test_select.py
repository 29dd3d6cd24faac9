"""Selects by the data (LeakyRelu, PRelu, Sign, Where of a comparison) run on the vector core:
compare ops give 1.0 / 0.0 masks, ``select`` picks by them (``isa.VEC_OPS``)."""

import numpy as np
import pytest
import tvm
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh
from tvm import relax
from tvm.relax.frontend import onnx as rx_onnx

import tvm_dsa

ACTIVATIONS = {
    "LeakyRelu": [h.make_node("LeakyRelu", ["c"], ["y"], alpha=0.1)],
    "PRelu": [h.make_node("PRelu", ["c", "slope"], ["y"])],
    "Sign": [h.make_node("Sign", ["c"], ["y"])],
    "Where": [h.make_node("Greater", ["c", "half"], ["m"]), h.make_node("Where", ["m", "c", "slope"], ["y"])],
    "Clip": [h.make_node("Clip", ["c", "lo", "hi"], ["y"])],
    "HardSigmoid": [h.make_node("HardSigmoid", ["c"], ["y"])],
}


@pytest.mark.parametrize("schedule", ["layerwise", "graphturbo"])
@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
def test_activation_after_a_conv_runs_on_the_dsa(act, schedule, rng):
    w = (rng.standard_normal((8, 4, 3, 3)) * 0.3).astype("float32")
    inits = [nh.from_array(w, "W"), nh.from_array(np.array(-0.5, "float32"), "lo"),
             nh.from_array(np.array(0.7, "float32"), "hi"), nh.from_array(np.array(0.5, "float32"), "half"),
             nh.from_array(np.linspace(0.1, 0.8, 8, dtype="float32").reshape(8, 1, 1), "slope")]
    graph = h.make_graph([h.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]), *ACTIVATIONS[act]], "g",
                         [h.make_tensor_value_info("x", TP.FLOAT, [1, 4, 8, 8])],
                         [h.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    mod = rx_onnx.from_onnx(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=10),
                            keep_params_in_input=False)
    x = rng.standard_normal((1, 4, 8, 8)).astype("float32")
    want = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    ex = tvm.compile(mod, target="dsa/stcp920", relax_pipeline=tvm_dsa.pipeline(schedule=schedule))
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    assert tvm_dsa.pipeline_result().host == {}
    assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max()
    if act == "Sign":  # a mask picks exact values: the signs agree but where |c| is near 0
        assert np.mean(got == want) > 0.95
    if act == "Where":  # the same branch taken but where c is near the threshold
        assert np.mean((got > 0.5) == (want > 0.5)) > 0.95
