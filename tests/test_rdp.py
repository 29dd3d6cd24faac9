"""Rank and Dimension Propagation (seed 001 §4.1): lattice laws, transfer functions of each
dynamism class on hand-built graphs (expected facts derived in the test), Merge at If, and the
fixed point of a graph whose facts circulate through an If."""

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax, tirx
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from tvm_dsa.relax_passes import rdp
from tvm_dsa.relax_passes.dynamism import Dynamism
from tvm_dsa.relax_passes.lattice import DIMS_NAC, DIMS_UNDEF, NAC, UNDEF, Dim, Dims, Fact, Kind

B, S = tirx.Var("B", "int64"), tirx.Var("S", "int64")

# ----------------------------------------------------------------------- lattice laws
# Elements include provably equal expressions written differently (S*B vs B*S, (B+1)*S vs B*S+S)
EXPRS = [lambda: B * S, lambda: S * B, lambda: (B + 1) * S, lambda: B * S + S, lambda: B + 1, lambda: S * 2]
dims = st.one_of(st.just(UNDEF), st.just(NAC), st.integers(0, 3).map(Dim.of),
                 st.sampled_from([B, S]).map(Dim.of), st.sampled_from(EXPRS).map(lambda f: Dim.of(f())))
tuples = st.one_of(st.just(DIMS_UNDEF), st.just(DIMS_NAC), st.lists(dims, max_size=3).map(Dims.of))
facts = st.builds(Fact, tuples, tuples)


@pytest.mark.parametrize("elements", [dims, tuples, facts], ids=["Dim", "Dims", "Fact"])
def test_meet_is_commutative_associative_idempotent(elements):
    @settings(max_examples=150, deadline=None)
    @given(elements, elements, elements)
    def laws(a, b, c):
        assert a.meet(b) == b.meet(a)
        assert a.meet(b).meet(c) == a.meet(b.meet(c))
        assert a.meet(a) == a

    laws()


@settings(max_examples=100, deadline=None)
@given(dims)
def test_undef_is_top_and_nac_is_bottom(d):
    assert d.meet(UNDEF) == d and UNDEF.meet(d) == d
    assert d.meet(NAC) == NAC
    assert Dims((d,)).meet(DIMS_UNDEF) == Dims((d,)) and Dims((d,)).meet(DIMS_NAC) == DIMS_NAC


def test_element_kinds_and_meet_of_equal_expressions():
    assert [Dim.of(x).kind for x in (4, S, B * S)] == [Kind.KNOWN, Kind.SYMBOLIC, Kind.EXPR]
    assert Dim.of(B * S).meet(Dim.of(S * B)) == Dim.of(B * S)       # equal though written apart
    assert Dim.of(B * S).meet(Dim.of(B * S + 1)) == NAC
    assert Dims.of([1, 2]).meet(Dims.of([1, 2, 3])) == DIMS_NAC     # ranks differ


# -------------------------------------------------------------------- graphs and helpers
def fact(result, name: str) -> Fact:
    return result.find(name)


def shape(result, name: str) -> tuple:
    """A variable's shape fact, integers as int, symbols and expressions as text, ⊤/⊥ as such."""
    f = fact(result, name).shape
    if not f.known:
        return "⊤" if f.undef else "⊥"
    return tuple(d.value if d.kind is Kind.KNOWN else str(d) for d in f)


def value(result, name: str) -> tuple:
    v = fact(result, name).value
    return tuple(d.value if d.kind is Kind.KNOWN else str(d) for d in v)


def test_isdo_forward_value_is_the_input_shape():
    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor(("B", "S", 4), "float32")):
            s = R.shape_of(x)
            t = R.shape_to_tensor(s)
            return t

    r = rdp.analyze(Mod)
    assert value(r, "s") == ("B", "S", 4) and value(r, "t") == ("B", "S", 4)
    assert shape(r, "t") == (3,)


