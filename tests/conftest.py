import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def conv_relu_model(cin: int, cout: int, size: int, groups: int = 1) -> onnx.ModelProto:
    """A 3x3 same-padded Conv (of ``groups`` groups) + Relu with seeded weights: one kernel,
    entirely on the DSA."""
    w = np.random.default_rng(0).standard_normal((cout, cin // groups, 3, 3)).astype("float32") * 0.2
    conv = h.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1], group=groups)
    g = h.make_graph([conv, h.make_node("Relu", ["c"], ["y"])],
                     "conv", [h.make_tensor_value_info("x", TP.FLOAT, [1, cin, size, size])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [1, cout, size, size])], [nh.from_array(w, "W")])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 10
    return model


@pytest.fixture(scope="session")
def conv_relu():
    """``conv_relu_model`` for tests and module-scoped fixtures."""
    return conv_relu_model


@pytest.fixture
def conv_onnx(tmp_path):
    """A Conv + Relu model saved as a file; returns (path, model)."""
    model = conv_relu_model(8, 16, 16)
    path = tmp_path / "conv.onnx"
    onnx.save(model, str(path))
    return str(path), model


@pytest.fixture(scope="session")
def resnet18_batch4():
    """Tiny ResNet-18 at batch 4: the Relax module, an input, llvm's output, the per-sample SET
    layer graph."""
    # imported here: the xdist controller loads this file too, and runs no test
    import tvm
    from tvm import relax

    from tvm_dsa.harness import import_onnx, layer_graph
    from tvm_dsa.models import TINY, example_inputs, get_model

    model = get_model("resnet18", batch=4, **TINY["resnet18"])
    mod = import_onnx(model)
    x = example_inputs(model)["input"]
    ref = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    graph = layer_graph(get_model("resnet18", **TINY["resnet18"]))
    return mod, x, ref, graph
