"""Parsing a resource allocation tree into a schedule (seed 002 §3.3).

For every layer: its tile group (a range of stripe ids, §3.3.2), its batch per invocation and the
number of invocations, the root child ("segment") it belongs to, whether its weights stay pinned,
and its intra-layer schedule. For every producer -> consumer edge: which parts of the feature map
go over the NoC to the consumer's tiles and which through DRAM (§3.3.1).

The seed's dataflow rules and how they are made precise here (docs/set.md quotes the seed):

- across different children of a root T-cut, a feature map goes through DRAM;
- otherwise it goes over the NoC when "consumed immediately", else through DRAM. An invocation of
  the producer writes one chunk (its samples); a consumer invocation reading that chunk consumes
  it immediately when it runs before the producer's next invocation in the tree's order: a T-cut
  runs sub-batch k of all its children before sub-batch k+1, an S-cut pipelines its children by
  sub-batch. In that order, with ``beta`` the batch of the children of the lowest common cut, the
  producer's next chunk (from sample ``(p+1)*b_u``) comes later iff it starts in a later
  ``beta``-block than the consumer's samples (from ``q*b_v``);
- feature maps kept on chip live in the retained half of the tiles' buffers (intra.py); when a
  segment's kept feature maps (one chunk per edge, summed over the edges crossing each leaf) and
  pinned weights exceed it, the excess fraction of every kept chunk is spilled through DRAM;
- weights: under a root T-cut each child's weights are loaded from DRAM once per root sub-batch
  and pinned while the child runs; under a root S-cut they are pinned for the whole run. Pinning
  fills the retained half of each tile in leaf order; a layer whose weights no longer fit reloads
  them at every invocation.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

from tvm_dsa.hardware.model import Hardware
from tvm_dsa.schedule.set.alloc import allocate, split_range
from tvm_dsa.schedule.set.intra import IntraLayer, LayerCost
from tvm_dsa.schedule.set.layers import LayerGraph
from tvm_dsa.schedule.set.tree import Leaf, Node, Path, Tree, sibling_dependencies


@dataclass(frozen=True)
class LeafPlan:
    """What the tree decides for one layer."""

    layer: int
    path: Path
    group: tuple[int, int]  # stripe ids [lo, hi) of its tile group
    batch: int  # samples per invocation
    invocations: int
    segment: int  # index of the root child it is under (0 under a root S-cut)
    pinned: bool  # weights loaded once per segment round and kept; else reloaded each invocation
    cost: LayerCost  # intra-layer schedule of one invocation

    @property
    def used(self) -> tuple[int, int]:
        """Stripe ids of the tiles the intra-layer partition uses (the first of the group)."""
        return self.group[0], self.group[0] + self.cost.tiles


class Chunk(NamedTuple):
    """Part of producer invocation ``p``'s output read by consumer invocation ``q`` (a tuple:
    large batches make thousands per tree)."""

    src: int
    p: int
    dst: int
    q: int
    elements: int
    noc: float  # fraction over the NoC (the rest through DRAM)


@dataclass(frozen=True)
class Schedule:
    tree: Tree
    leaves: tuple[LeafPlan, ...]  # indexed by layer
    chunks: tuple[Chunk, ...]
    spilled: tuple[float, ...]  # per segment: fraction of kept feature maps spilled to DRAM


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


def npt(node: Node, graph: LayerGraph, intra: IntraLayer) -> float:
    """Normalised processing time (§3.3.2): a leaf's one-sample time on one tile; a T-cut the sum
    of its children's; an S-cut that sum divided by ``sb / (sb + s)``, ``s`` the pipeline's start
    offset between its first and last child (the longest dependency chain among the children)."""
    if isinstance(node, Leaf):
        return intra.cost(node.layer, 1, 1).cycles
    total = sum(npt(c, graph, intra) for c in node.children)
    if node.kind == "T":
        return total
    depth = [0] * len(node.children)
    for i, j in sibling_dependencies(node, graph):
        depth[j] = max(depth[j], depth[i] + 1)
    return total * (node.sb + max(depth)) / node.sb


def allocate_groups(tree: Tree, graph: LayerGraph, intra: IntraLayer, tiles: int) -> dict[Path, tuple[int, int]]:
    """Tile group (stripe id range) of every node: a T-cut's children share its group, an S-cut
    splits its group by ``alloc.allocate`` on the children's NPTs, left to right."""
    groups: dict[Path, tuple[int, int]] = {}

    def walk(node: Node, path: Path, lo: int, hi: int) -> None:
        groups[path] = (lo, hi)
        if isinstance(node, Leaf):
            return
        if node.kind == "T":
            for i, c in enumerate(node.children):
                walk(c, path + (i,), lo, hi)
            return
        counts = allocate([npt(c, graph, intra) for c in node.children],
                          [c.min_tiles for c in node.children], hi - lo)
        for i, (c, (a, b)) in enumerate(zip(node.children, split_range(lo, counts))):
            walk(c, path + (i,), a, b)

    walk(tree.root, (), 0, tiles)
    return groups


