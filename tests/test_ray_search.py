"""Tuning and SET's restarts on Ray against the same work in this process: the builder and the
runner whose futures are Ray tasks give the in-process records, restarts as Ray tasks give the
in-process trees, and every kernel of a model gets its trials. One local Ray of 2 CPUs for the
module (about 7 s to start); the tuning runs share meta-schedule's first use (tens of seconds), so
the module runs in one xdist worker."""

import json
from contextlib import contextmanager

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh
from tvm import s_tir, te
from tvm.s_tir import meta_schedule as ms

import tvm_dsa
from tvm_dsa import hardware
from tvm_dsa.cli import main
from tvm_dsa.cli import args as cli_args
from tvm_dsa.dse import OnRay, ray_engine
from tvm_dsa.harness import import_onnx, layer_graph, load_model
from tvm_dsa.schedule.set.ops import LS, SET
from tvm_dsa.schedule.set.search import Anneal, anneal, anneal_each, best
from tvm_dsa.emit.emitter import build_program
from tvm_dsa.tir_passes.tile import TilePlan
from tvm_dsa.tiling import lower_kernel
from tvm_dsa.tuning import DSABuilder, extract_tasks, workload
from tvm_dsa.tuning.measure import BUILT
from tvm_dsa.tuning.space import lower_scheduled, sample_tiling

pytestmark = pytest.mark.xdist_group("ray-search")
TARGET = "dsa/stcp920"
TRIALS = 2  # per kernel: below the default round of 16, which used to leave all but one kernel without trials


@pytest.fixture(scope="module")
def ray():
    with ray_engine(None, 2) as on_ray:
        yield on_ray


