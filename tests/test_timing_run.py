"""Timing runs make no data they do not need: a static model's DSA calls, recorded when it is
compiled, are replayed without the VM and without tensors (``Compiled.calls``,
``harness.timing_run``); a model whose calls its inputs can change runs on the VM."""

import json
import tracemalloc

import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h

from tvm_dsa.cli import main
from tvm_dsa.harness import Compiled, import_onnx, timing_run
from tvm_dsa.models import TINY, example_inputs, get_model
from tvm_dsa.models.dynamic import nonzero, skipnet


def _without_flow_ids(trace: list) -> list:
    """The trace with its flow events' ids dropped: a process-wide counter numbers them."""
    return [{k: v for k, v in e.items() if k != "id"} for e in trace]


@pytest.mark.parametrize("name, target", [("resnet18", "dsa/stcp920"), ("bert_base", "dsa/stcp920"),
                                          ("dlrm", "dsa/stcp920"), ("resnet18", "dsa/set-edge16")])
def test_a_replayed_timing_run_is_the_vms(name, target):
    """The replay's report, kernel calls and trace are those of a timing run of ``main`` on the VM
    with the example inputs (DLRM's gathers run on the host there, and not at all in the replay)."""
    model = get_model(name, **TINY[name])
    compiled = Compiled.build(import_onnx(model), target)
    assert compiled.calls is not None
    replayed = compiled.run(None, mode="timing", trace=True)
    on_vm = compiled.run(example_inputs(model), mode="timing", trace=True)
    assert replayed.outputs == [] and len(on_vm.outputs) == len(model.graph.output)
    assert replayed.report.to_dict() == on_vm.report.to_dict()
    assert [(k.name, k.output_shapes) for k in replayed.kernels] == [(k.name, k.output_shapes) for k in on_vm.kernels]
    assert _without_flow_ids(replayed.trace) == _without_flow_ids(on_vm.trace) != []


def _static(model: onnx.ModelProto, shape: list[int]) -> onnx.ModelProto:
    """``model`` with its one input's dims fixed to ``shape``."""
    for dim, size in zip(model.graph.input[0].type.tensor_type.shape.dim, shape, strict=True):
        dim.ClearField("dim_param")
        dim.dim_value = size
    return model


@pytest.mark.parametrize("model", [_static(skipnet(), [1, 3, 16, 16]), _static(nonzero(), [8, 16])],
                         ids=["if", "nonzero"])
def test_a_model_whose_inputs_decide_its_calls_runs_on_the_vm(model):
    """An If (which branch's kernels run) or a NonZero (the shapes of the kernels after it) makes
    the calls depend on the inputs: nothing is recorded, a run without inputs is refused, and
    ``timing_run`` runs ``main`` on the VM with the example inputs."""
    compiled = Compiled.build(import_onnx(model), "dsa/stcp920")
    assert compiled.calls is None
    with pytest.raises(ValueError, match="a run without inputs is a timing run of a model whose DSA calls"):
        compiled.run(None, mode="timing")
    run = timing_run(compiled, model)
    assert run.kernels and run.report.kernels == len(run.kernels)


def test_a_replay_is_a_timing_run_only():
    model = get_model("resnet18", **TINY["resnet18"])
    with pytest.raises(ValueError, match="a run without inputs is a timing run"):
        Compiled.build(import_onnx(model), "dsa/stcp920").run(None, mode="functional")


def test_timing_only_makes_no_inputs(tmp_path, capsys):
    """``run --timing-only`` of a 1 x N @ N x N MatMul whose both operands are inputs: the N x N one
    is 256 MiB of float32 (made from 512 MiB of float64 random numbers before), and the run's
    peak of traced allocations stays below it; the report has the model's MACs."""
    n = 8192
    inputs = [h.make_tensor_value_info("a", TP.FLOAT, [1, n]), h.make_tensor_value_info("b", TP.FLOAT, [n, n])]
    graph = h.make_graph([h.make_node("MatMul", ["a", "b"], ["y"])], "matmul", inputs,
                         [h.make_tensor_value_info("y", TP.FLOAT, [1, n])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 10
    path = tmp_path / "matmul.onnx"
    onnx.save(model, str(path))
    tracemalloc.start()
    try:
        assert main(["run", str(path), "--timing-only", "--json"]) == 0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < n * n * 4
    assert json.loads(capsys.readouterr().out)["report"]["macs"] == n * n
