import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def conv_onnx(tmp_path):
    """A Conv + Relu model that runs entirely on the DSA, saved as a file; returns (path, model)."""
    w = np.random.default_rng(0).standard_normal((16, 8, 3, 3)).astype("float32") * 0.2
    g = h.make_graph([h.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c"], ["y"])],
                     "conv", [h.make_tensor_value_info("x", TP.FLOAT, [1, 8, 16, 16])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [1, 16, 16, 16])], [nh.from_array(w, "W")])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 10
    path = tmp_path / "conv.onnx"
    onnx.save(model, str(path))
    return str(path), model
