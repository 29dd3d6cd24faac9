"""Meta-schedule on the DSA: the design space, the LB check, builder and runner measuring with the
simulator, the database applied at compile time (numerics against llvm).

One small tuning run (a conv kernel, a few trials) is shared by the module: meta-schedule's first
use imports every TVM tensor intrinsic (about 20-30 s), once per process.
"""

import itertools
import json

import numpy as np
import onnx
import pytest
import tvm
import tvm_ffi
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh
from tvm import relax, s_tir, te
from tvm.s_tir import meta_schedule as ms

import tvm_dsa
from tvm_dsa import hardware
from tvm_dsa.emit.emitter import build_program
from tvm_dsa.harness import Compiled, import_onnx, max_relative_error
from tvm_dsa.runtime import simulate
from tvm_dsa.tir_passes.tile import TilePlan, anchor_info
from tvm_dsa.tiling import lower_kernel
from tvm_dsa.tuning import DSABuilder, extract_tasks, load_database, tuned_kernel, workload
from tvm_dsa.tuning.space import (FitsDSA, StepTile, below_floor, capacity_boxes, design_spaces, divisors, fits_lb,
                                  sample_tiling, tile_orders)

TARGET = "dsa/stcp920"
HW = hardware.get(TARGET)
#: the tests that tune run in one xdist worker: the first tuning of a process costs 30-100 s
#: (meta-schedule imports TVM's tensor intrinsics), paid once
TUNES = pytest.mark.xdist_group("meta-schedule-tuning")


def _matmul(n: int):
    a = te.placeholder((n, n), "float32", name="A")
    b = te.placeholder((n, n), "float32", name="B")
    k = te.reduce_axis((0, n), "k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return te.create_prim_func([a, b, c])


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, conv_relu):
    model = conv_relu(16, 32, 16)
    mod = import_onnx(model)
    work_dir = tmp_path_factory.mktemp("tune")
    seen = []
    result = tvm_dsa.tune(mod, TARGET, trials=8, work_dir=work_dir, per_iter=8, population=16,
                          progress=lambda done, total: seen.append((done, total)))
    return model, mod, work_dir, result, seen


def _seconds(func) -> float:
    return simulate(build_program(func, HW, "k"), mode="timing").report.seconds


def test_tile_orders_permute_only_loops_with_several_tiles():
    orders = tile_orders((1, 32, 16, 16))
    assert orders[0] == (0, 1, 2, 3) and len(orders) == 6 == len(set(orders))
    assert all(o[0] == 0 and sorted(o) == [0, 1, 2, 3] for o in orders)
    assert tile_orders((1, 1, 8)) == [(0, 1, 2)]


def test_design_spaces_split_every_spatial_loop_and_the_chunk_by_sampling():
    func = _matmul(64)
    spaces = design_spaces(s_tir.Schedule(workload(func)))
    assert len(spaces) == 2  # i, j: two orders
    for sch in spaces:
        samples = [inst for inst in sch.trace.insts if inst.kind.name == "SamplePerfectTile"]
        assert len(samples) == 3  # i, j and the reduction chunk


def test_fits_dsa_rejects_a_tile_larger_than_the_lb():
    func = _matmul(256)  # one whole fp32-accumulated 256x256 tile is far beyond a 64 KiB LB
    _, plan = lower_kernel(func, HW)
    post = FitsDSA(HW, anchor_info(func))
    whole, default = s_tir.Schedule(workload(func)), s_tir.Schedule(workload(func))
    sample_tiling(whole, (0, 1), TilePlan((256, 256), 256), False)
    sample_tiling(default, (0, 1), plan, False)
    assert post.apply(default) and not post.apply(whole)
    (res,) = DSABuilder().build([ms.builder.BuilderInput(whole.mod, hardware.make_target(TARGET))])
    assert res.artifact_path is None and "not a DSA kernel" in res.error_msg and "exceeds the LB" in res.error_msg


