"""``tvm-dsa compare``, ``trace`` and ``hw``, and the plots behind them, called in-process."""

import json
import tomllib
from importlib import resources

import pytest

from tvm_dsa import hardware
from tvm_dsa.cli import main
from tvm_dsa.harness import Compiled, import_onnx
from tvm_dsa.models import example_inputs
from tvm_dsa.show.plots import gantt_bars, plot_roofline, roofline_point


def _cycles(model, target, schedule="auto"):
    mod = import_onnx(model)
    return Compiled.build(mod, target, schedule).run(example_inputs(model), mode="timing").report


@pytest.mark.parametrize("command", ["compare", "trace", "hw", "tune", "explore"])
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith(f"usage: tvm-dsa {command}")


def test_compare_json_has_one_run_per_target_and_schedule(conv_onnx, capsys):
    path, model = conv_onnx
    targets = ["dsa/stcp920", "dsa/set-edge16-fp16"]
    argv = ["compare", path, "--json", "--schedule", "layerwise", "--schedule", "graphturbo"]
    assert main(argv + [a for t in targets for a in ("--target", t)]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [(r["target"], r["schedule"]) for r in runs] == [(t, s) for t in targets for s in ("layerwise", "graphturbo")]
    for r in runs:  # each row is that build's timing-only run
        report = _cycles(model, r["target"], r["schedule"])
        assert r["cycles"] == report.cycles and r["kernels"] == report.kernels
        assert r["speedup"] == pytest.approx(runs[0]["seconds"] / r["seconds"])
    assert runs[0]["speedup"] == 1.0


def test_compare_table_names_every_row(conv_onnx, capsys):
    assert main(["compare", conv_onnx[0], "--target", "dsa/stcp920", "--target", "dsa/set-cloud144-fp16"]) == 0
    out = capsys.readouterr().out
    assert "speedup" in out and "dsa/stcp920" in out and "dsa/set-cloud144-fp16" in out
    assert f"{_cycles(conv_onnx[1], 'dsa/set-cloud144-fp16').cycles:,}" in out


def test_trace_writes_the_trace_its_summary_and_a_gantt_chart(conv_onnx, tmp_path, capsys):
    trace, gantt = tmp_path / "t.json", tmp_path / "g.png"
    assert main(["trace", conv_onnx[0], "-o", str(trace), "--gantt", str(gantt), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    events = json.loads(trace.read_text())["traceEvents"]
    instructions = [e for e in events if e["ph"] == "X"]
    assert sum(u["instructions"] for u in data["units"].values()) == len(instructions) > 0
    for unit, s in data["units"].items():
        mine = [e for e in instructions if e["cat"] == unit]
        assert s["busy_us"] == pytest.approx(sum(e["dur"] for e in mine))
        assert s["tracks"] == len({(e["pid"], e["tid"]) for e in mine})
    assert data["cycles"] == _cycles(conv_onnx[1], "dsa/stcp920").cycles
    assert gantt.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bars = gantt_bars(events)
    assert len(bars) == len(instructions) and {b.track.split(" / ")[1] for b in bars} == set(data["units"])


def test_trace_table_and_bad_gantt_suffix(conv_onnx, tmp_path, capsys):
    assert main(["trace", conv_onnx[0], "-o", str(tmp_path / "t.json")]) == 0
    out = capsys.readouterr().out
    assert "busy (us)" in out and "mme" in out and "ui.perfetto.dev" in out
    assert main(["trace", conv_onnx[0], "-o", str(tmp_path / "t.json"), "--gantt", str(tmp_path / "g.jpg")]) == 2
    assert "use a .png or .svg file" in capsys.readouterr().err


def test_compare_plots_each_run_under_the_roofline(conv_onnx, tmp_path, capsys):
    roof = tmp_path / "roof.svg"
    argv = ["compare", conv_onnx[0], "--schedule", "layerwise", "--schedule", "graphturbo", "--roofline", str(roof)]
    assert main(argv) == 0
    text = roof.read_text()
    assert "layerwise" in text and "graphturbo" in text
    assert main(argv + ["--target", "dsa/stcp920", "--target", "dsa/set-edge16"]) == 2
    assert "single --target" in capsys.readouterr().err


def test_roofline_point_and_plot(conv_onnx, tmp_path):
    report = _cycles(conv_onnx[1], "dsa/stcp920")
    p = roofline_point("conv", report)
    hw = report.hardware
    assert p.intensity == report.macs / report.ddr_burst_bytes
    assert p.macs_per_cycle == report.macs / report.cycles <= p.bound
    assert p.bound == min(hw.peak_macs_per_cycle, p.intensity * hw.ddr_bytes_per_cycle)
    svg = tmp_path / "roof.svg"
    plot_roofline([p], hw, svg)
    text = svg.read_text()
    assert text.lstrip().startswith("<?xml") and "conv" in text


def _preset(name):
    return tomllib.loads(resources.files("tvm_dsa.hardware").joinpath("presets", f"{name}.toml").read_text())


def _toml(d, prefix=""):
    lines, tables = [], []
    for k, v in d.items():
        if isinstance(v, dict):
            tables.append((k, v))
        else:
            lines.append(f"{k} = {json.dumps(v)}")
    for k, v in tables:
        lines.append(f"[{prefix}{k}]")
        lines += [f"{kk} = {json.dumps(vv)}" for kk, vv in v.items()]
    return "\n".join(lines) + "\n"


def test_hw_validates_and_shows_a_hardware_file(tmp_path, capsys):
    chip = _preset("stcp920") | {"name": "my-chip", "lb_bytes": 131072}
    path = tmp_path / "my-chip.toml"
    path.write_text(_toml(chip))
    assert main(["hw", str(path)]) == 0
    out = capsys.readouterr().out
    assert "my-chip" in out and "a valid hardware description" in out and "131,072" in out
    assert main(["hw", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == hardware.load_file(path).to_dict()


def test_hw_names_the_bad_field_of_a_file(tmp_path, capsys):
    path = tmp_path / "bad.toml"
    path.write_text(_toml(_preset("stcp920") | {"ddr_bytes_per_cycle": 0}))
    assert main(["hw", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tvm-dsa: error: ") and "ddr_bytes_per_cycle" in err


def test_hw_json_lists_every_preset(capsys):
    assert main(["hw", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {f"dsa/{n}" for n in hardware.names()}
    assert data["dsa/stcp920"] == hardware.get("stcp920").to_dict()
