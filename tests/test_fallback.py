"""What the DSA path cannot build runs on the host, with the reason recorded: nothing that llvm
compiles and runs makes the ``dsa`` pipeline raise (ONNX's node cases that did)."""

import importlib
import re

import numpy as np
import pytest
import tvm
from helpers import scratch_in_ddr
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh
from tvm import relax
from tvm.relax.frontend import onnx as rx_onnx

import tvm_dsa
from tvm_dsa import hardware
from tvm_dsa.isa.program import ProgramError
from tvm_dsa.kernelgen.offload import VIEW


def one_node(node, inputs: dict, outputs: list[str], opset: int = 18):
    """A one-node model: ``inputs`` name -> (ONNX type, shape), ``outputs`` names."""
    graph = h.make_graph([node], "one", [h.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()],
                         [h.make_tensor_value_info(n, TP.UNDEFINED, None) for n in outputs])
    return rx_onnx.from_onnx(h.make_model(graph, opset_imports=[h.make_opsetid("", opset)], ir_version=10),
                             keep_params_in_input=False)


def run(mod, *inputs, target="dsa/stcp920", schedule="layerwise") -> list[np.ndarray]:
    ex = tvm.compile(mod, target=target, relax_pipeline=tvm_dsa.pipeline(schedule=schedule))
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](*(tvm.runtime.tensor(x) for x in inputs))
    return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]


def test_an_error_building_a_kernel_sends_it_to_the_host(monkeypatch, rng):
    def broken(*_args, **_kwargs):
        raise RuntimeError("boom\nmore")

    monkeypatch.setattr(importlib.import_module("tvm_dsa.kernelgen.layer"), "build_program", broken)
    mod = one_node(h.make_node("Add", ["a", "b"], ["c"]), {"a": (TP.FLOAT, [4, 8]), "b": (TP.FLOAT, [4, 8])}, ["c"])
    a, b = rng.standard_normal((2, 4, 8)).astype("float32")
    (c,) = run(mod, a, b)
    np.testing.assert_allclose(c, a + b, rtol=1e-6)
    # the error's first line and the innermost line of tvm_dsa it passed (here: the call of the patch)
    (reason,) = tvm_dsa.pipeline_result().host.values()
    assert re.fullmatch(r"the DSA path failed: RuntimeError: boom \(kernelgen/layer\.py:\d+\)", reason)


def test_a_program_the_validator_rejects_runs_on_the_host(monkeypatch, rng):
    layer = importlib.import_module("tvm_dsa.kernelgen.layer")

    def rejects(program):
        raise ProgramError(f"kernel {program.name} instruction 0 (dma): src0 has a negative stride (-2, 1)")

    monkeypatch.setattr(layer, "validate", rejects)
    mod = one_node(h.make_node("Relu", ["x"], ["y"]), {"x": (TP.FLOAT, [4, 8])}, ["y"])
    x = rng.standard_normal((4, 8)).astype("float32")
    (y,) = run(mod, x)
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    assert tvm_dsa.pipeline_result().host["relu"].startswith(
        "the DSA path failed: ProgramError: kernel relu instruction 0 (dma): src0 has a negative stride (-2, 1) (")


@pytest.mark.parametrize("schedule", ["layerwise", "graphturbo"])
def test_argmax_of_the_last_index_flips_its_input(schedule, rng):
    # select_last_index flips the input: a stride of -12 along a dim of one step was a DMA the
    # validator refused at run time (graphturbo); one step walks nowhere, its stride is 0
    mod = one_node(h.make_node("ArgMax", ["x"], ["y"], axis=0, keepdims=1, select_last_index=1),
                   {"x": (TP.FLOAT, [2, 3, 4])}, ["y"])
    x = rng.integers(0, 3, (2, 3, 4)).astype("float32")  # ties: the last index counts
    (y,) = run(mod, x, schedule=schedule)
    np.testing.assert_array_equal(y, 1 - np.argmax(x[::-1], axis=0, keepdims=True))


def test_a_zero_dimensional_output(rng):
    mod = one_node(h.make_node("MatMul", ["a", "b"], ["c"]), {"a": (TP.FLOAT, [5]), "b": (TP.FLOAT, [5])}, ["c"])
    a, b = rng.standard_normal((2, 5)).astype("float32")
    (c,) = run(mod, a, b)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5)
    assert "a 0-d output (a scalar)" in tvm_dsa.pipeline_result().host["matmul"]


@pytest.mark.parametrize("schedule", ["layerwise", "graphturbo"])
def test_a_kernel_of_several_outputs_runs_on_the_host(schedule, rng):
    mod = one_node(h.make_node("Split", ["x"], ["p", "q"], axis=1, num_outputs=2), {"x": (TP.FLOAT, [2, 6])},
                   ["p", "q"])
    x = rng.standard_normal((2, 6)).astype("float32")
    p, q = run(mod, x, schedule=schedule)
    np.testing.assert_array_equal(p, x[:, :3])
    np.testing.assert_array_equal(q, x[:, 3:])
    assert tvm_dsa.pipeline_result().host == {"split": "several outputs: the DSA runs kernels of one output"}


