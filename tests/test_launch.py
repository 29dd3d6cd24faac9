"""Kernels launched together: chained kernels (``isa.Kernel.chained``) start after the one before
without a launch, and ``kernelgen.launch`` joins the DSA calls nothing on the host separates."""

import importlib
from dataclasses import replace

import numpy as np
import pytest
import tvm
from helpers import chain, ddr, lb, make_program, scratch_in_ddr, single_sample_block
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh
from tvm import relax
from tvm.relax.frontend import onnx as rx_onnx

import tvm_dsa
from tvm_dsa import hardware
from tvm_dsa.harness import import_onnx
from tvm_dsa.isa import (VERSION, Dma, Program, ProgramError, Replica, TensorArg, stuck_multicasts,
                         validate)
from tvm_dsa.kernelgen.launch import joined_program, launch_together
from tvm_dsa.kernelgen.offload import VIEW
from tvm_dsa.kernelgen.rewrite import DSACall
from tvm_dsa.models import example_inputs
from tvm_dsa.models.cnn import densenet
from tvm_dsa.runtime import simulate
from tvm_dsa.runtime.timing import simulate_program
from tvm_dsa.schedule.graph import Node, OpGraph, Tensor
from tvm_dsa.schedule.plan import KernelSpec

HW = hardware.get("stcp920")


def _copy_kernels():
    """Two kernels: the first copies ``a`` into ``b`` through core 0's LB, the second ``b`` into ``c``
    through core 8's (another cluster)."""
    first = chain([Dma(0, (256,), lb(0, "float16", 1), ddr(0, "float16", 1)),
                   Dma(0, (256,), ddr(512, "float16", 1), lb(0, "float16", 1))])
    second = chain([Dma(8, (256,), lb(0, "float16", 1, core=8), ddr(512, "float16", 1)),
                    Dma(8, (256,), ddr(1024, "float16", 1), lb(0, "float16", 1, core=8))])
    args = [TensorArg("a", "input", (256,), "float16", "float16", 0),
            TensorArg("c", "output", (256,), "float16", "float16", 1024)]
    return make_program([first, second], args, 1536)


def test_a_chained_kernel_starts_when_the_one_before_ends_without_a_launch():
    launched = _copy_kernels()
    chained = replace(launched, kernels=(launched.kernels[0], replace(launched.kernels[1], chained=True)))
    a = np.arange(256).astype(np.float16)
    both, one = simulate(launched, [a]), simulate(chained, [a])
    np.testing.assert_array_equal(one.outputs[0], a)
    assert one.report.cycles == both.report.cycles - HW.kernel_launch_cycles
    first, second = simulate_program(chained, HW).kernels
    assert second.start_cycle == first.start_cycle + first.cycles
    assert (one.report.kernels, one.report.launches) == (2, 1) and both.report.launches == 2
    again = Program.deserialize(chained.serialize())
    assert [k.chained for k in again.kernels] == [False, True] and again.to_dict()["version"] == VERSION
    with pytest.raises(ProgramError, match="kernel k0: the first kernel of a program is launched, not chained"):
        validate(replace(chained, kernels=(replace(launched.kernels[0], chained=True),)))


def test_a_replicas_ddr_move_over_tensors_placed_apart_is_cut_into_pieces():
    """A replica moving one DDR range that holds two tensors (``w1``, ``w2``) onto the next two
    (``w3``, ``w4``): in a joined program that places the four apart and in another order, the
    copies still read ``w3``, ``w4`` and write ``o3``, ``o4``."""
    n, size = 32, 64  # float16 elements, bytes a tensor
    names = ["w1", "w2", "w3", "w4", "o1", "o2", "o3", "o4"]
    args = [TensorArg(t, "input" if t[0] == "w" else "output", (n,), "float16", "float16", k * size)
            for k, t in enumerate(names)]
    at = {a.name: a.offset for a in args}
    body = chain([Dma(0, (n,), lb(0, "float16", 1), ddr(at["w1"], "float16", 1)),
                  Dma(0, (n,), lb(size, "float16", 1), ddr(at["w2"], "float16", 1)),
                  Dma(0, (n,), ddr(at["o1"], "float16", 1), lb(0, "float16", 1)),
                  Dma(0, (n,), ddr(at["o2"], "float16", 1), lb(size, "float16", 1))])
    copy = Replica(0, 4, 4, 0, (("ddr", 0, at["w1"], at["w3"], 0, 2 * size),
                                ("ddr", 0, at["o1"], at["o3"], 0, 2 * size), ("lb", 0, 0, 2 * size, 0, 2 * size)))
    program = make_program([body], args, len(names) * size)
    program = replace(program, kernels=(replace(program.kernels[0], replicas=(copy,)),))
    joined, _ = joined_program([program], ["w4", "w2", "w3", "w1"], ["o3", "o1", "o4", "o2"], "scrambled")
    assert [a.name for a in joined.args] == ["w4", "w2", "w3", "w1", "o3", "o1", "o4", "o2"]
    new = {a.name: a.offset for a in joined.args}
    moves = [m for m in joined.kernels[0].replicas[0].moves if m[0] == "ddr"]
    assert moves == [("ddr", 0, new[a], new[a] + size, 0, new[b] - new[a])  # a move per tensor
                     for a, b in [("w1", "w3"), ("w2", "w4"), ("o1", "o3"), ("o2", "o4")]]
    w = {t: np.full(n, k + 1, np.float16) for k, t in enumerate(["w1", "w2", "w3", "w4"])}
    out = dict(zip(["o3", "o1", "o4", "o2"], simulate(joined, [w[t] for t in ["w4", "w2", "w3", "w1"]]).outputs))
    for k in range(1, 5):
        np.testing.assert_array_equal(out[f"o{k}"], w[f"w{k}"])