def test_isdo_names_what_only_execution_knows():
    """Algorithm 1, lines 16-18: a ⊥ dim read by Shape gets a symbolic constant of its own, and
    what is computed from it is resolved in terms of that symbol."""
    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor(("B", 8), "float32")):
            nz = R.nonzero(x)
            s = R.shape_of(nz)
            z = R.zeros(s, "float32")
            return z

    r = rdp.analyze(Mod)
    assert shape(r, "nz") == ("⊥", "⊥")            # EDO: rank only (Relax's inference knows no more)
    assert value(r, "s") == ("s_0", "s_1")         # named
    assert shape(r, "z") == ("s_0", "s_1")
    assert {"s_0", "s_1"} <= {v.name for v in r.symbols}


def test_isdos_forward_shape_is_the_ops_inference_on_rdp_shapes():
    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor(("N", 3, "H", "W"), "float32"), w: R.Tensor((8, 3, 3, 3), "float32")):
            y = R.nn.conv2d(x, w, strides=[2, 2], padding=[1, 1, 1, 1])
            return y

    r = rdp.analyze(Mod)
    n, _, h, _ = Mod["main"].params[0].ty.shape.values
    got = fact(r, "y").shape
    assert got[0] == Dim.of(n) and got[1] == Dim.of(8)
    assert tvm.sym.Analyzer().can_prove_equal(got[2].expr, tirx.floordiv(h + 2 * 1 - 3, 2) + 1)
    assert fact(r, "y").value == DIMS_NAC   # float data: value not tracked


def test_isdos_forward_value_evaluates_small_integer_tensors():
    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor(("B", "S", 64), "float32")):
            t = R.shape_to_tensor(R.shape_of(x))
            seq = R.take(t, R.const(1, "int64"), axis=0)
            twice = R.multiply(seq, R.const(2, "int64"))
            both = R.concat([R.reshape(twice, [1]), R.const(np.array([32], "int64"), "int64")], axis=0)
            return both

    r = rdp.analyze(Mod)
    assert value(r, "seq") == ("S",)
    assert value(r, "twice") == ("S * 2",)
    assert value(r, "both") == ("S * 2", 32)


def test_isvdos_reshape_from_a_computed_shape_chain():
    """Shape -> Gather -> Concat -> Reshape written in Relax (the importer folds it for ONNX):
    Relax's inference cannot see through tensor_to_shape; RDP's values can."""
    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor(("B", "S", 64), "float32")):
            t = R.shape_to_tensor(R.shape_of(x))
            bs = R.strided_slice(t, axes=[0], begin=[0], end=[2])
            new = R.concat([bs, R.const(np.array([4, 16], "int64"), "int64")], axis=0)
            y = R.reshape(x, R.tensor_to_shape(new))
            z = R.nn.relu(y)
            return z

    r = rdp.analyze(Mod)
    assert value(r, "new") == ("B", "S", 4, 16)
    assert shape(r, "y") == ("B", "S", 4, 16) and shape(r, "z") == ("B", "S", 4, 16)
    rows = {row.var.name: row for row in r.rows()}
    assert not rows["z"].relax_resolved and rows["z"].rdp_resolved


def test_constant_value_inputs_reclassify_isvdos_to_isdos():
    x = relax.Var("x", relax.TensorType([2, 3], "float32"))
    t = relax.Var("t", relax.TensorType([2], "int64"))
    static = relax.op.reshape(x, [3, 2])
    dynamic = relax.op.reshape(x, relax.op.tensor_to_shape(t))
    cls = rdp.op_class(static)
    assert cls.dynamism is Dynamism.ISVDOS
    assert cls.effective(lambda i: isinstance(static.args[i], relax.ShapeExpr)) is Dynamism.ISDOS
    assert cls.effective(lambda i: isinstance(dynamic.args[i], relax.ShapeExpr)) is Dynamism.ISVDOS


def test_isvdos_backward_gives_the_shape_input_its_value():
    """reshape(x, tensor_to_shape(t)) with t data: the output's required shape is t's value."""
    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor(("B", 4), "float32"), t: R.Tensor((2,), "int64")):
            B = T.int64()
            sv = R.tensor_to_shape(t)
            y = R.reshape(x, sv)
            z = R.match_cast(y, R.Tensor((B, 4), "float32"))
            return z

    r = rdp.analyze(Mod)
    assert value(r, "sv") == ("B", 4)
    assert value(r, "t") == ("B", 4)


