"""Operator classification by dynamism (seed 001 §3, Table 2).

Every operator gets one of four classes, by what its output depends on:

* ``ISDO``   input shape determined output — output shape *and value* from the input shapes
  (``Shape``, ``EyeLike``);
* ``ISDOS``  input shape determined output shape — the value needs the input values, the shape
  does not (``Conv``, ``Add``);
* ``ISVDOS`` input shape & value determined output shape — the output shape needs the values of
  some inputs, the *value inputs* (``Reshape``'s shape, ``Range``'s limits);
* ``EDO``    execution determined output — the shape is known only once the op has run
  (``NonZero``, ``If``).

An ``ISVDOS`` op whose value inputs are all constants (or absent, or known to RDP) is
re-classified ``ISDOS``: constant propagation makes it less dynamic (the seed's Upsample
example). ``OpClass.effective`` applies that rule; the RDP analysis calls it with what it knows.

Two tables: every ``relax.*`` operator registered in TVM (``tvm.ir.Op.list_op_names()``), with
the family of shape relation the RDP uses for backward inference, and every ONNX operator TVM's
Relax importer converts. ``python -m tvm_dsa.relax_passes.dynamism docs/sod2.md`` writes both into
the doc between its ``BEGIN/END GENERATED`` markers.
"""

from __future__ import annotations

import enum
import sys
from dataclasses import dataclass
from typing import Callable


class Dynamism(enum.Enum):
    ISDO = "input shape determined output"
    ISDOS = "input shape determined output shape"
    ISVDOS = "input shape & value determined output shape"
    EDO = "execution determined output"


class Family(enum.Enum):
    """How an op's output shape relates to its input shapes: what backward inference can use."""

    SAME = "same"            # output shape = shape of input 0
    BROADCAST = "broadcast"  # numpy broadcasting of all tensor inputs
    CONCAT = "concat"
    PERMUTE = "permute"
    MATMUL = "matmul"
    RESHAPE = "reshape"      # same element count as input 0, shape from a value input
    SHAPE_OF = "shape_of"    # output value = input shape
    TO_SHAPE = "to_shape"    # tensor_to_shape / shape_to_tensor: output value = input value
    CREATE = "create"        # output shape = value of a shape input (zeros, full, broadcast_to)
    OTHER = "other"          # no backward rule


@dataclass(frozen=True)
class OpClass:
    dynamism: Dynamism
    value_inputs: tuple[int, ...] = ()  # inputs whose values determine the output shape
    family: Family = Family.OTHER
    note: str = ""

    def __post_init__(self):
        if (self.dynamism is Dynamism.ISVDOS) != bool(self.value_inputs):
            raise ValueError(f"{self}: exactly the ISVDOS ops name value inputs")

    def effective(self, value_known: Callable[[int], bool]) -> Dynamism:
        """The class after constant propagation: ISVDOS with every value input known is ISDOS."""
        if self.dynamism is Dynamism.ISVDOS and all(value_known(i) for i in self.value_inputs):
            return Dynamism.ISDOS
        return self.dynamism


def _table(groups) -> dict[str, OpClass]:
    table: dict[str, OpClass] = {}
    for names, cls in groups:
        for name in names.split():
            if name in table:
                raise ValueError(f"operator {name} classified twice")
            table[name] = cls
    return table


D = Dynamism
F = Family

# ------------------------------------------------------------------------------ Relax
_RELAX_UNARY = """abs acos acosh asin asinh atan atanh ceil cos cosh erf exp floor log negative round
rsqrt sigmoid sign sin sinh sqrt square tan tanh trunc bitwise_not logical_not isfinite isinf isnan
astype clip nn.relu nn.gelu nn.gelu_tanh nn.silu nn.selu nn.softplus nn.leakyrelu nn.softmax
nn.log_softmax nn.layer_norm nn.group_norm nn.instance_norm nn.rms_norm nn.prelu tril triu flip sort
cumprod cumsum reverse_sequence scatter_elements scatter_nd index_put slice_scatter
ccl.allreduce ccl.broadcast_from_worker0 memory.ensure_zero_offset hint_on_device to_vdevice
wrap_param builtin.stop_lift_params grad.start_checkpoint grad.end_checkpoint grad.no_grad
dist.annotate_sharding dist.redistribute dist.redistribute_replica_to_shard"""

