"""The one hardware description every stage reads (shared/HARDWARE.md).

A chip is ``clusters`` clusters of ``cores_per_cluster`` cores. Each core has a private local
buffer (LB) and three compute units: the MME (a PE array), the VME (vector lanes for cheap
arithmetic) and the vector core (slower lanes that handle everything else). A cluster's cores share
a global buffer (GB, possibly 0 bytes) and are connected by a bus through the GB or by a mesh NoC.
DDR is shared by the whole chip.

The object is immutable and validated on construction: a bad value raises ``HardwareError`` naming
the field. A description read from a file or a dict is also checked for plausibility
(``check_plausible``). Bandwidths are bytes per cycle, energies picojoules.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tvm_dsa.dataflow.expr import NotationError
from tvm_dsa.dataflow.library import BENCHMARKS, standard_names
from tvm_dsa.dataflow.notation import INTERCONNECTS, interconnect


class HardwareError(ValueError):
    """A hardware description that cannot describe a working chip."""


# Storage types the datapath can hold, with their width in bytes.
STORAGE_DTYPES = {"float16": 2, "int8": 1, "float32": 4}


MME_MODELS = ("flat", "tenet")


@dataclass(frozen=True)
class MME:
    """Matrix engine: a ``rows`` x ``cols`` PE array doing one MAC per PE per cycle, its PE-to-PE
    ``interconnect`` and the ``dataflow`` it runs a matmul tile with (M on the rows, N on the columns,
    K in time for "output-stationary"; see ``tvm_dsa.dataflow``). ``model`` chooses how an MME
    instruction is costed: "flat" (rows x cols MACs per cycle plus the fill/drain) or "tenet" (the
    dataflow's latency counted on the relations, docs/tenet.md)."""

    rows: int
    cols: int
    dtype: str = "float16"
    accum_dtype: str = "float32"
    pipeline_cycles: int = 0  # fill/drain latency added to every instruction; 0 = rows + cols
    interconnect: str = "systolic-2d"
    dataflow: str = "output-stationary, systolic, pipelined"
    model: str = "flat"

    @property
    def macs_per_cycle(self) -> int:
        return self.rows * self.cols


@dataclass(frozen=True)
class Energy:
    """Energy per event in picojoules. ``vector_op`` is per lane-operation of VME / vector core;
    ``pe_link`` per bit crossing a PE-to-PE link of the MME, ``pe_register`` per bit a PE reads back
    from its own register (both charged by the "tenet" MME model, from the dataflow's spatial and
    temporal reuse)."""

    ddr_pj_per_bit: float
    gb_pj_per_bit: float
    lb_pj_per_bit: float
    mac_pj: float
    noc_hop_pj_per_bit: float = 0.0
    vector_op_pj: float = 0.0
    pe_link_pj_per_bit: float = 0.0
    pe_register_pj_per_bit: float = 0.0


@dataclass(frozen=True)
class Hardware:
    """A DSA chip. See shared/HARDWARE.md for the meaning and the source of each preset value."""

    name: str
    clusters: int
    cores_per_cluster: int
    lb_bytes: int
    gb_bytes: int
    mme: MME
    vme_lanes: int
    vector_lanes: int
    clock_hz: float
    ddr_bytes_per_cycle: float
    gb_bytes_per_cycle: float
    lb_bytes_per_cycle: float
    energy: Energy
    storage_dtype: str = "float16"
    interconnect: str = "bus"  # "bus" (through the GB) or "mesh"
    mesh: tuple[int, int] | None = None  # (width, height) when interconnect == "mesh"
    noc_link_bytes_per_cycle: float = 0.0
    kernel_launch_cycles: int = 2000
    dma_latency_cycles: int = 64
    prefetch_dma: bool = False  # each core has a second DMA queue ("pdma"): prefetches, and stores out of its LB
    multicast_dma: bool = False  # DMAs of one box to several GBs or LBs move as one transfer (``isa.Dma.multicast``)
    # each DMA queue sets up its next transfer while the current one moves (a descriptor queue that
    # runs ahead by one): set-up latencies overlap data, which still moves in queue order
    dma_run_ahead: bool = False
    vector_latency_cycles: int = 8
    ddr_burst_bytes: int = 64
    description: str = ""
    notes: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        _validate(self)

    # -- derived quantities -------------------------------------------------------------------
    @property
    def cores(self) -> int:
        return self.clusters * self.cores_per_cluster

    @property
    def storage_bytes(self) -> int:
        return STORAGE_DTYPES[self.storage_dtype]

    @property
    def wide_dtype(self) -> str:
        """Where values can leave the storage type (sums of squares, variances:
        ``kernel.ranges``), a float chip keeps them at its accumulator's width."""
        return self.mme.accum_dtype if self.is_float else self.storage_dtype

    @property
    def accum_bytes(self) -> int:
        return np.dtype(self.mme.accum_dtype).itemsize

    @property
    def peak_macs_per_cycle(self) -> int:
        return self.cores * self.mme.macs_per_cycle

    @property
    def is_float(self) -> bool:
        return self.storage_dtype.startswith("float")

    def cycles_to_seconds(self, cycles: float) -> float:
        return cycles / self.clock_hz

    # -- (de)serialisation --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["mesh"] = list(self.mesh) if self.mesh else None
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "hardware description") -> "Hardware":
        if not isinstance(data, dict):
            raise HardwareError(f"{source}: the top level must be a table of fields, got {type(data).__name__} "
                                f"{_short(data)}")
        data = dict(data)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise HardwareError(f"{source}: unknown field(s) {unknown}; known fields: {sorted(known)}")
        missing = sorted(
            f.name
            for f in dataclasses.fields(cls)
            if f.name not in data
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        )
        if missing:
            raise HardwareError(f"{source}: missing field(s) {missing}")
        try:
            data["mme"] = _sub(MME, data["mme"], f"{source}: mme")
            data["energy"] = _sub(Energy, data["energy"], f"{source}: energy")
            if isinstance(data.get("mesh"), list):
                data["mesh"] = tuple(data["mesh"])
            return cls(**data)
        except HardwareError as err:
            if str(err).startswith(source):
                raise
            raise HardwareError(f"{source}: {err}") from None


