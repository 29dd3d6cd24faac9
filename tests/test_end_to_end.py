"""tvm.compile(target="dsa/...", relax_pipeline="dsa") against llvm and onnxruntime."""

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
from tvm_dsa.kernelgen.offload import VIEW
from tvm_dsa import pipeline_result
from tvm_dsa.harness import Compiled, import_onnx
from tvm_dsa.models import TINY, example_inputs, get_model


def small_cnn(rng):
    """Conv + BatchNorm + Relu, a Flatten (a reshape the DSA does not run), MatMul, Softmax."""
    def init(name, arr):
        return nh.from_array(arr.astype("float32"), name)

    inits = [
        init("W", rng.standard_normal((16, 8, 3, 3)) * 0.2),
        init("s", 1 + 0.1 * rng.standard_normal(16)), init("b", 0.1 * rng.standard_normal(16)),
        init("m", 0.1 * rng.standard_normal(16)), init("v", 1 + 0.1 * rng.random(16)),
        init("W2", rng.standard_normal((16 * 8 * 8, 10)) * 0.05),
    ]
    nodes = [
        h.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
        h.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["bn"]),
        h.make_node("Relu", ["bn"], ["r"]),
        h.make_node("Flatten", ["r"], ["f"]),
        h.make_node("MatMul", ["f", "W2"], ["mm"]),
        h.make_node("Softmax", ["mm"], ["y"]),
    ]
    g = h.make_graph(nodes, "small_cnn", [h.make_tensor_value_info("x", TP.FLOAT, [1, 8, 16, 16])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [1, 10])], inits)
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def test_small_cnn_matches_llvm_and_onnxruntime(rng):
    model = small_cnn(rng)
    x = rng.standard_normal((1, 8, 16, 16)).astype("float32")
    mod = rx_onnx.from_onnx(model, keep_params_in_input=False)
    ref = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    ort_out = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    ex = tvm.compile(mod, target="dsa/stcp920", relax_pipeline=tvm_dsa.pipeline("layerwise"))  # a kernel per op
    result = pipeline_result(ex)
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-2, atol=2e-3)
    np.testing.assert_allclose(out, ort_out, rtol=1e-2, atol=2e-3)
    # the conv (BN folded in), the matmul and the softmax ran on the DSA; the flatten, a pure
    # reshape, stays a zero-copy view on the host
    assert len(result.dsa) == 3 and list(result.host) == ["reshape"]
    assert "pure reshape" in result.host["reshape"]
    conv_macs, fc_macs = 16 * 8 * 8 * 8 * 9, 1024 * 10
    assert result.dsa_macs == conv_macs + fc_macs and result.host_macs == 0
    report = tvm_dsa.last_report()
    assert report.kernels == 3 and report.macs == conv_macs + fc_macs
    assert report.cycles >= report.roofline_cycles > 0
    # the roofline is the model's bound: its MACs at the peak rate, or its input, weights and
    # output through DDR once in the storage type (not the kernels' arguments, intermediates too)
    hw = tvm_dsa.hardware.get("stcp920")
    elements = x.size + sum(nh.to_array(t).size for t in model.graph.initializer) + 10
    assert report.model_bound and report.bound_macs == conv_macs + fc_macs
    assert report.compulsory_ddr_bytes == elements * hw.storage_bytes
    assert sum(k.report.compulsory_ddr_bytes for k in tvm_dsa.last_kernel_runs()) > report.compulsory_ddr_bytes
    assert report.roofline_cycles == max(report.bound_macs / hw.peak_macs_per_cycle,
                                         report.compulsory_ddr_bytes / hw.ddr_bytes_per_cycle)
    assert report.roofline_fraction == report.roofline_cycles / report.cycles
    assert f"{report.roofline_fraction:.1%} reached" in str(report) and "the model's bound" in str(report)
    assert report.host_kernels == 0 and "on the host" not in str(report)  # the flatten is a view
    # the launch cost is part of the time: at least one launch per kernel
    assert report.cycles >= 3 * tvm_dsa.hardware.get("stcp920").kernel_launch_cycles
    # per kernel: the offloaded kernels in call order, their reports adding up to the model's
    runs = tvm_dsa.last_kernel_runs()
    assert [k.name for k in runs] == result.dsa
    assert sum(k.report.cycles for k in runs) == report.cycles
    assert [k.report.macs for k in runs] == [conv_macs, fc_macs, 0]
    assert runs[-1].output_shapes == (out.shape,)


def test_the_pipeline_chooses_graphturbo_for_a_static_model(rng):
    """``schedule="auto"`` (the default): the static model's ops in two stitched kernels (Conv with
    its BatchNorm and Relu; MatMul with Softmax) with the Flatten between them a view on the host,
    instead of layerwise's kernel per op; the same numbers as llvm, in fewer cycles."""
    model = small_cnn(rng)
    x = rng.standard_normal((1, 8, 16, 16)).astype("float32")
    mod = rx_onnx.from_onnx(model, keep_params_in_input=False)
    ref = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    kernels, cycles = {}, {}
    for schedule in ("auto", "layerwise"):
        ex = tvm.compile(mod, target="dsa/stcp920", relax_pipeline=tvm_dsa.pipeline(schedule))
        out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
        np.testing.assert_allclose(out, ref, rtol=1e-2, atol=2e-3)
        result = pipeline_result(ex)
        kernels[result.schedule] = tvm_dsa.last_report().kernels
        cycles[result.schedule] = tvm_dsa.last_report().cycles
        assert list(result.host.values()) == [VIEW]  # the Flatten
    assert list(pipeline_result(tvm.compile(mod, target="dsa/stcp920")).stitched) == pipeline_result().dsa
    assert kernels == {"graphturbo": 2, "layerwise": 3}
    assert cycles["graphturbo"] < cycles["layerwise"]


