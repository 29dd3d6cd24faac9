"""``tvm-dsa sweep`` and ``tvm_dsa.dse``: a tiny grid on a local Ray gives the in-process results, an
interrupted sweep resumes from its journal, invalid chips are recorded with the validator's line,
a bad space file is one line (exit 2), and the searches are deterministic for a seed."""

import dataclasses
import json
import re
import tomllib
from pathlib import Path

import pandas as pd
import pytest

from tvm_dsa import dse, hardware
from tvm_dsa.cli import main
from tvm_dsa.dse import engine as dse_engine
from tvm_dsa.harness import Compiled, import_onnx, load_model, timing_run

GRID = """base = "stcp920"
[hardware]
mme.rows = [16, 32]
ddr_bytes_per_cycle = [64.0, 128.0]
"""
ROOT = Path(__file__).resolve().parent.parent
# The area proxy's coefficients as docs/dse.md states them: an fp16 multiplier and an fp32 adder per
# MAC, 5.6 um^2 per SRAM byte.
MAC_UM2, SRAM_UM2 = 1640.0 + 4184.0, 5.6


def _sweep(capsys, *args) -> tuple[dict, str]:
    assert main(["sweep", *args, "--json"]) == 0
    out = capsys.readouterr()
    return json.loads(out.out), out.err


def _measured(rows: list[dict]) -> list[dict]:
    """The rows without what depends on the machine's load: the compile time."""
    return [{k: v for k, v in r.items() if k != "compile_seconds"} for r in rows]


def test_a_grid_on_ray_gives_the_in_process_results_and_an_interrupted_sweep_resumes(
        conv_onnx, tmp_path, monkeypatch, capsys):
    model, _ = conv_onnx
    space = tmp_path / "space.toml"
    space.write_text(GRID)
    local = tmp_path / "local.json"
    args = [model, "--space", str(space), "--in-process", "--out", str(local)]

    # interrupted after two trials: the journal holds them, the sweep run again runs the other two
    calls = []

    def interrupted(spec):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(spec)
        return dse.run_trial(spec)

    monkeypatch.setattr(dse_engine, "run_trial", interrupted)
    assert main(["sweep", *args]) == 130
    journal = tmp_path / "local.json.journal.jsonl"
    assert capsys.readouterr().err.endswith(f"tvm-dsa: sweep interrupted: 2 trial(s) in {journal}; the same "
                                            "command resumes\n")
    assert len(journal.read_text().splitlines()) == 2
    monkeypatch.undo()
    with journal.open("a") as f:
        f.write('{"key": "a line the interruption cut')
    capsys.readouterr()
    data, err = _sweep(capsys, *args, "--plot", str(tmp_path / "plots"))
    assert f"journal {journal} holds 2 trial(s)" in err and "(2 from the journal)" in err
    assert "trials run in this process (--in-process)" in err
    assert len([ln for ln in journal.read_text().splitlines() if ln.endswith("}")]) == 4

    # the grid, the last axis fastest, each trial's chip the preset with the point's fields
    rows = data["trials"]
    assert [(r["mme.rows"], r["ddr_bytes_per_cycle"]) for r in rows] == [(16, 64.0), (16, 128.0), (32, 64.0),
                                                                          (32, 128.0)]
    assert json.loads(local.read_text()) == rows
    base = hardware.get("stcp920")
    for r in rows:
        hw = hardware.get(r["chip"])
        assert r["status"] == "ok" and r["compiled_schedule"] == "graphturbo"
        assert hw == dataclasses.replace(base, name=hw.name, mme=dataclasses.replace(base.mme, rows=r["mme.rows"]),
                                         ddr_bytes_per_cycle=r["ddr_bytes_per_cycle"])
        sram = base.cores * base.lb_bytes + base.clusters * base.gb_bytes
        assert r["area_mm2"] == pytest.approx((base.cores * r["mme.rows"] * 32 * MAC_UM2 + sram * SRAM_UM2) * 1e-6)
        assert r["objective"] == r["seconds"] == r["cycles"] / hw.clock_hz
    # a trial measures what the chip's own timing run measures
    onnx_model = load_model(model)
    run = timing_run(Compiled.build(import_onnx(onnx_model), f"dsa/{rows[3]['chip']}"), onnx_model)
    assert rows[3]["cycles"] == run.report.cycles and rows[3]["energy_joules"] == run.report.energy_total
    assert rows[3]["roofline_fraction"] == run.report.roofline_fraction
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "pareto-area-conv.png", "pareto-energy-conv.png", "sensitivity-conv.png"]

    # the same grid as Ray tasks on a local Ray of 2 CPUs: the same results
    ray_out = tmp_path / "ray.parquet"
    on_ray, err = _sweep(capsys, model, "--space", str(space), "--workers", "2", "--out", str(ray_out))
    assert "starting a local Ray of 2 CPUs" in err and "trials run on Ray (local, 2 CPUs)" in err
    assert _measured(on_ray["trials"]) == _measured(rows)
    assert _measured(pd.read_parquet(ray_out).to_dict("records")) == _measured(rows)


