"""The one hardware description every stage reads (shared/HARDWARE.md).

A chip is ``clusters`` clusters of ``cores_per_cluster`` cores. Each core has a private local
buffer (LB) and three compute units: the MME (a PE array), the VME (vector lanes for cheap
arithmetic) and the vector core (slower lanes that handle everything else). A cluster's cores share
a global buffer (GB, possibly 0 bytes) and are connected by a bus through the GB or by a mesh NoC.
DDR is shared by the whole chip.

The object is immutable and validated on construction: a bad value raises ``HardwareError`` naming
the field. Bandwidths are bytes per cycle, energies picojoules.
"""

from __future__ import annotations

import dataclasses
import math
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
    prefetch_dma: bool = False  # each core has a second DMA queue ("pdma") for prefetches
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
            if data.get("mesh") is not None:
                data["mesh"] = tuple(int(v) for v in data["mesh"])
            return cls(**data)
        except HardwareError as err:
            if str(err).startswith(source):
                raise
            raise HardwareError(f"{source}: {err}") from None


def _sub(cls, value, where: str):
    if isinstance(value, cls):
        return value
    if not isinstance(value, dict):
        raise HardwareError(f"{where} must be a table, got {value!r}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise HardwareError(f"{where}: unknown field(s) {unknown}")
    try:
        return cls(**value)
    except TypeError as err:
        raise HardwareError(f"{where}: {err}") from None


def _positive(hw: Hardware, name: str, value, integer: bool) -> None:
    if integer and (not isinstance(value, int) or isinstance(value, bool)):
        raise HardwareError(f"field '{name}' must be an integer, got {value!r}")
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise HardwareError(f"field '{name}' must be a number, got {value!r}")
    if value <= 0:
        raise HardwareError(f"field '{name}' must be positive, got {value!r}")


def min_lb_bytes(mme: MME, storage_bytes: int, accum_bytes: int) -> int:
    """Smallest LB that holds one MME tile: a rows x cols accumulator and one row/col of operands.

    Below this no conv/matmul tile fits, so the compiler could not place any kernel on the core.
    """
    return mme.rows * mme.cols * accum_bytes + (mme.rows + mme.cols) * storage_bytes * 2


def _validate(hw: Hardware) -> None:
    if not isinstance(hw.name, str) or not hw.name or "/" in hw.name:
        raise HardwareError(f"field 'name' must be a non-empty string without '/', got {hw.name!r}")
    for name in ("clusters", "cores_per_cluster", "lb_bytes", "vme_lanes", "vector_lanes",
                 "kernel_launch_cycles", "ddr_burst_bytes"):
        if name == "kernel_launch_cycles" and getattr(hw, name) == 0:
            continue
        _positive(hw, name, getattr(hw, name), integer=True)
    for name in ("clock_hz", "ddr_bytes_per_cycle", "gb_bytes_per_cycle", "lb_bytes_per_cycle"):
        _positive(hw, name, getattr(hw, name), integer=False)
    if not isinstance(hw.gb_bytes, int) or hw.gb_bytes < 0:
        raise HardwareError(f"field 'gb_bytes' must be a non-negative integer, got {hw.gb_bytes!r}")
    for name in ("dma_latency_cycles", "vector_latency_cycles"):
        if not isinstance(getattr(hw, name), int) or getattr(hw, name) < 0:
            raise HardwareError(f"field '{name}' must be a non-negative integer")
    for name in ("prefetch_dma", "multicast_dma", "dma_run_ahead"):
        if not isinstance(getattr(hw, name), bool):
            raise HardwareError(f"field '{name}' must be true or false, got {getattr(hw, name)!r}")
    if not isinstance(hw.mme, MME):
        raise HardwareError("field 'mme' must be an MME")
    _positive(hw, "mme.rows", hw.mme.rows, integer=True)
    _positive(hw, "mme.cols", hw.mme.cols, integer=True)
    if hw.mme.dtype not in STORAGE_DTYPES:
        raise HardwareError(f"field 'mme.dtype' must be one of {sorted(STORAGE_DTYPES)}, got {hw.mme.dtype!r}")
    if hw.mme.accum_dtype not in ("float32", "int32"):
        raise HardwareError(f"field 'mme.accum_dtype' must be float32 or int32, got {hw.mme.accum_dtype!r}")
    _validate_dataflow(hw.mme)
    if hw.storage_dtype not in STORAGE_DTYPES:
        raise HardwareError(
            f"field 'storage_dtype' must be one of {sorted(STORAGE_DTYPES)}, got {hw.storage_dtype!r}"
        )
    for f in dataclasses.fields(Energy):
        v = getattr(hw.energy, f.name)
        if not isinstance(v, (int, float)) or v < 0:
            raise HardwareError(f"field 'energy.{f.name}' must be a non-negative number, got {v!r}")
    if hw.interconnect not in ("bus", "mesh"):
        raise HardwareError(f"field 'interconnect' must be 'bus' or 'mesh', got {hw.interconnect!r}")
    if hw.interconnect == "mesh":
        if hw.mesh is None or len(hw.mesh) != 2:
            raise HardwareError("field 'mesh' must be [width, height] when interconnect is 'mesh'")
        if hw.mesh[0] * hw.mesh[1] != hw.cores_per_cluster:
            raise HardwareError(
                f"field 'mesh' {list(hw.mesh)} has {hw.mesh[0] * hw.mesh[1]} nodes but "
                f"cores_per_cluster is {hw.cores_per_cluster}"
            )
        _positive(hw, "noc_link_bytes_per_cycle", hw.noc_link_bytes_per_cycle, integer=False)
    elif hw.gb_bytes == 0 and hw.cores_per_cluster > 1:
        raise HardwareError("field 'gb_bytes' is 0 but interconnect 'bus' goes through the GB; use a mesh")
    need = min_lb_bytes(hw.mme, STORAGE_DTYPES[hw.storage_dtype], np.dtype(hw.mme.accum_dtype).itemsize)
    if hw.lb_bytes < need:
        raise HardwareError(
            f"field 'lb_bytes' = {hw.lb_bytes} is too small for the smallest MME tile of a "
            f"{hw.mme.rows}x{hw.mme.cols} array: needs at least {need} bytes"
        )


def _validate_dataflow(mme: MME) -> None:
    """The MME's interconnect, dataflow and cost model name things the dataflow model knows."""
    # Imported here: the dataflow package imports this module.

    if mme.model not in MME_MODELS:
        raise HardwareError(f"field 'mme.model' must be one of {list(MME_MODELS)}, got {mme.model!r}")
    try:
        interconnect(mme.interconnect, 2)
    except NotationError:
        raise HardwareError(f"field 'mme.interconnect' must be one of {list(INTERCONNECTS)} (K a positive "
                            f"integer), got {mme.interconnect!r}") from None
    kinds = list(standard_names(BENCHMARKS["gemm"]))
    if mme.dataflow not in kinds:
        raise HardwareError(f"field 'mme.dataflow' must be one of {kinds}, got {mme.dataflow!r}")
