"""The double-buffering knob: the root block's ``dsa.double_buffer`` annotation decides how many LB
copies of each tile buffer the codegen places; both settings compute the kernel (against the same
PrimFunc built for llvm) and take different times; the tuning space samples and mutates it."""

from dataclasses import replace

import numpy as np
import pytest
import tvm
from tvm import s_tir

from tvm_dsa import hardware
from tvm_dsa.emit.emitter import build_program
from tvm_dsa.kernel.ir import CodegenError, accumulators, align, chunk_loops, plan_lb, read_kernel, stages_of
from tvm_dsa.harness import import_onnx, max_relative_error
from tvm_dsa.runtime import simulate
from tvm_dsa.tir_passes.tile import TilePlan, anchor_info
from tvm_dsa.tir_passes import lower_with_plan
from tvm_dsa.tuning import extract_tasks
from tvm_dsa.tuning.space import FlipChoice, design_spaces, lower_scheduled, sample_tiling, tile_orders

TARGET = "dsa/stcp920"
HW = hardware.get(TARGET)
PLAN = TilePlan((1, 16, 4, 16), 8)  # 4 row tiles, 2 chunks of input channels: loads to overlap


@pytest.fixture(scope="module")
def conv_task(conv_relu):
    (task,) = extract_tasks(import_onnx(conv_relu(16, 16, 16)), TARGET)
    return task


def _inputs_and_llvm(mod, seed: int):
    """Random inputs of the kernel ``mod`` (drawn with ``seed``) and llvm's output for them."""
    func = mod["main"]
    rng = np.random.default_rng(seed)
    args = [rng.standard_normal([int(d) for d in p.shape]).astype("float32") for p in func.params[:-1]]
    expected = tvm.runtime.tensor(np.zeros([int(d) for d in func.params[-1].shape], "float32"))
    tvm.compile(mod, target="llvm")["main"](*[tvm.runtime.tensor(a) for a in args], expected)
    return args, expected


def _lowered(task, plan, double_buffer):
    sch = s_tir.Schedule(task.mod)
    sample_tiling(sch, tile_orders(anchor_info(task.mod["main"]).spatial)[0], plan, double_buffer)
    return lower_scheduled(sch.mod["main"], HW)


def test_both_settings_compute_the_kernel_and_differ_in_time(conv_task):
    args, expected = _inputs_and_llvm(conv_task.mod, 0)
    cycles = {}
    for double in (False, True):
        lowered = _lowered(conv_task, PLAN, double)
        lb = plan_lb(read_kernel(lowered), HW)
        assert {len(b.slots) for b in lb.buffers.values()} == {2 if double else 1}
        program = build_program(lowered, HW, "conv")
        (out,) = simulate(program, args).outputs
        assert max_relative_error([out], [expected.numpy()]) < 2e-2  # fp16 storage on stcp920
        cycles[double] = simulate(program, mode="timing").report.cycles
    # two copies let a tile's loads run while the previous tile computes
    assert cycles[True] < cycles[False]


def test_double_buffering_that_does_not_fit_is_refused(conv_task):
    whole = TilePlan((1, 16, 16, 16), 16)  # one tile: fits once in the LB, not twice
    single = plan_lb(read_kernel(_lowered(conv_task, whole, False)), HW)
    assert single.total_bytes <= HW.lb_bytes < 2 * single.total_bytes
    with pytest.raises(CodegenError, match="double-buffered tile working set .* exceeds the LB"):
        _lowered(conv_task, whole, True)


def test_the_space_samples_it_and_the_mutator_flips_it(conv_task):
    (sch, *_) = design_spaces(s_tir.Schedule(conv_task.mod))
    trace = sch.trace
    (inst,) = [i for i in trace.insts if i.kind.name == "SampleCategorical"]
    flipped = FlipChoice().apply(trace)
    (again,) = [i for i in flipped.insts if i.kind.name == "SampleCategorical"]
    assert int(flipped.decisions[again]) == 1 - int(trace.decisions[inst])


def test_the_default_record_keeps_the_default_decision(conv_task):
    # the default tiling double-buffers when two copies fit, as the codegen decides without a knob
    default = lower_with_plan(conv_task.mod["main"], conv_task.default_plan)
    assert conv_task.default_double_buffer == plan_lb(read_kernel(default), HW).double_buffered



