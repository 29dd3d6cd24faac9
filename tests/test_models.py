"""Tests of the model zoo (tvm_dsa.models): ONNX validity, onnxruntime vs TVM llvm,
activation sanity, MAC counts (by hand for tiny models, literature for full-size ones)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers import by_tiny_model, tiny_llvm_output

from tvm_dsa.models import MODELS, TINY, example_inputs, get_model, macs, model_config
from tvm_dsa.models.builder import infer_shapes


def run_ort(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def run_tvm(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    import tvm
    from tvm.relax.frontend import onnx as rx_onnx

    mod = rx_onnx.from_onnx(model, keep_params_in_input=False)
    ex = tvm.compile(mod, target="llvm")
    vm = tvm.relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(feeds[i.name]) for i in model.graph.input])
    return out.numpy()


@pytest.fixture(scope="module")
def tiny_models() -> dict[str, onnx.ModelProto]:
    return {name: get_model(name, **kw) for name, kw in TINY.items()}


# ------------------------------------------------------------------------ registry / API
def test_registry_and_tiny_cover_the_same_models():
    assert set(TINY) == set(MODELS) == {
        "resnet18", "resnet50", "mobilenet_v2", "densenet121", "bert_base", "vit_b16",
        "dlrm", "conformer", "googlenet", "inception_resnet_v1", "pnasnet"}


def test_unknown_model_lists_known_ones():
    with pytest.raises(ValueError, match="resnet50"):
        get_model("alexnet")


def test_builds_are_deterministic_per_seed():
    a = get_model("conformer", **TINY["conformer"])
    b = get_model("conformer", **TINY["conformer"])
    c = get_model("conformer", **TINY["conformer"], seed=1)
    assert a.SerializeToString() == b.SerializeToString()
    wa = {t.name: onnx.numpy_helper.to_array(t) for t in a.graph.initializer}
    wc = {t.name: onnx.numpy_helper.to_array(t) for t in c.graph.initializer}
    assert wa.keys() == wc.keys()
    assert any(not np.array_equal(wa[k], wc[k]) for k in wa)


def test_example_inputs_respect_index_ranges(tiny_models):
    feeds = example_inputs(tiny_models["bert_base"])
    ids = feeds["input_ids"]
    assert ids.dtype == np.int64 and ids.shape == (1, 16)
    assert ids.min() >= 0 and ids.max() < TINY["bert_base"]["vocab"]

    feeds = example_inputs(tiny_models["dlrm"], seed=3)
    assert feeds["dense"].dtype == np.float32 and feeds["dense"].shape == (8, 13)
    sparse = feeds["sparse"]
    assert sparse.shape == (8, 4) and sparse.min() >= 0
    assert (sparse.max(axis=0) < np.array(TINY["dlrm"]["tables"])).all()
    # seeded
    assert np.array_equal(example_inputs(tiny_models["dlrm"], seed=3)["sparse"], sparse)


def test_model_metadata_records_config(tiny_models):
    assert model_config(tiny_models["vit_b16"])["patch"] == 8
    for m in tiny_models.values():
        assert m.ir_version == 10
        assert [(o.domain, o.version) for o in m.opset_import] == [("", 17)]


# --------------------------------------------------------------------------- tiny models
@pytest.mark.parametrize("name", by_tiny_model(TINY))
def test_tiny_model_onnxruntime_vs_tvm(name, tiny_models):
    model = tiny_models[name]
    onnx.checker.check_model(model, full_check=True)
    feeds = example_inputs(model)
    ref = run_ort(model, feeds)
    assert np.isfinite(ref).all()
    # activations neither exploded nor collapsed to a constant
    assert 0.05 < ref.std() < 10.0, ref.std()
    assert np.abs(ref).max() < 100.0
    out = tiny_llvm_output(name)  # run_tvm(model, feeds), compiled once for test_models_on_dsa too
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_bert_attention_mask_variant():
    model = get_model("bert_base", **TINY["bert_base"], attention_mask=True)
    onnx.checker.check_model(model, full_check=True)
    feeds = example_inputs(model, seed=1)
    assert set(np.unique(feeds["attention_mask"])) <= {0, 1}
    ref = run_ort(model, feeds)
    # a mask of all ones is the same as no mask
    ones = dict(feeds, attention_mask=np.ones_like(feeds["attention_mask"]))
    plain = get_model("bert_base", **TINY["bert_base"])
    np.testing.assert_allclose(run_ort(model, ones), run_ort(plain, {"input_ids": feeds["input_ids"]}),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(run_tvm(model, feeds), ref, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------ MACs by hand
def _conv(hw: int, cout: int, cin: int, k: int) -> int:
    """MACs of a k x k conv producing a hw x hw x cout map from cin channels."""
    return hw * hw * cout * cin * k * k


def _encoder_layer(s: int, h: int, f: int) -> int:
    """Q, K, V, output projections + QK^T + PV + two FFN matmuls (independent of heads)."""
    return 4 * s * h * h + 2 * s * s * h + 2 * s * h * f


def test_macs_tiny_resnet18(tiny_models):
    # image 32, base width 16, one BasicBlock per stage, 10 classes
    expected = (
        _conv(16, 16, 3, 7)                                               # stem, 32 -> 16
        + 2 * _conv(8, 16, 16, 3)                                         # layer1 (after maxpool)
        + _conv(4, 32, 16, 3) + _conv(4, 32, 32, 3) + _conv(4, 32, 16, 1)  # layer2 + downsample
        + _conv(2, 64, 32, 3) + _conv(2, 64, 64, 3) + _conv(2, 64, 32, 1)  # layer3
        + _conv(1, 128, 64, 3) + _conv(1, 128, 128, 3) + _conv(1, 128, 64, 1)  # layer4
        + 128 * 10)                                                       # fc
    assert macs(tiny_models["resnet18"]) == expected == 1586432


def test_macs_tiny_resnet50(tiny_models):
    # image 32, base 16, two stages with one Bottleneck each (expansion 4)
    expected = (
        _conv(16, 16, 3, 7)
        + _conv(8, 16, 16, 1) + _conv(8, 16, 16, 3) + _conv(8, 64, 16, 1) + _conv(8, 64, 16, 1)
        + _conv(8, 32, 64, 1) + _conv(4, 32, 32, 3) + _conv(4, 128, 32, 1) + _conv(4, 128, 64, 1)
        + 128 * 10)
    assert macs(tiny_models["resnet50"]) == expected


def test_macs_tiny_bert(tiny_models):
    c = TINY["bert_base"]
    expected = c["layers"] * _encoder_layer(c["seq"], c["hidden"], c["ffn"])
    assert macs(tiny_models["bert_base"]) == expected == 1638400


def test_macs_tiny_vit(tiny_models):
    c = TINY["vit_b16"]
    grid = c["image"] // c["patch"]
    tokens = grid * grid + 1
    expected = (_conv(grid, c["hidden"], 3, c["patch"])
                + c["layers"] * _encoder_layer(tokens, c["hidden"], c["mlp"])
                + c["hidden"] * c["num_classes"])
    assert macs(tiny_models["vit_b16"]) == expected


def test_macs_tiny_dlrm(tiny_models):
    c = TINY["dlrm"]
    b, d, n = c["batch"], c["bottom_mlp"][-1], len(c["tables"]) + 1
    expected = b * (13 * 32 + 32 * 16                 # bottom MLP
                    + n * n * d                       # Z @ Z^T
                    + (d + n * (n - 1) // 2) * 32 + 32)  # top MLP
    assert macs(tiny_models["dlrm"]) == expected


def test_macs_tiny_conformer(tiny_models):
    c = TINY["conformer"]
    t, d = c["seq"], c["dim"]
    ffn = 2 * t * d * 4 * d
    mhsa = 4 * t * d * d + 2 * t * t * d
    conv = t * 2 * d * d + t * d * 31 + t * d * d
    assert macs(tiny_models["conformer"]) == 2 * ffn + mhsa + conv


# ------------------------------------------------------------------------ full-size models
#: Literature MACs of the full-size default configurations (batch 1).
REFERENCE_GMACS = {
    "resnet18": 1.8,       # torchvision: 1.81 GFLOPS (multiply-adds)
    "resnet50": 4.1,       # 4.09
    "mobilenet_v2": 0.3,   # 0.30
    "densenet121": 2.9,    # 2.83-2.87
    "bert_base": 11.2,     # seq 128, encoder only
    "vit_b16": 17.6,       # 17.56
}


@pytest.mark.parametrize("name", list(MODELS))
def test_full_size_model_is_valid(name):
    model = get_model(name)
    onnx.checker.check_model(model)
    # strict shape inference (on a weight-less skeleton of the graph: same check, no 400 MB
    # serialisation); every tensor must get a static shape
    inferred = infer_shapes(model)
    infos = {vi.name: vi.type.tensor_type for vi in
             [*inferred.graph.value_info, *inferred.graph.output]}
    for node in model.graph.node:
        for out in node.output:
            tt = infos[out]
            assert tt.HasField("shape") and all(d.dim_value > 0 for d in tt.shape.dim), out
    gmacs = macs(model) / 1e9
    print(f"{name}: {gmacs:.3f} GMACs")
    if name in REFERENCE_GMACS:
        assert gmacs == pytest.approx(REFERENCE_GMACS[name], rel=0.05)