def _matmul_epilogue(m: int, n: int, k: int, stages: int):
    """``(A @ B + bias)`` scaled by ``stages`` factors (0.5, 1.0, ...), the scaled tiles summed at
    the end: all of them are live at once, so each takes its own LB place (an elementwise chain
    would not: ``plan_lb`` computes it in place)."""
    a = te.placeholder((m, k), "float32", name="A")
    b = te.placeholder((k, n), "float32", name="B")
    bias = te.placeholder((n,), "float32", name="bias")
    r = te.reduce_axis((0, k), "k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    d = te.compute((m, n), lambda i, j: c[i, j] + bias[j], name="D")
    parts = [te.compute((m, n), _scaled(d, 0.5 * (s + 1)), name=f"E{s}") for s in range(stages)]
    out = te.compute((m, n), lambda i, j: sum(p[i, j] for p in parts), name="F")
    return workload(te.create_prim_func([a, b, bias, out]))


def _scaled(t, f: float):
    return lambda i, j: t[i, j] * f


def _replayed(mod, spaces, count: int):
    """``count`` samples of ``spaces`` as the evolutionary search draws them: each space's trace
    replayed without its decisions, so every sampling instruction draws anew (seeds 1..count)."""
    for seed in range(1, count + 1):
        trace = s_tir.schedule.Trace(spaces[seed % len(spaces)].trace.insts, {})
        sch = s_tir.Schedule(mod, seed=seed)
        trace.apply_to_schedule(sch, remove_postproc=True)
        yield sch


def test_capacity_boxes_sample_tilings_that_fit_where_uniform_samples_do_not():
    mod = _matmul_epilogue(64, 2048, 512, 8)
    func, info = mod["main"], anchor_info(mod["main"])
    # the divisor grid (M tile x N tile x chunk), each tiling lowered: 2.5% of it clears the PE
    # array's floor (M >= 16, N >= 32) and fits the LB once, where every stage's M x N tile
    # takes room
    grid = list(itertools.product(divisors(64), divisors(2048), divisors(512)))
    good = {g for g in grid if not below_floor(info, g[:2], HW) and fits_lb(func, TilePlan(g[:2], g[2]), HW)}
    assert len(grid) == 840 and len(good) == 21
    # the boxes offer exactly tilings of that 2.5%, and all of it
    boxes = capacity_boxes(func, HW)
    assert set().union(*(itertools.product(*box.tiles, box.chunk) for box in boxes)) == good
    spaces = design_spaces(s_tir.Schedule(mod), HW)
    orders = len(tile_orders(info.spatial))
    assert len(spaces) == orders * (1 + len(boxes))
    post = FitsDSA(HW, info)
    # uniform samples (any divisor per loop) all fail; the boxes' samples fail only when two copies
    # of their tiles do not fit (double buffering is sampled too)
    assert not any(post.apply(sch) for sch in _replayed(mod, spaces[:orders], 64))
    fitting = [sch for sch in _replayed(mod, spaces[orders:], 64) if post.apply(sch)]
    assert len(fitting) >= 32
    # two of them, built and simulated, compute the kernel
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(s).astype("float32") * 0.1 for s in ((64, 512), (512, 2048)))
    bias = rng.standard_normal(2048).astype("float32")
    expected = (a @ b + bias) * sum(0.5 * (s + 1) for s in range(8))
    tilings = {}
    for sch in fitting:
        tilings.setdefault(tvm_ffi.structural_hash(sch.mod["main"]), sch)
    for sch in list(tilings.values())[:2]:
        program = build_program(tvm_dsa.tuning.space.lower_scheduled(sch.mod["main"], HW), HW, "ffn")
        (out,) = simulate(program, [a, b, bias]).outputs
        assert max_relative_error([out], [expected]) < 2e-2  # fp16 storage on stcp920