def test_without_a_decision_and_no_room_for_two_of_everything_the_loads_get_two_copies(conv_relu):
    # 16 -> 24 channels, the whole output in one tile, the input channels in two chunks: one copy
    # of everything fits the LB and two do not, but two of what the DMAs load (input, weights) do:
    # the second chunk's loads then run while the MME works on the first
    (task,) = extract_tasks(import_onnx(conv_relu(16, 24, 16)), TARGET)
    func, whole = task.mod["main"], TilePlan((1, 24, 16, 16), 8)
    undecided = lower_with_plan(func, whole)
    kernel = read_kernel(undecided)
    single = plan_lb(read_kernel(_lowered(task, whole, False)), HW)
    loaded = {st.dst.buffer for st in kernel.stages() if st.op == "dma" and st.dst.lb}
    assert loaded and single.total_bytes <= HW.lb_bytes < 2 * single.total_bytes
    lb = plan_lb(kernel, HW)
    assert {name: len(b.slots) for name, b in lb.buffers.items()} == \
        {name: 2 if name in loaded else 1 for name in lb.buffers}
    assert lb.total_bytes == single.total_bytes + sum(align(b.nbytes) for n, b in single.buffers.items() if n in loaded)
    args, expected = _inputs_and_llvm(task.mod, 1)
    program = build_program(undecided, HW, "conv")
    (out,) = simulate(program, args).outputs
    assert max_relative_error([out], [expected.numpy()]) < 2e-2
    one_copy = build_program(_lowered(task, whole, False), HW, "conv")
    assert simulate(program, mode="timing").report.cycles < simulate(one_copy, mode="timing").report.cycles


def _projection_model():
    """x @ W + b + r with x, r graph inputs (BERT's output projection and its residual)."""
    from onnx import TensorProto as TP
    from onnx import helper as h
    from onnx import numpy_helper as nh

    rng = np.random.default_rng(2)
    w, b = rng.standard_normal((256, 96)).astype("float32") * 0.1, rng.standard_normal(96).astype("float32")
    nodes = [h.make_node("MatMul", ["x", "W"], ["m"]), h.make_node("Add", ["m", "b"], ["a"]),
             h.make_node("Add", ["a", "r"], ["y"])]
    g = h.make_graph(nodes, "proj", [h.make_tensor_value_info("x", TP.FLOAT, [1, 64, 256]),
                                     h.make_tensor_value_info("r", TP.FLOAT, [1, 64, 96])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [1, 64, 96])], [nh.from_array(w, "W"), nh.from_array(b, "b")])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def test_without_room_for_two_of_every_load_the_chunk_loop_loads_get_two_copies():
    # one 64x96 tile, the reduction in chunks of 16: one copy of everything fits the LB; two of
    # every load (the residual's tile and the bias too) do not, two of each chunk's loads (input
    # rows, weight rows) do, and those are what overlaps the MME's work on the chunk before
    (task,) = extract_tasks(import_onnx(_projection_model()), TARGET)
    func, plan = task.mod["main"], TilePlan((1, 64, 96), 16)
    kernel = read_kernel(lower_with_plan(func, plan))
    single = plan_lb(read_kernel(_lowered(task, plan, False)), HW)
    loaded = {st.dst.buffer for st in kernel.stages() if st.op == "dma" and st.dst.lb}
    chunked = {st.dst.buffer for st in stages_of(chunk_loops(kernel)) if st.op == "dma"}
    assert len(chunked) == 2 and len(loaded) == 4  # x, W per chunk; b, r per tile
    nbytes = {n: align(b.nbytes) for n, b in single.buffers.items()}
    assert single.total_bytes + sum(nbytes[n] for n in loaded) > HW.lb_bytes
    lb = plan_lb(kernel, HW)
    assert {n: len(b.slots) for n, b in lb.buffers.items()} == {n: 2 if n in chunked else 1 for n in lb.buffers}
    assert lb.total_bytes == single.total_bytes + sum(nbytes[n] for n in chunked) <= HW.lb_bytes
    args, expected = _inputs_and_llvm(task.mod, 3)
    program = build_program(lower_with_plan(func, plan), HW, "proj")
    (out,) = simulate(program, args).outputs
    assert max_relative_error([out], [expected.numpy()]) < 2e-2
    one_copy = build_program(_lowered(task, plan, False), HW, "proj")
    assert simulate(program, mode="timing").report.cycles < simulate(one_copy, mode="timing").report.cycles


