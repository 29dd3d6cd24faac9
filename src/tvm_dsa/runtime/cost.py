"""The analytical cost of one instruction, shared by the simulator and the schedulers.

Compute instructions take a fixed number of cycles (``compute_cycles``). Data movement (DMA and
fill) is a *transfer*: a fixed latency, then a demand in bytes on each shared resource it crosses
(``dma_demand``); the simulator shares each resource's bandwidth among the transfers using it,
and ``dma_cycles`` is the uncontended time. Resources are ``("ddr",)`` for the chip's DDR,
``("gb", cluster)``, ``("lb", core)`` and ``("noc", core, next core)`` for each directed link of a
mesh, which a transfer between two cores' LBs crosses along its XY route (``mesh_route``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tvm_dsa.dataflow.mme import cost_model, tile_cycles, tile_metrics
from tvm_dsa.hardware.model import Hardware
from tvm_dsa.isa.instructions import Dma, Fill, Instruction, Mme, Operand, Reduce, Vector

Resource = tuple


def elements(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def stream_bytes(o: Operand, shape: tuple[int, ...]) -> int:
    """Bytes a compute unit streams for operand ``o``: broadcast (stride-0) dims are reused inside
    the unit, every other box point is one element access."""
    return o.itemsize * math.prod(n for n, s in zip(shape, o.strides) if s)


def mme_dims(ins: Mme) -> tuple[int, int, int, int]:
    """(batch, M, N, K) of an MME instruction: reduce dims give K; a spatial dim indexed by ``a``
    only is an M (PE row) dim, by ``b`` only an N (PE column) dim, by both (or neither) a batch dim."""
    batch = m = n = k = 1
    for e, r, sa, sb in zip(ins.shape, ins.reduce, ins.a.strides, ins.b.strides):
        if r:
            k *= e
        elif sa and not sb:
            m *= e
        elif sb and not sa:
            n *= e
        else:
            batch *= e
    return batch, m, n, k


def mme_cycles(batch: int, m: int, n: int, k: int, hw: Hardware) -> int:
    """Cycles of ``batch`` ``m x n x k`` products on the MME. The "flat" model: output-stationary,
    M on the PE rows, N on the columns, K in time, plus the array's fill/drain once. The "tenet"
    model: ``batch`` times the latency of one product under the MME's dataflow, counted on the
    relations (``tvm_dsa.dataflow.mme``; ``cost_model`` says which applies)."""
    if cost_model(hw) == "tenet":
        return batch * tile_cycles(hw, m, n, k)
    pipeline = hw.mme.pipeline_cycles or hw.mme.rows + hw.mme.cols
    return batch * -(-m // hw.mme.rows) * -(-n // hw.mme.cols) * k + pipeline


@dataclass(frozen=True)
class MmeTraffic:
    """Bytes an MME instruction moves: each operand between its memory and the PE array (``a``, ``b``
    read, ``dst`` written), across PE-to-PE links, and read back from the PEs' own registers."""

    a: int
    b: int
    dst: int
    links: int = 0
    registers: int = 0


def mme_traffic(ins: Mme, hw: Hardware) -> MmeTraffic:
    """The "flat" model streams every operand element once (``stream_bytes``: the array reuses the
    rest, how is not modelled). The "tenet" model moves, per tensor of each product, the dataflow's
    unique volume between the memory and the array (the output's is its write-backs), its spatial
    reuse over PE links and its temporal reuse from PE registers (seed 003's volumes)."""
    if cost_model(hw) != "tenet":
        return MmeTraffic(stream_bytes(ins.a, ins.shape), stream_bytes(ins.b, ins.shape),
                          stream_bytes(ins.dst, ins.shape))
    return product_traffic(hw, *mme_dims(ins), (ins.a.itemsize, ins.b.itemsize, ins.dst.itemsize))


def product_traffic(hw: Hardware, batch: int, m: int, n: int, k: int, sizes: tuple[int, int, int]) -> MmeTraffic:
    """What ``batch`` ``m x n x k`` products move under the MME's dataflow ("tenet"; ``sizes``:
    bytes of an element of A, B and Y), as ``mme_traffic`` counts an instruction's: what the SET
    evaluator bills a layer's parts with."""
    volumes = {t.tensor: t for t in tile_metrics(hw, m, n, k).tensors}
    size = dict(zip("ABY", sizes))
    return MmeTraffic(*(batch * volumes[t].unique * size[t] for t in ("A", "B", "Y")),
                      links=batch * sum(v.spatial_reuse * size[t] for t, v in volumes.items()),
                      registers=batch * sum(v.temporal_reuse * size[t] for t, v in volumes.items()))


