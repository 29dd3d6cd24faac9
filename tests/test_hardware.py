"""Hardware model: presets, derived values, validation errors, target tags."""

import dataclasses
import json
import re

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


ODD_VALUES = [None, "x", [], {}, [1], True, -1, 0, 2.5, float("nan"), float("inf"), 10**400, 10**12, [4, "a"],
              [-4, -4]]


@pytest.mark.parametrize("preset", ["stcp920", "set-edge16"])
def test_every_odd_value_is_accepted_or_named(preset):
    """Each field of a bus and of a mesh preset, and each of their [mme] and [energy] fields, set to
    each odd value: the description is a plausible chip, or one HardwareError names the field;
    nothing else is raised (a list for `storage_dtype` raised TypeError, a number for `mesh` too)."""
    base = get(preset).to_dict()
    paths = [(k,) for k in base] + [(k, sub) for k, v in base.items() if isinstance(v, dict) for sub in v]
    refused = 0
    for path in paths:
        for value in ODD_VALUES:
            d = json.loads(json.dumps(base))
            (d if len(path) == 1 else d[path[0]])[path[-1]] = value
            try:
                tvm_dsa.hardware.check_plausible(tvm_dsa.Hardware.from_dict(d))
            except HardwareError as err:
                refused += 1
                assert ".".join(path) in str(err) or (path == ("cores_per_cluster",) and "'mesh'" in str(err)), \
                    (path, value, str(err))
    assert refused > len(paths) * len(ODD_VALUES) // 2  # most odd values are refused, not all accepted


def test_a_top_level_that_is_not_a_table_is_named(tmp_path):
    path = tmp_path / "chip.json"
    path.write_text("[1, 2]")
    with pytest.raises(HardwareError, match=rf"^hardware file '{path}': the top level must be a table of fields, "
                                            r"got list \[1, 2\]$"):
        load_file(path)


@pytest.mark.parametrize("changes, message", [
    ({"clusters": 10**9}, "field 'clusters' = 1,000,000,000 is not plausible: at most 1,024"),
    ({"vme_lanes": 10**12}, "field 'vme_lanes' = 1,000,000,000,000 is not plausible: at most 16,384"),
    ({"clusters": 16, "cores_per_cluster": 8192},
     "clusters x cores_per_cluster = 131,072 is not plausible: at most 65,536"),
    ({"clock_hz": 1.0}, "field 'clock_hz' = 1 is not plausible: at least 1,000,000 (the clock is in Hz)"),
    ({"lb_bytes": 16 << 20}, "field 'lb_bytes' = 16,777,216 is larger than the GB, 'gb_bytes' = 8,388,608"),
    ({"energy": {**get("stcp920").to_dict()["energy"], "mac_pj": 5e4}},
     "field 'energy.mac_pj' = 50,000 is not plausible: at most 1,000"),
])
def test_an_implausible_chip_is_refused_naming_the_field(tmp_path, changes, message):
    with pytest.raises(HardwareError, match=re.escape(f"hardware file '{tmp_path / 'chip.json'}': {message}")):
        load_file(_write(tmp_path, **changes))


@pytest.mark.parametrize("field", ["clusters", "vme_lanes", "ddr_burst_bytes", "kernel_launch_cycles"])
def test_a_bound_is_the_last_value_accepted(tmp_path, field):
    limit = tvm_dsa.hardware.LIMITS[field]
    assert getattr(load_file(_write(tmp_path, **{field: limit})), field) == limit
    with pytest.raises(HardwareError, match=f"field '{field}' = {limit + 1:,} is not plausible: at most {limit:,}"):
        load_file(_write(tmp_path, **{field: limit + 1}))


def test_presets_are_plausible_and_objects_built_in_python_are_not_checked(tmp_path):
    """Every preset is within the bounds. A Hardware built in Python need only be one the compiler
    can use: the spill tests' 1 KiB GB below a 64 KiB LB is built, while the same description in a
    file is refused."""
    for name in tvm_dsa.hardware.names():
        assert tvm_dsa.hardware.check_plausible(get(name)) is get(name)
    small_gb = dataclasses.replace(get("stcp920"), gb_bytes=1024)
    assert small_gb.gb_bytes < small_gb.lb_bytes
    with pytest.raises(HardwareError, match="'lb_bytes' = 65,536 is larger than the GB, 'gb_bytes' = 1,024"):
        load_file(_write(tmp_path, gb_bytes=1024))
