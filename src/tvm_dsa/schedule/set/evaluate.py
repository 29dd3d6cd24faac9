"""The fast evaluator (seed 002 §4.3): latency and energy of a resource allocation tree.

Latency: every leaf invocation (a layer on its tile group for its batch of samples) is a rectangle
of the S-T graph. Invocations run in the tree's order on their tiles (a tile runs one layer at a
time) and start when their tiles are free and the producer invocations holding their samples have
ended. An invocation lasts ``pipelined(compute, max(DRAM, NoC), rounds) + DMA latency``: the longer
of compute and transfers, plus the shorter for the one round of a tile's part that nothing hides
(all of it where the part fits the buffer in one round: a lowered layer's one tile per core loads,
then computes). Compute and rounds come from the intra-layer schedule; DRAM lasts until its bytes
have gone through the chip's DRAM bandwidth in the time other invocations leave it idle (``_Dram``:
a group running alone gets all of it, as in the simulator, where transfers in flight share DRAM;
together no groups move more than it allows); NoC is the load of the busiest mesh link it uses
(``noc_link_bytes_per_cycle``), loads of its producers added, and no shorter than a DMA set-up
for each piece a tile gathers (``_route``: one transfer per producer tile holding part of its
block, as the lowered tiles load them, in order on their queue; on ``set-cloud144`` a small layer
split over 144 tiles gathers 8-32 pieces, and set-ups, not bytes, set its time). A convolution's
input, from DRAM or the NoC, counts as often as its parts' windows read it (``LayerCost.halo``).

Data on the mesh: a datum several tiles need (the copies a partitioned layer makes) travels its XY
multicast tree, each link once (``Mesh``); a feature map goes from the producer tiles holding each
part to the consumer tiles needing it (``layout_share``); DRAM traffic enters at the perimeter.

Energy by component (the seed's E_tot = sum DRAM accesses * e_d + sum link flits * e_hop + sum
tile energy): ``mac`` (MACs of every layer and sample), ``vector``, ``sram`` (buffer accesses at
``lb_pj_per_bit``), ``noc`` (bits x links crossed, feature maps between groups and DRAM traffic between
its controllers on the mesh perimeter and the tiles), ``dram`` (bits read and written),
``pe_array`` (the products' bits over PE links and from PE registers, as the simulator's report
counts them: 1.8 pJ a MAC on the int8 SET presets, 2.3 on the fp16 ones, 45-100 times
``mac_pj``; without it the evaluator counted a quarter of the simulated joules, and E²D searches
traded latency for energy the programs do not save).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from tvm_dsa.hardware.model import Hardware
from tvm_dsa.schedule.set.alloc import stripe_order
from tvm_dsa.schedule.set.analysis import LeafPlan, Schedule, Slot, analyse
from tvm_dsa.schedule.set.intra import IntraLayer, pipelined
from tvm_dsa.schedule.set.layers import LayerGraph
from tvm_dsa.schedule.set.tree import Tree, invocation_order


@dataclass(frozen=True)
class Evaluation:
    latency: float  # cycles
    energy: dict  # picojoules by component: mac, vector, sram, noc, dram, pe_array
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
    """XY multicast trees between tiles and from DRAM on the mesh, memoised per question.

    A datum several tiles need (the copies a partitioned layer makes, ``LayerCost.copy_sets``)
    travels once along its XY multicast tree: the union of the XY routes from its source to each
    destination, every link of it crossed once (the seed authors' evaluator multicasts too). A
    single destination is the plain XY route."""

    def __init__(self, hw: Hardware):
        self.width, self.height = hw.mesh
        self.xy = np.array(stripe_order(self.width, self.height))
        x, y = self.xy[:, 0], self.xy[:, 1]
        border = (x == 0) | (x == self.width - 1) | (y == 0) | (y == self.height - 1)
        self._ports = self.xy[border]  # the routers next to a DRAM controller, one hop off the mesh
        self._memo: dict = {}

    def edge_hops(self, lo: int, hi: int) -> float:
        """Mean hops between the tiles [lo, hi) and a DRAM controller on the mesh perimeter (each
        tile's own data: ``from_dram`` of one-tile sets)."""
        return self.from_dram(lo, tuple((t,) for t in range(hi - lo)))

    def multicast(self, src: tuple[int, int], lo: int, sets: tuple[tuple[int, ...], ...],
                  share: np.ndarray) -> tuple[float, float]:
        """(mean links, load of the busiest directed link) per unit of data of which tile
        ``src[0] + i`` sends ``share[i, j]`` to every tile of set ``j`` (offsets from ``lo``), each
        along its multicast tree."""
        spans = self._spans(lo, sets)
        sources = self.xy[src[0]:src[1]]
        return float((share * self._tree_links(sources, spans)).sum()), self._peak_load(sources, spans, share)

    def from_dram(self, lo: int, sets: tuple[tuple[int, ...], ...]) -> float:
        """Mean links a unit of data read from DRAM crosses to reach every tile of one of ``sets``
        (offsets from ``lo``, equally loaded): the hop from the controller to the perimeter router
        whose multicast tree is smallest, and that tree."""
        key = ("dram", lo, sets)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = 1.0 + float(self._tree_links(self._ports, self._spans(lo, sets)).min(axis=0).mean())
        return hit

    def _spans(self, lo: int, sets) -> tuple:
        """Per set: its tiles' lowest and highest column, and per column whether the set has a tile
        there and its lowest and highest row (arrays of shape (sets,) and (sets, width))."""
        key = ("spans", lo, sets)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = self._spans_of(lo, sets)
        return hit

    def _spans_of(self, lo: int, sets) -> tuple:
        n, w = len(sets), self.width
        xmin, xmax = np.full(n, w), np.full(n, -1)
        cols = np.zeros((n, w), dtype=bool)
        ymin, ymax = np.full((n, w), self.height), np.full((n, w), -1)
        for i, tiles in enumerate(sets):
            for x, y in self.xy[[lo + t for t in tiles]]:
                xmin[i], xmax[i] = min(xmin[i], x), max(xmax[i], x)
                cols[i, x] = True
                ymin[i, x], ymax[i, x] = min(ymin[i, x], y), max(ymax[i, x], y)
        return xmin, xmax, cols, ymin, ymax

    @staticmethod
    def _tree_links(sources: np.ndarray, spans) -> np.ndarray:
        """Links of the XY multicast tree from each source to each set, shape (sources, sets): the
        source's row from it to the set's farthest columns, then each column from the source's
        row to the set's farthest rows in it."""
        xmin, xmax, cols, ymin, ymax = spans
        sx, sy = sources[:, 0:1], sources[:, 1:2]
        row = np.maximum(sx, xmax) - np.minimum(sx, xmin)
        sy3 = sy[:, :, None]
        column = (np.maximum(sy3, ymax) - np.minimum(sy3, ymin)) * cols
        return row + column.sum(axis=2)

    def _peak_load(self, sources: np.ndarray, spans, share: np.ndarray) -> float:
        """The busiest directed link's share of the data (``share[i, j]`` from source i to set j)."""
        xmin, xmax, cols, ymin, ymax = spans
        n, w, h = len(xmin), self.width, self.height
        f = share.ravel()
        sx, sy = np.repeat(sources[:, 0], n), np.repeat(sources[:, 1], n)
        xmin, xmax = np.tile(xmin, len(sources)), np.tile(xmax, len(sources))
        peak = 0.0
        # the row leg east and west of the source: links [a, b) of row sy
        for a, b in ((sx, np.maximum(xmax, sx)), (np.minimum(xmin, sx), sx)):
            diff = np.zeros((h, w + 1))
            np.add.at(diff, (sy, a), f)
            np.add.at(diff, (sy, b), -f)
            peak = max(peak, float(np.cumsum(diff, axis=1).max()))
        # each column leg north and south of the source's row: links [a, b) of column x
        weight = np.tile(cols, (len(sources), 1)) * f[:, None]
        x = np.broadcast_to(np.arange(w), weight.shape)
        y = np.broadcast_to(sy[:, None], weight.shape)
        ylo, yhi = np.tile(ymin, (len(sources), 1)), np.tile(ymax, (len(sources), 1))
        for a, b in ((y, np.maximum(yhi, y)), (np.minimum(ylo, y), y)):
            diff = np.zeros((w, h + 1))
            np.add.at(diff, (x, a), weight)
            np.add.at(diff, (x, b), -weight)
            peak = max(peak, float(np.cumsum(diff, axis=1).max()))
        return peak


def _block_overlap(parts: int, rows: tuple[int, int, int], other: int, other_rows: tuple[int, int, int]) -> np.ndarray:
    """Share of a chunk in each of ``parts`` equal blocks of one side's rows and each of
    ``other``'s of the other side's, shape (parts, other). ``rows`` = (a, b, n): the chunk is
    samples [a, b) of that side's n (rows are sample-major; a block is a fraction of them)."""
    def blocks(k, rows):
        a, b, n = rows
        edges = (np.arange(k + 1) * n / k - a) / (b - a)
        return np.clip(edges[:-1], 0, 1), np.clip(edges[1:], 0, 1)

    lo, hi = blocks(parts, rows)
    olo, ohi = blocks(other, other_rows)
    return np.clip(np.minimum(hi[:, None], ohi[None, :]) - np.maximum(lo[:, None], olo[None, :]), 0, None)


def layout_share(producer: tuple[int, int, int], rows_u: tuple[int, int, int], consumer: tuple[int, int, int],
                 rows_v: tuple[int, int, int]) -> np.ndarray:
    """Share of a chunk each producer tile holds for each consumer ifmap block, shape (producer
    tiles, consumer blocks), from the two partitions (``LayerCost.copy_sets`` numbers the tiles):
    a producer part holds its batch block x row block x column block of the output, a consumer
    block needs its batch block x row block, every column. Blocks of the two sides meet by their
    fraction of the dimension (rows of consecutive layers follow the samples and their pixels or
    tokens); convolution halos scale the volume (``LayerCost.halo``), not these shares."""
    pb, pm, pn = producer
    qb, qm, _ = consumer
    batch = _block_overlap(pb, (0, 1, 1), qb, (0, 1, 1))
    rows = _block_overlap(pm, rows_u, qm, rows_v)
    share = (batch[:, None, :, None] * rows[None, :, None, :]).reshape(pb * pm, qb * qm) / pn
    return np.repeat(share, pn, axis=0)


def latency_bound(graph: LayerGraph, hw: Hardware, batch: int) -> float:
    """Cycles no tree can beat at ``batch`` (the roofline): every MAC at the chip's peak rate, or
    every weight once and the graph's inputs and outputs through DRAM at its whole bandwidth."""
    layers = graph.layers
    macs = batch * sum(layer.macs for layer in layers)
    elements = sum(layer.weights for layer in layers) + batch * sum(
        layer.dram_in + (layer.ofmap if layer.output else 0) for layer in layers)
    return max(macs / hw.peak_macs_per_cycle, elements * hw.storage_bytes / hw.ddr_bytes_per_cycle)


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
        self._routes: dict = {}  # (producer tiles and partition, consumer's) and chunk -> _route
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
        """What every invocation of a layer shares: its group, the tiles it uses, compute cycles and
        the rounds a tile runs them in, DRAM bytes it always moves (re-fetches, returned outputs),
        the mean hops to DRAM, the mean links an ifmap and a weight element read from DRAM cross
        to all their copies (memoised: they depend on the layer, its group and its batch only)."""
        key = (plan.layer, plan.group, plan.batch)
        hit = self._memo.get(key)
        if hit is None:
            hw, layer, mesh = self.hw, self.graph.layers[plan.layer], self.mesh
            lo, hi = plan.group
            fixed = (plan.cost.refetch + (layer.ofmap * plan.batch if layer.output else 0)) * hw.storage_bytes
            ifmap_sets, weight_sets = plan.cost.copy_sets()
            hit = self._memo[key] = (lo, hi, plan.used, plan.cost.cycles, plan.cost.rounds, fixed,
                                     mesh.edge_hops(*plan.used), mesh.from_dram(lo, ifmap_sets),
                                     mesh.from_dram(lo, weight_sets))
        return hit

    def _route(self, producer: LeafPlan, p: int, consumer: LeafPlan, q: int) -> tuple[float, float, int]:
        """(mean links, busiest link's load) per element of the chunk producer invocation ``p``
        sends consumer invocation ``q`` over the NoC: from the producer tiles holding each part to
        the consumer tiles needing it (``layout_share``), multicast to an ifmap block's copies;
        and the most pieces a consumer tile gathers (the producer tiles holding part of its
        block), each a transfer of its own."""
        bu, bv = producer.batch, consumer.batch
        a, b = max(p * bu, q * bv), min((p + 1) * bu, (q + 1) * bv)  # the chunk's samples
        rows_u, rows_v = (a - p * bu, b - p * bu, bu), (a - q * bv, b - q * bv, bv)
        key = (producer.used, producer.cost.partition, consumer.group[0], consumer.cost.partition, rows_u, rows_v)
        hit = self._routes.get(key)
        if hit is None:
            share = layout_share(producer.cost.partition, rows_u, consumer.cost.partition, rows_v)
            hit = self._routes[key] = (*self.mesh.multicast(producer.used, consumer.group[0],
                                                            consumer.cost.copy_sets()[0], share),
                                       int(np.count_nonzero(share > 0, axis=0).max()))
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
        route = self._route
        slots = []
        for v, q in invocation_order(tree):
            plan, layer = plans[v], graph.layers[v]
            lo, hi, used, cycles, rounds, fixed, edge_hops, ifmap_links, weight_links = per_layer[v]
            start = free.free_at(lo, hi)
            halo = plan.cost.halo
            ifmap_dram = layer.dram_in * plan.batch * halo  # each part's window read; copies fan out on the NoC
            weight_dram = layer.weights if not plan.pinned or (q * plan.batch) % round_batch == 0 else 0
            noc_load = 0.0
            pieces = 0  # transfers a tile's queue runs for its input, one DMA set-up each at least
            for src, p, _, _, elements, noc in inputs.get((v, q), ()):
                start = max(start, ends[src][p])
                ifmap_dram += elements * (1 - noc) * halo
                if noc:
                    links, peak, gathered = route(plans[src], p, plan, q)
                    pieces += gathered
                    volume = elements * noc * eb * halo
                    noc_bit_hops += volume * 8 * links
                    noc_load += volume * peak
            written = writes.get((v, q), 0)
            dram = (ifmap_dram + weight_dram + written) * eb + fixed
            noc_bit_hops += ((ifmap_dram * ifmap_links + weight_dram * weight_links) * eb
                             + (written * eb + fixed) * edge_hops) * 8
            dram_total += dram
            transfer = max(drams.transfer(start, dram / ddr_bw) - start, noc_load / link, pieces * dma)
            duration = pipelined(cycles, transfer, rounds) + dma
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
            "pe_array": sum((p.cost.pe_links * e.pe_link_pj_per_bit + p.cost.pe_registers * e.pe_register_pj_per_bit)
                            * p.invocations for p in plans) * 8,
        }
        return Evaluation(max(free.times), energy, dram_total, noc_bit_hops, hw.clock_hz, tuple(slots))