def analyse(tree: Tree, graph: LayerGraph, hw: Hardware, intra: IntraLayer) -> Schedule:
    """The schedule a valid tree stands for (``tree.validate`` first)."""
    groups = allocate_groups(tree, graph, intra, hw.cores)
    leaves: dict = {}  # layer -> (path, group, batch, segment, intra-layer cost)
    for path, node, b in tree.nodes():
        if isinstance(node, Leaf):
            lo, hi = groups[path]
            leaves[node.layer] = (path, (lo, hi), b, path[0] if tree.root.kind == "T" else 0,
                                  intra.cost(node.layer, hi - lo, b))
    pinned = _pinned(tree, leaves, hw)
    plans = [LeafPlan(v, path, group, b, tree.batch // b, segment, v in pinned, cost)
             for v, (path, group, b, segment, cost) in sorted(leaves.items())]
    spilled = _spill(tree, graph, plans, hw)
    return Schedule(tree, tuple(plans), tuple(_chunks(tree, graph, plans, spilled)), tuple(spilled))


def _retained(hw: Hardware) -> int:
    """Elements of one tile's buffer that hold data kept between layers (the other half of the
    buffer is the running layer's working set, intra.py)."""
    return (hw.lb_bytes - hw.lb_bytes // 2) // hw.storage_bytes


def _pinned(tree: Tree, leaves: dict, hw: Hardware) -> set[int]:
    """The layers whose weights stay pinned: in leaf order, while every tile a layer uses has room
    for its per-tile weights (a layer without weights counts as pinned)."""
    cap = _retained(hw)
    usage: dict[int, list[int]] = {}  # segment -> elements pinned per tile
    out = set()
    for layer in tree.root.layers:
        _, (lo, _), _, segment, cost = leaves[layer]
        tiles = usage.setdefault(segment, [0] * hw.cores)
        hi = lo + cost.tiles
        w = cost.weight_tile
        if not w:
            out.add(layer)
        elif max(tiles[lo:hi]) + w <= cap:
            tiles[lo:hi] = [x + w for x in tiles[lo:hi]]
            out.add(layer)
    return out


def _lca(a: Path, b: Path) -> Path:
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return a[:k]


def _crosses(tree: Tree, pu: LeafPlan, pv: LeafPlan) -> bool:
    """True when an edge joins two children of a root T-cut (its feature map goes through DRAM)."""
    return tree.root.kind == "T" and pu.segment != pv.segment


def _chunks(tree: Tree, graph: LayerGraph, plans: list[LeafPlan], spilled: list[float]) -> list[Chunk]:
    """Every (producer invocation, consumer invocation) pair sharing samples, with the share of
    the chunk that goes over the NoC (0 when not consumed at once, less than 1 when spilled)."""
    out = []
    for u, v in graph.edges:
        pu, pv = plans[u], plans[v]
        lca = _lca(pu.path, pv.path)
        out += _edge_chunks(u, v, pu.batch, pv.batch, graph.layers[u].ofmap, _crosses(tree, pu, pv),
                            1.0 - spilled[pu.segment], tree.batch_of(lca) // tree.node(lca).sb, tree.batch)
    return out


@functools.lru_cache(maxsize=1 << 12)
def _edge_chunks(u: int, v: int, bu: int, bv: int, elems: int, cross: bool, kept: float, beta: int,
                 batch: int) -> tuple[Chunk, ...]:
    """``_chunks`` of one edge, from what decides them (memoised: a search's neighbouring trees
    differ in a few edges). ``beta``: the batch of the children of the edge's lowest common cut."""
    out = []
    for q in range(batch // bv):
        s0, s1 = q * bv, (q + 1) * bv
        for p in range(s0 // bu, (s1 - 1) // bu + 1):
            overlap = min(s1, (p + 1) * bu) - max(s0, p * bu)
            nxt = (p + 1) * bu
            immediate = not cross and (nxt >= batch or nxt // beta > s0 // beta)
            out.append(Chunk(u, p, v, q, overlap * elems, kept if immediate else 0.0))
    return tuple(out)


def _spill(tree: Tree, graph: LayerGraph, plans: list[LeafPlan], hw: Hardware) -> list[float]:
    """Per segment, the fraction of kept feature maps that does not fit the retained buffers
    (an edge inside a segment keeps at least its producer's last chunk on chip) beside the weights
    pinned for the round: those of layers running more than once a round. A layer running once
    holds its weights only around its invocation, as its working set (the lowered program frees
    a pin after the round's last invocation reading it); counting them for the whole segment
    spilled ResNet-50's feature maps at batch 1 on ``set-edge16`` (LS: 7.4 MB of DRAM the
    program does not move)."""
    order = tree.root.layers
    pos = {layer: k for k, layer in enumerate(order)}
    segments = max(p.segment for p in plans) + 1
    # one difference array over leaf positions: a segment's leaves are consecutive and its edges
    # open and close inside them, so the running sum restarts at 0 at every segment
    kept = [0] * (len(order) + 1)
    for u, v in graph.edges:
        if not _crosses(tree, plans[u], plans[v]):
            size = plans[u].batch * graph.layers[u].ofmap
            kept[pos[u]] += size
            kept[pos[v]] -= size
    cap = _retained(hw)
    lo = [hw.cores] * segments
    hi = [0] * segments
    pinned = [0] * segments
    peak = [0] * segments
    root = tree.root
    round_batch = tree.batch // root.sb if root.kind == "T" else tree.batch
    run = 0
    for layer, d in zip(order, kept):
        p = plans[layer]
        seg = p.segment
        run += d
        if run > peak[seg]:
            peak[seg] = run
        if p.group[0] < lo[seg]:
            lo[seg] = p.group[0]
        if p.group[1] > hi[seg]:
            hi[seg] = p.group[1]
        if p.pinned and round_batch > p.batch:
            pinned[seg] += p.cost.weight_tile * p.cost.tiles
    spilled = []
    for seg in range(segments):
        room = max(0, (hi[seg] - lo[seg]) * cap - pinned[seg])
        spilled.append(0.0 if peak[seg] <= room else 1 - room / peak[seg])
    return spilled