def _ffn_model(k: int, n: int):
    """x @ W + b -> GELU (Erf form, as exported) with x a graph input: BERT's FFN1 in small."""
    from onnx import TensorProto as TP
    from onnx import helper as h
    from onnx import numpy_helper as nh

    rng = np.random.default_rng(4)
    consts = {"W": rng.standard_normal((k, n)) * 0.05, "b": rng.standard_normal(n), "sq": np.array(2 ** -0.5),
              "one": np.array(1.0), "half": np.array(0.5)}
    nodes = [h.make_node("MatMul", ["x", "W"], ["m"]), h.make_node("Add", ["m", "b"], ["a"]),
             h.make_node("Mul", ["a", "sq"], ["s"]), h.make_node("Erf", ["s"], ["e"]),
             h.make_node("Add", ["e", "one"], ["e1"]), h.make_node("Mul", ["a", "e1"], ["g"]),
             h.make_node("Mul", ["g", "half"], ["y"])]
    g = h.make_graph(nodes, "ffn", [h.make_tensor_value_info("x", TP.FLOAT, [1, 64, k])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [1, 64, n])],
                     [nh.from_array(v.astype("float32"), name) for name, v in consts.items()])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def test_an_epilogue_in_strips_leaves_room_for_deeper_double_buffered_chunks():
    # one 64x96 tile of a matmul + GELU: the GELU's float32 temporaries of the tile's size leave
    # no room for two copies of a chunk of 32; in 4 strips of 16 rows they hold a strip and do
    from tvm_dsa.tiling import _loads_overlapped

    (task,) = extract_tasks(import_onnx(_ffn_model(768, 96)), TARGET)
    func = task.mod["main"]
    whole, strips = TilePlan((1, 64, 96), 32), TilePlan((1, 64, 96), 32, strips=4)
    kernels = {p: read_kernel(lower_with_plan(func, p)) for p in (whole, strips)}
    lbs = {p: plan_lb(k, HW) for p, k in kernels.items()}
    assert not lbs[whole].double_buffered and lbs[strips].double_buffered
    (loop,) = [n for n in kernels[strips].tile_loops()[-1].body if getattr(n, "kind", None) == "strip"]
    vector = {st.dst.buffer for st in stages_of(loop.body) if st.op == "vector"}
    assert loop.extent == 4 and len(vector) == 6  # add, mul, erf, add, mul, mul
    assert all(lbs[strips].buffers[n].nbytes * 4 == lbs[whole].buffers[n].nbytes for n in vector)
    # the chunk loop and the tile-level loads are as they were
    assert [st.name for st in stages_of(chunk_loops(kernels[strips]))] == \
        [st.name for st in stages_of(chunk_loops(kernels[whole]))]
    args, expected = _inputs_and_llvm(task.mod, 5)
    cycles = {}
    for plan in (whole, strips, TilePlan((1, 64, 96), 16)):
        program = build_program(lower_with_plan(func, plan), HW, "ffn")
        (out,) = simulate(program, args).outputs
        assert max_relative_error([out], [expected.numpy()]) < 2e-2
        cycles[plan] = simulate(program, mode="timing").report.cycles
    # faster than one copy of the chunk of 32 and than two copies of a chunk of 16
    assert cycles[strips] < min(cycles[whole], cycles[TilePlan((1, 64, 96), 16)])
    # and the choice of a stitched kernel's layer, from a plan with chunks of 32 and one copy
    assert _loads_overlapped(func, anchor_info(func), whole, lower_with_plan(func, whole), HW, None)[1] == strips


def test_strips_that_do_not_divide_the_rows_are_refused():
    from tvm_dsa.kernel.analysis import Unsupported

    (task,) = extract_tasks(import_onnx(_ffn_model(64, 96)), TARGET)
    with pytest.raises(Unsupported, match=r"3 strips do not divide the write-back's rows \(64\)"):
        lower_with_plan(task.mod["main"], TilePlan((1, 64, 96), 32, strips=3))


