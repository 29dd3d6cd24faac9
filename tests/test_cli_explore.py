"""``tvm-dsa explore``: SET / LS / LP searches of a tiny model with a small beta, in-process."""

import json

import pytest

from tvm_dsa import hardware
from tvm_dsa.cli import main
from tvm_dsa.models import TINY, get_model
from tvm_dsa.schedule.set import Evaluator, Tree
from tvm_dsa.schedule.set.search import OBJECTIVES
from tvm_dsa.harness import layer_graph

TARGET = "dsa/set-edge16"


@pytest.fixture(scope="module")
def graph():
    return layer_graph(get_model("resnet18", **TINY["resnet18"]))


def test_json_reports_each_schemes_best_tree_as_the_evaluator_scores_it(graph, tmp_path, capsys):
    plot, saved = tmp_path / "st.svg", tmp_path / "best.json"
    argv = ["explore", "resnet18", "--tiny", "--target", TARGET, "--batch", "2", "--objective", "delay",
            "--beta", "2", "--seed", "3", "--plot", str(plot), "--save", str(saved), "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert [s["scheme"] for s in out["schemes"]] == ["set", "ls", "lp"]
    assert out["layers"] == len(graph) and out["objective"] == "delay" and out["batch"] == 2
    evaluator = Evaluator(graph, hardware.get(TARGET))
    for s in out["schemes"]:
        # beta iterations per layer; SET's search runs LS's and LP's first
        assert s["iterations"] == (3 if s["scheme"] == "set" else 1) * 2 * len(graph)
        e = evaluator.evaluate(Tree.parse(s["tree"], graph))
        assert s["latency_cycles"] == pytest.approx(e.latency) and s["energy_joules"] == pytest.approx(e.joules)
        assert s["edp"] == pytest.approx(s["energy_joules"] * s["seconds"])
        assert s["cost"] == pytest.approx(e.cost(*OBJECTIVES["delay"]))
    best = Tree.from_json(json.loads(saved.read_text()), graph)
    assert best.text(graph) == out["tree"] == out["schemes"][0]["tree"]
    assert plot.read_text().lstrip().startswith("<?xml") and out["plot"] == str(plot)


def test_table_names_the_schemes_and_prints_the_tree(capsys):
    assert main(["explore", "resnet18", "--tiny", "--beta", "1"]) == 0
    out = capsys.readouterr().out
    assert all(f" {s} " in out for s in ("SET", "LS", "LP")) and "latency / SET" in out
    assert "best tree (SET" in out and "T" in out.split("best tree")[1]


@pytest.mark.parametrize("argv, message", [
    (["--objective", "speed"], "unknown objective 'speed'"),
    (["--beta", "0"], "--beta must be positive"),
    (["--plot", "st.jpg"], "jpg"),
])
def test_bad_arguments_are_named(argv, message, capsys):
    assert main(["explore", "resnet18", "--tiny", *argv]) == 2
    assert message in capsys.readouterr().err
