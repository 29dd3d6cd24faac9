"""The dynamic models of tvm_dsa.models.dynamic: one build for every shape, numerics against
onnxruntime, and what RDP knows of their shapes."""

import warnings

import numpy as np
import onnxruntime as ort
import pytest
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

from tvm_dsa.models.dynamic import DYNAMIC
from tvm_dsa.relax_passes import rdp

warnings.filterwarnings("ignore", module="tvm.relax.frontend.onnx")


def _input(name, shape, rng):
    if name == "bert":
        return rng.integers(0, 100, shape).astype(np.int64)
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("name, shapes", [
    ("bert", [(1, 5), (2, 9)]),
    ("cnn", [(1, 3, 16, 16), (2, 3, 13, 21)]),
])
def test_one_llvm_build_runs_every_shape_like_onnxruntime(name, shapes, rng):
    model = DYNAMIC[name]()
    vm = relax.VirtualMachine(tvm.compile(from_onnx(model, keep_params_in_input=False), target="llvm"), tvm.cpu())
    sess = ort.InferenceSession(model.SerializeToString())
    feed = sess.get_inputs()[0].name
    for shape in shapes:
        x = _input(name, shape, rng)
        ref = sess.run(None, {feed: x})[0]
        out = vm["main"](tvm.runtime.tensor(x)).numpy()
        assert out.shape == ref.shape
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def _analyze(name):
    return rdp.analyze(from_onnx(DYNAMIC[name](), keep_params_in_input=False))


def test_positions_from_range_are_resolved_only_by_rdp():
    """shape_chain adds Range(0, seq) positions: Relax names the range's length afresh and loses
    the sum's dims; RDP proves the length is seq and resolves every tensor."""
    r = _analyze("shape_chain")
    s = r.summary()
    assert s.rdp == s.tensors and s.relax < s.tensors
    assert {str(row.fact.shape) for row in r.rows() if row.relax_shape == "ndim=3"} == {"(batch, seq, 64)"}


def test_gated_block_that_changes_shape_merges_to_nac_dims():
    """skipnet's second If: a stride-2 conv ((h - 1) // 2 + 1) or a 2x2 average pool (h // 2):
    the merge keeps batch and channels, the spatial dims are ⊥; Relax keeps only the rank."""
    r = _analyze("skipnet")
    ifs = [row for row in r.rows() if row.producer == "if"]
    assert [str(row.fact.shape) for row in ifs] == ["(batch, 8, height, width)", "(batch, 8, ⊥, ⊥)"]
    assert [row.relax_shape for row in ifs] == ["(batch, 8, height, width)", "ndim=4"]
    assert str(r.rows()[-1].fact.shape) == "(batch, 10)" and r.rows()[-1].relax_shape == "ndim=2"
