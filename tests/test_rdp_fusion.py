"""RDP-aware fusion (seed 001 §4.2): layers and intermediate bytes with TVM's fusion as imported
and with RDP's shapes, counted on the fused modules."""

import math
import warnings
from types import SimpleNamespace

import pytest
import tvm
from tvm import relax, tirx
from tvm.relax.frontend.onnx import from_onnx

from tvm_dsa.models.dynamic import DYNAMIC
from tvm_dsa.relax_passes.fusion import fuse
from tvm_dsa.relax_passes.rdp_fusion import (INJECTIVE, OPAQUE, AnnotateSymbolicReshapes, FusionCount, count_kernels,
                                             symbolic_reshapes)

warnings.filterwarnings("ignore", module="tvm.relax.frontend.onnx")


def _fused(name, rdp_fusion):
    with tvm.target.Target("dsa/stcp920"):
        return fuse(from_onnx(DYNAMIC[name](), keep_params_in_input=False), rdp_fusion)


def _legalized(build):
    bb = relax.BlockBuilder()
    build(bb)
    with tvm.target.Target("llvm"):
        return tvm.transform.Sequential([relax.transform.LegalizeOps(),
                                         relax.transform.AnnotateTIROpPattern()])(bb.get())


def test_bert_head_split_and_merge_fuse_into_their_transposes():
    """bert (2 layers): q, k, v head splits and the merge are reshapes next to transposes; with
    symbolic dims TVM marks them opaque and keeps them apart (views of their inputs, so neither
    kernels nor bytes). RDP-aware fusion folds each into its transpose, as TVM does when the
    shapes are static: the same kernels and bytes, and no reshape left."""
    sizes = {"batch": 2, "seq": 16}
    tvm_mod, rdp_mod = _fused("bert", False), _fused("bert", True)
    assert count_kernels(tvm_mod, sizes) == count_kernels(rdp_mod, sizes)
    names = lambda m: {gv.name_hint for gv, f in m.functions.items() if isinstance(f, tirx.PrimFunc)}  # noqa: E731
    assert {"reshape", "reshape1"} <= names(tvm_mod)
    assert {"fused_reshape_transpose", "fused_transpose2_reshape1"} <= names(rdp_mod)
    assert not any(n.startswith("reshape") for n in names(rdp_mod))


def test_gated_blocks_fuse_inside_if_branches():
    """skipnet as imported has no dataflow blocks (it has Ifs), so TVM fuses nothing: every conv,
    bias add and ReLU is a kernel. With dataflow blocks restored and RDP's shapes, each
    conv + add (+ ReLU) is one kernel, in the branches too."""
    sizes = {"batch": 2, "height": 15, "width": 11}
    tvm_mod, rdp_mod = _fused("skipnet", False), _fused("skipnet", True)
    tvm_count, rdp_count = count_kernels(tvm_mod, sizes), count_kernels(rdp_mod, sizes)
    convs = lambda m: [gv.name_hint for gv in m.functions if "conv2d" in gv.name_hint]  # noqa: E731
    assert all(not n.startswith("fused_") for n in convs(tvm_mod))
    assert all(n.startswith("fused_conv2d") for n in convs(rdp_mod))
    assert rdp_count.layers < tvm_count.layers and rdp_count.intermediate_bytes < tvm_count.intermediate_bytes


def test_reshape_annotated_only_where_element_counts_are_proven_equal():
    n, m = tirx.Var("n", "int64"), tirx.Var("m", "int64")

    def graph(target):
        def build(bb):
            x = relax.Var("x", relax.TensorType((n, 64), "float32"))
            y = relax.Var("y", relax.TensorType((m,), "float32"))
            with bb.function("main", [x, y]):
                with bb.dataflow():
                    r = bb.emit(relax.op.reshape(x, target))
                    out = bb.emit_output(relax.op.permute_dims(r, [1, 0, 2]))
                bb.emit_func_output(out)
        return _legalized(build)

    same = graph(relax.ShapeExpr([n, 4, 16]))  # n*64 == n*4*16
    assert [int(same[gv].attrs["op_pattern"]) for gv in same.functions if gv.name_hint == "reshape"] == [OPAQUE]
    (gv,) = symbolic_reshapes(same)
    assert int(AnnotateSymbolicReshapes(same)[gv].attrs["op_pattern"]) == INJECTIVE
    assert symbolic_reshapes(graph(relax.ShapeExpr([m, 4, 16]))) == []  # n*64 vs m*64: not proven


@pytest.mark.parametrize("name", ["cnn", "shape_chain"])
def test_counts_are_the_kernels_output_bytes(name):
    """count_kernels against a direct sum over the fused module's call_tir bindings, each dim
    evaluated as the Python expression it prints as (``T.int64(1)`` for constants)."""
    sizes = {"cnn": {"batch": 2, "height": 24, "width": 20}, "shape_chain": {"batch": 2, "seq": 16}}[name]
    mod = _fused(name, True)
    layers, total = 0, 0
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            if (isinstance(b.value, relax.Call) and b.value.op.same_as(tvm.ir.Op.get("relax.call_tir"))
                    and not relax.analysis.has_reshape_pattern(mod[b.value.args[0]])):  # views
                layers += 1
                dims = [eval(str(d), {"T": SimpleNamespace(int64=int)}, dict(sizes)) for d in b.var.ty.shape.values]
                total += math.prod(dims) * tvm.runtime.DataType(str(b.var.ty.dtype)).bits // 8
    assert count_kernels(mod, sizes) == FusionCount(layers, total)
