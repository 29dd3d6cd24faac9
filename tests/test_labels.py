"""Layers named after the model's ONNX nodes (``harness.labels``), and the commands that show them.

The model is built here with named nodes (and some unnamed, labelled by their op type), so every
expected label comes from this file's graph: its node names and the shapes ONNX infers."""

import json
import xml.etree.ElementTree as ET

import matplotlib
import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from tvm_dsa.cli import main
from tvm_dsa.harness import Compiled, import_onnx, label_trace, timing_run
from tvm_dsa.harness.labels import Label, kernel_label, layer_labels
from tvm_dsa.relax_passes.fusion import fuse
from tvm_dsa.schedule.graph import OpGraph

pytestmark = pytest.mark.xdist_group("labels")


def _weights(rng, *shape):
    return (rng.standard_normal(shape) * 0.3).astype("float32")


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    """A stem (conv, batch norm, ReLU) pooled to 1 x 1, two convolutions of it added, an unnamed
    ReLU and a global average pooling of the same 1 x 1 shape, an unnamed Flatten, and two
    MatMuls of one input with weights of one shape (only their values tell them apart)."""
    rng = np.random.default_rng(0)
    inits = {"w0": _weights(rng, 8, 3, 3, 3), "w1": _weights(rng, 8, 8, 3, 3), "w2": _weights(rng, 8, 8, 1, 1),
             "wq": _weights(rng, 8, 8), "wk": _weights(rng, 8, 8), "scale": 1 + _weights(rng, 8),
             "bias": _weights(rng, 8), "mean": _weights(rng, 8), "var": 1 + np.abs(_weights(rng, 8))}
    nodes = [
        h.make_node("Conv", ["x", "w0"], ["c0"], name="stem/conv", pads=[1, 1, 1, 1], strides=[2, 2]),
        h.make_node("BatchNormalization", ["c0", "scale", "bias", "mean", "var"], ["b0"], name="stem/bn"),
        h.make_node("Relu", ["b0"], ["r0"], name="stem/relu"),
        h.make_node("MaxPool", ["r0"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        h.make_node("Conv", ["p", "w1"], ["left"], name="left/conv", pads=[1, 1, 1, 1]),
        h.make_node("Conv", ["p", "w2"], ["right"], name="right/conv"),
        h.make_node("Add", ["left", "right"], ["a"], name="merge/add"),
        h.make_node("Relu", ["a"], ["ar"]),
        h.make_node("GlobalAveragePool", ["ar"], ["g"]),
        h.make_node("Flatten", ["g"], ["f"]),
        h.make_node("MatMul", ["f", "wq"], ["q"], name="head/q"),
        h.make_node("MatMul", ["f", "wk"], ["k"], name="head/k"),
        h.make_node("Mul", ["q", "k"], ["y"], name="head/mul"),
    ]
    graph = h.make_graph(nodes, "named", [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, 4, 4])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [1, 8])],
                         [nh.from_array(v, k) for k, v in inits.items()])
    m = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 10
    onnx.checker.check_model(m)
    return m


@pytest.fixture(scope="module")
def fused(model):
    with tvm.target.Target("llvm"):
        return fuse(import_onnx(model))


@pytest.fixture(scope="module")
def labels(model, fused) -> dict[str, Label]:
    return layer_labels(model, fused)


@pytest.fixture(scope="module")
def onnx_file(model, tmp_path_factory):
    path = tmp_path_factory.mktemp("labels") / "named.onnx"
    onnx.save(model, str(path))
    return str(path)


def _inferred(model) -> dict[str, tuple]:
    """Each tensor's shape as ONNX infers it."""
    g = onnx.shape_inference.infer_shapes(model).graph
    return {vi.name: tuple(d.dim_value for d in vi.type.tensor_type.shape.dim) for vi in [*g.value_info, *g.output]}


def test_every_node_is_in_one_layer_named_by_its_contraction(model, fused, labels):
    """The layers partition the ONNX nodes; a layer is named by its contraction's node, else by
    its last node that computes (an unnamed one by its op type), with its output's shape."""
    graph = OpGraph.from_relax(fused)
    assert list(labels) == [n.name for n in graph.nodes]
    named = [label.nodes for label in labels.values()]
    every = [n.name or n.op_type for n in model.graph.node]
    assert sorted(n for nodes in named for n in nodes) == sorted(every)
    shapes, producer = _inferred(model), {n.name or n.op_type: n.output[0] for n in model.graph.node}
    for node in graph.nodes:
        label = labels[node.name]
        assert label.shape == graph.tensors[node.output].shape == shapes[producer[label.nodes[-1]]]
    by_anchor = {label.anchor: label for label in labels.values()}
    assert by_anchor["stem/conv"].nodes == ("stem/conv", "stem/bn", "stem/relu")
    assert str(by_anchor["stem/conv"]) == "stem/conv +2 1x8x2x2"
    assert str(by_anchor["pool"]) == "pool 1x8x1x1"
    # the pooling of a 1 x 1 map has the shape of the layer before it, and is a layer of its own
    assert str(by_anchor["GlobalAveragePool"]) == "GlobalAveragePool 1x8x1x1"
    assert str(by_anchor["Flatten"]) == "Flatten 1x8"
    assert {"left/conv", "right/conv", "head/q", "head/k"} <= set(by_anchor)


