"""Intra-layer scheduling (seed 002 §4.2.2): one layer on a tile group, searched exhaustively.

For ``s`` samples of a layer on ``g`` tiles the engine tries every partition of the contraction
``b x (s*m) x n x k`` into ``pb x pm x pn`` parts (one per tile; parts beyond the MME's block
count are useless and not tried), both mappings of M/N onto the PE array's rows and columns, and
both loop orders when a tile's working set does not fit its buffer (keep a block of weights and
stream the ifmap once per block, or the converse). A tile's compute time is the spine's MME and
vector cost (``runtime.cost``), the epilogue on the vector unit overlapping the next round's
product (``pipelined``: in one round it follows the product, as a lowered tile runs it). The
chosen partition minimises the invocation's time estimate:
compute and the time its inputs take to arrive, overlapped as far as the tile's rounds allow
(``pipelined``: a part that fits the buffer runs as one round, its loads before its product, as
the lowered programs run it; ``_search``).

Partitioning replicates data (§3.5): a tile of an N-split needs the whole ifmap of its rows, a
tile of an M-split all its weights; the copies are what enters the tiles. A convolution's M-split
blocks read overlapping windows of its input (``Layer.window_reads``: a 7 x 7 stride-2 stem split
in 144 blocks reads its image 3.6 times), which the lowered tiles load, each its own. Vector-only layers
(pooling, softmax, normalisation, copies) split their elements over the tiles and replicate their
(small) constants. Quantities are elements; the evaluator converts them with the storage width.

Half of each tile's buffer is the working set of the running layer; the other half holds what
the tree keeps on chip between layers (pinned weights, feature maps) — see ``evaluate``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tvm_dsa.kernel.ir import ALIGN
from tvm_dsa.hardware.model import Hardware
from tvm_dsa.dataflow.mme import cost_model
from tvm_dsa.runtime.cost import mme_cycles, product_traffic, vector_cycles
from tvm_dsa.schedule.set.layers import Layer, LayerGraph


@dataclass(frozen=True)
class LayerCost:
    """One invocation of a layer on a tile group (elements, not bytes)."""

    partition: tuple[int, int, int]  # (pb, pm, pn) parts; their product is the tiles used
    cycles: int  # compute cycles of the busiest tile
    ifmap_in: int  # ifmap elements entering the tiles (copies included, re-fetches not)
    weight_in: int  # weight elements entering the tiles (copies included)
    ofmap_out: int  # output elements leaving the tiles
    weight_tile: int  # weight elements one tile holds (what pinning keeps)
    sram: int  # buffer element accesses (writes of what enters, array reads, output writes/reads)
    refetch: int  # elements read again from DRAM because the working set did not fit
    rounds: int  # rounds a tile runs its part in: 1 where its working set fits, else halves of it
    pe_links: int = 0  # bytes the parts' products move over PE-to-PE links (``runtime.cost.product_traffic``)
    pe_registers: int = 0  # bytes they read back from the PEs' registers
    halo: float = 1.0  # ifmap elements the parts' windows read over the ifmap's (``Layer.window_reads``)

    @property
    def tiles(self) -> int:
        pb, pm, pn = self.partition
        return pb * pm * pn

    def copy_sets(self) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]:
        """The tiles (offsets in the group) that need the same ifmap element, and those that need
        the same weight element. Part ``(b, m, n)`` runs on tile ``(b * pm + m) * pn + n``: an
        ifmap block's ``pn`` copies sit on consecutive tiles (neighbours in stripe order), a weight
        block's ``pm`` copies ``pn`` tiles apart."""
        pb, pm, pn = self.partition
        ifmap = tuple(tuple(range(r * pn, (r + 1) * pn)) for r in range(pb * pm))
        weight = tuple(tuple(range(b * pm * pn + n, (b + 1) * pm * pn, pn)) for b in range(pb) for n in range(pn))
        return ifmap, weight


def pipelined(compute: float, transfer: float, rounds: int) -> float:
    """Cycles of a tile's part run in ``rounds`` rounds, each loading its share of ``transfer``
    while the round before computes: the longer of the two, plus the shorter's one round that
    nothing hides (the first load, or the last product). In one round the loads precede the
    product: their sum."""
    return max(compute, transfer) + min(compute, transfer) / rounds


def _rounds(working_set: int, room: int) -> int:
    """Rounds of a part whose tiles hold ``working_set`` elements where ``room`` fit: one where it
    fits, else rounds of half the room (two copies, so the next round loads while one computes)."""
    return 1 if working_set <= room else _ceil(2 * working_set, room)


def working_set_bytes(hw: Hardware) -> int:
    """Bytes of a tile's buffer the running layer's tiles may use (half; the other half keeps
    data between layers). Kernel generation tiles SET's layers to fit it too."""
    return hw.lb_bytes // 2 // ALIGN * ALIGN


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