_RELAX_BROADCAST = """add subtract multiply divide floor_divide floor_mod mod power maximum minimum
atan2 log_add_exp equal not_equal less less_equal greater greater_equal logical_and logical_or
logical_xor bitwise_and bitwise_or bitwise_xor left_shift right_shift where ewise_fma"""

_RELAX_OTHER_ISDOS = """argmax argmin argsort max min mean sum prod std variance median
expand_dims squeeze flatten nn.batch_flatten layout_transform take gather_elements gather_nd
index_tensor split stack tile repeat topk one_hot outer einsum meshgrid bucketize
nn.conv1d nn.conv2d nn.conv3d nn.conv1d_transpose nn.conv2d_transpose nn.conv3d_transpose
nn.avg_pool1d nn.avg_pool2d nn.avg_pool3d nn.max_pool1d nn.max_pool2d nn.max_pool3d
nn.adaptive_avg_pool1d nn.adaptive_avg_pool2d nn.adaptive_avg_pool3d nn.pad nn.pixel_shuffle
nn.batch_norm nn.dropout nn.attention nn.attention_bias nn.attention_var_len nn.nll_loss
nn.cross_entropy_with_logits collapse_sum_like quantize dequantize image.grid_sample
vision.roi_align vision.roi_pool vision.get_valid_counts vision.non_max_suppression
vision.multibox_transform_loc multinomial_from_uniform ccl.allgather ccl.scatter_from_worker0
grad.avg_pool2d_backward grad.max_pool2d_backward grad.nll_loss_backward grad.take_backward"""

_RELAX_DECLARED = """call_tir call_tir_inplace call_tir_with_grad call_dps_packed call_pure_packed
call_inplace_packed call_builtin_with_ctx call_py_func invoke_closure invoke_pure_closure
make_closure dist.call_tir_local_view vm.call_tir_dyn"""

_RELAX_ISDO = """size inspect.tensor_ndim inspect.tensor_shape_i inspect.tensor_stride_i
inspect.tensor_dtype_code inspect.tensor_dtype_bits inspect.tensor_dtype_lanes
inspect.tensor_byte_offset inspect.tensor_elem_offset null_value print assert_op
memory.kill_storage memory.kill_tensor vm.kill_object"""

RELAX_OPS: dict[str, OpClass] = {
    f"relax.{k}": v for k, v in _table([
        (_RELAX_UNARY, OpClass(D.ISDOS, family=F.SAME)),
        (_RELAX_BROADCAST, OpClass(D.ISDOS, family=F.BROADCAST)),
        (_RELAX_OTHER_ISDOS, OpClass(D.ISDOS)),
        ("concat", OpClass(D.ISDOS, family=F.CONCAT)),
        ("permute_dims", OpClass(D.ISDOS, family=F.PERMUTE)),
        ("matmul", OpClass(D.ISDOS, family=F.MATMUL)),
        (_RELAX_DECLARED, OpClass(D.ISDOS, note="output shape declared by the call's struct info")),
        ("shape_of", OpClass(D.ISDO, family=F.SHAPE_OF)),
        ("zeros_like ones_like eye_like", OpClass(D.ISDO, family=F.SAME)),
        (_RELAX_ISDO, OpClass(D.ISDO, note="value from shapes, dtypes or layout only")),
        ("shape_to_tensor", OpClass(D.ISDOS, family=F.TO_SHAPE, note="value = the shape's value")),
        ("full_like", OpClass(D.ISDOS, family=F.SAME, note="value = the fill value")),
        ("tensor_to_shape", OpClass(D.ISVDOS, (0,), F.TO_SHAPE, "shape value = the tensor's value")),
        ("reshape", OpClass(D.ISVDOS, (1,), F.RESHAPE)),
        ("memory.view", OpClass(D.ISVDOS, (1,), F.RESHAPE)),
        ("broadcast_to", OpClass(D.ISVDOS, (1,), F.CREATE)),
        ("collapse_sum_to image.resize2d image.resize3d image.affine_grid",
         OpClass(D.ISVDOS, (1,), F.CREATE)),
        ("zeros ones full builtin.alloc_tensor", OpClass(D.ISVDOS, (0,), F.CREATE)),
        ("memory.alloc_tensor vm.alloc_tensor", OpClass(D.ISVDOS, (2,), F.CREATE)),
        ("memory.alloc_storage vm.alloc_storage", OpClass(D.ISVDOS, (0,), note="size in bytes")),
        ("arange", OpClass(D.ISVDOS, (0, 1, 2))),
        ("eye", OpClass(D.ISVDOS, (0, 1))),
        ("hamming_window", OpClass(D.ISVDOS, (0,))),
        ("dynamic_strided_slice", OpClass(D.ISVDOS, (1, 2, 3))),
        ("strided_slice", OpClass(D.ISVDOS, (1, 2, 3, 4), note="axes, begin, end, strides")),
        ("nonzero", OpClass(D.EDO, note="count of non-zero elements")),
        ("unique", OpClass(D.EDO, note="count of distinct elements")),
        ("vision.all_class_non_max_suppression", OpClass(D.EDO, note="count of kept boxes")),
    ]).items()
}