def test_a_tiles_stores_wait_behind_its_next_tiles_first_loads(conv_task):
    """16 one-row tiles on a cluster's 8 cores, two each, in two chunks, double-buffered, on a chip
    with one DMA queue per core: each core issues its second tile's first-chunk loads before its
    first tile's stores, which wait for the product and the epilogue and, in the core's in-order
    DMA queue, held those loads back. Both orders compute the kernel; the stores behind the loads
    take fewer cycles."""
    from tvm_dsa import isa
    from tvm_dsa.emit import emitter as emit

    args, expected = _inputs_and_llvm(conv_task.mod, 1)
    lowered = _lowered(conv_task, TilePlan((1, 16, 1, 16), 8), True)
    kernel = read_kernel(lowered)
    (chunks,) = chunk_loops(kernel)
    _, first, _ = emit.store_split(kernel.tile_loops()[-1].body, plan_lb(kernel, HW))  # loads of a chunk
    streams, cycles = {}, {}
    one_queue = replace(HW, prefetch_dma=False)
    for held in (True, False):
        program = build_program(lowered, one_queue, "conv", hold_stores=held)
        (out,) = simulate(program, args).outputs  # functional: every dependency checked
        assert max_relative_error([out], [expected.numpy()]) < 2e-2
        cycles[held] = simulate(program, mode="timing").report.cycles
        seq: dict = {}
        for ins in program.expanded().kernels[0].instructions:
            if isinstance(ins, isa.Dma):
                seq.setdefault(ins.core, []).append("load" if ins.dst.mem == "lb" else "store")
        streams[held] = seq
    assert sorted(streams[True]) == list(range(HW.cores_per_cluster))
    for core, seq in streams[False].items():
        tile = seq.index("store")  # one tile's loads, then its stores
        stores = seq[tile:].index("load")
        assert seq == (["load"] * tile + ["store"] * stores) * 2
        # held back: the next tile's first-chunk loads go ahead of the stores, the last tile's
        # stores at the end
        assert streams[True][core] == (["load"] * tile + ["load"] * first + ["store"] * stores
                                       + ["load"] * (tile - first) + ["store"] * stores)
        assert tile == chunks.extent * first  # the chunk's loads are all the tile loads
    assert cycles[True] < cycles[False]


def test_on_a_chip_with_a_second_dma_queue_the_stores_take_it(conv_task):
    """The tiles of the test above on stcp920, whose cores have a second DMA queue (``pdma``,
    ``prefetch_dma``): every store out of an LB goes there, every load stays on the first, so a
    store waiting for its tile's epilogue holds no load back, held or not; the kernel is computed
    and is no slower than with one queue and the stores held."""
    from tvm_dsa import isa

    assert HW.prefetch_dma
    args, expected = _inputs_and_llvm(conv_task.mod, 1)
    lowered = _lowered(conv_task, TilePlan((1, 16, 1, 16), 8), True)
    cycles = {}
    for hw in (HW, replace(HW, prefetch_dma=False)):
        program = build_program(lowered, hw, "conv")
        (out,) = simulate(program, args).outputs
        assert max_relative_error([out], [expected.numpy()]) < 2e-2
        cycles[hw.prefetch_dma] = simulate(program, mode="timing").report.cycles
        dmas = [ins for ins in program.expanded().kernels[0].instructions if isinstance(ins, isa.Dma)]
        stores = [ins for ins in dmas if ins.src.mem == "lb"]
        assert stores and len(stores) < len(dmas)
        assert all(ins.prefetch == (hw.prefetch_dma and ins.src.mem == "lb") for ins in dmas)
    assert cycles[True] <= cycles[False]


