"""Which unit runs a contraction: the anchor's ``dsa.vector_contraction`` annotation puts it on the
vector units (products, then a sum reduction) instead of the MME; both compute the kernel (against
the same PrimFunc built for llvm). Where the MME would use one PE column (a depthwise conv) the
tuning space offers the choice (the default lowering keeps the MME), and its capacity boxes hold
tilings that fit on each unit; a stitched kernel's layer is timed in place on both
(``tiling.lower_timed``)."""

import collections
import math

import numpy as np
import pytest
import tvm
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh
from tvm import s_tir, te

from tvm_dsa import hardware, isa
from tvm_dsa.emit.emitter import build_program
from tvm_dsa.kernel.ir import POINT_SUMS, read_kernel, scratch_bytes
from tvm_dsa.harness import import_onnx, max_relative_error
from tvm_dsa.runtime import simulate
from tvm_dsa.tir_passes.tile import TilePlan, anchor_info
from tvm_dsa.kernel.analysis import Unsupported
from tvm_dsa.tiling import lower_kernel, lower_timed, timed_cycles
from tvm_dsa.tir_passes import lower_with_plan
from tvm_dsa.tir_passes.tile import annotate_vector_contraction, on_vector_units
from tvm_dsa.tuning import extract_tasks
from tvm_dsa.tuning.space import FlipChoice, capacity_boxes, design_spaces, fits_lb, unit_choice

TARGET = "dsa/stcp920"
HW = hardware.get(TARGET)
PLAN = TilePlan((1, 8, 4, 16), 1)  # fits the LB on both units


@pytest.fixture(scope="module")
def depthwise(conv_relu):
    """A depthwise 3x3 conv + ReLU over 32 channels: a contraction with no N loop."""
    (task,) = extract_tasks(import_onnx(conv_relu(32, 32, 16, groups=32)), TARGET)
    return task


def _reference(func):
    rng = np.random.default_rng(0)
    args = [rng.standard_normal([int(d) for d in p.shape]).astype("float32") for p in func.params[:-1]]
    out = tvm.runtime.tensor(np.zeros([int(d) for d in func.params[-1].shape], "float32"))
    tvm.compile(tvm.IRModule({"main": func}), target="llvm")["main"](*[tvm.runtime.tensor(a) for a in args], out)
    return args, out.numpy()


def test_both_units_compute_the_kernel_and_the_vector_units_win_a_depthwise_conv(depthwise):
    func = depthwise.mod["main"]
    args, expected = _reference(func)
    cycles = {}
    for vector in (False, True):
        lowered = lower_with_plan(func, TilePlan(PLAN.tiles, PLAN.chunk, vector))
        (anchor,) = [s for s in read_kernel(lowered).stages() if s.name.startswith("group_conv2d")]
        assert (anchor.op, anchor.reduce_op) == (("reduce", "sum") if vector else ("mme", ""))
        program = build_program(lowered, HW, "depthwise")
        kinds = {type(i) for k in program.kernels for i in k.instructions}
        assert (isa.Mme in kinds) != vector
        (out,) = simulate(program, args).outputs
        assert max_relative_error([out], [expected]) < 2e-2  # fp16 storage on stcp920
        cycles[vector] = simulate(program, mode="timing").report.cycles
    # a tile's 8 x 4 x 16 outputs of 9 products each: on the MME one PE column works (N = 1),
    # on the vector units 64 lanes share the products and the sums
    m, k = 4 * 16, 9
    assert 2 * m * k / HW.vme_lanes < math.ceil(m / HW.mme.rows) * k
    assert cycles[True] < cycles[False]


