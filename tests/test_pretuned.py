"""Pre-tuned records shipped in the package (seed 004's TopHub): what each preset's database holds,
that the ``dsa`` pipeline applies the target's preset's by default (not another preset's, not with
``database=False``), stays exact, and how ``merge_records`` keeps the fastest record per workload
and chip."""

import pytest
import tvm_ffi
from tvm import s_tir, te
from tvm.s_tir import meta_schedule as ms

from tvm_dsa import hardware
from tvm_dsa.emit.emitter import build_program
from tvm_dsa.harness import Compiled, import_onnx, load_model, max_relative_error
from tvm_dsa.models import example_inputs
from tvm_dsa.runtime import simulate
from tvm_dsa.schedule.set.scheduler import SetOptions
from tvm_dsa.schedule.set.search import Anneal
from tvm_dsa.tir_passes.tile import TilePlan
from tvm_dsa.tiling import lower_kernel
from tvm_dsa.tuning import (
    default_seconds, extract_tasks, load_database, merge_records, pretuned, records_dir, tuned_kernel,
    tuned_kernels, workload
)
from tvm_dsa.tuning.shipped import FILES, read_records
from tvm_dsa.tuning.space import lower_scheduled, sample_tiling

TARGET = "dsa/stcp920"
HW = hardware.get(TARGET)


@pytest.mark.parametrize("chip", ["stcp920", "set-edge16-fp16", "set-cloud144-fp16", "set-edge16", "set-cloud144"])
def test_the_shipped_database_holds_one_record_per_workload_of_its_preset(chip):
    database = pretuned(chip)
    assert database is not None
    records = database.get_all_tuning_records()
    assert records and all(str(r.target.attrs["model"]) == chip for r in records)
    hashes = [tvm_ffi.structural_hash(r.workload.mod) for r in records]
    assert len(set(hashes)) == len(hashes)
    # looked up one at a time (by the hash each workload line begins with), each is found
    fresh = read_records(records_dir(chip))
    assert all(fresh.has_workload(r.workload.mod) for r in records)
    # package data stays small: the compressed files only
    assert sorted(f.name for f in records_dir(chip).iterdir()) == sorted(FILES)
    assert sum(f.stat().st_size for f in records_dir(chip).iterdir()) < 1 << 20
    # a chip of one's own (a preset renamed) has no records: nothing is applied to it
    own = hardware.register({**hardware.get(chip).to_dict(), "name": f"own-{chip}"}, override=True)
    assert pretuned(own.name) is None


def test_the_dsa_pipeline_applies_them_by_default_and_stays_exact():
    model = load_model("resnet50", tiny=True)
    mod, inputs = import_onnx(model), example_inputs(model)
    database = pretuned("stcp920")
    tasks = extract_tasks(mod, TARGET)
    shipped = [t for t in tasks if database.has_workload(t.mod)]
    assert shipped  # the tiny benchmark ResNet-50's kernels are among the shipped ones
    assert set(Compiled.build(mod, TARGET).offload.tuned) == {t.name for t in shipped}  # the compiler's schedule
    # layerwise: one kernel per task, so the model's cycles are the tasks' sum
    default, off = Compiled.build(mod, TARGET, "layerwise"), Compiled.build(mod, TARGET, "layerwise", database=False)
    assert set(default.offload.tuned) == {t.name for t in shipped} and off.offload.tuned == []
    run = default.run(inputs)
    # against the untuned DSA build (which the model tests check against llvm and onnxruntime):
    # the records change how kernels are tiled, not what they compute
    assert max_relative_error(run.outputs, off.run(inputs).outputs) < 1e-2
    # each kernel runs as its record measured it: the model's cycles differ by the records' gains
    gain = 0
    for task in shipped:
        lowered = tuned_kernel(database, task.mod["main"], HW)
        tuned = simulate(build_program(lowered, HW, task.name), mode="timing").report.seconds
        gain += task.calls * round((task.default_seconds - tuned) * HW.clock_hz)
    assert gain >= 0
    assert off.run(inputs, mode="timing").report.cycles - default.run(inputs, mode="timing").report.cycles == gain


def test_set_trees_use_no_records():
    # SET tiles its layers to half the LB (the other half keeps data between layers); records are
    # tuned for the whole LB, so a SET compile is the one without them
    edge = "dsa/set-edge16-fp16"
    model = load_model("resnet50", tiny=True)
    mod, inputs = import_onnx(model), example_inputs(model)
    assert Compiled.build(mod, edge, "layerwise").offload.tuned  # the preset has records: layerwise replays them
    options = SetOptions(Anneal(beta=1, seed=0))
    tree, off = (Compiled.build(mod, edge, "set", options, database=d) for d in (None, False))
    assert tree.offload.tuned == [] and tree.offload.trees
    assert tree.run(inputs, mode="timing").report.cycles == off.run(inputs, mode="timing").report.cycles


