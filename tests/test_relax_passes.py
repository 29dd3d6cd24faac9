"""Relax passes of the pipeline, each against what TVM's own passes make of the same module."""

import numpy as np
import onnx
import onnx.numpy_helper
import pytest
import tvm
import tvm_ffi
from helpers import relax_graph
from tvm import relax

import tvm_dsa
from tvm_dsa.harness import import_onnx, load_model
from tvm_dsa.isa import Vector
from tvm_dsa.relax_passes.fold import EVALUATORS, FoldConstantsLeft, FoldWeights, _left_to_fold
from tvm_dsa.relax_passes.simplify import ClampAsClip, SimplifyInference

PREPARE = tvm.transform.Sequential([relax.transform.FoldBatchnormToConv2D(),
                                    relax.transform.DecomposeOpsForInference(),
                                    relax.transform.CanonicalizeBindings()])


def constant_calls(mod) -> list[str]:
    """Ops of ``main`` still called on nothing but constants."""
    left = []

    def visit(call):
        if isinstance(call.op, tvm.ir.Op) and call.args and all(
                isinstance(a, (tvm.ir.expr.Constant, relax.ShapeExpr)) for a in call.args):
            left.append(call.op.name)

    tvm_ffi.structural_walk(mod["main"].body, [(relax.Call, visit)])
    return left


@pytest.mark.parametrize("model", ["resnet50", "mobilenet_v2", "bert_base", "dlrm"])
def test_fold_weights_equals_tvm_fold_constant(model):
    mod = PREPARE(import_onnx(load_model(model, tiny=True, batch=1)))
    with tvm.target.Target("llvm"):
        ours = FoldWeights(mod)
        left = constant_calls(relax.transform.DeadCodeElimination()(ours))
        assert not set(left) & set(EVALUATORS), left
        assert tvm_ffi.structural_equal(relax.transform.FoldConstant()(ours),
                                        relax.transform.FoldConstant()(mod))


def test_fold_weights_leaves_other_ops_and_variables_alone():
    rng = np.random.default_rng(0)
    w = relax.const(rng.standard_normal((4, 6)).astype("float32"))
    op = relax.op
    mod = relax_graph([(2, 4)], lambda x: op.matmul(x, op.add(op.permute_dims(op.nn.softmax(w), [0, 1]),
                                                             op.reshape(op.multiply(w, w), (4, 6)))))
    folded = FoldWeights(mod)
    # softmax is left to FoldConstant; the squared and reshaped weight becomes one constant
    assert constant_calls(folded) == ["relax.nn.softmax"]
    consts = []
    tvm_ffi.structural_walk(folded["main"].body, [(tvm.ir.expr.Constant, consts.append)])
    squared = [c.value.numpy() for c in consts if isinstance(c.value, tvm.runtime.Tensor)][-1]
    np.testing.assert_array_equal(squared, w.value.numpy() ** 2)


def test_fold_constants_left_folds_what_fold_weights_leaves():
    """A softmax of a weight (no numpy evaluator) is still folded, by TVM's FoldConstant, through
    a variable bound to the weight; a model with nothing left (ViT-B/16, BERT) skips it, and the
    result is the same as FoldConstant's."""
    w = relax.const(np.random.default_rng(1).standard_normal((4, 6)).astype("float32"))
    op = relax.op
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            bound = bb.emit(w)
            out = bb.emit_output(op.matmul(x, bb.emit(op.nn.softmax(bound))))
        bb.emit_func_output(out)
    mod = bb.get()
    assert _left_to_fold(mod["main"])
    with tvm.target.Target("llvm"):
        folded = relax.transform.DeadCodeElimination()(FoldConstantsLeft(mod))
        assert constant_calls(folded) == [] and tvm_ffi.structural_equal(folded, relax.transform.DeadCodeElimination()(
            relax.transform.FoldConstant()(mod)))
    for model in ("vit_b16", "bert_base"):
        prepared = FoldWeights(PREPARE(import_onnx(load_model(model, tiny=True, batch=1))))
        assert not _left_to_fold(prepared["main"]), model
        with tvm.target.Target("llvm"):
            assert FoldConstantsLeft(prepared).same_as(prepared)
            dce = relax.transform.DeadCodeElimination()  # FoldConstant drops unused constant bindings
            assert tvm_ffi.structural_equal(dce(relax.transform.FoldConstant()(prepared)), dce(prepared))