def test_step_tile_moves_a_box_decision_to_a_neighbouring_size():
    func = _matmul(256)
    (box, *_) = capacity_boxes(func, HW)
    sch = s_tir.Schedule(workload(func))
    sample_tiling(sch, (0, 1), box=box)
    trace = sch.trace
    tiles = [i for i in trace.insts if i.kind.name == "SampleCategorical" and len(i.attrs[0]) > 1][:-1]
    assert tiles  # the box offers several sizes of some tile (the last categorical: double buffering)
    stepped = StepTile().apply(trace)
    moved = [(a, int(trace.decisions[a]), int(stepped.decisions[b]))
             for a, b in zip(trace.insts, stepped.insts)
             if a.kind.name == "SampleCategorical" and int(trace.decisions[a]) != int(stepped.decisions[b])]
    assert len(moved) == 1 and moved[0][0] in tiles and abs(moved[0][1] - moved[0][2]) == 1


def test_the_vector_floor_is_the_widest_tile_a_reshape_allows():
    # out[i, j] = A[j // 16, i, j % 16]: a tile of j must divide 16 to keep the indices affine, so
    # the 64-element floor of other kernels would rule out every tiling
    a = te.placeholder((4, 8, 16), "float32", name="A")
    func = te.create_prim_func([a, te.compute((8, 64), lambda i, j: a[j // 16, i, j % 16], name="B")])
    info = anchor_info(func)
    assert info.spatial == (8, 64) and info.align[-1] == 16
    assert below_floor(info, (8, 16), HW) is None and "below 16 elements" in below_floor(info, (8, 8), HW)
    boxes = capacity_boxes(func, HW)
    assert boxes and all(box.tiles[-1] == (16,) for box in boxes)
    for box in boxes:  # every tiling a box offers lowers within the LB
        assert all(fits_lb(func, TilePlan(tiles, None), HW) for tiles in itertools.product(*box.tiles))


def test_a_default_whose_trace_does_not_lower_is_not_committed(tmp_path):
    from tvm_dsa.models import TINY, get_model
    from tvm_dsa.kernel.analysis import Unsupported
    from tvm_dsa.tuning import _best_seconds, _commit_default
    from tvm_dsa.tuning.measure import build_candidate

    tasks = extract_tasks(import_onnx(get_model("vit_b16", **TINY["vit_b16"])), TARGET)
    task = next(t for t in tasks if "transpose" in t.name and t.name.endswith("concatenate_add1"))
    # lower_kernel tiles the head merge by its simplified indices; the same tiling of the workload
    # as it is leaves a raw reshape index non-affine
    sch = s_tir.Schedule(task.mod)
    sample_tiling(sch, tile_orders(anchor_info(task.mod["main"]).spatial)[0], task.default_plan)
    with pytest.raises(Unsupported, match="not affine"):
        build_candidate(sch.mod["main"], HW)
    database = load_database(tmp_path)
    _commit_default(database, task, hardware.make_target(TARGET))
    assert not database.has_workload(task.mod)
    assert _best_seconds(database, task, HW) == task.default_seconds


@TUNES
def test_tasks_are_the_offloaded_kernels_with_their_default_time(tuned):
    model, mod, *_ = tuned
    (task,) = extract_tasks(mod, TARGET)  # conv + relu fused into one kernel
    lowered, plan = lower_kernel(task.mod["main"], HW)
    assert task.calls == 1 and task.default_plan == plan
    assert task.default_seconds == _seconds(lowered)


@TUNES
def test_records_are_simulated_times_and_tuning_never_loses(tuned):
    _, mod, work_dir, result, seen = tuned
    (task,) = result.tasks
    assert task.trials >= 8 and seen[-1] == (8, 8)
    database = load_database(work_dir)
    wl = extract_tasks(mod, TARGET)[0].mod
    records = database.get_top_k(database.commit_workload(wl), 100)
    assert len(records) >= 2  # the default tiling and measured candidates
    best = records[0]
    assert round(float(best.run_secs[0]) * HW.clock_hz) == task.tuned_cycles <= task.default_cycles
    # the runner's time is the simulator's time of the program the record's trace produces
    for rec in records[:3]:
        sch = s_tir.Schedule(wl)
        rec.trace.apply_to_schedule(sch, remove_postproc=False)
        assert _seconds(tvm_dsa.tuning.space.lower_scheduled(sch.mod["main"], HW)) == float(rec.run_secs[0])
    assert result.cycles(True) == task.tuned_cycles and result.to_dict()["tasks"][0]["name"] == task.name


@TUNES
def test_compiling_with_the_database_uses_the_records_and_stays_exact(tuned):
    model, mod, work_dir, result, _ = tuned
    x = np.random.default_rng(1).standard_normal((1, 16, 16, 16)).astype("float32")
    ref = Compiled.build(mod, "llvm").run({"x": x}).outputs
    # the tuner times each task as layerwise runs it: one kernel, the record's tiling
    ex = tvm.compile(mod, target=TARGET, relax_pipeline=tvm_dsa.pipeline("layerwise", database=str(work_dir)))
    assert tvm_dsa.pipeline_result().tuned == [result.tasks[0].name]
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    assert max_relative_error([out], ref) < 2e-2
    assert tvm_dsa.last_report().cycles == result.tasks[0].tuned_cycles
    # the registered "dsa" pipeline finds the database in scope
    with load_database(work_dir):
        tvm.compile(mod, target=TARGET, relax_pipeline="dsa")
    assert tvm_dsa.pipeline_result().tuned == [result.tasks[0].name]
    tvm.compile(mod, target=TARGET, relax_pipeline="dsa")
    assert tvm_dsa.pipeline_result().tuned == []


@TUNES
def test_records_of_another_chip_are_not_applied(tuned):
    _, mod, work_dir, *_ = tuned
    other = hardware.get("set-edge16-fp16")
    (task,) = extract_tasks(mod, TARGET)
    assert tuned_kernel(load_database(work_dir), task.mod["main"], other) is None


@TUNES
def test_tune_command_and_compare_with_its_database(conv_onnx, tmp_path, capsys):
    from tvm_dsa.cli import main

    path, _ = conv_onnx
    work_dir = str(tmp_path / "db")
    assert main(["tune", path, "--trials", "4", "--per-iter", "4", "--work-dir", work_dir, "--json"]) == 0
    (task,) = json.loads(capsys.readouterr().out)["tasks"]
    assert task["trials"] >= 4 and task["tuned_cycles"] <= task["default_cycles"]
    assert main(["compare", path, "--schedule", "layerwise", "--database", work_dir, "--no-records", "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    # the shipped records have nothing for this kernel: the default build is untuned
    assert [(r["records"], r["tuned_kernels"]) for r in runs] == [("none", 0), ("shipped", 0), (work_dir, 1)]
    assert [r["cycles"] for r in runs] == [task["default_cycles"], task["default_cycles"], task["tuned_cycles"]]


def test_bad_tuning_input_is_named(tmp_path, conv_relu):
    mod = import_onnx(conv_relu(16, 32, 16))
    with pytest.raises(ValueError, match="trials must be at least 1"):
        tvm_dsa.tune(mod, TARGET, trials=0, work_dir=tmp_path)
    with pytest.raises(ValueError, match="is not a directory"):
        tvm.compile(mod, target=TARGET, relax_pipeline=tvm_dsa.pipeline(database=str(tmp_path / "missing")))
    empty = onnx.helper.make_model(h.make_graph([h.make_node("Gather", ["t", "i"], ["y"])], "g",
                                                [h.make_tensor_value_info("i", TP.INT64, [4])],
                                                [h.make_tensor_value_info("y", TP.FLOAT, [4, 8])],
                                                [nh.from_array(np.zeros((10, 8), "float32"), "t")]),
                                   opset_imports=[h.make_opsetid("", 17)])
    empty.ir_version = 10
    with pytest.raises(ValueError, match="nothing to tune"):
        tvm_dsa.tune(import_onnx(empty), TARGET, trials=4, work_dir=tmp_path)
