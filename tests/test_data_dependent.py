"""Models with data-dependent shapes (NonZero, TopK with a computed k, Range from Shape): imported
where TVM's importer refuses them (tvm_dsa.frontend), one dsa build runs every input, the DSA
runs what it can and the host the rest, outputs against onnxruntime."""

import warnings

import numpy as np
import onnxruntime as ort
import pytest
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx as tvm_from_onnx

import tvm_dsa
from tvm_dsa.harness import max_relative_error
from tvm_dsa.frontend import from_onnx
from tvm_dsa.models.dynamic import DATA_DEPENDENT

warnings.filterwarnings("ignore", module="tvm.relax.frontend.onnx")

# (input shapes, scales): nonzero's all-negative input selects no row at all
INPUTS = {
    "nonzero": [((5, 16), 1.0), ((9, 16), 1.0), ((1, 16), 1.0), ((4, 16), -1.0)],
    "topk": [((2, 8), 1.0), ((3, 10), 1.0), ((1, 6), 1.0)],
    "topk_data": [((2, 8), 1.0), ((3, 10), 1.0), ((1, 6), 1.0)],
    "range_shape": [((2, 5, 16), 1.0), ((1, 9, 16), 1.0), ((3, 2, 16), 1.0)],
}
# what stays on the host and why (pipeline_result().host): the ops the DSA cannot run
ON_HOST = {"nonzero": "take", "topk": "argsort", "topk_data": "argsort", "range_shape": "arange"}


def _input(shape, scale, seed):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return -np.abs(x) if scale < 0 else x


@pytest.mark.parametrize("name", sorted(DATA_DEPENDENT))
def test_one_dsa_build_runs_every_input_like_onnxruntime(name):
    model = DATA_DEPENDENT[name]()
    sess = ort.InferenceSession(model.SerializeToString())
    vm = relax.VirtualMachine(tvm.compile(from_onnx(model), target="dsa/stcp920", relax_pipeline="dsa"), tvm.cpu())
    host = tvm_dsa.pipeline_result().host
    assert any(ON_HOST[name] in kernel for kernel in host), host
    shapes = set()
    for seed, (shape, scale) in enumerate(INPUTS[name]):
        x = _input(shape, scale, seed)
        ref = sess.run(None, {"x": x})
        out = vm["main"](tvm.runtime.tensor(x))
        outs = [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]
        assert [o.shape for o in outs] == [r.shape for r in ref]
        shapes.add(outs[0].shape)
        if outs[0].size:
            assert max_relative_error(outs, ref) < 2e-3
            assert tvm_dsa.last_kernel_runs(), "no kernel ran on the DSA"
    assert len(shapes) >= 3  # one build, output shapes that only the inputs decide


@pytest.mark.parametrize("name,error", [("topk", "cannot handle ShapeExpr inputs"), ("topk_data", "k must be a constant")])
def test_tvms_importer_refuses_what_ours_takes(name, error):
    with pytest.raises(Exception, match=error):
        tvm_from_onnx(DATA_DEPENDENT[name](), keep_params_in_input=False)
    mod = from_onnx(DATA_DEPENDENT[name]())
    assert "topk_k" in mod["main"].script()  # k: a symbol the program defines at run time


def test_topk_k_from_the_shape_is_proven_by_rdp():
    """k = n // 2: ApplyRDP replaces the run-time symbol by the expression of the input's dims."""
    from tvm_dsa.relax_passes.rdp_apply import ApplyRDP

    from tvm import tirx

    main = ApplyRDP()(from_onnx(DATA_DEPENDENT["topk"]()))["main"]
    n = main.params[0].ty.shape.values[1]
    for field in main.ret_ty.fields:
        k = field.shape.values[1]
        assert isinstance(k, tirx.Div) and k.a.same_as(n) and int(k.b) == 2
    assert "topk_k" not in main.script()