def test_invalid_chips_are_recorded_with_the_validators_line(tmp_path, monkeypatch, capsys):
    """An LB below one MME tile fails the validator, one above the GB the plausibility check: each
    trial is recorded with that line, and nothing is compiled. Without --out the journal is
    ./sweep.journal.jsonl."""
    monkeypatch.chdir(tmp_path)
    space = tmp_path / "space.toml"
    space.write_text('base = "stcp920"\n[hardware]\nlb_bytes = [1024, 16777216]\n')
    data, _ = _sweep(capsys, "resnet18", "--tiny", "--space", str(space), "--in-process")
    expected = []
    for lb in (1024, 16777216):
        chip = hardware.get("stcp920").to_dict() | {"lb_bytes": lb}
        with pytest.raises(hardware.HardwareError) as err:
            hardware.check_plausible(hardware.Hardware.from_dict(chip, source="chip"), source="chip")
        expected.append(str(err.value))
    assert "field 'lb_bytes' = 1024 is too small" in expected[0] and "is larger than the GB" in expected[1]
    assert [(r["lb_bytes"], r["status"], r["message"]) for r in data["trials"]] == [
        (1024, "invalid", expected[0]), (16777216, "invalid", expected[1])]
    assert len((tmp_path / "sweep.journal.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize("text, message", [
    ('base = "stcp920"\n[hardware]\nmme.rowz = [16]\n', "[hardware] has no field 'mme.rowz'"),
    ('base = "stcp920"\n[hardware]\nlb_bytes = []\n', "'lb_bytes': an empty list of values"),
    ('base = "stcp920"\n[hardware]\nlb_bytes = {min = 4, max = 2, step = 1}\n', "a range needs min <= max"),
    ('base = "stcp920"\n[compiler]\nschedule = ["fast"]\n', "schedule: unknown ['fast']"),
    ('base = "nochip"\n', "base: unknown DSA preset 'nochip'"),
    ('[hardware]\nlb_bytes = [1]\n', "'base' must name a preset"),
    ('base = "stcp920"\nlb_bytes = [1]\n', "unknown key(s) ['lb_bytes']"),
    ('base = "stcp920"\n[hardware\n', "not valid TOML"),
])
def test_a_bad_space_file_is_one_line_and_exit_2(tmp_path, capsys, text, message):
    space = tmp_path / "space.toml"
    space.write_text(text)
    assert main(["sweep", "resnet18", "--tiny", "--space", str(space), "--in-process"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"tvm-dsa: error: space file {space}: ") and message in err


class _Synthetic:
    """An engine that times nothing: a trial's latency is a function of its point."""

    def run(self, specs, running):
        for s in specs:
            running(1)
            p = dict(s.point)
            seconds = (p["mme.rows"] - 24) ** 2 + 1000 / p["ddr_bytes_per_cycle"]
            yield dse.TrialResult(s.key, s.model, s.batch, s.tiny, p, "synthetic", "ok",
                                  metrics={"seconds": seconds, "energy_joules": 1.0, "area_mm2": 1.0})


@pytest.mark.parametrize("search", ["random", "optuna"])
def test_a_search_is_the_same_for_a_seed_and_resumes_from_its_journal(tmp_path, search):
    space = dse.parse_space({"base": "stcp920", "hardware": {"mme.rows": [8, 16, 24, 32, 48],
                                                              "ddr_bytes_per_cycle": [32.0, 64.0, 128.0, 256.0]}})
    config = dse.SweepConfig(("resnet18",), True, None, space, search, samples=8, seed=3)

    def points(journal, seed=3):
        results = dse.sweep(dataclasses.replace(config, seed=seed), _Synthetic(), dse.Journal(journal), lambda s: None)
        return [r.params for r in results]

    first = points(tmp_path / "a.jsonl")
    assert len(first) == 8 and all(p in space.grid() for p in first)
    assert points(tmp_path / "b.jsonl") == first != points(tmp_path / "c.jsonl", seed=4)
    if search == "random":
        assert len({json.dumps(p) for p in first}) == 8
    seen = []
    dse.sweep(config, _Synthetic(), dse.Journal(tmp_path / "a.jsonl"), seen.append)
    assert seen[-1].done == seen[-1].resumed == 8 and seen[-1].best.params == min(
        first, key=lambda p: (p["mme.rows"] - 24) ** 2 + 1000 / p["ddr_bytes_per_cycle"])



def test_the_docs_space_file_and_the_examples_are_spaces():
    """docs/dse.md's example and the shipped spaces parse, with the sizes their comments state."""
    (example,) = re.findall(r"^```toml\n(.*?)^```", (ROOT / "docs" / "dse.md").read_text(), re.S | re.M)
    assert dse.parse_space(tomllib.loads(example)).size == 3 * 3 * 4 * 2 * 2 * 2 * 2
    assert dse.load_space(ROOT / "examples" / "space-stcp920.toml").size == 108
    assert dse.load_space(ROOT / "examples" / "space-set-edge16.toml").size == 54 * 2


@pytest.mark.parametrize("options, message", [
    (["--samples", "4"], "--samples goes with --search random or optuna"),
    (["--search", "random"], "--search random needs --samples N"),
    (["--out", "results.csv"], "use a .json or .parquet file"),
    (["--out", "nodir/results.json"], "its directory does not exist"),
    (["--address", "127.0.0.1:1", "--in-process"], "not with --in-process"),
])
def test_bad_sweep_options_are_one_line_and_exit_2(tmp_path, monkeypatch, capsys, options, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "space.toml").write_text(GRID)
    assert main(["sweep", "resnet18", "--tiny", "--space", "space.toml", *options]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tvm-dsa: error: ") and message in err


def test_an_optuna_sweep_from_the_command_line(tmp_path, capsys):
    """Optuna asks 3 points of a space whose chips the validator refuses: each is recorded, and told
    to the sampler as failed; the same seed asks the same points."""
    space = tmp_path / "space.toml"
    space.write_text('base = "stcp920"\n[hardware]\nlb_bytes = [16, 32, 48, 64]\nmme.cols = [32, 64]\n')
    args = ["resnet18", "--tiny", "--space", str(space), "--in-process", "--search", "optuna", "--samples", "3"]
    data, _ = _sweep(capsys, *args, "--out", str(tmp_path / "a.json"))
    again, _ = _sweep(capsys, *args, "--out", str(tmp_path / "b.json"))
    assert len(data["trials"]) == 3 and {r["status"] for r in data["trials"]} == {"invalid"}
    assert all(r["lb_bytes"] in (16, 32, 48, 64) and r["mme.cols"] in (32, 64) for r in data["trials"])
    assert again["trials"] == data["trials"]


def test_a_trial_whose_worker_died_runs_again_when_the_sweep_resumes(tmp_path):
    """A trial Ray lost (its worker killed by the out-of-memory monitor) counts as failed in the
    progress, stays in the journal, and a resumed sweep does not take it as done; an ok, invalid
    or failed trial it takes."""
    path = tmp_path / "sweep.journal.jsonl"
    journal = dse.Journal(path)
    metrics = {"seconds": 1e-3, "energy_joules": 1e-3, "area_mm2": 1.0}
    results = {status: dse.TrialResult(status, "resnet18", 1, True, {"lb_bytes": 1}, "chip", status, "why",
                                       metrics=metrics if status == "ok" else {})
               for status in ("ok", "invalid", "failed", "lost")}
    status = dse.Status(4, "latency")
    for result in results.values():
        journal.add(result)
        status.record(result)
    assert (status.done, status.failed, status.invalid) == (4, 2, 1)
    assert len(path.read_text().splitlines()) == 4
    assert set(dse.Journal(path).done) == {"ok", "invalid", "failed"}