def test_parallel_layers_of_one_weight_shape_get_their_own_nodes(model, fused, labels):
    """``head/q`` and ``head/k`` read one input with weights of one shape: each layer's label is
    the node whose weights it holds (compared by value)."""
    graph = OpGraph.from_relax(fused)
    inits = {t.name: nh.to_array(t) for t in model.graph.initializer}
    weight = {"head/q": inits["wq"], "head/k": inits["wk"]}
    checked = 0
    for node in graph.nodes:
        label = labels[node.name]
        if label.anchor in weight:
            consts = [graph.tensors[t].expr.value.numpy() for t in node.inputs if graph.tensors[t].constant]
            assert any(c.shape == (8, 8) and np.array_equal(c, weight[label.anchor]) for c in consts)
            checked += 1
    assert checked == 2


def test_a_kernel_is_named_by_its_first_contraction():
    conv = Label("lv", "stem/conv", "Conv", ("stem/conv", "stem/relu"), (1, 8, 2, 2))
    pool = Label("lv1", "pool", "MaxPool", ("pool",), (1, 8, 1, 1))
    assert kernel_label([pool, conv]) == "stem/conv +1 1x8x2x2 and 1 more layer"
    assert kernel_label([pool]) == "pool 1x8x1x1" and kernel_label([]) == ""
    assert conv.to_dict() == {"relax": "lv", "label": "stem/conv +1 1x8x2x2", "anchor": "stem/conv", "op": "Conv",
                              "onnx_nodes": ["stem/conv", "stem/relu"], "shape": [1, 8, 2, 2], "weights": {}}


def test_a_compiled_models_trace_names_each_instruction_by_the_model(model, labels):
    """``Compiled.names``: every layer and kernel of a graphturbo build, so every instruction of
    its trace gets the model's name; the Relax names stay in ``layer`` and ``kernel``."""
    compiled = Compiled.build(import_onnx(model), "dsa/stcp920", "graphturbo")
    names = compiled.names(compiled.labels(model))
    assert {k: names[k] for k in labels} == {k: str(v) for k, v in labels.items()}
    for kernel, layers in compiled.offload.layers.items():
        assert names[kernel] == kernel_label([labels[n] for n in layers])
    events = label_trace(timing_run(compiled, model, trace=True).trace, names)
    ran = [e for e in events if e.get("ph") == "X"]
    assert ran and all(e["args"]["node"] == names.get(e["args"]["layer"], names[e["args"]["kernel"]]) for e in ran)
    assert {e["args"]["layer"] for e in ran} & set(labels)


def _svg_texts(path) -> list[str]:
    """The text of an SVG written with ``svg.fonttype: none`` (text as text, not paths)."""
    return [t.text for t in ET.parse(path).getroot().iter() if t.tag.endswith("text") and t.text]