@pytest.mark.parametrize("other, expected", [
    ((1, 4), ("B", "⊤")),       # the other is broadcast on dim 0 only: x's dim 0 is the output's
    ((4,), ("B", "⊤")),         # absent on dim 0: the same
    ((1, 1), ("B", 4)),         # broadcast on both
    (("B", 4), ("⊤", "⊤")),     # x could be 1 or the output's on each dim
])
def test_broadcasting_backward_rule(other, expected):
    n = relax.Var("n", relax.TensorType([B], "float32"))
    x = relax.Var("x", relax.TensorType(dtype="float32", ndim=2))
    o = relax.Var("o", relax.TensorType([d if isinstance(d, int) else B for d in other], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [n, x, o]):
        y = bb.emit(relax.op.add(x, o), name_hint="y")
        z = bb.match_cast(y, relax.TensorType([B, 4], "float32"), name_hint="z")
        bb.emit_func_output(z)
    r = rdp.analyze(bb.get())
    assert shape(r, "x") == expected


def test_backward_through_concat_matmul_and_permute():
    @I.ir_module
    class Mod:
        @R.function
        def main(n: R.Tensor(("B",), "float32"), x: R.Tensor(ndim=2, dtype="float32"),
                 y: R.Tensor(("B", 3), "float32"), u: R.Tensor(ndim=2, dtype="float32"),
                 p: R.Tensor(ndim=3, dtype="float32")):
            B = T.int64()
            c = R.concat([x, y], axis=1)
            cz = R.match_cast(c, R.Tensor((B, 8), "float32"))
            m = R.matmul(u, R.const(np.zeros((16, 8), "float32")))
            mz = R.match_cast(m, R.Tensor((B, 8), "float32"))
            q = R.permute_dims(p, axes=[2, 0, 1])
            qz = R.match_cast(q, R.Tensor((2, B, 5), "float32"))
            return (cz, mz, qz)

    r = rdp.analyze(Mod)
    assert shape(r, "x") == ("B", 5)       # 8 - 3 on the axis, the output's dim elsewhere
    assert shape(r, "u") == ("B", 16)      # rows from the output, columns = the weight's rows
    assert shape(r, "p") == ("B", 5, 2)    # the inverse permutation


def test_edo_forward_is_rank_only_and_backward_says_nothing():
    @I.ir_module
    class Mod:
        @R.function
        def main(n: R.Tensor(("B",), "float32"), x: R.Tensor(ndim=2, dtype="float32")):
            B = T.int64()
            nz = R.nonzero(x)
            z = R.match_cast(nz, R.Tensor((2, B), "int64"))
            return z

    r = rdp.analyze(Mod)
    assert shape(r, "nz") == ("⊥", "⊥")
    assert shape(r, "z") == (2, "B")       # what the match_cast asserts
    assert shape(r, "x") == ("⊤", "⊤")     # nonzero's output shape says nothing of its input


# ---------------------------------------------------------------------- Merge and If
def test_merge_at_if_keeps_what_both_branches_agree_on():
    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor(("N", 4, "H", "W"), "float32"), c: R.Tensor((), "bool")):
            if c:
                a = R.nn.relu(x)
                y = a
            else:
                b = R.nn.max_pool2d(x, pool_size=[2, 2], strides=[2, 2])
                y = b
            z = R.sigmoid(y)
            return z

    r = rdp.analyze(Mod)
    assert shape(r, "a") == ("N", 4, "H", "W")              # each branch keeps its own facts
    assert shape(r, "b") == ("N", 4, "H // 2", "W // 2")
    assert shape(r, "y") == ("N", 4, "⊥", "⊥") and shape(r, "z") == ("N", 4, "⊥", "⊥")
    assert [row.relax_shape for row in r.rows() if row.var.name == "z"] == ["ndim=4"]