def _concat_calls(one_box: bool):
    """Two DSA calls: ``a = x`` (through an LB), then ``out = concat(y, a)``, its inputs next to each
    other in its program's DDR and read as one box (``one_box``) or as two. With their graph."""
    n = 32  # float16 elements: 64 bytes, one alignment unit
    f16 = lambda name, role, off, k=1: TensorArg(name, role, (k * n,), "float16", "float16", off)  # noqa: E731
    copy = make_program([chain([Dma(0, (n,), lb(0, "float16", 1), ddr(0, "float16", 1)),
                                Dma(0, (n,), ddr(64, "float16", 1), lb(0, "float16", 1))])],
                        [f16("x", "input", 0), f16("a", "output", 64)], 128)
    loads = [Dma(0, (2 * n,), lb(0, "float16", 1), ddr(0, "float16", 1))] if one_box else \
        [Dma(0, (n,), lb(off, "float16", 1), ddr(off, "float16", 1)) for off in (0, 64)]
    concat = make_program([chain([*loads, Dma(0, (2 * n,), ddr(128, "float16", 1), lb(0, "float16", 1))])],
                          [f16("y", "input", 0), f16("a", "input", 64), f16("out", "output", 128, 2)], 256)
    tensors = {t: Tensor(t, (k * n,), "float16", p) for t, k, p in (("x", 1, None), ("y", 1, None), ("a", 1, 0),
                                                                      ("out", 2, 1))}
    graph = OpGraph((Node(0, "a", "copy", ("x",), "a"), Node(1, "out", "concat", ("y", "a"), "out")), tensors,
                    ("out",), params=("x", "y"))
    calls = [DSACall(KernelSpec("copy", ("a",)), copy.serialize(), ("x",), ("a",)),
             DSACall(KernelSpec("concat", ("out",)), concat.serialize(), ("y", "a"), ("out",))]
    return calls, graph


def test_a_call_reading_two_tensors_as_one_box_is_launched_alone():
    """A concatenation whose program reads its two inputs, next to each other in its DDR, as one
    box: joined, the tensors are placed apart and the box would read past the first. It stays a
    call of its own; read as two boxes, the two calls are joined and give the same values."""
    calls, graph = _concat_calls(one_box=True)
    assert launch_together(calls, graph) == (calls, [])
    calls, graph = _concat_calls(one_box=False)
    (call,), runs = launch_together(calls, graph)
    assert runs == [("copy", "concat")] and (call.inputs, call.outputs) == (("x", "y"), ("out",))
    x, y = np.arange(32, dtype=np.float16), -np.arange(32, dtype=np.float16)
    (out,) = simulate(Program.deserialize(call.text), [x, y]).outputs
    np.testing.assert_array_equal(out, np.concatenate([y, x]))


def _model(nodes, inputs, output, weights=()):
    graph = h.make_graph(nodes, "m", [h.make_tensor_value_info(n, TP.FLOAT, s) for n, s in inputs.items()],
                         [h.make_tensor_value_info(output, TP.FLOAT, None)], [nh.from_array(w, n) for n, w in weights])
    return rx_onnx.from_onnx(h.make_model(graph, opset_imports=[h.make_opsetid("", 18)], ir_version=10),
                             keep_params_in_input=False)


def _run(mod, *inputs, schedule="layerwise"):
    ex = tvm.compile(mod, target="dsa/stcp920", relax_pipeline=tvm_dsa.pipeline(schedule=schedule))
    return relax.VirtualMachine(ex, tvm.cpu())["main"](*(tvm.runtime.tensor(x) for x in inputs)).numpy()


def _llvm(mod, *inputs):
    ex = tvm.compile(mod, target="llvm")
    return relax.VirtualMachine(ex, tvm.cpu())["main"](*(tvm.runtime.tensor(x) for x in inputs)).numpy()


