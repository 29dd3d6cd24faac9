"""Operator classification (seed 001 §3, Table 2): complete, consistent with the op signatures,
re-classified by constant propagation, and the doc's table generated from this code."""

from pathlib import Path

import onnx.defs
import pytest
import tvm
from tvm import relax

from tvm_dsa.relax_passes import dynamism as dyn
from tvm_dsa.relax_passes.dynamism import Dynamism as D

DOC = Path(__file__).resolve().parent.parent / "docs" / "sod2.md"


def test_every_relax_operator_is_classified():
    assert dyn.relax_op_names() == set(dyn.RELAX_OPS)


def test_every_onnx_operator_the_importer_maps_is_classified():
    assert dyn.onnx_importer_ops() == set(dyn.ONNX_OPS)


def test_relax_value_inputs_are_arguments_that_carry_values():
    """A value input is an argument of the op (by its registered signature) that is not the
    data tensor being transformed: a shape, a scalar or an index tensor."""
    for name, cls in dyn.RELAX_OPS.items():
        args = tvm.ir.Op.get(name).arguments
        if name == "relax.strided_slice":  # registered with one argument, called with five
            x = relax.Var("x", relax.TensorType([4, 4], "float32"))
            assert len(relax.op.strided_slice(x, [0], [1], [3], [1]).args) == 5
            continue
        for i in cls.value_inputs:
            assert i < len(args), (name, i)
            assert args[i].type_info in ("Shape", "Expr", "PrimExpr", "Tensor"), (name, args[i].type_info)


def test_relax_families_match_signatures():
    for name, cls in dyn.RELAX_OPS.items():
        types = [a.type_info for a in tvm.ir.Op.get(name).arguments]
        if cls.family is dyn.Family.BROADCAST:
            assert set(types) == {"Tensor"} and len(types) >= 2, (name, types)
        if cls.family in (dyn.Family.RESHAPE, dyn.Family.CREATE):
            assert types[cls.value_inputs[0]] in ("Shape", "Expr"), (name, types)


def test_onnx_value_inputs_exist_in_the_latest_schema():
    checked = 0
    for op, cls in dyn.ONNX_OPS.items():
        if not cls.value_inputs:
            continue
        schema = onnx.defs.get_schema(op)
        names = [i.name for i in schema.inputs]
        assert max(cls.value_inputs) < len(names), (op, names)
        assert 0 not in cls.value_inputs or op in ("ConstantOfShape", "Range"), op  # input 0 is the data
        checked += 1
    assert checked == sum(1 for c in dyn.ONNX_OPS.values() if c.dynamism is D.ISVDOS)


def test_seed_examples():
    """The examples the seed gives for each class (§3)."""
    assert {op: dyn.classify_onnx(op).dynamism for op in
            ["Shape", "EyeLike", "Conv", "Add", "AveragePool", "Range", "NonZero", "If"]} == {
        "Shape": D.ISDO, "EyeLike": D.ISDO, "Conv": D.ISDOS, "Add": D.ISDOS, "AveragePool": D.ISDOS,
        "Range": D.ISVDOS, "NonZero": D.EDO, "If": D.EDO}


@pytest.mark.parametrize("op, constant, expected", [
    ("Upsample", {1}, D.ISDOS),          # the seed's example: constant scales
    ("Upsample", set(), D.ISVDOS),
    ("Resize", {1, 2, 3}, D.ISDOS),
    ("Resize", {1, 2}, D.ISVDOS),        # computed sizes
    ("Reshape", {1}, D.ISDOS),
    ("NonZero", {0}, D.EDO),             # execution determined whatever is constant
    ("Shape", set(), D.ISDO),
])
def test_constant_propagation_reclassifies(op, constant, expected):
    assert dyn.classify_onnx(op).effective(lambda i: i in constant) is expected


def test_unknown_operator_is_a_clear_error():
    with pytest.raises(KeyError, match="'Frobnicate' has no dynamism class"):
        dyn.classify_onnx("Frobnicate")
    with pytest.raises(ValueError, match="exactly the ISVDOS ops name value inputs"):
        dyn.OpClass(D.ISDOS, (1,))


def test_doc_table_is_generated_from_the_code():
    assert dyn.generated_section(DOC.read_text(encoding="utf-8")) == dyn.render_tables(), (
        "docs/sod2.md is stale: run python -m tvm_dsa.relax_passes.dynamism docs/sod2.md")