def test_a_target_gets_its_own_presets_records_not_another_presets():
    edge = "dsa/set-edge16-fp16"
    hw = hardware.get(edge)
    model = load_model("resnet50", tiny=True)
    mod, inputs = import_onnx(model), example_inputs(model)
    own, other = pretuned(hw.name), pretuned("stcp920")
    tasks = extract_tasks(mod, edge)
    shipped = {t.name for t in tasks if own.has_workload(t.mod)}
    # layerwise: on this mesh chip the default may pick set, which replays no records
    default, off = Compiled.build(mod, edge, "layerwise"), Compiled.build(mod, edge, "layerwise", database=False)
    assert shipped and set(default.offload.tuned) == shipped and off.offload.tuned == []
    assert max_relative_error(default.run(inputs).outputs, off.run(inputs).outputs) < 1e-2
    # a kernel both presets have records for, tiled otherwise by stcp920's record: on the edge
    # chip the pipeline lowers it as the edge preset's record says
    lookup = tuned_kernels(None, hw)
    differ = 0
    for task in tasks:
        if not (own.has_workload(task.mod) and other.has_workload(task.mod)):
            continue
        func = task.mod["main"]
        (record,) = other.get_top_k(other.commit_workload(task.mod), 1)
        sch = s_tir.Schedule(workload(func))
        record.trace.apply_to_schedule(sch, remove_postproc=False)
        as_stcp920 = lower_scheduled(sch.mod["main"], hw)
        lowered = lookup(func)
        assert tvm_ffi.structural_equal(lowered, tuned_kernel(own, func, hw))
        differ += not tvm_ffi.structural_equal(lowered, as_stcp920)
    assert differ


def _matmul(n: int):
    a, b = te.placeholder((n, n), name="A"), te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), "k")
    return te.create_prim_func([a, b, te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k))])


def _commit(database, func, seconds: float, chip: str, plan: TilePlan | None = None) -> None:
    """A record of ``func`` tiled by ``plan`` (default: the default tiling) stored as measured in
    ``seconds`` on ``chip``."""
    wl = workload(func)
    sch = s_tir.Schedule(wl)
    sample_tiling(sch, (0, 1), plan or lower_kernel(func, HW)[1], False)
    database.commit_tuning_record(ms.database.TuningRecord(
        sch.trace, database.commit_workload(wl), [seconds], hardware.make_target(f"dsa/{chip}"),
        ms.arg_info.ArgInfo.from_prim_func(wl["main"])))


def test_merge_remeasures_the_fastest_records_and_keeps_those_as_fast_as_the_default(tmp_path):
    small, mid, large = _matmul(64), _matmul(96), _matmul(128)
    thin = TilePlan((16, 32), 16)  # PE-array-sized tiles: slower than the default on all three
    for func in (mid, large):
        assert replayed(func, thin) > default_seconds(func, HW)
    a, b = load_database(tmp_path / "a"), load_database(tmp_path / "b")
    _commit(a, small, 1e-5, "stcp920")
    _commit(b, small, 5e-6, "stcp920")
    _commit(b, small, 1e-9, "set-edge16")  # another chip's: never merged
    _commit(b, mid, 1e-9, "stcp920", thin)  # only a record slower than the default: none shipped
    _commit(b, large, 3e-5, "stcp920")
    _commit(b, large, 1e-9, "stcp920", thin)  # a stale time: re-measured, slower than the default
    assert merge_records([a, tmp_path / "b"], "stcp920", tmp_path / "out") == 2
    merged = read_records(tmp_path / "out")
    times = {tvm_ffi.structural_hash(r.workload.mod): float(r.run_secs[0]) for r in merged.get_all_tuning_records()}
    # the default tiling's records (not large's stale one), with the time of their program now
    assert times == {tvm_ffi.structural_hash(workload(f)): default_seconds(f, HW) for f in (small, large)}
    # merging into the folder again with it as a source keeps it
    assert merge_records([tmp_path / "out"], "stcp920", tmp_path / "out") == 2
    assert sorted(tmp_path.joinpath("out").iterdir()) == sorted(tmp_path / "out" / n for n in FILES)


def replayed(func, plan: TilePlan) -> float:
    sch = s_tir.Schedule(workload(func))
    sample_tiling(sch, (0, 1), plan, False)
    return simulate(build_program(lower_scheduled(sch.mod["main"], HW), HW, "k"), mode="timing").report.seconds