def test_two_sub_graphs_run_in_one_launch(monkeypatch, rng):
    """relu(conv1x1) -> relu(conv3x3) -> conv1x1 + x at batch 1: graphturbo cuts it before the
    window into two stitched kernels, one DSA call: one launch instead of two, llvm's values, and
    the cycles of the kernels launched apart less a launch, and fewer with the tensor between them
    kept in the GBs (``kernelgen.resident``): it no longer moves through DDR. The tensor is no longer
    the VM's: the call takes the input, returns the output. Layerwise (the baseline) launches each
    of its kernels."""
    mod, x = single_sample_block(rng)
    y = _run(mod, x, schedule="graphturbo")
    result, report, (call,) = tvm_dsa.pipeline_result(), tvm_dsa.last_report(), tvm_dsa.last_kernel_runs()
    ref = _llvm(mod, x)
    np.testing.assert_allclose(y, ref, rtol=2e-2, atol=2e-2 * np.abs(ref).max())
    (run,) = result.launches
    assert run == tuple(result.dsa) and len(run) == 2 and call.name == f"{run[0]}..{run[1]}"
    assert (report.kernels, report.launches) == (2, 1)
    assert [k.chained for k in call.program.kernels] == [False, True]
    assert [a.name for a in call.program.args if not a.name.startswith("const")] == ["a0", "gv"]  # x, the output

    offload = importlib.import_module("tvm_dsa.kernelgen.offload")
    monkeypatch.setattr(offload, "launch_together", lambda calls, graph, views: (calls, []))
    np.testing.assert_array_equal(_run(mod, x, schedule="graphturbo"), y)
    apart, runs = tvm_dsa.last_report(), tvm_dsa.last_kernel_runs()
    assert [r.name for r in runs] == list(run) and apart.launches == 2
    (between,) = [a.name for a in runs[0].program.args if a.role == "output"]
    assert between not in {a.name for a in call.program.args}
    assert report.cycles < apart.cycles - HW.kernel_launch_cycles
    end = max(a.offset + a.nbytes for a in call.program.args)  # the tensor between: in no DDR byte past them
    assert all(o.extent_bytes(i.shape)[1] <= end for k in call.program.expanded().kernels for i in k.instructions
               if type(i) is Dma for o in (i.src, i.dst) if o.mem == "ddr")
    assert report.ddr_write == 64 * 32 * 32 * 2 and report.ddr_read < apart.ddr_read
    monkeypatch.undo()
    scratch_in_ddr(monkeypatch)
    np.testing.assert_array_equal(_run(mod, x, schedule="graphturbo"), y)
    assert tvm_dsa.last_report().cycles == apart.cycles - HW.kernel_launch_cycles
    _run(mod, x, schedule="layerwise")
    assert tvm_dsa.pipeline_result().launches == [] and tvm_dsa.last_report().launches > 1


def test_a_joined_dense_block_leaves_no_multicast_waiting_for_ever():
    """A dense block of six layers at batch 1 (DenseNet-BC over a 56 x 56 image): its kernels run
    in one launch, and the launch passes re-source their loads (the block's input read in bands
    across the bus) and drop copies. An edit can pair a core's load of a box with another
    cluster's load of it layers later (the n-th load of a box into each LB is one transfer), and
    the two queues then wait on each other: before ``edits.plain_where_stuck`` 128 such DMAs in
    the block's kernel, which the simulator moved alone only once nothing else could run. None is
    left in any kernel, and the outputs are llvm's (every dependency checked)."""
    model = densenet(image=56, blocks=(6,))
    mod = import_onnx(model)
    (x,) = example_inputs(model).values()
    y = _run(mod, x, schedule="graphturbo")
    ref = _llvm(mod, x)
    np.testing.assert_allclose(y, ref, rtol=2e-2, atol=2e-2 * np.abs(ref).max())
    (call,) = tvm_dsa.last_kernel_runs()
    kernels = call.program.expanded().kernels
    assert len(kernels) > 1 and any(i.multicast for k in kernels for i in k.instructions if type(i) is Dma)
    assert all(not stuck_multicasts(list(k.instructions), HW.cores_per_cluster) for k in kernels)


def _flattened(rng, also_flat: bool):
    """relu(conv(x)) flattened (a view on the host) into a matrix product; the flat tensor is also
    returned where ``also_flat``."""
    w = rng.standard_normal((8, 4, 3, 3)).astype("float32") * 0.3
    wm = rng.standard_normal((512, 16)).astype("float32") * 0.1
    nodes = [h.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c"], ["r"]),
             h.make_node("Flatten", ["r"], ["flat"]), h.make_node("MatMul", ["flat", "wm"], ["y"])]
    outputs = ["y", "flat"] if also_flat else ["y"]
    graph = h.make_graph(nodes, "m", [h.make_tensor_value_info("x", TP.FLOAT, [1, 4, 8, 8])],
                         [h.make_tensor_value_info(o, TP.FLOAT, None) for o in outputs],
                         [nh.from_array(w, "w"), nh.from_array(wm, "wm")])
    return rx_onnx.from_onnx(h.make_model(graph, opset_imports=[h.make_opsetid("", 18)], ir_version=10),
                             keep_params_in_input=False)


