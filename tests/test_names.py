"""Buffers and tensors that share a name stay apart: TIR lets two parameters of a PrimFunc carry
one name (``multiply(x, x)`` legalizes to ``multiply(x: x, x_1: x)``), and kernel generation keys
buffers by name (``tir_passes.names``)."""

import numpy as np
import pytest
import tvm
from onnx import TensorProto as TP
from onnx import helper as h
from tvm import relax
from tvm.relax.frontend import onnx as rx_onnx

import tvm_dsa
from tvm_dsa.emit.emitter import build_program
from tvm_dsa.hardware import get
from tvm_dsa.kernel.analysis import Unsupported
from tvm_dsa.tiling import lower_kernel
from tvm_dsa.tir_passes.names import buffer_names, unique_buffer_names

NUMPY = {"Mul": np.multiply, "Add": np.add, "Sub": np.subtract, "Div": np.divide, "MatMul": np.matmul}


def same_input_twice(op: str):
    """``op(x, x)`` and ``op(a, b)`` of one shape as two outputs: TVM gives both one PrimFunc."""
    shape = [8, 8] if op == "MatMul" else [2, 3, 4, 5]
    inputs = [h.make_tensor_value_info(n, TP.FLOAT, shape) for n in "xab"]
    outputs = [h.make_tensor_value_info(n, TP.FLOAT, shape) for n in "yz"]
    graph = h.make_graph([h.make_node(op, ["x", "x"], ["y"]), h.make_node(op, ["a", "b"], ["z"])], "g", inputs,
                         outputs)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=10)
    return rx_onnx.from_onnx(model), shape


def legalized(mod):
    with tvm.target.Target("llvm"):
        return tvm.transform.Sequential([relax.transform.LegalizeOps(), relax.transform.FuseOps(),
                                         relax.transform.FuseTIR()])(mod)


@pytest.mark.parametrize("schedule", ["layerwise", "graphturbo"])
@pytest.mark.parametrize("op", sorted(NUMPY))
def test_an_input_read_twice_does_not_merge_another_kernels_inputs(op, schedule, rng):
    mod, shape = same_input_twice(op)
    x, a, b = (rng.uniform(0.5, 1.5, shape).astype("float32") for _ in range(3))
    ex = tvm.compile(mod, target="dsa/stcp920", relax_pipeline=tvm_dsa.pipeline(schedule=schedule))
    y, z = relax.VirtualMachine(ex, tvm.cpu())["main"](*(tvm.runtime.tensor(v) for v in (x, a, b)))
    assert tvm_dsa.pipeline_result().host == {}
    for got, want in ((y, NUMPY[op](x, x)), (z, NUMPY[op](a, b))):
        np.testing.assert_allclose(got.numpy(), want, rtol=2e-3, atol=2e-3 * np.abs(want).max())


def test_repeated_parameter_names_are_made_unique():
    mod = legalized(same_input_twice("Mul")[0])
    (name,) = [gv.name_hint for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    func = mod[name]
    assert buffer_names(func) == ["x", "x", "T_multiply"]
    renamed = unique_buffer_names(func)
    assert len(set(buffer_names(renamed))) == 3
    tvm.ir.assert_structural_equal(renamed, func)  # names aside, the same function
    assert unique_buffer_names(renamed) is renamed


def test_kernel_generation_refuses_two_buffers_of_one_name():
    mod = legalized(same_input_twice("Mul")[0])
    (func,) = [f for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    hw = get("stcp920")
    with pytest.raises(Unsupported, match="two buffers are named x"):
        build_program(lower_kernel(func, hw)[0], hw, "multiply")