@pytest.fixture(scope="module")
def three_kernels_onnx():
    """Conv + ReLU, max-pool, conv + ReLU at 16x16 and 8x8: three distinct DSA kernels, each
    measured in milliseconds."""
    rng = np.random.default_rng(0)
    w1 = nh.from_array((rng.standard_normal((16, 8, 3, 3)) * 0.2).astype("float32"), "W1")
    w2 = nh.from_array((rng.standard_normal((32, 16, 3, 3)) * 0.2).astype("float32"), "W2")
    nodes = [h.make_node("Conv", ["x", "W1"], ["c1"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c1"], ["r1"]),
             h.make_node("MaxPool", ["r1"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             h.make_node("Conv", ["p", "W2"], ["c2"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c2"], ["y"])]
    g = h.make_graph(nodes, "three", [h.make_tensor_value_info("x", TP.FLOAT, [1, 8, 16, 16])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [1, 32, 8, 8])], [w1, w2])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 10
    return model


@pytest.fixture(scope="module")
def three_kernels(three_kernels_onnx):
    return import_onnx(three_kernels_onnx)


@pytest.fixture(scope="module")
def in_process(three_kernels, tmp_path_factory):
    """The model tuned in this process, with the progress it reported."""
    work_dir = tmp_path_factory.mktemp("in-process")
    seen = []
    result = tvm_dsa.tune(three_kernels, TARGET, trials=TRIALS, work_dir=work_dir,
                          progress=lambda done, total: seen.append((done, total)))
    return result, work_dir, seen


def _records(work_dir) -> list[dict]:
    return [json.loads(line) for line in (work_dir / "database_tuning_record.json").read_text().splitlines()]


def test_every_kernel_gets_its_trials(three_kernels, in_process):
    """``trials`` is per kernel, in rounds no larger than it: each of the three kernels is measured
    TRIALS times (the default round of 16 once gave the first kernel all of a model's budget), and
    the database holds those measurements and the default tiling of each."""
    result, work_dir, seen = in_process
    tasks = extract_tasks(three_kernels, TARGET)
    assert [t.name for t in result.tasks] == [t.name for t in tasks] and len(tasks) == 3
    assert [t.trials for t in result.tasks] == [TRIALS] * 3
    assert seen == [(0, 3 * TRIALS)] + [(k * TRIALS, 3 * TRIALS) for k in (1, 2, 3)]  # 0: before the first round
    assert len(_records(work_dir)) == 3 * (TRIALS + 1)
    # the default tiling is a record, so no kernel ends slower than it, and none is left untried
    assert all(t.tuned_cycles <= t.default_cycles and t.outcome != "no trial" for t in result.tasks)
    faster = sum(t.outcome == "faster" for t in result.tasks)
    assert result.rows()[-1][-2:] == (str(3 * TRIALS), f"{faster} of 3 faster")


def test_tuning_on_ray_gives_the_in_process_records(ray, three_kernels, in_process, tmp_path):
    """The same seed, its candidates built and measured as Ray tasks: the same records, in the same
    order, and the same result."""
    result, work_dir, _ = in_process
    on_ray = tvm_dsa.tune(three_kernels, TARGET, trials=TRIALS, work_dir=tmp_path, on_ray=True)
    assert _records(tmp_path) == _records(work_dir)
    assert on_ray.to_dict() | {"work_dir": ""} == result.to_dict() | {"work_dir": ""}


def test_the_ray_builder_builds_the_programs_and_refusals_of_this_process(ray):
    """A round of two candidates of a 256 x 256 x 256 matmul, its default tiling and the whole
    product as one tile (fp32 partial sums alone fill 256 KiB, beyond a 64 KiB LB): built as Ray
    tasks, the same program and the same refusal as here."""
    a, b = te.placeholder((256, 256), "float32", name="A"), te.placeholder((256, 256), "float32", name="B")
    k = te.reduce_axis((0, 256), "k")
    func = te.create_prim_func([a, b, te.compute((256, 256), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k))])
    hw = hardware.get(TARGET)
    default, whole = s_tir.Schedule(workload(func)), s_tir.Schedule(workload(func))
    sample_tiling(default, (0, 1), lower_kernel(func, hw)[1], False)
    sample_tiling(whole, (0, 1), TilePlan((256, 256), 256), False)
    inputs = [ms.builder.BuilderInput(s.mod, hardware.make_target(TARGET)) for s in (default, whole)]
    here, there = DSABuilder().build(inputs), DSABuilder(on_ray=True).build(inputs)
    assert [r.error_msg for r in there] == [r.error_msg for r in here]
    assert here[0].error_msg is None and "exceeds the LB" in here[1].error_msg
    assert BUILT.pop(there[0].artifact_path) == BUILT.pop(here[0].artifact_path) == build_program(
        lower_scheduled(default.mod["main"], hw), hw, "candidate")


def test_the_same_seed_tunes_the_same_records_again(three_kernels, in_process, tmp_path):
    """What makes the comparison above mean something: meta-schedule's XGBoost model scores with
    numpy's global generator until it has 100 samples, and its task scheduler draws its own seed;
    ``tune`` seeds both, so a second run in this process measures the same candidates."""
    _, work_dir, _ = in_process
    tvm_dsa.tune(three_kernels, TARGET, trials=TRIALS, work_dir=tmp_path)
    assert _records(tmp_path) == _records(work_dir)


@pytest.fixture(scope="module")
def set_graph():
    return layer_graph(load_model("resnet18", tiny=True)), hardware.get("dsa/set-edge16")


def test_restarts_on_ray_give_the_in_process_trees_and_the_best_is_kept(ray, set_graph):
    """Four SET seeds and two LS seeds as Ray tasks: per seed the tree and cost of the search run
    alone in this process; ``best`` keeps the one of least cost."""
    graph, hw = set_graph
    configs = [Anneal(beta=5, seed=s, space=space) for space, seeds in ((SET, range(4)), (LS, range(2)))
               for s in seeds]
    batch = 2  # (at batch 4 the four SET seeds now end on one tree)
    alone = [anneal(graph, hw, batch, c) for c in configs]
    seen = []
    on_ray = anneal_each(graph, hw, batch, configs, on_ray=True,
                         progress=lambda done, total: seen.append((done, total)))
    assert seen == [(k, 6) for k in range(1, 7)]  # as the searches end, in any order
    assert [(r.tree, r.cost, r.seed) for r in on_ray] == [(r.tree, r.cost, c.seed) for r, c in zip(alone, configs)]
    assert [(r.tree, r.cost) for r in anneal_each(graph, hw, batch, configs)] == [(r.tree, r.cost) for r in alone]
    costs = [r.cost for r in alone[:4]]
    assert len(set(costs)) > 1  # the seeds find different trees: keeping the best matters
    assert best(on_ray[:4]).seed == costs.index(min(costs))


def test_explore_restarts_keep_each_schemes_best_seed(capsys, set_graph):
    """``--restarts 3``: each scheme's reported search is the best of seeds 0-2 run alone."""
    graph, hw = set_graph
    assert main(["explore", "resnet18", "--tiny", "--beta", "5", "--restarts", "3", "--in-process", "--json"]) == 0
    out = capsys.readouterr()
    data = json.loads(out.out)
    assert "explore: 9 searches (SET, LS, LP) of resnet18 run in this process (--in-process)" in out.err
    for scheme in data["schemes"]:
        space = {"set": SET, "ls": LS}.get(scheme["scheme"])
        if space is None:
            continue
        costs = [anneal(graph, hw, 1, Anneal(beta=5, seed=s, space=space)).cost for s in range(3)]
        assert (scheme["seed"], scheme["cost"]) == (costs.index(min(costs)), min(costs))


def test_one_restart_with_an_address_runs_on_that_cluster(ray, monkeypatch, capsys, set_graph):
    """``--restarts 1 --address A`` (the default restarts) joins the cluster at A and runs the
    three searches there, rather than in this process: the engine is asked for A (here it hands
    over the module's local Ray), stderr says so, and the trees are the in-process ones."""
    asked = []

    @contextmanager
    def cluster(address, workers):
        asked.append(address)
        yield OnRay(2, address)

    monkeypatch.setattr(cli_args, "ray_engine", cluster)
    argv = ["explore", "resnet18", "--tiny", "--beta", "5", "--json"]
    assert main(argv + ["--address", "10.0.0.7:6379"]) == 0
    out = capsys.readouterr()
    assert asked == ["10.0.0.7:6379"]
    assert "explore: connecting to the Ray cluster at 10.0.0.7:6379" in out.err
    assert "explore: 3 searches (SET, LS, LP) of resnet18 run on Ray (10.0.0.7:6379, 2 CPUs)" in out.err
    assert main(argv) == 0
    alone = capsys.readouterr()
    assert "run in this process (one search per scheme)" in alone.err and asked == ["10.0.0.7:6379"]
    def trees(text: str) -> list[dict]:
        return [{k: v for k, v in s.items() if k != "search_seconds"} for s in json.loads(text)["schemes"]]

    assert trees(out.out) == trees(alone.out)


def test_tune_without_ray_runs_in_process_and_says_so(monkeypatch, capsys, tmp_path, three_kernels_onnx,
                                                     in_process):
    """The command line's result is the API's (the same seed, in this process)."""
    monkeypatch.setattr(cli_args, "ray_available", lambda: False)
    onnx.save(three_kernels_onnx, str(tmp_path / "three.onnx"))
    argv = ["tune", str(tmp_path / "three.onnx"), "--trials", str(TRIALS), "--work-dir", str(tmp_path / "db"),
            "--json"]
    assert main(argv) == 0
    out = capsys.readouterr()
    assert "tune: candidates built and measured in this process (Ray is not installed" in out.err
    assert json.loads(out.out)["tasks"] == in_process[0].to_dict()["tasks"]
    # the kernels by the model's nodes (unnamed here: their op types) and output shapes
    assert sorted(json.loads(out.out)["kernel_labels"].values()) == ["Conv +1 1x16x16x16", "Conv +1 1x32x8x8",
                                                                   "MaxPool 1x16x8x8"]
    assert main(argv[:-1] + ["--address", "127.0.0.1:1"]) == 2
    assert "Ray is not installed" in capsys.readouterr().err


def test_bad_restart_arguments_are_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["explore", "resnet18", "--tiny", "--restarts", "0"])
    assert exit_.value.code == 2 and "argument --restarts: must be at least 1, not 0" in capsys.readouterr().err
    assert main(["explore", "resnet18", "--tiny", "--restarts", "2", "--in-process", "--address", "127.0.0.1:1"]) == 2
    assert capsys.readouterr().err.strip().endswith("--address runs on a Ray cluster: not with --in-process")
