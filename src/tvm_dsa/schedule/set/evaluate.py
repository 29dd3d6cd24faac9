"""The fast evaluator (seed 002 §4.3): latency and energy of a resource allocation tree.

Latency: every leaf invocation (a layer on its tile group for its batch of samples) is a rectangle
of the S-T graph. Invocations run in the tree's order on their tiles (a tile runs one layer at a
time) and start when their tiles are free and the producer invocations holding their samples have
ended. An invocation lasts ``max(compute, DRAM, NoC) + DMA latency``: compute from the intra-layer
schedule; DRAM until its bytes have gone through the chip's DRAM bandwidth in the time other
invocations leave it idle (``_Dram``: a group running alone gets all of it, as in the simulator,
where transfers in flight share DRAM; together no groups move more than it allows); NoC the load of
the busiest mesh link it uses (XY routing, ``noc_link_bytes_per_cycle``), loads of its producers
added.

Energy by component (the seed's E_tot = sum DRAM accesses * e_d + sum link flits * e_hop + sum
tile energy): ``mac`` (MACs of every layer and sample), ``vector``, ``sram`` (buffer accesses at
``lb_pj_per_bit``), ``noc`` (bits x hops, feature maps between groups and DRAM traffic between
its controllers on the mesh perimeter and the tiles), ``dram`` (bits read and written).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from ...hardware.model import Hardware
from .alloc import stripe_order
from .analysis import LeafPlan, Schedule, analyse
from .intra import IntraLayer
from .layers import LayerGraph
from .tree import Leaf, Node, Tree


@dataclass(frozen=True)
class Evaluation:
    latency: float  # cycles
    energy: dict  # picojoules by component: mac, vector, sram, noc, dram
    dram_bytes: float
    noc_bit_hops: float
    clock_hz: float
    timeline: tuple[Slot, ...] = ()  # with ``Evaluator.evaluate(..., timeline=True)``

    @property
    def seconds(self) -> float:
        return self.latency / self.clock_hz

    @property
    def joules(self) -> float:
        return sum(self.energy.values()) * 1e-12

    @property
    def edp(self) -> float:
        return self.joules * self.seconds

    def cost(self, n: float, m: float) -> float:
        """The search objective ``E^n * D^m`` (joules, seconds)."""
        return self.joules ** n * self.seconds ** m

    def to_dict(self) -> dict:
        return {"latency_cycles": self.latency, "seconds": self.seconds, "joules": self.joules,
                "edp": self.edp, "energy_pj": dict(self.energy), "dram_bytes": self.dram_bytes,
                "noc_bit_hops": self.noc_bit_hops}


class Mesh:
    """XY routing statistics between tile groups on the mesh, memoised per pair of id ranges."""

    def __init__(self, hw: Hardware):
        self.width, self.height = hw.mesh
        self.xy = np.array(stripe_order(self.width, self.height))
        x, y = self.xy[:, 0], self.xy[:, 1]
        edge = np.minimum(np.minimum(x, self.width - 1 - x), np.minimum(y, self.height - 1 - y)) + 1
        self._edge_sum = [0.0] + np.cumsum(edge).tolist()
        self._routes: dict = {}

    def edge_hops(self, lo: int, hi: int) -> float:
        """Mean hops between the tiles [lo, hi) and a DRAM controller on the mesh perimeter."""
        return (self._edge_sum[hi] - self._edge_sum[lo]) / (hi - lo)

    def route(self, src: tuple[int, int], dst: tuple[int, int]) -> tuple[float, float]:
        """(mean hops, load of the busiest directed link) per unit of data spread evenly from the
        tiles ``src`` to the tiles ``dst`` (id ranges), under XY routing."""
        key = (src, dst)
        hit = self._routes.get(key)
        if hit is None:
            hit = self._routes[key] = self._route(src, dst)
        return hit

    def _route(self, src, dst) -> tuple[float, float]:
        a, b = self.xy[src[0]:src[1]], self.xy[dst[0]:dst[1]]
        xs, ys = np.repeat(a[:, 0], len(b)), np.repeat(a[:, 1], len(b))
        xd, yd = np.tile(b[:, 0], len(a)), np.tile(b[:, 1], len(a))
        f = 1.0 / len(xs)
        peak = 0.0
        # horizontal leg in row ys, then vertical leg in column xd; each direction separately
        for row, s, e, n in ((ys, xs, xd, self.width), (xd, ys, yd, self.height)):
            for fwd in (e > s, e < s):
                diff = np.zeros((max(self.width, self.height), n + 1))
                np.add.at(diff, (row[fwd], np.minimum(s, e)[fwd]), f)
                np.add.at(diff, (row[fwd], np.maximum(s, e)[fwd]), -f)
                if fwd.any():
                    peak = max(peak, float(np.cumsum(diff, axis=1).max()))
        hops = float(np.mean(np.abs(xs - xd) + np.abs(ys - yd)))
        return hops, peak


def latency_bound(graph: LayerGraph, hw: Hardware, batch: int) -> float:
    """Cycles no tree can beat at ``batch`` (the roofline): every MAC at the chip's peak rate, or
    every weight once and the graph's inputs and outputs through DRAM at its whole bandwidth."""
    layers = graph.layers
    macs = batch * sum(layer.macs for layer in layers)
    elements = sum(layer.weights for layer in layers) + batch * sum(
        layer.dram_in + (layer.ofmap if layer.output else 0) for layer in layers)
    return max(macs / hw.peak_macs_per_cycle, elements * hw.storage_bytes / hw.ddr_bytes_per_cycle)