def test_run_prints_and_returns_the_models_names(onnx_file, labels, capsys):
    assert main(["run", onnx_file, "--timing-only", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["layers"] == [label.to_dict() for label in labels.values()]
    by_anchor = {label.anchor: str(label) for label in labels.values()}
    assert data["offload"]["kernel_labels"]["reshape"] == by_anchor["Flatten"]
    assert main(["run", onnx_file, "--timing-only"]) == 0
    assert f"  host {by_anchor['Flatten']}: a pure reshape" in capsys.readouterr().out


def test_trace_plots_carry_the_model_batch_and_chip_and_a_legend(onnx_file, labels, tmp_path, capsys):
    trace, gantt = tmp_path / "t.json", tmp_path / "gantt.svg"
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        assert main(["trace", onnx_file, "-o", str(trace), "--gantt", str(gantt), "--lifetimes",
                     str(tmp_path / "life.svg"), "--schedule", "graphturbo"]) == 0
    out = capsys.readouterr().out
    events = json.loads(trace.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    shown = {str(label) for label in labels.values()}
    nodes = {e["args"]["node"] for e in events if e.get("ph") == "X"}
    assert nodes & shown and all(n in shown or " more layer" in n for n in nodes)
    texts = _svg_texts(gantt)
    assert f"{onnx_file}, batch 1 on dsa/stcp920 (graphturbo)" in texts and "mme" in texts  # title, legend
    lifetimes = sorted(tmp_path.glob("life*.svg"))
    assert lifetimes and "tensor lifetimes of " in out
    for path in lifetimes:
        texts = _svg_texts(path)
        assert any(t.startswith(f"{onnx_file}, batch 1 on dsa/stcp920") for t in texts)
        assert "intermediate" in texts and "promoted weight" in texts


def test_explore_lists_and_plots_the_tree_by_the_models_names(onnx_file, labels, tmp_path, capsys):
    plot = tmp_path / "st.svg"
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        assert main(["explore", onnx_file, "--beta", "2", "--batch", "2", "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    listing = out.split("best tree", 1)[1]
    for label in labels.values():
        if label.op not in ("Flatten",):  # a view: not a layer of SET's graph
            assert f"  {label}\n" in listing
    assert "lv" not in listing
    texts = _svg_texts(plot)
    assert f"{onnx_file} on dsa/set-edge16, batch 2: SET's best tree" in texts and "layers" in texts
    assert {t.split("  ", 1)[1] for t in texts if t.startswith("l") and "  " in t} <= {str(v) for v in labels.values()}
    assert main(["explore", onnx_file, "--beta", "2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {d["relax"]: d["label"] for d in data["layer_labels"]}.items() <= {k: str(v) for k, v in labels.items()}.items()


def test_a_layer_the_graph_does_not_explain_is_named_for_its_reader():
    """TVM's Gather wraps negative indices in a kernel of its own (``less``, ``add``, ``where``),
    no ONNX node's: it keeps its PrimFunc's name, for the Gather reading it; the layers after
    it still find their nodes."""
    rng = np.random.default_rng(1)
    nodes = [h.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
             h.make_node("MatMul", ["e", "w"], ["y"], name="proj")]
    graph = h.make_graph(nodes, "gather", [h.make_tensor_value_info("ids", TP.INT64, [1, 4])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [1, 4, 8])],
                         [nh.from_array(_weights(rng, 10, 8), "table"), nh.from_array(_weights(rng, 8, 8), "w")])
    m = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 10
    with tvm.target.Target("llvm"):
        labels = list(layer_labels(m, fuse(import_onnx(m))).values())
    assert [str(label) for label in labels[1:]] == ["embed 1x4x8", "proj 1x4x8"]
    assert not labels[0].nodes and labels[0].anchor.endswith(" for embed") and labels[0].shape == (1, 4)


def test_weights_are_named_by_the_models_initializers(model, fused, labels):
    """A Relax constant holding an initializer's values is named by it (the convolutions without a
    batch norm, the MatMuls); the stem's weights, scaled by batch-norm folding, hold no
    initializer's values: the one of their size its nodes read, ``(folded)``, and its bias the
    norm's."""
    graph = OpGraph.from_relax(fused)
    inits = {t.name: nh.to_array(t) for t in model.graph.initializer}
    stem = next(label for label in labels.values() if label.anchor == "stem/conv")
    checked = 0
    for node in graph.nodes:
        for const, name in labels[node.name].weights:
            value = graph.tensors[const].expr.value.numpy().reshape(-1)
            held = [k for k, v in inits.items() if v.size == value.size and np.array_equal(v.reshape(-1), value)]
            if held:
                assert name in held
                checked += 1
    assert checked >= 4 and {"w1", "w2", "wq", "wk"} <= {n for label in labels.values() for _, n in label.weights}
    (stem_weight,) = [n for c, n in stem.weights if graph.tensors[c].shape == inits["w0"].shape]
    assert stem_weight == "w0 (folded)"
    # the folded bias (the convolution has none): of the norm's four inputs of its size, its bias
    norm = next(n for n in model.graph.node if n.op_type == "BatchNormalization")
    (stem_bias,) = [n for c, n in stem.weights if graph.tensors[c].shape != inits["w0"].shape]
    assert stem_bias == f"{norm.input[2]} (folded)"


def _separable() -> onnx.ModelProto:
    """A depthwise convolution, a ReLU and a pointwise convolution (MobileNet's block) at batch 8,
    where the pair is faster fused (``kernelgen.blocks``)."""
    rng = np.random.default_rng(2)
    nodes = [h.make_node("Conv", ["x", "wd"], ["d"], name="block/dw", group=16, pads=[1, 1, 1, 1]),
             h.make_node("Relu", ["d"], ["dr"], name="block/dw_relu"),
             h.make_node("Conv", ["dr", "wp"], ["y"], name="block/pw")]
    graph = h.make_graph(nodes, "separable", [h.make_tensor_value_info("x", TP.FLOAT, [8, 16, 16, 16])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [8, 24, 16, 16])],
                         [nh.from_array(_weights(rng, 16, 1, 3, 3), "wd"), nh.from_array(_weights(rng, 24, 16, 1, 1), "wp")])
    m = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 10
    return m


@pytest.mark.parametrize("schedule", ["layerwise", "graphturbo"])
def test_a_fused_depthwise_pointwise_pair_is_named_by_both_nodes(schedule, tmp_path):
    """The pair's kernel, its trace's instructions and (graphturbo) its stitched kernel's weights
    in the lifetimes plot carry both nodes' names and the model's weight names, not the
    pointwise layer's alone nor ``constN``."""
    from tvm_dsa.show.lifetimes import capture_allocations, lifetime_bars

    m = _separable()
    with capture_allocations() as stitched:
        compiled = Compiled.build(import_onnx(m), "dsa/stcp920", schedule)
    assert any(b.fused_cycles < b.parts_cycles for b in compiled.offload.blocks)  # the pair was fused
    (kernel,) = compiled.offload.layers
    shape = "x".join(map(str, _inferred(m)["y"]))
    nodes = [n.name for n in m.graph.node]
    expected = f"block/dw + block/pw +{len(nodes) - 2} {shape}"
    names = compiled.names(compiled.labels(m))
    assert names[kernel] == expected
    events = label_trace(timing_run(compiled, m, trace=True).trace, names)
    assert {e["args"]["node"] for e in events if e.get("ph") == "X"} == {expected}
    if schedule == "graphturbo":
        (buffers,) = stitched.values()
        weights = {b.label for b in lifetime_bars(buffers, 0, names) if b.kind == "w"}
        assert weights == {f"w: {t.name}" for t in m.graph.initializer}


def _walk(graph):
    for node in graph.node:
        yield node
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _walk(a.g)


def test_a_dynamic_models_layers_are_labelled_in_its_if_branches_too():
    """SkipNet (symbolic batch, height, width; two If gates): every node that computes, those of
    the If branches too, is in one layer, a symbolic dim shown by its name; every kernel, on the
    DSA or the host, is named by the model."""
    from tvm_dsa.models.dynamic import DYNAMIC

    m = DYNAMIC["skipnet"]()
    compiled = Compiled.build(import_onnx(m), "dsa/stcp920")
    labels = compiled.labels(m)
    computing = {n.name for n in _walk(m.graph) if n.op_type not in ("If", "Identity")}
    named = [n for label in labels.values() for n in label.nodes]
    assert sorted(named) == sorted(set(named)) and set(named) >= computing
    branch = {n.name for n in _walk(m.graph)} - {n.name for n in m.graph.node}
    assert branch & computing <= set(named) and any(n.op_type == "If" for n in m.graph.node)
    batch = m.graph.input[0].type.tensor_type.shape.dim[0].dim_param
    assert all(label.shape[0] == batch for label in labels.values() if label.shape and label.shape != ())
    stem = next(label for label in labels.values() if label.anchor == m.graph.node[0].name)
    dims = [d.dim_param or d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    assert str(stem).endswith(f"{dims[0]} x 8 x {dims[2]} x {dims[3]}")
    names = compiled.names(labels)
    for kernel in [*compiled.offload.dsa, *compiled.offload.host]:
        assert names.get(kernel) and names[kernel] != kernel


def test_a_dynamic_transformers_embeddings_are_labelled():
    """BERT with symbolic batch and sequence: the position and token-type tables are indexed by
    layers that ONNX computes from constants (Range, ConstantOfShape) and Relax in kernels; each
    Gather is a layer of its own, by its node, and every MatMul is a layer's anchor."""
    from tvm_dsa.models.dynamic import DYNAMIC

    m = DYNAMIC["bert"]()
    with tvm.target.Target("llvm"):
        labels = layer_labels(m, fuse(import_onnx(m)))
    anchors = [label.anchor for label in labels.values()]
    gathers = [n.name for n in m.graph.node if n.op_type == "Gather" and n.input[0].endswith("embeddings")]
    assert len(gathers) == 3 and set(gathers) <= set(anchors)
    matmuls = [n.name for n in m.graph.node if n.op_type == "MatMul"]
    assert set(matmuls) <= {n for label in labels.values() for n in label.nodes}
    weighted = {n.name for n in m.graph.node if n.op_type == "MatMul" and n.input[1] in
                {t.name for t in m.graph.initializer}}
    assert weighted <= set(anchors)
    for label in labels.values():
        if label.anchor in gathers:
            table = next(n.input[0] for n in m.graph.node if n.name == label.anchor)
            assert [name for _, name in label.weights] == [table]