@pytest.mark.parametrize("else_op, expected", [("relu", ("B", 8)), ("add", ("B", "⊤"))])
def test_fixed_point_through_if(else_op, expected):
    """x's dims come only from the match_cast after the If: required of y, then of both branch
    results, then of x (backward), then forward again into the other branch and the If. The
    worklist needs more than one sweep, and at the end no node changes any fact."""
    one = relax.const(np.ones((1, 8), "float32"))
    n = relax.Var("n", relax.TensorType([B], "float32"))
    x = relax.Var("x", relax.TensorType(dtype="float32", ndim=2))
    c = relax.Var("c", relax.TensorType([], "bool"))
    then_v = relax.Var("a", relax.TensorType(dtype="float32", ndim=2))
    else_v = relax.Var("b", relax.TensorType(dtype="float32", ndim=2))
    else_call = relax.op.nn.relu(x) if else_op == "relu" else relax.op.add(x, one)
    branch = lambda v, call: relax.SeqExpr([relax.BindingBlock([relax.VarBinding(v, call)])], v)  # noqa: E731
    bb = relax.BlockBuilder()
    with bb.function("main", [n, x, c]):
        y = bb.emit(relax.If(c, branch(then_v, relax.op.add(x, one)), branch(else_v, else_call)), name_hint="y")
        z = bb.match_cast(y, relax.TensorType([B, 8], "float32"), name_hint="z")
        bb.emit_func_output(z)
    func = bb.get()["main"]

    solver = rdp._Solver(func)
    r = solver.run()
    assert shape(r, "x") == expected
    assert shape(r, "a") == ("B", 8) and shape(r, "b") == ("B", 8) and shape(r, "y") == ("B", 8)
    assert r.visits > len(solver.nodes)                       # more than one sweep
    assert all(not solver._visit(i) for i in range(len(solver.nodes)))   # a fixed point


# ------------------------------------------------------------------- ONNX and reporting
def test_range_length_from_shape_is_resolved_beyond_relax():
    """Range(0, Shape(x)[1], 1) imported from ONNX: Relax names the length with a fresh
    variable (match_cast of tensor_to_shape); RDP evaluates the integer chain and proves it is S."""
    from onnx import TensorProto, helper

    from tvm.relax.frontend.onnx import from_onnx

    node = helper.make_node
    graph = helper.make_graph(
        [node("Shape", ["x"], ["s"]), node("Gather", ["s", "one"], ["n"], axis=0),
         node("Range", ["zero", "n", "one"], ["pos"]), node("Gather", ["emb", "pos"], ["y"], axis=0)],
        "g", [helper.make_tensor_value_info("x", TensorProto.INT64, ["B", "S"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("zero", TensorProto.INT64, [], [0]), helper.make_tensor("one", TensorProto.INT64, [], [1]),
         helper.make_tensor("emb", TensorProto.FLOAT, [32, 8], np.zeros(256).tolist())])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    r = rdp.analyze(from_onnx(model, keep_params_in_input=False))
    last = r.rows()[-1]
    assert last.relax_shape.startswith("(range_len") and not last.relax_resolved
    assert str(last.fact.shape) == "(S, 8)" and last.rdp_resolved
    s = r.summary()
    assert s.rdp_only == sum(1 for row in r.rows() if row.relax_shape.startswith("(range_len"))
    assert s.rdp == s.tensors


def test_report_prints_every_tensor_and_a_summary():
    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor(("B", 4), "float32")):
            y = R.nn.relu(x)
            return y

    r = rdp.analyze(Mod)
    text = str(r)
    assert text.splitlines()[0].split() == ["tensor", "op", "class", "Relax", "RDP"]
    assert any(line.split()[:3] == ["y", "nn.relu", "ISDOS"] for line in text.splitlines())
    assert text.splitlines()[-1].startswith("2 tensors: 2 resolved by Relax, 2 by RDP (0 by RDP only)")


def test_analyze_rejects_what_is_not_a_relax_function():
    with pytest.raises(TypeError, match="RDP analyses a Relax function, not PrimFunc"):
        rdp.analyze(tvm.IRModule({"main": tirx.PrimFunc([], tirx.Evaluate(0))}))