def _sub(cls, value, where: str):
    if isinstance(value, cls):
        return value
    if not isinstance(value, dict):
        raise HardwareError(f"{where} must be a table, got {_short(value)}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise HardwareError(f"{where}: unknown field(s) {unknown}")
    try:
        return cls(**value)
    except TypeError as err:
        raise HardwareError(f"{where}: {err}") from None


def _short(value) -> str:
    """``value`` as a message shows it: its repr, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(name: str, value, integer: bool, zero: bool = False) -> None:
    """``value`` is a finite number (an integer where ``integer``; a bool is neither), positive, or
    non-negative where ``zero``."""
    if integer and (not isinstance(value, int) or isinstance(value, bool)):
        raise HardwareError(f"field '{name}' must be an integer, got {_short(value)}")
    if not isinstance(value, (int, float)) or isinstance(value, bool) or (
            isinstance(value, float) and not math.isfinite(value)):
        raise HardwareError(f"field '{name}' must be a number, got {_short(value)}")
    if value < 0 or (value == 0 and not zero):
        raise HardwareError(f"field '{name}' must be {'non-negative' if zero else 'positive'}, got {value!r}")


def min_lb_bytes(mme: MME, storage_bytes: int, accum_bytes: int) -> int:
    """Smallest LB that holds one MME tile: a rows x cols accumulator and one row/col of operands.

    Below this no conv/matmul tile fits, so the compiler could not place any kernel on the core.
    """
    return mme.rows * mme.cols * accum_bytes + (mme.rows + mme.cols) * storage_bytes * 2


def _validate(hw: Hardware) -> None:
    if not isinstance(hw.name, str) or not hw.name or "/" in hw.name:
        raise HardwareError(f"field 'name' must be a non-empty string without '/', got {_short(hw.name)}")
    if not isinstance(hw.description, str):
        raise HardwareError(f"field 'description' must be a string, got {_short(hw.description)}")
    if not isinstance(hw.notes, dict):
        raise HardwareError(f"field 'notes' must be a table, got {_short(hw.notes)}")
    for name in ("clusters", "cores_per_cluster", "lb_bytes", "vme_lanes", "vector_lanes", "ddr_burst_bytes"):
        _number(name, getattr(hw, name), integer=True)
    for name in ("gb_bytes", "kernel_launch_cycles", "dma_latency_cycles", "vector_latency_cycles"):
        _number(name, getattr(hw, name), integer=True, zero=True)
    for name in ("clock_hz", "ddr_bytes_per_cycle", "gb_bytes_per_cycle", "lb_bytes_per_cycle"):
        _number(name, getattr(hw, name), integer=False)
    _number("noc_link_bytes_per_cycle", hw.noc_link_bytes_per_cycle, integer=False, zero=hw.interconnect != "mesh")
    for name in ("prefetch_dma", "multicast_dma", "dma_run_ahead"):
        if not isinstance(getattr(hw, name), bool):
            raise HardwareError(f"field '{name}' must be true or false, got {_short(getattr(hw, name))}")
    if not isinstance(hw.mme, MME):
        raise HardwareError("field 'mme' must be an MME")
    _number("mme.rows", hw.mme.rows, integer=True)
    _number("mme.cols", hw.mme.cols, integer=True)
    _number("mme.pipeline_cycles", hw.mme.pipeline_cycles, integer=True, zero=True)
    if not isinstance(hw.mme.dtype, str) or hw.mme.dtype not in STORAGE_DTYPES:
        raise HardwareError(f"field 'mme.dtype' must be one of {sorted(STORAGE_DTYPES)}, got {_short(hw.mme.dtype)}")
    if hw.mme.accum_dtype not in ("float32", "int32"):
        raise HardwareError(f"field 'mme.accum_dtype' must be float32 or int32, got {_short(hw.mme.accum_dtype)}")
    _validate_dataflow(hw.mme)
    if not isinstance(hw.storage_dtype, str) or hw.storage_dtype not in STORAGE_DTYPES:
        raise HardwareError(
            f"field 'storage_dtype' must be one of {sorted(STORAGE_DTYPES)}, got {_short(hw.storage_dtype)}"
        )
    if not isinstance(hw.energy, Energy):
        raise HardwareError("field 'energy' must be an Energy")
    for f in dataclasses.fields(Energy):
        _number(f"energy.{f.name}", getattr(hw.energy, f.name), integer=False, zero=True)
    if hw.interconnect not in ("bus", "mesh"):
        raise HardwareError(f"field 'interconnect' must be 'bus' or 'mesh', got {_short(hw.interconnect)}")
    mesh = hw.mesh
    if mesh is not None and not (isinstance(mesh, tuple) and len(mesh) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in mesh)):
        raise HardwareError(f"field 'mesh' must be [width, height], two positive integers, got {_short(mesh)}")
    if hw.interconnect == "mesh":
        if mesh is None:
            raise HardwareError("field 'mesh' must be [width, height] when interconnect is 'mesh'")
        if mesh[0] * mesh[1] != hw.cores_per_cluster:
            raise HardwareError(
                f"field 'mesh' {list(mesh)} has {mesh[0] * mesh[1]} nodes but "
                f"cores_per_cluster is {hw.cores_per_cluster}"
            )
    elif hw.gb_bytes == 0 and hw.cores_per_cluster > 1:
        raise HardwareError("field 'gb_bytes' is 0 but interconnect 'bus' goes through the GB; use a mesh")
    need = min_lb_bytes(hw.mme, STORAGE_DTYPES[hw.storage_dtype], np.dtype(hw.mme.accum_dtype).itemsize)
    if hw.lb_bytes < need:
        raise HardwareError(
            f"field 'lb_bytes' = {hw.lb_bytes} is too small for the smallest MME tile of a {_short(hw.mme.rows)}"
            f"x{_short(hw.mme.cols)} array (mme.rows x mme.cols): needs at least {_short(need)} bytes"
        )


def _validate_dataflow(mme: MME) -> None:
    """The MME's interconnect, dataflow and cost model name things the dataflow model knows."""
    # Imported here: the dataflow package imports this module.

    if mme.model not in MME_MODELS:
        raise HardwareError(f"field 'mme.model' must be one of {list(MME_MODELS)}, got {_short(mme.model)}")
    known = isinstance(mme.interconnect, str)
    if known:
        try:
            interconnect(mme.interconnect, 2)
        except NotationError:
            known = False
    if not known:
        raise HardwareError(f"field 'mme.interconnect' must be one of {list(INTERCONNECTS)} (K a positive "
                            f"integer), got {_short(mme.interconnect)}")
    kinds = list(standard_names(BENCHMARKS["gemm"]))
    if mme.dataflow not in kinds:
        raise HardwareError(f"field 'mme.dataflow' must be one of {kinds}, got {_short(mme.dataflow)}")


# How far a plausible chip goes (docs/hardware-format.md, "Plausible values"): each bound is far beyond the
# presets and the accelerators they model, so a description past one holds a slip (of a unit, of digits),
# not a chip, on which the compiler and the simulator would spend their memory and time. Dotted names are
# fields of [mme] and [energy]; "cores" and "peak_macs_per_cycle" are the chip's totals.
LIMITS: dict[str, int | float] = {
    "clusters": 1024, "cores_per_cluster": 16384, "cores": 65536,
    "mme.rows": 1024, "mme.cols": 1024, "peak_macs_per_cycle": 1 << 26,
    "vme_lanes": 16384, "vector_lanes": 16384,
    "lb_bytes": 1 << 30, "gb_bytes": 1 << 32,
    "clock_hz": 10**10,
    "ddr_bytes_per_cycle": 65536, "gb_bytes_per_cycle": 65536, "lb_bytes_per_cycle": 65536,
    "noc_link_bytes_per_cycle": 65536, "ddr_burst_bytes": 4096,
    "kernel_launch_cycles": 10**6, "dma_latency_cycles": 10**6, "vector_latency_cycles": 10**6,
    "mme.pipeline_cycles": 10**6,
    **{f"energy.{f.name}": 1000 for f in dataclasses.fields(Energy)},
}
MIN_CLOCK_HZ = 1e6  # a slower clock is a value given in MHz or GHz
_TOTALS = {"cores": "clusters x cores_per_cluster",
           "peak_macs_per_cycle": "the peak MACs per cycle (cores x mme.rows x mme.cols)"}


def check_plausible(hw: Hardware, source: str = "hardware description") -> Hardware:
    """``hw`` if a chip could be so: within ``LIMITS``, a clock of at least ``MIN_CLOCK_HZ``, an LB
    no larger than its GB; else a ``HardwareError`` naming ``source``, the field and the bound.
    Descriptions read from a file or a dict are checked (``registry.load_file``, ``registry.register``);
    a ``Hardware`` built in Python need only be one the compiler can use, so tests build odd chips on
    purpose (a 1 KiB GB below a 64 KiB LB, to make a stitched kernel spill)."""
    for name, limit in LIMITS.items():
        value = operator.attrgetter(name)(hw)
        if value > limit:
            what = _TOTALS.get(name, f"field '{name}'")
            raise HardwareError(f"{source}: {what} = {_amount(value)} is not plausible: at most {_amount(limit)} "
                                "(docs/hardware-format.md, \"Plausible values\")")
    if hw.clock_hz < MIN_CLOCK_HZ:
        raise HardwareError(f"{source}: field 'clock_hz' = {_amount(hw.clock_hz)} is not plausible: at least "
                            f"{_amount(MIN_CLOCK_HZ)} (the clock is in Hz)")
    if 0 < hw.gb_bytes < hw.lb_bytes:
        raise HardwareError(f"{source}: field 'lb_bytes' = {hw.lb_bytes:,} is larger than the GB, 'gb_bytes' = "
                            f"{hw.gb_bytes:,}: a cluster's GB, which its cores share, is the level above their LBs")
    return hw


def _amount(value: int | float) -> str:
    """``value`` with thousands separators (a whole float as an integer)."""
    whole = isinstance(value, int) or (value.is_integer() and abs(value) < 1e18)
    return f"{int(value):,}" if whole else f"{value:,g}"