def test_on_a_mesh_chip_the_pipeline_keeps_the_fastest_schedule(rng):
    """On set-edge16-fp16 ``schedule="auto"`` compiles the static model with set, layerwise and
    graphturbo, simulates their programs (timing) and keeps the one with the fewest cycles: the
    result names each with its cycles, the kept schedule's are the run's, and the numbers are
    llvm's."""
    model = small_cnn(rng)
    x = rng.standard_normal((1, 8, 16, 16)).astype("float32")
    mod = rx_onnx.from_onnx(model, keep_params_in_input=False)
    ref = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    ex = tvm.compile(mod, target="dsa/set-edge16-fp16", relax_pipeline=tvm_dsa.pipeline())
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-2, atol=2e-3)
    result = pipeline_result(ex)
    assert set(result.timed) == {"set", "layerwise", "graphturbo"}
    assert result.schedule == min(result.timed, key=result.timed.get)
    assert tvm_dsa.last_report().cycles == result.timed[result.schedule]
    for schedule in result.timed:
        ex = tvm.compile(mod, target="dsa/set-edge16-fp16", relax_pipeline=tvm_dsa.pipeline(schedule))
        assert pipeline_result(ex).schedule == schedule and not pipeline_result(ex).timed
        relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
        assert tvm_dsa.last_report().cycles == result.timed[schedule]


def test_a_report_says_how_many_of_the_models_kernels_ran_on_the_host():
    """Tiny DLRM's embedding gathers run on the host: the model's bound holds their tables and
    work, the cycles not their time, and the report says how many kernels that is (from the
    compilation's host kernels, views left out)."""
    model = get_model("dlrm", **TINY["dlrm"])
    compiled = Compiled.build(import_onnx(model), "dsa/stcp920")
    result, report = compiled.offload, compiled.run(example_inputs(model), mode="timing").report
    gathers = [name for name, why in result.host.items() if why != VIEW]
    assert gathers and report.host_kernels == len(gathers)
    assert f"{len(gathers)} of its kernels ran on the host, outside the cycles" in str(report)


def test_export_library_keeps_the_program(rng, tmp_path):
    model = small_cnn(rng)
    x = rng.standard_normal((1, 8, 16, 16)).astype("float32")
    mod = rx_onnx.from_onnx(model, keep_params_in_input=False)
    ex = tvm.compile(mod, target="dsa", relax_pipeline="dsa")
    first = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    path = str(tmp_path / "model.so")
    ex.export_library(path)
    loaded = tvm.runtime.load_module(path)
    again = relax.VirtualMachine(loaded, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_array_equal(first, again)
    assert tvm_dsa.last_report().kernels == len(pipeline_result(ex).dsa) > 0


def test_non_dsa_target_is_rejected():
    mod = relax_graph_add()
    with pytest.raises(Exception, match="not a DSA target"):
        tvm.compile(mod, target="llvm", relax_pipeline="dsa")


def relax_graph_add():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(x, x))
        bb.emit_func_output(out)
    return bb.get()


def test_pipeline_factory_with_options(rng):
    model = small_cnn(rng)
    x = rng.standard_normal((1, 8, 16, 16)).astype("float32")
    mod = rx_onnx.from_onnx(model, keep_params_in_input=False)
    ex = tvm.compile(mod, target="dsa/stcp920", relax_pipeline=tvm_dsa.pipeline(schedule="layerwise"))
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    ort_out = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(out, ort_out, rtol=1e-2, atol=2e-3)
    with pytest.raises(ValueError, match="unknown schedule 'nope'.*layerwise"):
        tvm_dsa.pipeline(schedule="nope")


def test_op_the_dsa_lacks_runs_on_the_host(rng):
    """An embedding Gather (a data-dependent index) stays on the host; the matmul after it runs on
    the DSA; the whole graph still matches onnxruntime."""
    table = nh.from_array((rng.standard_normal((50, 32)) * 0.5).astype("float32"), "table")
    w = nh.from_array((rng.standard_normal((32, 24)) * 0.2).astype("float32"), "w")
    nodes = [h.make_node("Gather", ["table", "ids"], ["e"]), h.make_node("MatMul", ["e", "w"], ["m"]),
             h.make_node("Relu", ["m"], ["y"])]
    g = h.make_graph(nodes, "embed", [h.make_tensor_value_info("ids", TP.INT64, [4, 8])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [4, 8, 24])], [table, w])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 10
    ids = rng.integers(0, 50, (4, 8)).astype("int64")
    mod = rx_onnx.from_onnx(model, keep_params_in_input=False)
    ex = tvm.compile(mod, target="dsa/stcp920", relax_pipeline=tvm_dsa.pipeline("layerwise"))  # a kernel per op
    result = pipeline_result(ex)
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(ids)).numpy()
    ort_out = ort.InferenceSession(model.SerializeToString()).run(None, {"ids": ids})[0]
    np.testing.assert_allclose(out, ort_out, rtol=1e-2, atol=2e-3 * np.abs(ort_out).max())
    # the gather, and the importer's negative-index fix-up of the int64 ids, run on the host
    assert "an index reads tensor data (a gather)" in result.host["take"]
    assert all(n in ("take", "fused_less_add_where") for n in result.host) and len(result.dsa) == 1
    assert result.dsa_macs == 4 * 8 * 32 * 24 and result.host_macs == 0