def test_fold_weights_keeps_int64():
    """relax.const of an int64 array is int32 unless told otherwise (TVM 0.27): a folded int64
    constant must stay int64, or the add that uses it no longer type-checks."""
    ids = relax.const(np.arange(8, dtype=np.int64).reshape(1, 8), "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8), "int64"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(relax.op.add(ids, ids), x))
        bb.emit_func_output(out)
    folded = relax.transform.DeadCodeElimination()(FoldWeights(bb.get()))
    consts = []
    tvm_ffi.structural_walk(folded["main"].body, [(tvm.ir.expr.Constant, lambda c: consts.append(c)
                                                    if isinstance(c.value, tvm.runtime.Tensor) else None)])
    assert [str(c.ty.dtype) for c in consts] == ["int64"]
    np.testing.assert_array_equal(consts[0].value.numpy(), 2 * np.arange(8).reshape(1, 8))


def op_names(mod) -> list[str]:
    names = []
    tvm_ffi.structural_walk(mod["main"].body, [(relax.Call, lambda c: names.append(c.op.name))])
    return names


@pytest.mark.parametrize("perm,axis,inverse,cancels", [
    ([0, 2, 1, 3], -1, [0, 2, 1, 3], True),   # shape_chain's head split and merge: the axis stays
    ([0, 2, 1, 3], 1, [0, 2, 1, 3], True),    # the softmax along the moved axis: x's axis 2
    ([1, 2, 3, 0], 0, [3, 0, 1, 2], True),    # a rotation and its inverse
    ([0, 2, 1, 3], -1, [0, 1, 3, 2], False),  # not the inverse: the transposes stay
])
@pytest.mark.parametrize("softmax", [relax.op.nn.softmax, relax.op.nn.log_softmax])
def test_a_softmax_between_inverse_transposes_loses_them(rng, perm, axis, inverse, cancels, softmax):
    from tvm_dsa.relax_passes.transpose import CancelTransposePairs

    op = relax.op
    mod = relax_graph([(2, 3, 4, 5)], lambda x: op.permute_dims(softmax(op.permute_dims(x, perm), axis=axis), inverse))
    out = CancelTransposePairs(mod)
    assert op_names(out).count("relax.permute_dims") == (0 if cancels else 2)
    x = rng.standard_normal((2, 3, 4, 5)).astype("float32")
    run = lambda m: relax.VirtualMachine(tvm.compile(m, target="llvm"), tvm.cpu())["main"](  # noqa: E731
        tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(run(out), run(mod), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("start,step,sliced", [
    (0, 1, True),    # shape_chain's positions: table[arange(seq)]
    (3, 2, True),    # rows 3, 5, 7, ...
    (-1, 1, False),  # the first index is -1: ONNX's fix reads the last row, not a slice
])
def test_a_gather_at_a_range_becomes_a_slice(start, step, sliced):
    """take(table, where(i < 0, i + 64, i)) with i = arange(start, ...) * 1 + 0, as TVM imports
    ONNX's Gather of a Range: a strided slice where the indices are an arithmetic progression that
    is never negative."""
    from tvm_dsa.relax_passes.gather import GatherOfRangeAsSlice

    op = relax.op
    table = np.random.default_rng(0).standard_normal((64, 8)).astype("float32")
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((n, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            i = bb.emit(op.arange(start, start + step * n, step, "int64"))
            i = bb.emit(op.add(op.multiply(op.astype(i, "int64"), relax.const(1, "int64")), relax.const(0, "int64")))
            i = bb.emit(op.where(op.less(i, relax.const(0, "int64")), op.add(i, relax.const(64, "int64")), i))
            out = bb.emit_output(op.add(x, op.take(relax.const(table), i, axis=0)))
        bb.emit_func_output(out)
    mod = bb.get()
    out = GatherOfRangeAsSlice(mod)
    assert ("relax.strided_slice" in op_names(out), "relax.take" in op_names(out)) == (sliced, not sliced)
    xs = np.random.default_rng(1).standard_normal((5, 8)).astype("float32")
    run = lambda m: relax.VirtualMachine(tvm.compile(m, target="llvm"), tvm.cpu())["main"](  # noqa: E731
        tvm.runtime.tensor(xs)).numpy()
    rows = (start + step * np.arange(5)) % 64
    np.testing.assert_allclose(run(out), xs + table[rows], rtol=1e-6)
    np.testing.assert_allclose(run(mod), xs + table[rows], rtol=1e-6)


def _calls(mod) -> list[str]:
    names = []
    tvm_ffi.structural_walk(mod["main"].body, [(relax.Call, lambda c: names.append(c.op.name)
                                                if isinstance(c.op, tvm.ir.Op) else None)])
    return names


def _llvm(mod, *arrays):
    ex = tvm.compile(mod, target="llvm")
    return relax.VirtualMachine(ex, tvm.cpu())["main"](*(tvm.runtime.tensor(a) for a in arrays)).numpy()



def _clamped(form: str, low: float, high: float):
    """``x + y`` clamped to [low, high], as TVM's ``clip`` or as ONNX's Clip with its bounds as
    inputs (ReLU6 as PyTorch exports it), which imports as ``minimum(maximum(., low), high)``."""
    shape = (1, 4, 6, 6)
    if form == "clip":
        return relax_graph([shape, shape], lambda x, y: relax.op.clip(relax.op.add(x, y), low, high))
    io = [onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, shape) for n in "xyz"]
    bounds = [onnx.numpy_helper.from_array(np.float32(v), n) for v, n in ((low, "low"), (high, "high"))]
    nodes = [onnx.helper.make_node("Add", ["x", "y"], ["s"]),
             onnx.helper.make_node("Clip", ["s", "low", "high"], ["z"])]
    model = onnx.helper.make_model(onnx.helper.make_graph(nodes, "clamp", io[:2], io[2:], bounds),
                                   opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=10)
    return import_onnx(model)


@pytest.mark.parametrize("form", ["clip", "onnx"])
@pytest.mark.parametrize("low, high, ops", [(0.0, 6.0, {"add", "clip"}), (1.0, -1.0, {"add", "max", "min"})])
def test_a_clamp_runs_as_one_clip_pass(form, low, high, ops):
    """A ReLU6 runs on the DSA as one ``clip`` pass over the elements, not a ``min`` and a ``max``:
    as TVM's ``clip`` (``max(min(x, 6), 0)`` in one stage) and as ONNX's Clip with its bounds as
    inputs, whose ``minimum(maximum(x, 0), 6)`` of constant tensors ``ClampAsClip`` makes a clip
    (before it, the kernel read the bounds as buffers and took two passes). Bounds crossed,
    ``max(min(x, -1), 1)`` is 1 everywhere and ``min(max(x, 1), -1)`` -1, where ``clip(x, 1, -1)``
    would give -1 and 1: they stay two passes."""
    rng = np.random.default_rng(1)
    mod = _clamped(form, low, high)
    x, y = (rng.standard_normal((1, 4, 6, 6)).astype("float32") * 5 for _ in range(2))
    ref = _llvm(mod, x, y)
    assert np.all(ref == (high if form == "onnx" else low)) if low > high else np.all((ref >= low) & (ref <= high))
    ex = tvm.compile(mod, target="dsa/stcp920", relax_pipeline=tvm_dsa.pipeline(schedule="graphturbo"))
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(y)).numpy()
    np.testing.assert_allclose(out, ref, rtol=2e-3, atol=2e-3 * np.abs(ref).max())
    vector = [i for r in tvm_dsa.last_kernel_runs() for k in r.program.expanded().kernels
              for i in k.instructions if type(i) is Vector]
    assert {i.op for i in vector} == ops
    if "clip" in ops:
        assert sum(np.prod(i.shape) for i in vector if i.op == "clip") == ref.size  # each element once


def test_a_clamps_inner_half_read_elsewhere_is_kept():
    """``minimum(maximum(x, 0), 6)`` where the maximum is also an output: the clip would compute the
    maximum a second time, so ``ClampAsClip`` leaves the pair (and a lone maximum) as they are."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            low = bb.emit(relax.op.maximum(x, relax.const(0.0, "float32")))
            both = bb.emit(relax.op.minimum(low, relax.const(6.0, "float32")))
            out = bb.emit_output(relax.Tuple([low, both]))
        bb.emit_func_output(out)
    mod = bb.get()
    kept = ClampAsClip(mod)
    assert sorted(_calls(kept)) == ["relax.maximum", "relax.minimum"]
    tvm.ir.assert_structural_equal(kept, mod)


def test_a_batch_norm_no_convolution_takes_becomes_one_multiply_and_one_add():
    """A batch norm after a concatenation (DenseNet's pre-activation) cannot fold into a
    convolution; decomposed, it is (x - mean) / std * gamma + beta: four passes over x and four
    parameter vectors. ``SimplifyInference`` leaves x * scale + shift (llvm's values to rounding);
    where a step of the chain is read elsewhere too, the chain is folded only from there on. On the
    DSA the product is then inlined into the sum: one multiply-accumulate pass (``mac``)."""
    rng = np.random.default_rng(0)
    values = [v.astype("float32") for v in (rng.standard_normal(6), rng.standard_normal(6), rng.standard_normal(6),
                                            rng.uniform(0.5, 2, 6))]  # gamma, beta, mean, variance
    params = [relax.const(v) for v in values]
    op = relax.op
    mod = relax_graph([(1, 2, 5, 5), (1, 4, 5, 5)], lambda x, y: op.nn.relu(
        op.nn.batch_norm(op.concat([x, y], axis=1), *params, axis=1, training=False)[0]))
    simple = SimplifyInference()(mod)
    assert sorted(_calls(simple)) == ["relax.add", "relax.concat", "relax.multiply", "relax.nn.relu"]
    x, y = rng.standard_normal((1, 2, 5, 5)).astype("float32"), rng.standard_normal((1, 4, 5, 5)).astype("float32")
    ref = _llvm(mod, x, y)
    np.testing.assert_allclose(_llvm(simple, x, y), ref, rtol=1e-5, atol=1e-5)
    # on the DSA the product is inlined into the sum (``tir_passes.inline``): one mac pass, then relu
    ex = tvm.compile(mod, target="dsa/stcp920", relax_pipeline=tvm_dsa.pipeline(schedule="graphturbo"))
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(y)).numpy()
    np.testing.assert_allclose(out, ref, rtol=2e-3, atol=2e-3 * np.abs(ref).max())
    ops = [(i.op, i.shape) for r in tvm_dsa.last_kernel_runs() for k in r.program.expanded().kernels
           for i in k.instructions if type(i) is Vector]
    assert {op for op, _ in ops} == {"mac", "relu"}
    assert sum(np.prod(shape) for op, shape in ops if op == "mac") == ref.size  # each element once

    m, s, g = (relax.const(values[n].reshape(1, 6, 1, 1)) for n in (2, 3, 0))
    shared = relax_graph([(1, 6, 5, 5)], lambda x: op.add(op.divide(op.subtract(x, m), s),
                                                          op.multiply(op.subtract(x, m), g)))
    assert sorted(_calls(SimplifyInference()(shared))) == sorted(_calls(shared))  # chains of two: left as they are