def _swish_model(rows: int, k: int, n: int):
    """x @ W + b -> x * sigmoid(x): Conformer's first feed-forward layer in small."""
    from onnx import TensorProto as TP
    from onnx import helper as h
    from onnx import numpy_helper as nh

    rng = np.random.default_rng(6)
    w, b = rng.standard_normal((k, n)).astype("float32") * 0.05, rng.standard_normal(n).astype("float32")
    nodes = [h.make_node("MatMul", ["x", "W"], ["m"]), h.make_node("Add", ["m", "b"], ["a"]),
             h.make_node("Sigmoid", ["a"], ["s"]), h.make_node("Mul", ["a", "s"], ["y"])]
    g = h.make_graph(nodes, "swish", [h.make_tensor_value_info("x", TP.FLOAT, [1, rows, k])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [1, rows, n])], [nh.from_array(w, "W"), nh.from_array(b, "b")])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def test_an_epilogue_in_strips_leaves_room_for_a_second_accumulator():
    """Tiles of 128 x 32 of a matmul + swish, chunks of 32 double-buffered: the swish's float32
    temporaries of the tile's size leave no room for a second accumulator, so each tile's first
    product waits for the previous tile's epilogue (the sigmoid on the 16-lane vector core). In 4
    strips the temporaries hold a strip, the accumulator gets two places
    (``tiling._strips_for_two_accumulators``), and the next tile's products run while the
    epilogue drains the other: the kernel is computed, in fewer cycles."""
    from tvm_dsa import isa
    from tvm_dsa.tiling import _strips_for_two_accumulators, _two_accumulators

    (task,) = extract_tasks(import_onnx(_swish_model(1024, 256, 128)), TARGET)
    func = task.mod["main"]
    plan = TilePlan((1, 128, 32), 32)
    whole = lower_with_plan(func, plan)
    assert not _two_accumulators(read_kernel(whole), HW, None)
    stripped = lower_with_plan(func, _strips_for_two_accumulators(func, plan, HW, None))
    kernel = read_kernel(stripped)
    (loop,) = [n for n in kernel.tile_loops()[-1].body if getattr(n, "kind", None) == "strip"]
    lb = plan_lb(kernel, HW)
    (acc,) = accumulators(kernel)
    assert len(lb.buffers[acc].slots) == 2 and lb.total_bytes <= HW.lb_bytes
    assert loop.extent in (2, 4, 8)  # the fewest strips that make the room
    if loop.extent > 2:
        smaller = lower_with_plan(func, TilePlan((1, 128, 32), 32, strips=loop.extent // 2))
        assert not _two_accumulators(read_kernel(smaller), HW, None)
    args, expected = _inputs_and_llvm(task.mod, 7)
    cycles, gb = {}, frozenset(range(len(func.params) - 1))
    for name, lowered in (("whole", whole), ("strips", stripped)):
        program = build_program(lowered, HW, "swish")
        (out,) = simulate(program, args).outputs  # functional: every dependency checked
        assert max_relative_error([out], [expected.numpy()]) < 2e-2
        # timed as in a stitched kernel, loading from the GB (from DDR the loads bind)
        cycles[name] = simulate(build_program(lowered, HW, "swish", gb=gb), mode="timing").report.cycles
        ins = program.expanded().kernels[0].instructions
        mmes = [y for y in ins if isinstance(y, isa.Mme) and y.core == 0]
        assert len(mmes) == 4 * 256 // 32  # four tiles a core, 8 chunks each
        # one accumulator: each later tile's first product waits for the epilogue before it; two:
        # the tiles take turns, the first product of each writes the place the tile before did not
        firsts = [mmes[t * 8] for t in range(4)]
        waits = [any(isinstance(ins[d], isa.Vector) for d in y.deps) for y in firsts[1:]]
        places = [y.dst.offset for y in firsts]
        if name == "whole":
            assert waits == [True] * 3 and len(set(places)) == 1
        else:
            assert places[0] == places[2] != places[1] == places[3]
    assert cycles["strips"] < 0.95 * cycles["whole"]


def test_a_tile_of_part_of_the_arrays_columns_is_widened_to_whole_passes():
    """Tiles of 66 x 48 of a matmul + swish: a product of 48 columns takes two passes of the PE
    array's 32, one half full. ``tiling._full_columns`` rounds the N tile up to 64 (it divides the
    192 columns), in the fewest epilogue strips that fit the LB; the kernel is computed, a
    64-column product costs less than 4/3 of a 48-column one (the cost model's passes), and the
    layer's products take fewer MME cycles."""
    from tvm_dsa import isa
    from tvm_dsa.runtime.cost import mme_cycles
    from tvm_dsa.tiling import _full_columns

    (task,) = extract_tasks(import_onnx(_swish_model(264, 256, 192)), TARGET)
    func = task.mod["main"]
    narrow = TilePlan((1, 66, 48), 32)
    wide = _full_columns(func, anchor_info(func), narrow, HW, None)
    assert (wide.tiles, wide.chunk) == ((1, 66, 64), 32)
    if wide.strips > 1:  # the fewest strips: half as many do not fit
        with pytest.raises(CodegenError):
            plan_lb(read_kernel(lower_with_plan(func, replace(wide, strips=wide.strips // 2))), HW)
    assert _full_columns(func, anchor_info(func), wide, HW, None) is None  # whole passes already
    assert 3 * mme_cycles(1, 66, 64, 32, HW) < 4 * mme_cycles(1, 66, 48, 32, HW)
    args, expected = _inputs_and_llvm(task.mod, 8)
    busy = {}
    for plan in (narrow, wide):
        program = build_program(lower_with_plan(func, plan), HW, "swish")
        (out,) = simulate(program, args).outputs
        assert max_relative_error([out], [expected.numpy()]) < 2e-2
        busy[plan] = sum(mme_cycles(1, *y.shape[1:], HW) for y in program.expanded().kernels[0].instructions
                         if isinstance(y, isa.Mme))
    assert busy[wide] < busy[narrow]