class IntraLayer:
    """The intra-layer engine for one graph on one chip, memoised per (layer, tiles, samples)."""

    def __init__(self, graph: LayerGraph, hw: Hardware):
        self.graph, self.hw = graph, hw
        self.work_elements = working_set_bytes(hw) // hw.storage_bytes
        self._cache: dict = {}

    def cost(self, layer: int, tiles: int, samples: int) -> LayerCost:
        """The best schedule of ``samples`` samples of layer ``layer`` on ``tiles`` tiles."""
        key = (layer, tiles, samples)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self._search(self.graph.layers[layer], tiles, samples)
        return hit

    def _search(self, layer: Layer, g: int, s: int) -> LayerCost:
        """The candidate with the shortest estimated invocation: compute and the longer of DRAM
        (unique data and re-fetches at the group's share of the bandwidth) and delivery into the
        tiles (copies included, one NoC link per tile), ``pipelined`` over the part's rounds; ties
        go to the one moving less."""
        hw = self.hw
        dram_bw = hw.ddr_bytes_per_cycle * g / hw.cores / hw.storage_bytes  # elements per cycle
        link_bw = hw.noc_link_bytes_per_cycle * g / hw.storage_bytes
        best, best_key = None, None
        for cand in self._candidates(layer, g, s):
            moved = cand.ifmap_in + cand.weight_in
            unique = s * layer.ifmap * cand.halo + layer.weights  # each part's window read once
            transfer = max((unique + cand.refetch) / dram_bw, moved / link_bw)
            key = (pipelined(cand.cycles, transfer, cand.rounds), moved)
            if best_key is None or key < best_key:
                best, best_key = cand, key
        return best

    def _candidates(self, layer: Layer, g: int, s: int):
        c = layer.contraction
        if c is None:
            p = max(1, min(g, s * layer.ofmap // self.hw.vme_lanes))
            yield self._vector_only(layer, p, s)
            return
        rows, cols = self.hw.mme.rows, self.hw.mme.cols
        m = s * c.m
        for pb in range(1, min(c.b, g) + 1):
            for pn in range(1, min(_ceil(c.n, min(rows, cols)), g // pb) + 1):
                pm = max(1, min(g // (pb * pn), _ceil(m, min(rows, cols))))
                yield self._partitioned(layer, s, pb, pm, pn)

    def _vector_only(self, layer: Layer, p: int, s: int) -> LayerCost:
        ifmap, ofmap = s * layer.ifmap, s * layer.ofmap
        cycles = vector_cycles(_ceil(s * layer.vector_ops, p), "vme", self.hw)
        weight_in = layer.weights * p
        return LayerCost((1, p, 1), cycles, ifmap, weight_in, ofmap, layer.weights,
                         ifmap + weight_in + s * layer.vector_ops + 2 * ofmap, 0,
                         _rounds(_ceil(ifmap, p) + _ceil(ofmap, p) + layer.weights, self.work_elements))

    def _partitioned(self, layer: Layer, s: int, pb: int, pm: int, pn: int) -> LayerCost:
        hw, c = self.hw, layer.contraction
        rows, cols = hw.mme.rows, hw.mme.cols
        parts = pb * pm * pn
        bt, mt, nt = _ceil(c.b, pb), _ceil(s * c.m, pm), _ceil(c.n, pn)
        mme, m_rows, n_cols = min((mme_cycles(bt, mt, nt, c.k, hw), mt, nt), (mme_cycles(bt, nt, mt, c.k, hw), nt, mt))
        vec = vector_cycles(_ceil(s * layer.vector_ops, parts), "vme", hw) if layer.vector_ops else 0
        ifmap = s * layer.ifmap
        if layer.window is not None:
            ifmap += layer.window_reads(pm, s) - s * math.prod(layer.window[:3])
        i_t = _ceil(ifmap, pm * pb)
        w_t = _ceil(layer.weights, pn * pb)
        o_t = _ceil(s * layer.ofmap, parts)
        ri = rw = 1
        if i_t + w_t + o_t > self.work_elements:
            block = max(1, (self.work_elements - min(o_t, self.work_elements // 2)) // 2)
            ri_a, rw_b = _ceil(w_t, block), _ceil(i_t, block)  # weights kept / ifmap kept
            if i_t * ri_a + w_t <= i_t + w_t * rw_b:
                ri = ri_a
            else:
                rw = rw_b
        ifmap_in, weight_in = i_t * parts, w_t * parts
        reads = i_t * _ceil(nt, cols) + w_t * _ceil(mt, rows)
        sram = ifmap_in + weight_in + parts * (reads + 2 * o_t)
        refetch = (i_t * (ri - 1) + w_t * (rw - 1)) * parts
        rounds = _rounds(i_t + w_t + o_t, self.work_elements)
        pe = (0, 0)  # the "flat" MME model moves nothing over PE links (``runtime.cost.mme_traffic``)
        if cost_model(hw) == "tenet":
            moved = product_traffic(hw, parts * bt, m_rows, n_cols, c.k, (hw.storage_bytes, hw.storage_bytes, hw.accum_bytes))
            pe = (moved.links, moved.registers)
        return LayerCost((pb, pm, pn), int(pipelined(mme, vec, rounds)), ifmap_in, weight_in, s * layer.ofmap, w_t,
                         sram, refetch, rounds, *pe, ifmap / max(1, s * layer.ifmap))