def vector_cycles(n: int, unit: str, hw: Hardware) -> int:
    """Cycles of ``n`` element operations on the VME (``unit == "vme"``) or the vector core: one
    element per lane per cycle plus the pipeline latency."""
    lanes = hw.vme_lanes if unit == "vme" else hw.vector_lanes
    return -(-n // lanes) + hw.vector_latency_cycles


def compute_cycles(ins: Instruction, hw: Hardware) -> int:
    """Cycles of an MME / vector / reduce instruction (``mme_cycles``, ``vector_cycles``)."""
    if isinstance(ins, Mme):
        return mme_cycles(*mme_dims(ins), hw)
    if isinstance(ins, (Vector, Reduce)):
        return vector_cycles(elements(ins.shape), ins.unit, hw)
    raise TypeError(f"{type(ins).__name__} is a transfer, not a compute instruction")


def contiguous_run(o: Operand, shape: tuple[int, ...]) -> int:
    """Elements in one contiguous run of ``o`` walked in box order: the innermost dims merged while
    each dim's stride equals the run length so far (the chain starting at stride 1)."""
    run = 1
    for n, s in zip(reversed(shape), reversed(o.strides)):
        if n == 1:
            continue
        if s != run:
            break
        run *= n
    return run


def ddr_effective_bytes(o: Operand, shape: tuple[int, ...], hw: Hardware) -> int:
    """Bytes DDR actually moves for operand ``o``: every contiguous run rounded up to whole bursts."""
    run = contiguous_run(o, shape)
    burst = hw.ddr_burst_bytes
    return elements(shape) // run * -(-run * o.itemsize // burst) * burst


def mesh_hops(src_core: int, dst_core: int, hw: Hardware) -> int:
    """XY-routing hops between two cores of a mesh (position of a core within its cluster)."""
    w = hw.mesh[0]
    a, b = src_core % hw.cores_per_cluster, dst_core % hw.cores_per_cluster
    return abs(a % w - b % w) + abs(a // w - b // w)


def mesh_route(src_core: int, dst_core: int, hw: Hardware) -> list[tuple[int, int]]:
    """The directed links (core, next core) of the XY route between two cores of a mesh: along
    the row to the destination's column, then along that column (positions within the source's
    cluster, like ``mesh_hops``)."""
    w, cpc = hw.mesh[0], hw.cores_per_cluster
    base, a, b = src_core - src_core % cpc, src_core % cpc, dst_core % cpc
    x, y, links = a % w, a // w, []
    for axis, target in ((0, b % w), (1, b // w)):
        while (x, y)[axis] != target:
            step = 1 if target > (x, y)[axis] else -1
            nx, ny = (x + step, y) if axis == 0 else (x, y + step)
            links.append((base + y * w + x, base + ny * w + nx))
            x, y = nx, ny
    return links


def noc_hops(ins: Instruction, hw: Hardware) -> int:
    """Mesh hops of an LB-to-LB DMA between different cores; 0 for everything else."""
    if (isinstance(ins, Dma) and hw.interconnect == "mesh" and ins.src.mem == ins.dst.mem == "lb"
            and ins.src.index != ins.dst.index):
        return mesh_hops(ins.src.index, ins.dst.index, hw)
    return 0


def dma_demand(ins: Dma | Fill, hw: Hardware) -> dict[Resource, int]:
    """Bytes the transfer needs from each resource it crosses (DDR sides in whole bursts)."""
    payload = elements(ins.shape) * ins.dst.itemsize
    demand: dict[Resource, int] = {}

    def use(r: Resource, nbytes: int) -> None:
        demand[r] = demand.get(r, 0) + nbytes

    if isinstance(ins, Fill):
        use(("lb", ins.dst.index), payload)
        return demand
    cpc = hw.cores_per_cluster
    for o in (ins.src, ins.dst):
        if o.mem == "ddr":
            use(("ddr",), ddr_effective_bytes(o, ins.shape, hw))
        else:
            use((o.mem, o.index), payload)
    if ins.src.mem == ins.dst.mem == "lb" and ins.src.index != ins.dst.index:
        if hw.interconnect == "mesh":
            for link in mesh_route(ins.src.index, ins.dst.index, hw):
                use(("noc", *link), payload)
        else:  # a bus goes through the GB of each cluster on the way
            for c in {ins.src.index // cpc, ins.dst.index // cpc}:
                use(("gb", c), payload)
    elif {ins.src.mem, ins.dst.mem} == {"gb", "lb"} and hw.interconnect != "mesh":
        gb, lb = (ins.src, ins.dst) if ins.src.mem == "gb" else (ins.dst, ins.src)
        if lb.index // cpc != gb.index:  # another cluster's GB: the bus goes through the LB's GB too
            use(("gb", lb.index // cpc), payload)
    return demand


def dma_latency(ins: Dma | Fill, hw: Hardware) -> int:
    """Fixed cycles before a transfer moves data: the DMA set-up (plus one per mesh hop); a fill
    only has the short pipeline of a local write, modelled as the vector latency."""
    if isinstance(ins, Fill):
        return hw.vector_latency_cycles
    return hw.dma_latency_cycles + noc_hops(ins, hw)


def bandwidth(r: Resource, hw: Hardware) -> float:
    """Bytes per cycle of resource ``r``."""
    return {
        "ddr": hw.ddr_bytes_per_cycle,
        "gb": hw.gb_bytes_per_cycle,
        "lb": hw.lb_bytes_per_cycle,
        "noc": hw.noc_link_bytes_per_cycle,
    }[r[0]]


def dma_cycles(ins: Dma | Fill, hw: Hardware) -> int:
    """Uncontended cycles of a transfer: latency, then its slowest resource at full bandwidth."""
    demand = dma_demand(ins, hw)
    return dma_latency(ins, hw) + math.ceil(max(b / bandwidth(r, hw) for r, b in demand.items()) - 1e-9)


def instruction_cycles(ins: Instruction, hw: Hardware) -> int:
    """Uncontended cycles of any instruction."""
    if isinstance(ins, (Dma, Fill)):
        return dma_cycles(ins, hw)
    return compute_cycles(ins, hw)