#: Not an operator but classified like one: the branch taken is known once ``cond`` is computed.
RELAX_IF = OpClass(D.EDO, note="control flow: the branch taken is decided at run time")

# ------------------------------------------------------------------------------- ONNX
_ONNX_ISDOS = """Abs Acos Acosh Add And ArgMax ArgMin Asin Asinh Atan Atanh Attention AveragePool
BatchNormalization BiasGelu BitShift BitwiseAnd BitwiseNot BitwiseOr BitwiseXor Cast CastLike Ceil
Clip Concat ConcatFromSequence Conv ConvTranspose Cos Cosh CumSum DepthToSpace DequantizeLinear Div
Dropout DynamicQuantizeLinear Einsum Elu EmbedLayerNormalization Equal Erf Exp FastGelu Flatten Floor
Gather GatherElements GatherND Gelu Gemm GlobalAveragePool GlobalLpPool GlobalMaxPool Greater
GreaterOrEqual GridSample GroupNormalization HardSigmoid HardSwish Hardmax Identity
InstanceNormalization IsInf IsNaN LRN LayerNormalization LeakyRelu Less LessOrEqual Log LogSoftmax
LpPool MatMul MatMulInteger MatMulInteger16 Max MaxPool MaxRoiPool Mean MeanVarianceNormalization
Min Mish Mod Mul Neg Not Optional OptionalGetElement Or PRelu Pow QuantizeLinear RMSNormalization
Reciprocal Relu RoiAlign Round Scatter ScatterElements ScatterND Selu SequenceConstruct SequenceErase
SequenceInsert Shrink Sigmoid Sign Sin Sinh SkipLayerNormalization Softmax Softplus Softsign
SpaceToDepth Sqrt Sub Sum Tan Tanh ThresholdedRelu Transpose Trilu Where Xor"""

_ONNX_REDUCE = """ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin
ReduceProd ReduceSum ReduceSumSquare"""

