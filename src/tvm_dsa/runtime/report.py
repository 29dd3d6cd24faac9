"""What a run cost: cycles, traffic per memory level, busy time per unit, occupancy, energy.

``Report`` stores only counted quantities; everything derived from them and the hardware
(seconds, utilisation, energy, roofline) is a property, so combining reports stays consistent.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from tvm_dsa.hardware.model import Hardware
from tvm_dsa.isa.instructions import LANE_OPS, Dma, Fill, Mme, Operand, Reduce, macs, multicast_groups, operands
from tvm_dsa.isa.program import Program
from tvm_dsa.runtime.cost import ddr_effective_bytes, elements, mesh_route, mme_traffic, noc_hops, stream_bytes
from tvm_dsa.runtime.timing import ProgramTiming

UNIT_TYPES = ("dma", "pdma", "cdma", "mme", "vme", "vec")
TRAFFIC = ("ddr_read", "ddr_write", "gb_read", "gb_write", "lb_read", "lb_write")
_SUMMED = ("cycles", "kernels", "launches", "instructions", "macs", "vector_lane_ops", *TRAFFIC, "ddr_burst_bytes",
           "noc_bytes", "noc_hop_bytes", "pe_link_bytes", "pe_register_bytes", "bound_macs", "compulsory_ddr_bytes")


@dataclass(frozen=True)
class Report:
    hardware: Hardware = field(repr=False)
    cycles: int = 0
    kernels: int = 0
    launches: int = 0  # of the kernels, those launched (the others chained to the one before: ``Kernel.chained``)
    instructions: int = 0
    macs: int = 0
    vector_lane_ops: int = 0  # elements processed by VME / vector core
    ddr_read: int = 0  # payload bytes by memory level and direction (DMA sides, compute operands)
    ddr_write: int = 0
    gb_read: int = 0
    gb_write: int = 0
    lb_read: int = 0
    lb_write: int = 0
    ddr_burst_bytes: int = 0  # bytes DDR really moved: contiguous runs rounded up to bursts
    noc_bytes: int = 0  # payload of LB-to-LB transfers over the mesh
    noc_hop_bytes: int = 0  # the same, times the hops each byte travels
    pe_link_bytes: int = 0  # bytes across PE-to-PE links inside the MMEs ("tenet" MME model)
    pe_register_bytes: int = 0  # bytes PEs read back from their own registers ("tenet" MME model)
    busy: dict = field(default_factory=dict)  # unit type -> busy cycles summed over its units
    lb_peak_bytes: int = 0  # max over kernels and LBs of the bytes written in the kernel
    gb_peak_bytes: int = 0
    # the roofline's inputs: the MACs and DDR bytes any schedule must do and move. A program's
    # report counts its own MACs and args; a model run's, the model's (``with_bound``)
    bound_macs: int = 0
    compulsory_ddr_bytes: int = 0
    model_bound: bool = False  # the bound is the model's (not the sum of its kernels')
    host_kernels: int = 0  # of the model's kernels, those the host ran: in the bound, not in the cycles
    # what a functional run computed that the chip's number types could not hold: one line per
    # kernel that overflowed (a finite value became inf) or gave inf/NaN from finite inputs
    numerics: tuple[str, ...] = ()

    # -- derived ------------------------------------------------------------------------------
    @property
    def seconds(self) -> float:
        return self.hardware.cycles_to_seconds(self.cycles)

    def unit_count(self, unit: str) -> int:
        return self.hardware.clusters if unit == "cdma" else self.hardware.cores

    @property
    def utilisation(self) -> dict[str, float]:
        return {u: self.busy.get(u, 0) / (self.cycles * self.unit_count(u)) if self.cycles else 0.0
                for u in UNIT_TYPES}

    @property
    def mme_mac_utilisation(self) -> float:
        return self.macs / (self.cycles * self.hardware.peak_macs_per_cycle) if self.cycles else 0.0

    @property
    def energy(self) -> dict[str, float]:
        """Joules by component: bits moved times pJ/bit, MACs and vector lane-operations."""
        e = self.hardware.energy
        pj = {
            "ddr": self.ddr_burst_bytes * 8 * e.ddr_pj_per_bit,
            "gb": (self.gb_read + self.gb_write) * 8 * e.gb_pj_per_bit,
            "lb": (self.lb_read + self.lb_write) * 8 * e.lb_pj_per_bit,
            "noc": self.noc_hop_bytes * 8 * e.noc_hop_pj_per_bit,
            "pe_array": (self.pe_link_bytes * e.pe_link_pj_per_bit + self.pe_register_bytes * e.pe_register_pj_per_bit) * 8,
            "mac": self.macs * e.mac_pj,
            "vector": self.vector_lane_ops * e.vector_op_pj,
        }
        return {k: v * 1e-12 for k, v in pj.items()}

    @property
    def energy_total(self) -> float:
        return sum(self.energy.values())

    @property
    def roofline_cycles(self) -> float:
        """Lower bound of any schedule: the bound's MACs at the peak rate, or its DDR bytes at full
        bandwidth."""
        return max(self.bound_macs / self.hardware.peak_macs_per_cycle,
                   self.compulsory_ddr_bytes / self.hardware.ddr_bytes_per_cycle)

    @property
    def roofline_ratio(self) -> float:
        """How many times the roofline the run took (1.0: at the bound)."""
        return self.cycles / self.roofline_cycles if self.roofline_cycles else 0.0

    @property
    def roofline_binds(self) -> str:
        """Which half of the roofline binds: ``MACs`` at the peak rate or ``DDR`` bytes at full bandwidth."""
        hw = self.hardware
        return "MACs" if self.bound_macs / hw.peak_macs_per_cycle >= self.compulsory_ddr_bytes / hw.ddr_bytes_per_cycle else "DDR"

    @property
    def roofline_basis(self) -> str:
        """Whose bound the roofline is (the model's, or its kernels' with their arguments through
        DDR) and which half binds."""
        whose = "the model's" if self.model_bound else "its kernels'"
        host = (f"; {self.host_kernels} of its kernel{'s' * (self.host_kernels > 1)} ran on the host, outside "
                "the cycles" if self.host_kernels else "")
        return f"{whose} bound, {self.roofline_binds}{host}"

    @property
    def roofline_fraction(self) -> float:
        """The share of the roofline the run reached: roofline cycles over the run's cycles."""
        return self.roofline_cycles / self.cycles if self.cycles else 0.0

    # -- composition --------------------------------------------------------------------------
    @classmethod
    def combine(cls, reports: list["Report"]) -> "Report":
        """Reports of runs one after another: counts and cycles add, peaks take the maximum."""
        if not reports:
            raise ValueError("Report.combine needs at least one report")
        hw = reports[0].hardware
        if any(r.hardware != hw for r in reports):
            raise ValueError("Report.combine: reports are for different hardware")
        busy = {u: sum(r.busy.get(u, 0) for r in reports) for u in UNIT_TYPES}
        return cls(hw, **{f: sum(getattr(r, f) for r in reports) for f in _SUMMED}, busy=busy,
                   lb_peak_bytes=max(r.lb_peak_bytes for r in reports),
                   gb_peak_bytes=max(r.gb_peak_bytes for r in reports),
                   model_bound=all(r.model_bound for r in reports),
                   numerics=tuple(line for r in reports for line in r.numerics))

    def with_bound(self, macs: int, ddr_bytes: int, host_kernels: int = 0) -> "Report":
        """The same counts under a model's bound: its MACs and its inputs, weights and outputs;
        ``host_kernels`` of its kernels ran on the host (their work is in the bound, their time is
        not in the cycles: DLRM's embedding gathers read tables the DSA never loads, and its
        fraction of the bound can pass 100 %)."""
        return dataclasses.replace(self, bound_macs=int(macs), compulsory_ddr_bytes=int(ddr_bytes), model_bound=True,
                                   host_kernels=host_kernels)

    # -- presentation -------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = {"hardware": self.hardware.name, "clock_hz": self.hardware.clock_hz}
        d.update((f.name, getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != "hardware")
        d.update(busy=dict(self.busy), seconds=self.seconds, utilisation=self.utilisation,
                 mme_mac_utilisation=self.mme_mac_utilisation, energy=self.energy, energy_total=self.energy_total,
                 roofline_cycles=self.roofline_cycles, roofline_ratio=self.roofline_ratio,
                 roofline_fraction=self.roofline_fraction)
        return d

    def __str__(self) -> str:
        hw = self.hardware
        rows = [
            ("hardware", f"{hw.name} @ {hw.clock_hz / 1e9:g} GHz"),
            ("cycles", f"{self.cycles:,} ({self.seconds * 1e3:.4g} ms)"),
            ("roofline", f"{self.roofline_cycles:,.0f} cycles, {self.roofline_basis}: {self.roofline_fraction:.1%} "
                         "reached"),
            ("kernels / launches / instructions", f"{self.kernels:,} / {self.launches:,} / {self.instructions:,}"),
            ("MACs", f"{self.macs:,} ({self.mme_mac_utilisation:.2%} of peak)"),
        ]
        for level in ("ddr", "gb", "lb"):
            rows.append((f"{level.upper()} read / write", f"{getattr(self, level + '_read'):,} / "
                         f"{getattr(self, level + '_write'):,} B"))
        rows.append(("DDR bursts / NoC", f"{self.ddr_burst_bytes:,} B / {self.noc_bytes:,} B"))
        rows.append(("peak LB / GB", f"{self.lb_peak_bytes:,} / {self.gb_peak_bytes:,} B"))
        util = self.utilisation
        for u in UNIT_TYPES:
            if u != "pdma" or self.hardware.prefetch_dma:
                rows.append((f"busy {u}", f"{self.busy.get(u, 0):,} cycles ({util[u]:.1%})"))
        for k, v in self.energy.items():
            rows.append((f"energy {k}", f"{v * 1e6:.4g} uJ"))
        rows.append(("energy total", f"{self.energy_total * 1e6:.4g} uJ"))
        rows += [("NUMERICS", line) for line in self.numerics]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _union_bytes(ranges: list[tuple[int, int]]) -> int:
    total, reach = 0, None
    for lo, hi in sorted(ranges):
        if reach is None or lo > reach:
            total += hi - lo
            reach = hi
        elif hi > reach:
            total += hi - reach
            reach = hi
    return total


def _counts(ins, hw: Hardware, rider: bool = False) -> dict[str, int]:
    """What one instruction adds to the report's counters (traffic, MACs, lane operations); a
    ``rider`` (a multicast DMA that moved in another's transfer) reads nothing of its own."""
    c: dict[str, int] = {}

    def add(name: str, n: int) -> None:
        c[name] = c.get(name, 0) + n

    def traffic(o: Operand, direction: str, nbytes: int, shape: tuple[int, ...]) -> None:
        add(f"{o.mem}_{direction}", nbytes)
        if o.mem == "ddr":
            add("ddr_burst_bytes", ddr_effective_bytes(o, shape, hw))

    srcs, dst = operands(ins)
    if isinstance(ins, (Dma, Fill)):
        payload = elements(ins.shape) * dst.itemsize
        for o in srcs if not rider else ():
            traffic(o, "read", payload, ins.shape)
        traffic(dst, "write", payload, ins.shape)
        hops = noc_hops(ins, hw)
        if hops:
            add("noc_bytes", payload)
            add("noc_hop_bytes", payload * hops)
        return c
    if isinstance(ins, Mme):
        moved = mme_traffic(ins, hw)
        traffic(ins.a, "read", moved.a, ins.shape)
        traffic(ins.b, "read", moved.b, ins.shape)
        traffic(dst, "write", moved.dst, ins.shape)
        if ins.accumulate:  # the output's previous values, read once
            traffic(dst, "read", stream_bytes(dst, ins.shape), ins.shape)
        add("pe_link_bytes", moved.links)
        add("pe_register_bytes", moved.registers)
        add("macs", macs(ins))
        return c
    for o in srcs:
        traffic(o, "read", stream_bytes(o, ins.shape), ins.shape)
    traffic(dst, "write", stream_bytes(dst, ins.shape), ins.shape)
    add("vector_lane_ops", elements(ins.shape) * (1 if isinstance(ins, Reduce) else LANE_OPS.get(ins.op, 1)))
    return c


def _tree_hops_saved(kernel, riders: frozenset, hw: Hardware) -> int:
    """Hop-bytes ``_counts`` bills a kernel's multicasts between LBs beyond their trees: a transfer
    crosses each link of the union of its members' XY routes once (as the timing charges it,
    ``timing._Costs.multicast``), where each member is billed its own route."""
    instrs = kernel.instructions
    if hw.interconnect != "mesh" or not any(instrs[i].src.mem == "lb" for i in riders):
        return 0
    saved = 0
    for g in {g for g in multicast_groups(instrs).values() if len(g) > 1 and g[1] in riders}:
        first = instrs[g[0]]
        if first.src.mem != "lb":
            continue
        routes = [mesh_route(first.src.index, instrs[i].dst.index, hw) for i in g]
        tree = set().union(*map(set, routes))
        saved += elements(first.shape) * first.dst.itemsize * (sum(map(len, routes)) - len(tree))
    return saved


def _key(ins) -> tuple:
    """Everything ``_counts`` depends on: the box, and each operand's memory, dtype and strides
    (and, for a DMA, the memories' indices, which give the NoC hops), not the offsets."""
    kind = type(ins)
    d = ins.dst
    if kind is Dma:
        s = ins.src
        return (kind, ins.shape, d.mem, d.index, d.dtype, d.strides, s.mem, s.index, s.dtype, s.strides)
    if kind is Fill:
        return (kind, ins.shape, d.mem, d.dtype, d.strides)
    if kind is Mme:
        a, b = ins.a, ins.b
        return (kind, ins.shape, ins.accumulate, d.mem, d.dtype, d.strides, a.mem, a.dtype, a.strides,
                b.mem, b.dtype, b.strides)
    if kind is Reduce:
        s = ins.src
        return (kind, ins.shape, ins.accumulate, d.mem, d.dtype, d.strides, s.mem, s.dtype, s.strides)
    return (kind, LANE_OPS.get(ins.op, 1), ins.shape, d.mem, d.dtype, d.strides,
            *[(o.mem, o.dtype, o.strides) if isinstance(o, Operand) else None for o in ins.srcs])


def build_report(program: Program, hw: Hardware, timing: ProgramTiming, numerics: tuple[str, ...] = ()) -> Report:
    """Count what the program's instructions move and compute, and what the timing made busy;
    ``numerics``: what the functional run could not hold (``Report.numerics``)."""
    c = dict.fromkeys(_SUMMED, 0)
    busy = dict.fromkeys(UNIT_TYPES, 0)
    peak = {"lb": 0, "gb": 0}
    seen: dict[tuple, list] = {}  # _key -> [an instruction with that key, how many]
    spans: dict[tuple, int] = {}  # (strides, shape) -> elements from the first to the last touched

    for k, kt in zip(program.kernels, timing.kernels):
        written: dict[tuple[str, int], list[tuple[int, int]]] = {}
        for i, (ins, (unit, _), s, e) in enumerate(zip(k.instructions, kt.units, kt.shown(), kt.end)):
            busy[unit] += e - s
            key = (_key(ins), i in kt.riders)
            entry = seen.get(key)
            if entry is None:
                seen[key] = [ins, 1]
            else:
                entry[1] += 1
            dst = ins.dst
            if dst.mem in peak:
                shape = ins.shape
                span = spans.get((dst.strides, shape))
                if span is None:
                    span = spans[(dst.strides, shape)] = sum((n - 1) * st for n, st in zip(shape, dst.strides)) + 1
                written.setdefault((dst.mem, dst.index), []).append((dst.offset, dst.offset + span * dst.itemsize))
        for (mem, _), ranges in written.items():
            peak[mem] = max(peak[mem], _union_bytes(ranges))
        c["noc_hop_bytes"] -= _tree_hops_saved(k, kt.riders, hw)
    for (_, rider), (ins, count) in seen.items():
        for name, n in _counts(ins, hw, rider).items():
            c[name] += n * count
    c.update(cycles=timing.cycles, kernels=len(program.kernels), launches=sum(not k.chained for k in program.kernels),
             instructions=program.num_instructions,
             bound_macs=c["macs"], compulsory_ddr_bytes=sum(a.nbytes for a in program.args))
    return Report(hw, **c, busy=busy, lb_peak_bytes=peak["lb"], gb_peak_bytes=peak["gb"], numerics=numerics)
