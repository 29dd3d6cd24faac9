"""One trial of a sweep: a chip (the base with a point's fields set) and a model, compiled and run
in timing mode; what it cost, or why it could not run.

    spec = TrialSpec("resnet18", tiny=True, batch=None, base=hardware.get("stcp920").to_dict(),
                     point=(("mme.rows", 32), ("schedule", "graphturbo")))
    result = run_trial(spec)        # a TrialResult: status "ok", "invalid" (the validator's line) or "failed"

``run_trial`` is what an engine runs, in this process or in a Ray worker: it takes and returns plain
data, and caches each model's import per process.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
from dataclasses import asdict, dataclass, field

from tvm_dsa import hardware
from tvm_dsa.harness import Compiled, import_onnx, load_model, one_line, timing_run
from tvm_dsa.kernelgen.stitched import StitchOptions
from tvm_dsa.runtime.report import UNIT_TYPES

# The area proxy (docs/dse.md, "Area"): a MAC is a multiplier of the MME's operand type and an adder
# of its accumulator's type, an SRAM byte is 8 bit cells with their periphery; mm^2 in 45 nm
# (Horowitz, ISSCC 2014, "Computing's energy problem": the multipliers' and adders' areas).
MULTIPLIER_UM2 = {"int8": 282.0, "float16": 1640.0, "float32": 7700.0}
ADDER_UM2 = {"int32": 137.0, "float32": 4184.0}
SRAM_UM2_PER_BYTE = 8 * 0.7  # a 45 nm 6T cell (~0.35 um^2) doubled for the arrays' periphery

OBJECTIVES = {"latency": "s", "energy": "J", "edp": "J s", "area-latency": "mm^2 s"}  # each with its unit
COMPILER_FIELDS = ("schedule",)  # and every stitch.<option>


@dataclass(frozen=True)
class TrialSpec:
    """What a trial runs: ``model`` (a built-in name or an .onnx path) at ``batch`` (``tiny``: its
    small configuration) on the ``base`` chip description with ``point``'s fields set; the point's
    ``schedule`` and ``stitch.<option>`` fields are the compiler's."""

    model: str
    tiny: bool
    batch: int | None
    base: dict
    point: tuple[tuple[str, object], ...]

    @property
    def key(self) -> str:
        """A digest of everything the trial's result depends on: the journal's key."""
        return _digest([self.model, self.tiny, self.batch, self.base, self.point])

    def chip(self) -> dict:
        """The base description with the point's hardware fields set; named after the base and a
        digest of the fields, so that every distinct chip has its own target tag."""
        chip = copy.deepcopy(self.base)
        for name, value in self.point:
            if name in COMPILER_FIELDS or name.startswith("stitch."):
                continue
            *tables, leaf = name.split(".")
            table = chip
            for t in tables:
                table = table[t]
            table[leaf] = value
        chip.pop("name")
        chip["name"] = f"{self.base['name']}-{_digest(chip)[:10]}"
        return chip

    def compiler(self) -> tuple[str, StitchOptions | None]:
        """The schedule (``auto`` unless the point sets one) and the stitched kernels' options."""
        point = dict(self.point)
        stitch = {k.removeprefix("stitch."): v for k, v in point.items() if k.startswith("stitch.")}
        return point.get("schedule", "auto"), StitchOptions(**stitch) if stitch else None


@dataclass(frozen=True)
class TrialResult:
    """A trial's outcome: ``status`` ``ok`` with its ``metrics``, ``invalid`` (the chip fails the
    hardware validator, whose line is the ``message``), ``failed`` (compiling or simulating
    raised: its last line) or ``lost`` (its worker died: out of memory, a crash; not the chip's
    outcome, so a resumed sweep runs it again). ``schedule`` is the one compiled (``auto``'s
    choice)."""

    key: str
    model: str
    batch: int | None
    tiny: bool
    params: dict
    chip: str
    status: str
    message: str = ""
    schedule: str = ""
    metrics: dict = field(default_factory=dict)

    def objective(self, name: str) -> float | None:
        """The value to minimise (docs/dse.md, "Objectives"); None unless the trial ran."""
        if self.status != "ok":
            return None
        m = self.metrics
        return {"latency": m["seconds"], "energy": m["energy_joules"], "edp": m["seconds"] * m["energy_joules"],
                "area-latency": m["area_mm2"] * m["seconds"]}[name]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "TrialResult":
        return cls(**data)


def run_trial(spec: TrialSpec) -> TrialResult:
    """Validate the spec's chip, register it, compile the model for it and run it in timing mode."""
    chip = spec.chip()
    done = functools.partial(TrialResult, spec.key, spec.model, spec.batch, spec.tiny, dict(spec.point), chip["name"])
    try:
        hw = hardware.check_plausible(hardware.Hardware.from_dict(chip, source="chip"), source="chip")
    except hardware.HardwareError as err:
        return done("invalid", str(err))
    try:
        hardware.register(hw)
        schedule, options = spec.compiler()
        model, mod = _imported(spec.model, spec.tiny, spec.batch)
        compiled = Compiled.build(mod, f"dsa/{hw.name}", schedule, options=options)
        run = timing_run(compiled, model, check_hazards=False)
    except Exception as err:  # noqa: BLE001 - a trial that cannot run is recorded, the sweep goes on
        return done("failed", f"{type(err).__name__}: {one_line(err)}")
    if run.report is None:
        return done("failed", "no kernel ran on the DSA")
    return done("ok", schedule=compiled.offload.schedule, metrics=metrics(run.report, hw, compiled.seconds))


def metrics(report, hw: hardware.Hardware, compile_seconds: float) -> dict:
    """The numbers a trial records: time, energy by component, bytes per level, utilisation, the
    fraction of the roofline, compile time and the area proxy."""
    sram = hw.cores * hw.lb_bytes + hw.clusters * hw.gb_bytes
    area = (hw.peak_macs_per_cycle * (MULTIPLIER_UM2[hw.mme.dtype] + ADDER_UM2[hw.mme.accum_dtype])
            + sram * SRAM_UM2_PER_BYTE) * 1e-6
    return {
        "cycles": report.cycles, "seconds": report.seconds, "energy_joules": report.energy_total,
        **{f"energy_{k}_joules": v for k, v in report.energy.items()},
        **{k: getattr(report, k) for k in ("ddr_read", "ddr_write", "ddr_burst_bytes", "gb_read", "gb_write",
                                           "lb_read", "lb_write", "noc_bytes", "macs", "kernels")},
        **{f"{u}_utilisation": report.utilisation[u] for u in UNIT_TYPES},
        "mme_mac_utilisation": report.mme_mac_utilisation, "roofline_fraction": report.roofline_fraction,
        "compile_seconds": compile_seconds, "peak_macs_per_cycle": hw.peak_macs_per_cycle, "sram_bytes": sram,
        "area_mm2": area,
    }


@functools.lru_cache(maxsize=4)
def _imported(spec: str, tiny: bool, batch: int | None):
    """(ONNX model, Relax module) of a model, once per process: a worker runs many trials of it."""
    model = load_model(spec, tiny=tiny, batch=batch)
    return model, import_onnx(model)


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()