def test_a_slice_with_default_axes_compiles(rng):
    # FoldConstant before legalization left a call to an undefined shape_func here
    mod = one_node(h.make_node("Slice", ["x", "starts", "ends"], ["y"]),
                   {"x": (TP.FLOAT, [20, 10, 5]), "starts": (TP.INT64, [3]), "ends": (TP.INT64, [3])}, ["y"])
    x = rng.standard_normal((20, 10, 5)).astype("float32")
    (y,) = run(mod, x, np.array([0, 0, 3]), np.array([20, 10, 4]))
    np.testing.assert_array_equal(y, x[:, :, 3:4])


def test_set_on_a_graph_without_a_batch_runs_layerwise(rng):
    mod = one_node(h.make_node("ReduceSum", ["x"], ["y"], keepdims=1), {"x": (TP.FLOAT, [4, 64])}, ["y"])
    x = rng.standard_normal((4, 64)).astype("float32")
    (y,) = run(mod, x, target="dsa/set-edge16-fp16", schedule="set")
    np.testing.assert_allclose(y, x.sum(keepdims=True), atol=1e-3 * np.abs(x).sum())  # fp16 inputs
    result = tvm_dsa.pipeline_result()
    assert result.unstitched["set"].startswith("the set schedule does not apply (tensor") and not result.host


def test_a_set_tree_that_does_not_build_runs_its_layers_one_kernel_each(monkeypatch, rng):
    def broken(*_args, **_kwargs):
        raise IndexError("tuple index out of range")

    monkeypatch.setattr(importlib.import_module("tvm_dsa.kernelgen.tree"), "build_tree_program", broken)
    mod = one_node(h.make_node("Relu", ["x"], ["y"]), {"x": (TP.FLOAT, [4, 8, 4, 4])}, ["y"])
    x = rng.standard_normal((4, 8, 4, 4)).astype("float32")
    (y,) = run(mod, x, target="dsa/set-edge16-fp16", schedule="set")
    np.testing.assert_allclose(y, np.maximum(x, 0), rtol=1e-3, atol=1e-3)
    result = tvm_dsa.pipeline_result()
    (reason,) = result.unstitched.values()
    assert reason.startswith("the DSA path failed: IndexError: tuple index out of range (kernelgen/tree.py:")
    assert result.dsa == ["relu"] and not result.host


def test_an_unstitched_sub_graph_runs_its_layers_as_layerwise_does(monkeypatch, rng):
    """A sub-graph that does not build (two convolutions) runs its layers one kernel each, as
    layerwise runs them: the same kernels and values, and the cycles but a launch (graphturbo
    launches the two together, ``kernelgen.launch``, its scratch in DDR). The Flatten after them
    is no layer of the sub-graph: a view on the host under both schedules."""
    def broken(*_args, **_kwargs):
        raise IndexError("tuple index out of range")

    monkeypatch.setattr(importlib.import_module("tvm_dsa.kernelgen.stitched"), "emit_stitched", broken)
    scratch_in_ddr(monkeypatch)
    w = rng.standard_normal((8, 4, 3, 3)).astype("float32")
    w2 = rng.standard_normal((8, 8, 3, 3)).astype("float32")
    graph = h.make_graph(
        [h.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), h.make_node("Conv", ["c", "w2"], ["d"]),
         h.make_node("Flatten", ["d"], ["y"])], "ccf",
        [h.make_tensor_value_info("x", TP.FLOAT, [1, 4, 8, 8])], [h.make_tensor_value_info("y", TP.FLOAT, [1, 288])],
        [nh.from_array(w, "w"), nh.from_array(w2, "w2")])
    mod = rx_onnx.from_onnx(h.make_model(graph, opset_imports=[h.make_opsetid("", 18)], ir_version=10),
                            keep_params_in_input=False)
    x = rng.standard_normal((1, 4, 8, 8)).astype("float32")
    (y,) = run(mod, x, schedule="graphturbo")
    stitched = tvm_dsa.pipeline_result()
    cycles = tvm_dsa.last_report().cycles
    (lw,) = run(mod, x)
    layerwise = tvm_dsa.pipeline_result()
    np.testing.assert_array_equal(y, lw)
    (reason,) = stitched.unstitched.values()
    assert reason.startswith("the DSA path failed: IndexError: tuple index out of range")
    assert stitched.dsa == layerwise.dsa and len(stitched.dsa) == 2
    assert stitched.host == layerwise.host and list(stitched.host.values()) == [VIEW]
    assert stitched.launches == [tuple(stitched.dsa)] and not layerwise.launches
    assert cycles == tvm_dsa.last_report().cycles - hardware.get("stcp920").kernel_launch_cycles
