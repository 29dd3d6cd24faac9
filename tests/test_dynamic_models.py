"""The dynamic models of tvm_dsa.models.dynamic: one build for every shape, numerics against
onnxruntime, and what RDP knows of their shapes."""

import warnings

import numpy as np
import onnxruntime as ort
import pytest
import tvm
import tvm_ffi
from helpers import with_gate_outputs
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

from tvm_dsa.models.dynamic import DYNAMIC
from tvm_dsa.relax_passes import rdp
from tvm_dsa.relax_passes.lattice import show
from tvm_dsa.relax_passes.rdp_apply import ApplyRDP

warnings.filterwarnings("ignore", module="tvm.relax.frontend.onnx")


def _input(name, shape, rng, scale):
    if name == "bert":
        return rng.integers(0, 100, shape).astype(np.int64)
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _check_against_onnxruntime(name, mod, shapes, rng) -> set:
    """Run the one build at every shape; returns the If decisions onnxruntime took."""
    model = DYNAMIC[name]()
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    sess = ort.InferenceSession(with_gate_outputs(model).SerializeToString())
    feed = sess.get_inputs()[0].name
    taken = set()
    for k, shape in enumerate(shapes):
        x = _input(name, shape, rng, scale=(0.5, 4.0)[k % 2])  # skipnet's gates: small runs skip
        ref, *gates = sess.run(None, {feed: x})
        taken.add(tuple(bool(g) for g in gates))
        out = vm["main"](tvm.runtime.tensor(x)).numpy()
        assert out.shape == ref.shape
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    return taken


@pytest.mark.parametrize("name, shapes", [
    ("bert", [(1, 5), (2, 9)]),
    ("cnn", [(1, 3, 16, 16), (2, 3, 13, 21)]),
])
def test_one_llvm_build_runs_every_shape_like_onnxruntime(name, shapes, rng):
    _check_against_onnxruntime(name, from_onnx(DYNAMIC[name](), keep_params_in_input=False), shapes, rng)


@pytest.mark.parametrize("name, shapes", [
    ("shape_chain", [(1, 5, 64), (3, 7, 64)]),
    ("skipnet", [(1, 3, 16, 16), (2, 3, 15, 11), (1, 3, 9, 12), (3, 3, 7, 7)]),
])
def test_rdp_makes_compilable_what_relax_alone_cannot(name, shapes, rng):
    """Relax does not know some shapes of these models, so LegalizeOps leaves those ops and the VM
    code generator refuses them; with RDP's shapes cast in, one build runs every shape."""
    mod = from_onnx(DYNAMIC[name](), keep_params_in_input=False)
    with pytest.raises(tvm.error.InternalError, match="CodeGenVM cannot emit this Relax operator"):
        tvm.compile(mod, target="llvm")
    taken = _check_against_onnxruntime(name, ApplyRDP()(mod), shapes, rng)
    if name == "skipnet":  # both ways through each gate
        assert {t[0] for t in taken} == {True, False} and {t[1] for t in taken} == {True, False}


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


def test_apply_rdp_casts_only_where_relax_knows_less():
    """skipnet: one cast, after the If whose branches differ, naming the dims RDP found ⊥;
    everything after it is inferred by Relax from the cast."""
    mod = ApplyRDP()(from_onnx(DYNAMIC["skipnet"](), keep_params_in_input=False))
    casts = []
    tvm_ffi.structural_walk(mod["main"].body, [(relax.MatchCast, casts.append)])
    assert len(casts) == 1
    dims = [show(d) for d in casts[0].ty.shape.values]
    assert dims[:2] == ["batch", "8"] and all(d.endswith(("_2", "_3")) for d in dims[2:])
    assert str(mod["main"].ret_ty) == 'R.Tensor((batch, 10), dtype="float32")'


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "bert_base", *DYNAMIC])
def test_rdp_agrees_with_relax_wherever_relax_knows(name):
    """On the static zoo and the dynamic models: every dim Relax's struct info gives in terms of
    the inputs is the dim RDP finds (RDP only ever adds to what Relax knows)."""
    from tvm_dsa.harness import import_onnx, load_model

    mod = (from_onnx(DYNAMIC[name](), keep_params_in_input=False) if name in DYNAMIC
           else import_onnx(load_model(name, tiny=True)))
    analyzer = tvm.sym.Analyzer()
    compared = 0
    for row in rdp.analyze(mod).rows():
        if row.relax_resolved:
            dims = row.fact.shape
            assert dims.known and len(dims) == row.var.ty.ndim, row.var.name
            for d, e in zip(dims, row.var.ty.shape.values):
                assert d.determined and analyzer.can_prove_equal(d.expr, e), (row.var.name, str(d), e)
                compared += 1
    assert compared > 0