def test_a_view_only_the_next_call_reads_joins_the_run(monkeypatch, rng):
    """A flatten (a pure reshape: a view on the host) between a convolution and the product reading
    it: the run takes the view in, the product reads the convolution's output in its place. One
    launch, llvm's values, the cycles apart less a launch (its scratch in DDR). Returned as well,
    the flat tensor is the host's: the two kernels are launched apart."""
    scratch_in_ddr(monkeypatch)
    x = rng.standard_normal((1, 4, 8, 8)).astype("float32")
    mod = _flattened(rng, also_flat=False)
    y = _run(mod, x, schedule="graphturbo")
    result, report = tvm_dsa.pipeline_result(), tvm_dsa.last_report()
    np.testing.assert_allclose(y, _llvm(mod, x), rtol=2e-2, atol=2e-2)
    assert list(result.host.values()) == [VIEW]  # the flatten
    (run,) = result.launches
    assert run == tuple(result.dsa) and len(run) == 2 and report.launches == 1
    offload = importlib.import_module("tvm_dsa.kernelgen.offload")
    monkeypatch.setattr(offload, "launch_together", lambda calls, graph, views: (calls, []))
    np.testing.assert_array_equal(_run(mod, x, schedule="graphturbo"), y)
    assert report.cycles == tvm_dsa.last_report().cycles - HW.kernel_launch_cycles
    monkeypatch.undo()

    mod = _flattened(rng, also_flat=True)
    ex = tvm.compile(mod, target="dsa/stcp920", relax_pipeline=tvm_dsa.pipeline(schedule="graphturbo"))
    y, flat = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
    ref_y, ref_flat = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())["main"](tvm.runtime.tensor(x))
    np.testing.assert_allclose(flat.numpy(), ref_flat.numpy(), rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(y.numpy(), ref_y.numpy(), rtol=2e-2, atol=2e-2)
    assert tvm_dsa.pipeline_result().launches == [] and tvm_dsa.last_report().launches == 2


def test_a_host_kernel_between_two_dsa_kernels_keeps_them_apart(rng):
    """The sum of all elements (a 0-d output) runs on the host between the ReLU and the product
    that reads both: the two DSA kernels stay two launches, the host's in between."""
    mod = _model([h.make_node("Relu", ["x"], ["r"]), h.make_node("ReduceSum", ["r"], ["s"], keepdims=0),
                  h.make_node("Mul", ["r", "s"], ["y"])], {"x": [4, 8]}, "y")
    x = rng.standard_normal((4, 8)).astype("float32")
    y = _run(mod, x)
    result = tvm_dsa.pipeline_result()
    r = np.maximum(x, 0)
    np.testing.assert_allclose(y, r * r.sum(), rtol=1e-2)
    assert "a 0-d output (a scalar)" in " ".join(result.host.values())
    assert result.launches == [] and len(result.dsa) == 2
    assert tvm_dsa.last_report().launches == 2


def test_a_tensor_another_binding_makes_keeps_its_reader_apart(rng):
    """A top-k (several outputs: the host's) reads the ReLU's output, and a kernel on the DSA reads
    its values and that output: the values come from a binding that is no layer, so that kernel
    is launched on its own, after the host's."""
    ints = [(n, np.array([v], "int64")) for n, v in (("k", 2), ("start", 0), ("end", 2), ("axis", 1))]
    mod = _model([h.make_node("Relu", ["x"], ["r"]), h.make_node("TopK", ["r", "k"], ["v", "i"], axis=1),
                  h.make_node("Sigmoid", ["v"], ["s"]), h.make_node("Slice", ["r", "start", "end", "axis"], ["head"]),
                  h.make_node("Add", ["s", "head"], ["y"])], {"x": [2, 8]}, "y", ints)
    x = rng.standard_normal((2, 8)).astype("float32")
    y = _run(mod, x)
    result = tvm_dsa.pipeline_result()
    r = np.maximum(x, 0)
    np.testing.assert_allclose(y, 1 / (1 + np.exp(-np.sort(r)[:, ::-1][:, :2])) + r[:, :2], rtol=1e-2, atol=1e-3)
    assert result.host == {"topk": "several outputs: the DSA runs kernels of one output"}
    assert len(result.dsa) == 2 and result.launches == []