ONNX_OPS: dict[str, OpClass] = _table([
    (_ONNX_ISDOS, OpClass(D.ISDOS)),
    ("Shape Size EyeLike", OpClass(D.ISDO)),
    ("Constant SequenceEmpty", OpClass(D.ISDO, note="no inputs: output known")),
    ("SequenceLength OptionalHasElement", OpClass(D.ISDO, note="value from the container's size")),
    ("Reshape Expand Tile", OpClass(D.ISVDOS, (1,), note="shape / repeats input")),
    ("ConstantOfShape", OpClass(D.ISVDOS, (0,))),
    ("Range", OpClass(D.ISVDOS, (0, 1, 2))),
    ("Slice", OpClass(D.ISVDOS, (1, 2, 3, 4), note="starts, ends, axes, steps")),
    ("Pad", OpClass(D.ISVDOS, (1, 3), note="pads, axes")),
    ("Resize", OpClass(D.ISVDOS, (1, 2, 3), note="roi, scales, sizes")),
    ("Upsample", OpClass(D.ISVDOS, (1,), note="scales")),
    ("TopK", OpClass(D.ISVDOS, (1,), note="k")),
    ("OneHot", OpClass(D.ISVDOS, (1,), note="depth")),
    ("Squeeze Unsqueeze", OpClass(D.ISVDOS, (1,), note="axes input (opset >= 13)")),
    (_ONNX_REDUCE, OpClass(D.ISVDOS, (1,), note="axes input (ReduceSum opset >= 13, others >= 18)")),
    ("Split SplitToSequence", OpClass(D.ISVDOS, (1,), note="split sizes")),
    ("SequenceAt", OpClass(D.ISVDOS, (1,), note="position picks the element")),
    ("MaxUnpool", OpClass(D.ISVDOS, (2,), note="output_shape")),
    ("AffineGrid", OpClass(D.ISVDOS, (1,), note="size")),
    ("NonZero", OpClass(D.EDO)),
    ("Unique", OpClass(D.EDO)),
    ("Compress", OpClass(D.EDO, note="count of true conditions")),
    ("NonMaxSuppression AllClassNMS", OpClass(D.EDO, note="count of kept boxes")),
    ("If", OpClass(D.EDO, note="control flow")),
])


def onnx_importer_ops() -> set[str]:
    """Operators TVM's Relax ONNX importer converts (its converter map, plus ``If``)."""
    from tvm.relax.frontend.onnx import onnx_frontend

    return set(onnx_frontend._get_convert_map()) | {"If"}


def relax_op_names() -> set[str]:
    import tvm

    return {n for n in tvm.ir.Op.list_op_names() if n.startswith("relax.")}


def classify_relax(name: str) -> OpClass:
    try:
        return RELAX_OPS[name]
    except KeyError:
        raise KeyError(f"Relax operator {name!r} has no dynamism class; add it to RELAX_OPS") from None


def classify_onnx(op_type: str) -> OpClass:
    try:
        return ONNX_OPS[op_type]
    except KeyError:
        raise KeyError(f"ONNX operator {op_type!r} has no dynamism class; add it to ONNX_OPS") from None


# ------------------------------------------------------------------------- the doc table
BEGIN = "<!-- BEGIN GENERATED: python -m tvm_dsa.relax_passes.dynamism docs/sod2.md -->"
END = "<!-- END GENERATED -->"


def _markdown(title: str, table: dict[str, OpClass], prefix: str = "") -> list[str]:
    """One row per (class, value inputs, note): the operators that share them."""
    groups: dict[tuple, list[str]] = {}
    for name, c in table.items():
        groups.setdefault((list(Dynamism).index(c.dynamism), c.value_inputs, c.note), []).append(
            name.removeprefix(prefix))
    lines = [f"#### {title}", "", "| class | operators | value inputs | note |", "|---|---|---|---|"]
    for (dyn, inputs, note), names in sorted(groups.items()):
        lines.append(f"| {list(Dynamism)[dyn].name} | {', '.join(sorted(names))} | "
                     f"{', '.join(map(str, inputs))} | {note} |")
    return lines


def render_tables() -> str:
    """Both tables as markdown, as they appear in docs/sod2.md."""
    return "\n".join([
        *_markdown(f"ONNX operators the importer converts ({len(ONNX_OPS)})", ONNX_OPS), "",
        *_markdown(f"Relax operators ({len(RELAX_OPS)}, `relax.` omitted)", RELAX_OPS, "relax."),
    ])


def generated_section(text: str) -> str:
    """The text between the doc's markers."""
    try:
        start = text.index(BEGIN) + len(BEGIN)
        return text[start:text.index(END, start)].strip("\n")
    except ValueError:
        raise ValueError(f"the doc has no {BEGIN!r} ... {END!r} section") from None


def write_doc(path: str) -> None:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    old = generated_section(text)
    start = text.index(BEGIN) + len(BEGIN)
    end = text.index(END, start)
    new = f"{text[:start]}\n{render_tables()}\n{text[end:]}"
    with open(path, "w", encoding="utf-8") as f:
        f.write(new)
    print(f"{path}: table {'unchanged' if old == render_tables() else 'updated'}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tvm_dsa.relax_passes.dynamism docs/sod2.md")
    write_doc(sys.argv[1])