def invocation_order(tree: Tree) -> list[tuple[int, int]]:
    """(layer, invocation) in the tree's order: every cut runs sub-batch k of all its children
    before sub-batch k+1 (a T-cut one child after the other on shared tiles, an S-cut's children
    on their own tiles, pipelined). Each tile's invocations appear in the order it runs them and
    every producer invocation before the consumer invocations that read it; the lowered program
    (``codegen.set_program``) is emitted in this order too."""

    def order(node: Node, b: int) -> list[tuple[int, int, int]]:
        """(layer, invocation, samples per invocation) of ``node`` run over ``b`` samples: its
        first sub-batch's order, repeated with the invocations moved on by a sub-batch."""
        if isinstance(node, Leaf):
            return [(node.layer, 0, b)]
        bc = b // node.sb
        first = [x for c in node.children for x in order(c, bc)]
        return [(v, i + k * bc // lb, lb) for k in range(node.sb) for v, i, lb in first]

    return [(v, i) for v, i, _ in order(tree.root, tree.batch)]


class _Tiles:
    """When each tile is free, as runs of consecutive stripe ids free at the same time: a group
    occupies a range of ids at once, so a chip has few runs, and the evaluator's two questions
    per invocation cost a few list operations instead of numpy calls on every tile."""

    def __init__(self, tiles: int):
        self.cuts = [0, tiles]  # run k is [cuts[k], cuts[k + 1])
        self.times = [0.0]

    def free_at(self, lo: int, hi: int) -> float:
        """When all of the tiles [lo, hi) are free."""
        return max(self.times[bisect.bisect_right(self.cuts, lo) - 1:bisect.bisect_left(self.cuts, hi)])

    def occupy(self, lo: int, hi: int, end: float) -> None:
        """The tiles [lo, hi) are busy until ``end``."""
        cuts, times = self.cuts, self.times
        i = bisect.bisect_right(cuts, lo) - 1  # the run holding lo
        j = bisect.bisect_left(cuts, hi)  # the first run starting at or after hi
        head = [cuts[i]] if cuts[i] < lo else []
        tail = [hi] if cuts[j] > hi else []
        cuts[i:j] = head + [lo] + tail
        times[i:j] = ([times[i]] if head else []) + [end] + ([times[j - 1]] if tail else [])


class _Dram:
    """When DRAM is busy, as disjoint intervals in time order. An invocation's transfers take
    DRAM's idle time from its start on at the whole bandwidth (a fluid DRAM served in the tree's
    order), so invocations running at once never move more bytes than the bandwidth allows: a
    group alone gets all of it, groups running together share it."""

    def __init__(self):
        self.starts: list[float] = []
        self.ends: list[float] = []

    def transfer(self, start: float, cycles: float) -> float:
        """Reserve ``cycles`` of DRAM time in the idle gaps from ``start`` on; when they end."""
        if cycles <= 0:
            return start
        starts, ends = self.starts, self.ends
        i = j = bisect.bisect_left(ends, start)  # the first interval not over by ``start``
        t, left = start, cycles
        while j < len(starts) and starts[j] - t < left:  # this gap is too short: take it
            left -= max(starts[j] - t, 0.0)
            t = ends[j]
            j += 1
        end = t + left
        if j < len(starts) and starts[j] == end:  # the reservation closes the next gap
            end = ends[j]
            j += 1
        lo = min(start, starts[i]) if i < j else start
        starts[i:j], ends[i:j] = [lo], [max(end, t)]
        return t + left


@dataclass(frozen=True)
class Slot:
    """One rectangle of the S-T graph: invocation ``invocation`` of ``layer`` (samples
    ``[invocation * batch, (invocation + 1) * batch)``) on stripe ids ``tiles`` from ``start`` to
    ``end`` (cycles)."""

    layer: int
    invocation: int
    batch: int
    tiles: tuple[int, int]
    start: float
    end: float


EVALUATED_TREES = 1 << 14  # evaluations an ``Evaluator`` remembers (it forgets them all past this)


class Evaluator:
    """Evaluates trees of one layer graph on one chip; intra-layer schedules and routes are
    memoised across trees (a search evaluates thousands), and so are the trees' evaluations: an
    annealing search proposes the same neighbour again (ResNet-50 on set-edge16 at batch 64: 17 %
    of 2,242 evaluations at beta = 40)."""

    def __init__(self, graph: LayerGraph, hw: Hardware):
        if hw.interconnect != "mesh":
            raise ValueError(f"SET needs a mesh of tiles; chip {hw.name!r} has a {hw.interconnect}")
        self.graph, self.hw = graph, hw
        self.intra = IntraLayer(graph, hw)
        self.mesh = Mesh(hw)
        self._memo: dict = {}  # (layer, group, batch) -> _constants
        self._evaluated: dict = {}  # tree -> Evaluation

    def schedule(self, tree: Tree) -> Schedule:
        return analyse(tree, self.graph, self.hw, self.intra)

    def evaluate(self, tree: Tree, timeline: bool = False) -> Evaluation:
        if timeline:
            return self.evaluate_schedule(self.schedule(tree), timeline)
        hit = self._evaluated.get(tree)
        if hit is None:
            if len(self._evaluated) >= EVALUATED_TREES:
                self._evaluated.clear()
            hit = self._evaluated[tree] = self.evaluate_schedule(self.schedule(tree))
        return hit

    def _constants(self, plan: LeafPlan) -> tuple:
        """What every invocation of a layer shares: its group, the tiles it uses, compute cycles,
        DRAM bytes it always moves (re-fetches, returned outputs), the mean hops to DRAM
        (memoised: they depend on the layer, its group and its batch only)."""
        key = (plan.layer, plan.group, plan.batch)
        hit = self._memo.get(key)
        if hit is None:
            hw, layer = self.hw, self.graph.layers[plan.layer]
            lo, hi = plan.group
            fixed = (plan.cost.refetch + (layer.ofmap * plan.batch if layer.output else 0)) * hw.storage_bytes
            hit = self._memo[key] = (lo, hi, plan.used, plan.cost.cycles, fixed, self.mesh.edge_hops(lo, hi))
        return hit

    def evaluate_schedule(self, sched: Schedule, timeline: bool = False) -> Evaluation:
        """Latency and energy; with ``timeline`` also every invocation's rectangle (``Slot``)."""
        hw, graph, tree = self.hw, self.graph, sched.tree
        eb = hw.storage_bytes
        plans = sched.leaves
        inputs: dict = {}  # (v, q) -> chunks it reads
        writes: dict = {}  # (u, p) -> elements written to DRAM
        for c in sched.chunks:
            src, p, dst, q, _, noc = c
            inputs.setdefault((dst, q), []).append(c)
            if noc < 1:
                chunk = plans[src].batch * graph.layers[src].ofmap
                writes[(src, p)] = max(writes.get((src, p), 0), chunk * (1 - noc))
        root = tree.root
        round_batch = tree.batch // root.sb if root.kind == "T" else tree.batch
        free, drams = _Tiles(hw.cores), _Dram()
        ends: list[list[float]] = [[0.0] * p.invocations for p in plans]
        dram_total = noc_bit_hops = 0.0
        link, ddr_bw, dma = hw.noc_link_bytes_per_cycle, hw.ddr_bytes_per_cycle, hw.dma_latency_cycles
        per_layer = [self._constants(plan) for plan in plans]
        route = self.mesh.route
        slots = []
        for v, q in invocation_order(tree):
            plan, layer = plans[v], graph.layers[v]
            lo, hi, used, cycles, fixed, edge_hops = per_layer[v]
            cost = plan.cost
            ifmap_copies = cost.ifmap_copies
            start = free.free_at(lo, hi)
            ifmap_dram = layer.dram_in * plan.batch  # unique elements read; copies fan out on the NoC
            weight_dram = layer.weights if not plan.pinned or (q * plan.batch) % round_batch == 0 else 0
            noc_load = 0.0
            for src, p, _, _, elements, noc in inputs.get((v, q), ()):
                start = max(start, ends[src][p])
                ifmap_dram += elements * (1 - noc)
                if noc:
                    hops, peak = route(per_layer[src][2], used)
                    volume = elements * noc * ifmap_copies * eb
                    noc_bit_hops += volume * 8 * hops
                    noc_load += volume * peak
            written = writes.get((v, q), 0)
            dram = (ifmap_dram + weight_dram + written) * eb + fixed
            delivered = (ifmap_dram * ifmap_copies + weight_dram * cost.weight_copies + written) * eb
            noc_bit_hops += (delivered + fixed) * 8 * edge_hops
            dram_total += dram
            duration = max(cycles, drams.transfer(start, dram / ddr_bw) - start, noc_load / link) + dma
            end = start + duration
            ends[v][q] = end
            free.occupy(lo, hi, end)
            if timeline:
                slots.append(Slot(v, q, plan.batch, used, start, end))
        sram = sum(p.cost.sram * p.invocations for p in plans) * eb
        e = hw.energy
        energy = {
            "mac": sum(lay.macs for lay in graph.layers) * tree.batch * e.mac_pj,
            "vector": sum(lay.vector_ops for lay in graph.layers) * tree.batch * e.vector_op_pj,
            "sram": sram * 8 * e.lb_pj_per_bit,
            "noc": noc_bit_hops * e.noc_hop_pj_per_bit,
            "dram": dram_total * 8 * e.ddr_pj_per_bit,
        }
        return Evaluation(max(free.times), energy, dram_total, noc_bit_hops, hw.clock_hz, tuple(slots))
