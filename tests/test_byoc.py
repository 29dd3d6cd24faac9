"""TVM's BYOC flow for the DSA (``tvm_dsa.byoc``): the ``dsa.`` patterns in TVM's registry,
``FuseOpsByPattern`` + ``RunCodegen`` offload the kernels the ``dsa`` pipeline does, with the same
programs and numbers, and what is not one DSA kernel runs on the host with the reason kept."""

import json

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.backend.pattern_registry import get_patterns_with_prefix
from tvm.script import relax as R

import tvm_dsa
from helpers import by_tiny_model, tiny_llvm_output
from tvm_dsa.byoc.codegen import composites_of
from tvm_dsa.byoc.partition import partition_for_dsa
from tvm_dsa.byoc.patterns import patterns
from tvm_dsa.harness import import_onnx
from tvm_dsa.models import TINY, example_inputs, get_model


def _run(ex, args):
    """The first output and the DSA kernel runs of one run of ``ex`` (in a session of its own:
    a module built with target llvm marks no run start)."""
    with tvm_dsa.session() as s:
        out = relax.VirtualMachine(ex, tvm.cpu())["main"](*args)
    while not hasattr(out, "numpy"):
        out = out[0]
    return out.numpy(), s.kernel_runs()


def test_the_patterns_are_in_tvms_registry_in_priority_order():
    names = [p.name for p in get_patterns_with_prefix("dsa")]
    assert names == [p[0] for p in patterns()]
    assert names[0] == "dsa.matmul_bias_gelu" and names.index("dsa.conv2d_6") < names.index("dsa.conv2d_0")


@pytest.mark.parametrize("name", by_tiny_model(TINY))
def test_byoc_runs_every_zoo_model_as_llvm_does(name):
    """Where the pipeline offloads ops no pattern covers (concatenations, the importer's own TIR
    functions), the flows group differently (``python benchmarks/byoc.py``); the numbers agree."""
    model = get_model(name, **TINY[name])
    args = [tvm.runtime.tensor(v) for v in example_inputs(model).values()]
    ex = tvm.compile(relax.transform.RunCodegen()(partition_for_dsa(import_onnx(model))), target="llvm")
    out, runs = _run(ex, args)
    ref = tiny_llvm_output(name)
    assert np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-6) < 2e-2, "BYOC output differs from llvm beyond fp16 error"
    composites = composites_of(ex)
    assert len(runs) >= sum(c.host is None for c in composites) > 0  # a composite may be called more than once
    assert all(c.host for c in composites if c.program is None)


@pytest.mark.parametrize("name", by_tiny_model(["resnet18", "bert_base"]))
def test_byoc_gives_the_dsa_pipelines_programs_and_numbers(name):
    """A pattern is one fused op: BYOC's kernels are the layerwise schedule's, but for the pairs
    the pipeline makes one kernel (``kernelgen.blocks``: a BYOC composite is compiled alone).
    BERT's are layout copies folded into the products reading them, which move values exactly:
    the same outputs, bit for bit."""
    model = get_model(name, **TINY[name])
    mod = import_onnx(model)
    args = [tvm.runtime.tensor(v) for v in example_inputs(model).values()]
    byoc, byoc_runs = _run(tvm.compile(relax.transform.RunCodegen()(partition_for_dsa(mod)), target="llvm"), args)
    ex = tvm.compile(mod, target="dsa/stcp920", relax_pipeline=tvm_dsa.pipeline("layerwise"))
    dsa, dsa_runs = _run(ex, args)
    chosen = [b for b in tvm_dsa.pipeline_result(ex).blocks if b.fused_cycles < b.parts_cycles]
    fused = {f"{b.producer}_{b.consumer.removeprefix('fused_')}" for b in chosen}
    assert (len(chosen) > 0) == (name == "bert_base")
    assert len(byoc_runs) == len(dsa_runs) + len(chosen) > len(chosen)  # a pair: a call fewer
    apart = [json.dumps(k.program.nameless()) for k in dsa_runs if k.name not in fused]
    byoc_programs = [json.dumps(k.program.nameless()) for k in byoc_runs]
    assert all(apart.count(p) <= byoc_programs.count(p) for p in apart)  # the same kernels elsewhere
    if not chosen:
        assert sum(k.report.cycles for k in byoc_runs) == sum(k.report.cycles for k in dsa_runs)
    np.testing.assert_array_equal(byoc, dsa)  # (and llvm's: test_byoc_runs_every_zoo_model_as_llvm_does)


@pytest.mark.xdist_group("tiny-resnet18")
def test_the_plain_flow_offloads_by_the_registry_and_matches_llvm():
    """``FuseOpsByPattern(get_patterns_with_prefix("dsa"), annotate_codegen=True)`` then
    ``RunCodegen()`` on the module as imported (its batch norms unfolded: a convolution whose
    batch norm's unused outputs leak stays apart from it)."""
    model = get_model("resnet18", **TINY["resnet18"])
    mod = import_onnx(model)
    args = [tvm.runtime.tensor(v) for v in example_inputs(model).values()]
    parted = relax.transform.FuseOpsByPattern(get_patterns_with_prefix("dsa"), annotate_codegen=True)(mod)
    ex = tvm.compile(relax.transform.RunCodegen()(parted), target="llvm")
    out, runs = _run(ex, args)
    composites = composites_of(ex)
    assert all(c.host is None for c in composites) and len(runs) >= len(composites) > 0
    llvm = tiny_llvm_output("resnet18")
    np.testing.assert_allclose(out, llvm, rtol=2e-2, atol=2e-2 * np.abs(llvm).max())


def _matmul_relu(weight: np.ndarray) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, relax.const(weight)))
            out = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(out)
    return bb.get()


def test_two_executables_with_the_same_symbols_keep_their_own_kernels(rng):
    """Both modules' functions get the same global symbol; each executable still runs its own
    weights (its stubs name its composites)."""
    x = rng.standard_normal((4, 64)).astype("float32")
    weights = [rng.standard_normal((64, 32)).astype("float32") for _ in range(2)]
    exes = [tvm.compile(relax.transform.RunCodegen()(partition_for_dsa(_matmul_relu(w))), target="llvm")
            for w in weights]
    for ex, w in zip(exes, weights):
        out, runs = _run(ex, [tvm.runtime.tensor(x)])
        assert len(runs) == 1 and runs[0].report.macs == 4 * 64 * 32
        np.testing.assert_allclose(out, np.maximum(x @ w, 0), rtol=1e-2, atol=2e-2)


@tvm.script.ir_module
class IntAdd:
    @R.function
    def main(x: R.Tensor((8, 16), "int32"), y: R.Tensor((8, 16), "int32")):
        with R.dataflow():
            z = R.add(x, y)
            out = R.multiply(z, y)
            R.output(out)
        return out


def test_a_composite_the_dsa_cannot_run_runs_on_the_host_with_its_reason(rng):
    x, y = (rng.integers(-100, 100, (8, 16)).astype("int32") for _ in range(2))
    ex = tvm.compile(relax.transform.RunCodegen()(partition_for_dsa(IntAdd)), target="llvm")
    out, runs = _run(ex, [tvm.runtime.tensor(x), tvm.runtime.tensor(y)])
    np.testing.assert_array_equal(out, (x + y) * y)
    (composite,) = composites_of(ex)
    assert runs == [] and "int32" in composite.host
