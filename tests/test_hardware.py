"""Hardware model: presets, derived values, validation errors, target tags."""

import json

import pytest
import tvm

import tvm_dsa
from tvm_dsa import plugin
from tvm_dsa.hardware import HardwareError, get, load_file, min_lb_bytes


def test_presets_match_hardware_md():
    hw = get("stcp920")
    assert (hw.clusters, hw.cores_per_cluster, hw.lb_bytes, hw.gb_bytes) == (4, 8, 64 * 1024, 8 << 20)
    assert hw.peak_macs_per_cycle == 4 * 8 * 16 * 32
    edge = get("set-edge16")
    # 0.5 GB/s per TOPS: 16 tiles x 1024 MACs x 2 ops x 1 GHz
    assert edge.ddr_bytes_per_cycle == pytest.approx(0.5 * 16 * 1024 * 2 / 1000, rel=1e-3)
    assert edge.storage_dtype == "int8" and get("set-edge16-fp16").storage_dtype == "float16"
    assert get("dsa") == hw == get("dsa/stcp920")


def test_target_tags_carry_the_chip():
    t = tvm.target.Target("dsa/set-cloud144")
    assert "dsa" in list(t.keys) and tvm_dsa.hardware.from_target(t).name == "set-cloud144"
    assert tvm_dsa.hardware.from_target(tvm.target.Target("dsa")).name == "stcp920"
    plugin.register()  # again (the entry point already ran it): idempotent, tags unchanged
    assert tvm_dsa.hardware.from_target(tvm.target.Target("dsa/set-cloud144")).name == "set-cloud144"


def test_unknown_preset_is_named():
    with pytest.raises(HardwareError, match="unknown DSA preset 'dsa/nope'.*stcp920"):
        tvm_dsa.hardware.make_target("dsa/nope")


def _write(tmp_path, **changes):
    d = get("stcp920").to_dict()
    d.update(changes)
    d["name"] = "mine"
    p = tmp_path / "chip.json"
    p.write_text(json.dumps(d))
    return p


def test_too_small_lb_names_the_field(tmp_path):
    hw = get("stcp920")
    need = min_lb_bytes(hw.mme, 2, 4)
    with pytest.raises(HardwareError, match=rf"'lb_bytes' = 1024 is too small.*{need}"):
        load_file(_write(tmp_path, lb_bytes=1024))


@pytest.mark.parametrize("field,value,msg", [
    ("ddr_bytes_per_cycle", 0, "'ddr_bytes_per_cycle' must be positive"),
    ("clusters", 2.5, "'clusters' must be an integer"),
    ("interconnect", "ring", "'interconnect' must be 'bus' or 'mesh'"),
    ("bogus", 1, r"unknown field\(s\) \['bogus'\]"),
])
def test_bad_fields_are_named(tmp_path, field, value, msg):
    with pytest.raises(HardwareError, match=msg):
        load_file(_write(tmp_path, **{field: value}))


def test_mesh_must_match_core_count():
    d = get("set-edge16").to_dict()
    d["mesh"] = [4, 3]
    with pytest.raises(HardwareError, match="12 nodes but cores_per_cluster is 16"):
        tvm_dsa.Hardware.from_dict(d)


def test_user_chip_registers_a_tag(tmp_path):
    hw = tvm_dsa.hardware.register(_write(tmp_path, lb_bytes=128 * 1024))
    assert hw.lb_bytes == 128 * 1024
    assert tvm_dsa.hardware.from_target(tvm.target.Target("dsa/mine")) == hw