def test_the_choice_is_offered_where_one_pe_column_would_work(conv_relu, depthwise):
    assert unit_choice(anchor_info(depthwise.mod["main"]), HW)
    (narrow,) = extract_tasks(import_onnx(conv_relu(8, HW.mme.cols // 2, 8)), TARGET)  # N = 16 columns of 32
    assert not unit_choice(anchor_info(narrow.mod["main"]), HW)
    # an integer MME sums exactly in int32, the vector units in float32: no choice
    int8 = hardware.get("dsa/set-edge16")
    assert int8.mme.accum_dtype == "int32" and not unit_choice(anchor_info(depthwise.mod["main"]), int8)


def test_lower_kernel_takes_the_mme_unless_told(conv_relu, depthwise):
    # the default lowering keeps the MME (timing both units in every compile costs seconds); the
    # vector units are a tuning record's choice, or lower_kernel's where it is told and they may
    func = depthwise.mod["main"]
    assert not depthwise.default_plan.vector
    lowered, plan = lower_kernel(func, HW, vector=True)
    assert plan.vector and on_vector_units(lowered)
    int8 = "dsa/set-edge16"
    (task,) = extract_tasks(import_onnx(conv_relu(32, 32, 16, groups=32)), int8)
    with pytest.raises(Unsupported, match="cannot run on the vector units of set-edge16"):
        lower_kernel(task.mod["main"], hardware.get(int8), vector=True)


def test_lower_timed_keeps_the_unit_timed_faster_in_place(depthwise):
    """A stitched depthwise layer is timed on the MME (one PE column) and on the vector units,
    its input in the GB (``timed_cycles``), and lowered for the faster, whether or not other
    plans are timed too (``plans``)."""
    func, gb = depthwise.mod["main"], frozenset({0})
    mme, vme = lower_kernel(func, HW)[0], lower_kernel(func, HW, vector=True)[0]
    on_vector = timed_cycles(vme, HW, None, gb) < timed_cycles(mme, HW, None, gb)
    for plans in (True, False):
        assert on_vector_units(lower_timed(func, HW, None, gb, mme, plans=plans)) == on_vector
    # 32 channels of 16 x 16: a tile's products on 64 lanes beat one PE column of 16 rows
    assert on_vector


def test_capacity_boxes_are_per_unit_and_their_largest_tilings_fit(depthwise):
    func = depthwise.mod["main"]
    boxes = capacity_boxes(func, HW)
    assert {b.vector for b in boxes} == {False, True}
    for box in boxes:
        top = TilePlan(tuple(t[0] for t in box.tiles), box.chunk[0], box.vector)
        assert fits_lb(func, top, HW)
    # a depthwise tap's products are multiply-accumulated into the sums (``Stage.point_sums``): no
    # temporary of nine products, so the vector boxes' tops hold at least as many outputs as the MME's
    volume = {v: max(math.prod(t[0] for t in b.tiles) for b in boxes if b.vector == v) for v in (False, True)}
    assert volume[True] >= volume[False]
    (anchor,) = [st for st in read_kernel(lower_with_plan(func, TilePlan(PLAN.tiles, PLAN.chunk, True))).stages()
                 if st.op == "reduce"]
    assert anchor.point_sums() == (4, 5, 6) and math.prod(anchor.shape[i] for i in (4, 5, 6)) == 9
    assert scratch_bytes(anchor, {}, None) == 0
    top = max((b for b in boxes if b.vector), key=lambda b: math.prod(t[0] for t in b.tiles))
    args, expected = _reference(func)  # summed a tap at a time, the kernel computes what llvm does
    program = build_program(lower_with_plan(func, TilePlan(tuple(t[0] for t in top.tiles), top.chunk[0], True)), HW, "taps")
    vector = [i for k in program.kernels for i in k.instructions if isinstance(i, (isa.Vector, isa.Reduce))]
    ops = collections.Counter(i.op for i in vector if isinstance(i, isa.Vector))
    # per output box: the first tap written (mul, where the zero fill was folded in), eight added (mac)
    assert not any(isinstance(i, isa.Reduce) for i in vector) and ops["mac"] == 8 * ops["mul"] > 0
    assert all(i.srcs[2] == i.dst for i in vector if i.op == "mac")
    (out,) = simulate(program, args).outputs
    assert max_relative_error([out], [expected]) < 2e-2


def test_a_conformers_31_taps_are_multiply_accumulated_one_at_a_time():
    """A 1-D depthwise convolution of 31 taps (a Conformer's) on the vector units: each tap a
    ``mac`` of the output box (``POINT_SUMS`` covers it), the values llvm's."""
    w = np.random.default_rng(1).standard_normal((16, 1, 31)).astype("float32") * 0.2
    conv = h.make_node("Conv", ["x", "W"], ["y"], pads=[15, 15], group=16)
    graph = h.make_graph([conv], "dw31", [h.make_tensor_value_info("x", TP.FLOAT, [1, 16, 64])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [1, 16, 64])], [nh.from_array(w, "W")])
    (task,) = extract_tasks(import_onnx(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=10)),
                            TARGET)
    func = task.mod["main"]
    lowered = lower_kernel(func, HW, vector=True)[0]
    (anchor,) = [st for st in read_kernel(lowered).stages() if st.op == "reduce"]
    assert math.prod(anchor.shape[i] for i in anchor.point_sums()) == 31 <= POINT_SUMS
    program = build_program(lowered, HW, "dw31")
    ops = collections.Counter(i.op for k in program.kernels for i in k.instructions if isinstance(i, isa.Vector))
    assert ops["mac"] == 30 * ops["mul"] > 0
    args, expected = _reference(func)
    (out,) = simulate(program, args).outputs
    assert max_relative_error([out], [expected]) < 2e-2


def test_the_space_samples_the_unit_and_the_mutator_flips_it(depthwise):
    spaces = design_spaces(s_tir.Schedule(depthwise.mod), HW)
    units = []
    for sch in spaces:
        (annotate,) = [i for i in sch.trace.insts
                       if i.kind.name == "Annotate" and str(i.attrs[0]) == "dsa.vector_contraction"]
        (sample,) = [i for i in sch.trace.insts if i.outputs and i.outputs[0].same_as(annotate.inputs[1])]
        units.append([int(c) for c in sample.attrs[0]])
    assert [0, 1] in units  # the uniform spaces choose; a capacity box's space has its own unit
    assert [0] in units and [1] in units
    uniform = spaces[units.index([0, 1])].trace
    for _ in range(8):  # FlipChoice picks one of the two-way decisions (double buffering or the unit)
        flipped = FlipChoice().apply(uniform)
        changed = [i for i in uniform.insts if i.kind.name == "SampleCategorical"
                   and int(flipped.decisions[_same(flipped, i)]) != int(uniform.decisions[i])]
        assert len(changed) == 1


def _same(trace, inst):
    """``inst``'s counterpart in ``trace`` (a copy of the trace it came from)."""
    return next(i for i in trace.insts if i.kind.name == inst.kind.name and i.outputs[0].same_as(inst.outputs[0]))


def test_a_kernel_without_a_contraction_has_no_unit_to_choose():
    x = te.placeholder((64,), "float32", name="x")
    relu = te.create_prim_func([x, te.compute((64,), lambda i: te.max(x[i], 0.0), name="relu")])
    with pytest.raises(Unsupported, match="no contraction"):
        annotate_vector_contraction(s_tir.Schedule(relu), 1)
