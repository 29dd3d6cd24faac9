"""The ``tvm-dsa`` command, called in-process: output, JSON, trace, exit codes on bad input."""

import io
import json
import re
import sys

import numpy as np
import pytest

from tvm_dsa import hardware
from tvm_dsa.cli import main
from tvm_dsa.harness import Compiled
from tvm_dsa.models import TINY, get_model, macs


def test_run_tiny_model_prints_numerics_offload_and_report(capsys):
    assert main(["run", "resnet50", "--tiny"]) == 0
    out = capsys.readouterr().out
    assert "numerics: max |dsa - llvm| / max |llvm| = " in out and ": ok" in out
    assert "MACs on the DSA: " in out and "on the host" in out
    assert "cycles" in out and "roofline" in out
    assert "(graphturbo schedule)" in out  # the compiler's choice for a static model
    assert "the model's bound" in out and "% reached" in out


def test_run_on_a_mesh_chip_says_which_schedules_it_timed(capsys):
    """On set-edge16-fp16 the pipeline times set, layerwise and graphturbo: the run names each
    with its cycles and the one it kept, whose cycles the report has."""
    assert main(["run", "resnet18", "--tiny", "--target", "dsa/set-edge16-fp16", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    timed = data["offload"]["timed"]
    assert set(timed) == {"set", "layerwise", "graphturbo"} and data["schedule"] == min(timed, key=timed.get)
    assert data["report"]["cycles"] == timed[data["schedule"]]
    assert main(["run", "resnet18", "--tiny", "--target", "dsa/set-edge16-fp16"]) == 0
    out = capsys.readouterr().out
    assert ("schedule: timed " + ", ".join(f"{s} {timed[s]:,} cycles" for s in ("set", "layerwise", "graphturbo"))
            + f"; {data['schedule']} kept") in out


def test_json_macs_equal_the_models_macs(conv_onnx, capsys):
    path, model = conv_onnx
    assert main(["run", path, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["offload"]["host"] == {} and data["offload"]["dsa_mac_share"] == 1.0
    assert data["report"]["macs"] == data["offload"]["dsa_macs"] == macs(model) > 0
    assert data["schedule"] == "graphturbo" and data["report"]["bound_macs"] == macs(model)
    assert data["report"]["roofline_fraction"] == data["report"]["roofline_cycles"] / data["report"]["cycles"]
    assert data["numerics"]["ok"] and data["numerics"]["max_relative_error"] < data["numerics"]["tolerance"]


def test_json_macs_of_a_tiny_zoo_model(capsys):
    assert main(["run", "resnet18", "--tiny", "--json", "--no-check"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["numerics"] is None and data["offload"]["host_macs"] == 0
    assert data["report"]["macs"] == macs(get_model("resnet18", **TINY["resnet18"]))


def test_trace_file_is_chrome_trace_json(conv_onnx, tmp_path, capsys):
    trace = tmp_path / "trace.json"
    assert main(["run", conv_onnx[0], "--timing-only", "--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "numerics" not in out and f"written to {trace}" in out
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e["ph"] == "X" and e["dur"] > 0 for e in events)


def test_float_model_on_int8_preset_runs_timing_only(capsys):
    """int8 chip: int32 accumulators requantised by the vector units; timing is exact, MACs all
    on the DSA, and the int8 array's peak (1024 MACs per tile) bounds the roofline."""
    from tvm_dsa import hardware

    assert main(["run", "resnet18", "--tiny", "--target", "dsa/set-edge16", "--timing-only", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    report = data["report"]
    assert data["numerics"] is None and data["offload"]["host_macs"] == 0
    assert report["macs"] == macs(get_model("resnet18", **TINY["resnet18"]))
    peak = hardware.get("set-edge16").peak_macs_per_cycle
    assert report["cycles"] >= report["roofline_cycles"] >= report["macs"] / peak


def test_numerics_outside_the_tolerance_fail(conv_onnx, capsys):
    assert main(["run", conv_onnx[0], "--tolerance", "0"]) == 1
    captured = capsys.readouterr()
    assert ": FAILED" in captured.out and "above the tolerance" in captured.err


def test_hw_lists_the_presets(capsys):
    assert main(["hw"]) == 0
    out = capsys.readouterr().out
    assert "dsa/stcp920" in out and "dsa/set-edge16-fp16" in out


@pytest.mark.parametrize("case, expected", [
    ("random_bytes", "is not a valid ONNX model"),
    ("missing_file", "no such file"),
    ("unknown_model", "unknown model 'resnet1000'"),
    ("unknown_target", "unknown DSA preset 'dsa/nope'"),
    ("float_on_int8", "--timing-only"),
    ("set_on_a_bus", "schedule 'set' runs on a mesh of tiles; dsa/stcp920 has a bus"),
    ("set_search_on_a_bus", "SET's search runs on a mesh of tiles; dsa/stcp920 has a bus"),
])
def test_bad_input_exits_2_with_one_line(case, expected, tmp_path, capsys):
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(np.random.default_rng(1).bytes(4096))
    argv = {
        "random_bytes": ["run", str(garbage)],
        "missing_file": ["run", str(tmp_path / "absent.onnx")],
        "unknown_model": ["run", "resnet1000"],
        "unknown_target": ["run", "resnet18", "--tiny", "--target", "dsa/nope"],
        "float_on_int8": ["run", "resnet18", "--tiny", "--target", "dsa/set-edge16"],
        "set_on_a_bus": ["compare", "resnet18", "--tiny", "--schedule", "set"],
        "set_search_on_a_bus": ["explore", "resnet18", "--tiny", "--target", "stcp920"],
    }[case]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("tvm-dsa: error: ") and expected in captured.err
    assert captured.err.count("\n") == 1
    if case == "float_on_int8":
        assert "pass --quantize to run it quantized to int8" in captured.err and "set-edge16-fp16" in captured.err


def _chip_file(tmp_path, name: str, preset: str = "stcp920", **changes) -> str:
    """``preset``'s description as ``<name>.json``, renamed ``name``, with ``changes``."""
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(hardware.get(preset).to_dict() | {"name": name} | changes))
    return str(path)


@pytest.mark.parametrize("case, expected", [
    ("not_a_table", "the top level must be a table of fields, got list [1, 2]"),
    ("lb_over_gb", "field 'lb_bytes' = 16,777,216 is larger than the GB, 'gb_bytes' = 8,388,608"),
    ("lanes", "field 'vme_lanes' = 1,000,000,000,000 is not plausible: at most 16,384"),
])
def test_hw_names_what_is_off_in_a_file_in_one_line(case, expected, tmp_path, capsys):
    if case == "not_a_table":
        path = tmp_path / "list.json"
        path.write_text("[1, 2]")
    else:
        changes = {"lb_over_gb": {"lb_bytes": 16 << 20}, "lanes": {"vme_lanes": 10**12}}[case]
        path = _chip_file(tmp_path, case, **changes)
    assert main(["hw", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"tvm-dsa: error: hardware file '{path}': {expected}")
    assert captured.err.count("\n") == 1


HALF_CLOCK = 0.5e9  # the file chips' clock: stcp920's is 1 GHz, so a report's time shows which chip ran


@pytest.mark.parametrize("command", ["run", "compare", "trace", "tune", "explore", "dataflow"])
def test_a_hardware_file_works_wherever_a_preset_name_does(command, conv_onnx, tmp_path, capsys):
    """Each command taking --target runs on the chip a hardware file describes, under its tag:
    its name in the output, its clock in the times."""
    preset = "set-edge16-fp16" if command == "explore" else "stcp920"  # SET's search needs a mesh
    chip = f"file-{preset}"
    path = _chip_file(tmp_path, chip, preset, clock_hz=HALF_CLOCK)
    model = conv_onnx[0]
    argv = {
        "run": ["run", model, "--timing-only"],
        "compare": ["compare", model, "--target", "stcp920"],  # a preset's bare name is a target too
        "trace": ["trace", model, "-o", str(tmp_path / "trace.json")],
        "tune": ["tune", model, "--trials", "1", "--work-dir", str(tmp_path / "tune"), "--in-process"],
        "explore": ["explore", model, "--beta", "1"],
        "dataflow": ["dataflow", "--model", model],
    }[command]
    assert main([*argv, "--target", path, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    if command == "run":
        assert out["target"] == f"dsa/{chip}" and out["report"]["hardware"] == chip
        assert out["report"]["seconds"] == pytest.approx(out["report"]["cycles"] / HALF_CLOCK)
    elif command == "compare":
        assert [r["target"] for r in out["runs"]] == ["dsa/stcp920", f"dsa/{chip}"]
        assert [r["seconds"] * clock for r, clock in zip(out["runs"], (1e9, HALF_CLOCK))] == \
            pytest.approx([r["cycles"] for r in out["runs"]])
    elif command == "trace":  # the trace's time axis is in microseconds of the file chip's clock
        events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
        end = max(e["ts"] + e["dur"] for e in events if e.get("ph") == "X")
        assert end == pytest.approx(out["cycles"] / HALF_CLOCK * 1e6, rel=1e-3)
    elif command == "tune":
        assert out["target"] == chip and [t["trials"] for t in out["tasks"]] == [1]
    elif command == "explore":
        assert out["target"] == f"dsa/{chip}"
        assert all(s["seconds"] == pytest.approx(s["latency_cycles"] / HALF_CLOCK) for s in out["schemes"])
    else:
        assert out["head"].startswith(f"{model} on dsa/{chip}: ")


def test_a_bad_hardware_file_as_target_exits_2_with_one_line(tmp_path, capsys):
    missing = tmp_path / "absent.toml"
    implausible = _chip_file(tmp_path, "trillion-lanes", vme_lanes=10**12)
    edited_preset = _chip_file(tmp_path, "stcp920", lb_bytes=128 * 1024)  # the preset's copy, edited, name kept
    for target, expected in ((str(missing), f"hardware file '{missing}' does not exist"),
                             (implausible, "field 'vme_lanes' = 1,000,000,000,000 is not plausible"),
                             (edited_preset, "a different chip named 'stcp920' is already registered: give yours")):
        assert main(["compare", "resnet18", "--tiny", "--target", "dsa/stcp920", "--target", target]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1
        assert captured.err.startswith("tvm-dsa: error: ") and expected in captured.err


@pytest.mark.parametrize("error, expected", [
    (MemoryError("Unable to allocate 32.0 GiB for an array with shape (65536, 65536) and data type float64"),
     "out of memory: Unable to allocate 32.0 GiB for an array with shape (65536, 65536) and data type float64"),
    (RuntimeError("Traceback (most recent call last):\n  0: tvm::Lower\nInternalError: Check failed: x"),
     "RuntimeError: InternalError: Check failed: x (TVM_DSA_TRACEBACK=1 prints the traceback)"),
])
def test_any_other_failure_exits_2_with_one_line(error, expected, conv_onnx, monkeypatch, capsys):
    """A failure that is not the input's fault (here raised where the model is compiled) is one
    line too, exit code 2; TVM_DSA_TRACEBACK=1 lets it through with its traceback."""
    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(Compiled, "build", fail)
    assert main(["run", conv_onnx[0]]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == f"tvm-dsa: error: {expected}\n"
    monkeypatch.setenv("TVM_DSA_TRACEBACK", "1")
    with pytest.raises(type(error)):
        main(["run", conv_onnx[0]])


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_sees_what_the_command_does_and_stdout_gets_the_output_alone(conv_onnx, monkeypatch, capsys):
    """On a terminal the command shows from its start what it does (``cli.activity``, drawn when it
    starts, then at each refresh); the JSON on stdout, not a terminal here, is untouched by it."""
    monkeypatch.setattr(sys, "stderr", _Terminal())
    assert main(["run", conv_onnx[0], "--timing-only", "--json"]) == 0
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", sys.stderr.getvalue())  # the text without colours and moves
    assert shown.startswith("⠋ tvm-dsa run ")  # the first thing drawn, before any work
    assert json.loads(capsys.readouterr().out)["target"] == "dsa/stcp920"
