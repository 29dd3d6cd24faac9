"""GraphTurbo's hardware-aware partitioning (seed 000 §3; docs/graphturbo.md is the spec).

The scheduler ``graphturbo`` groups a module's layers with these algorithms and returns one
stitched kernel per sub-graph; kernel generation (``kernelgen.stitch``) splits it into instances,
binds them to cores and places the tensors. The algorithms, pure functions on ``SubGraphs``:

- ``split_info`` (Algorithm 1): for each loop dimension ``d`` of a sub-graph's output tensor,
  whether it can split the sub-graph into instances whose footprint fits the local buffer, with
  which factor ``f_d``, and how many of the sub-graph's layers that split reaches (``n_d``).
- ``best_split`` (Eq. 1): lexmax(n_d, -f_d, -d).
- ``group`` (Algorithm 2): straight, diamond and branch merges, iterated until no pass lowers the
  number of sub-graphs, each merge allowed by rule (i) or (ii) on split factors.
- ``instance_graph`` and ``order_instances`` (§3.3, Algorithm 3): each sub-graph split into
  ``f_d`` isomorphic instances, edges between instances that share data only, ordered
  breadth-first and depth-first; the order that keeps fewer bytes in flight is kept.

Choices where the seed is silent (docs/graphturbo.md, §1 [AMBIG]):
- candidate factors ``v`` are the divisors of the dimension's extent (load balance), tried from
  small to large; the first whose instance fits (⌈peak / v⌉ ≤ LB) is kept, the greedy choice
  ("a smaller v cuts peak into larger pieces");
- ``peak`` is the most activation bytes live at once while the sub-graph runs its layers in
  order (inputs from other sub-graphs, intermediates until their last reader, outputs), in the
  chip's storage type; weights are promoted separately (§2.2) and not counted; ``graphturbo``
  gives the algorithms one cluster's share of the batch (§2.1);
- a layer is reached by the split when its output has the dimension ``d`` (same rank, same
  position) and the factor divides its extent there.
- in rule (i) for the branch pattern the seed compares the merged factor with SG2's; by analogy
  with the straight pattern (the consumer's factor) the exit's factor is used;
- a sub-graph with no split that fits the LB is not merged by the LB grouping (its merge could
  not fit either); a second grouping with the GB's capacity (§3.6: the LB may be replaced by the
  GB) merges the sub-graphs the first made, so the tensors between them stay in the GB, where a
  stitched kernel keeps its intermediates;
- instance ``i`` of a sub-graph split by ``f`` along dimension ``d`` covers the fraction
  [i/f, (i+1)/f) of its output along ``d``; a consumer instance needs a producer instance when
  both split the same dimension and their fractions overlap, and needs all of them otherwise;
- "better memory utilisation" (BFS vs DFS) is the smaller peak of bytes produced and not yet
  consumed by every instance that reads them (graph outputs leave the chip and do not count).
The recomputation cost model of §3.1 is not applied here: kernel generation coarsens a sub-graph's
instances instead (``kernelgen.stitch.RECOMPUTE_LIMIT``), it does not stop the merge. Applied here
(``benchmarks/graphturbo_recompute.py``), it rejects the channel splits that alone fit the LB and
with them most merges (docs/graphturbo.md).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import tvm_ffi
from tvm import tirx
from tvm.s_tir import SBlockRealize

from tvm_dsa.kernel.analysis import REDUCE_ITER, Load, contraction, int_value, uses_var
from tvm_dsa.kernel.macs import kernel_macs
from tvm_dsa.schedule import register
from tvm_dsa.schedule.graph import OpGraph, SubGraphs
from tvm_dsa.schedule.plan import RECOMPUTE_LIMIT, KernelSpec, Lowering, StitchPlan


@dataclass(frozen=True)
class Split:
    """One entry of SplitInfo: the 4-tuple (split_d, n_d, f_d, d) of seed 000 Algorithm 1."""

    d: int
    split: bool
    n: int
    f: int


def sg_tensors(sgs: SubGraphs, g: int) -> tuple[list[str], list[str], list[str]]:
    """(inputs from outside, intermediates, outputs) of SG ``g``: activation tensor names."""
    graph, members = sgs.graph, sgs.groups[g]
    inputs, inner, outputs = [], [], []
    for n in sorted(members):
        node = graph.nodes[n]
        for t in node.inputs:
            tensor = graph.tensors[t]
            if not tensor.constant and tensor.producer not in members and t not in inputs:
                inputs.append(t)
        used_outside = any(c not in members for c in graph.consumers(n)) or node.output in graph.outputs
        (outputs if used_outside or not graph.consumers(n) else inner).append(node.output)
    return inputs, inner, outputs


def peak_bytes(sgs: SubGraphs, g: int, element_bytes: int) -> int:
    """Peak activation bytes live while SG ``g`` runs its layers in order, in a storage type of
    ``element_bytes``: at each layer, the tensors already available (SG inputs, earlier outputs)
    that this or a later layer still reads or that leave the SG, plus this layer's output."""
    graph, order = sgs.graph, sorted(sgs.groups[g])
    inputs, _, outputs = sg_tensors(sgs, g)
    last = {t: k for k, n in enumerate(order) for t in graph.nodes[n].inputs}  # a tensor's last reader
    last.update((t, len(order)) for t in outputs)
    expiring: dict = {}  # layer -> bytes no longer live from it on
    live = peak = 0

    def arrives(t, k):
        nonlocal live
        if last.get(t, -1) >= k:
            nbytes = math.prod(graph.tensors[t].shape) * element_bytes
            live += nbytes
            expiring[last[t] + 1] = expiring.get(last[t] + 1, 0) + nbytes

    for t in inputs:
        arrives(t, 0)
    for k, n in enumerate(order):
        live -= expiring.pop(k, 0)
        arrives(graph.nodes[n].output, k)
        peak = max(peak, live)
    return peak


def split_info(sgs: SubGraphs, g: int, lb_bytes: int, element_bytes: int) -> list[Split]:
    """Algorithm 1 for SG ``g``'s (first) output tensor: one ``Split`` per loop dimension."""
    graph = sgs.graph
    _, _, outputs = sg_tensors(sgs, g)
    out = graph.tensors[outputs[0]].shape
    peak = peak_bytes(sgs, g, element_bytes)
    layers = [graph.tensors[graph.nodes[n].output].shape for n in sorted(sgs.groups[g])]
    info = []
    for d, extent in enumerate(out):
        f = next((v for v in range(1, extent + 1) if extent % v == 0 and math.ceil(peak / v) <= lb_bytes), None)
        if f is None:
            info.append(Split(d, False, 0, 0))
            continue
        reached = sum(1 for shape in layers if len(shape) == len(out) and shape[d] % f == 0)
        info.append(Split(d, True, reached, f))
    return info


def best_split(info: list[Split]) -> Split | None:
    """Eq. 1: the split reaching most layers, then with the smallest factor (fuller LB), then the
    outermost dimension (parallelism without communication). None when nothing splits."""
    candidates = [s for s in info if s.split]
    return max(candidates, key=lambda s: (s.n, -s.f, -s.d)) if candidates else None


def split_factor(sgs: SubGraphs, g: int, lb_bytes: int, element_bytes: int) -> int | None:
    """The factor of SG ``g``'s best split (None when no split fits)."""
    best = best_split(split_info(sgs, g, lb_bytes, element_bytes))
    return best.f if best else None


def group(sgs: SubGraphs, lb_bytes: int, element_bytes: int, fixed: frozenset = frozenset()) -> SubGraphs:
    """Algorithm 2: merge sub-graphs by the three patterns while a pass lowers their number.
    Nodes in ``fixed`` (layers the DSA cannot run) are never merged.

    Rule (i), straight {SG1, SG2} and branch {SG2, SG3}: the consumer's factor is not smaller
    than the producer's (a large factor does not spread past a downsampling), and the merged
    factor is not larger than the consumer's (grouping keeps the consumer's LB utilisation).
    Rule (ii), diamond {SG2, SG3, SG4}: the merged factor is not larger than the largest of
    theirs."""

    def factor(g):
        return split_factor(sgs, g, lb_bytes, element_bytes)

    def merged_factor(members):
        trial = SubGraphs(sgs.graph, list(sgs.groups))
        return split_factor(trial, trial.merge(members), lb_bytes, element_bytes)

    def rule_i(producer, consumer):
        fp, fc = factor(producer), factor(consumer)
        if fp is None or fc is None or fc < fp:
            return False
        fm = merged_factor({producer, consumer})
        return fm is not None and fm <= fc

    def rule_ii(members):
        fs = [factor(g) for g in members]
        if None in fs:
            return False
        fm = merged_factor(set(members))
        return fm is not None and fm <= max(fs)

    def run(pattern, allowed) -> None:
        """Merge the first allowed match and look again, until no match is allowed."""
        while True:
            for match in pattern():
                if not any(sgs.groups[g] & fixed for g in match) and allowed(match):
                    sgs.merge(match)
                    break
            else:
                return

    def pair_ok(m):
        return rule_i(*sorted(m))  # SGs are in topological order: the producer comes first

    while True:
        before = len(sgs.groups)
        run(sgs.straight, pair_ok)
        run(sgs.diamond, rule_ii)
        run(sgs.branch, pair_ok)
        if len(sgs.groups) == before:
            return sgs


def group_two_levels(sgs: SubGraphs, lb_bytes: int, gb_bytes: int, element_bytes: int,
                     fixed: frozenset = frozenset()) -> SubGraphs:
    """Algorithm 2 with the LB, then again with the GB over the sub-graphs it made (§3.6:
    "LB可以被GB替代"): a stitched kernel keeps the tensors between its layers in the GB, so
    sub-graphs are merged by the same patterns and rules with the GB's capacity in Algorithm 1,
    and the tensors between them stay on chip instead of crossing DDR between kernels. The LB
    grouping alone ends a sub-graph after each of MobileNetV2's depthwise convolutions (rule (i):
    the projection's factor is smaller), and its expanded tensors crossed DDR: 12.4x the model's
    compulsory bytes at batch 8. A layer of a ResNet-50 stage-1 block, which no split fits into
    the LB, is merged only at this level."""
    return group(group(sgs, lb_bytes, element_bytes, fixed), gb_bytes, element_bytes, fixed)


@dataclass(frozen=True)
class Instance:
    sg: int
    index: int  # 0 .. count - 1
    count: int
    dim: int | None  # split dimension of the SG's output (None: not split)
    nbytes: int  # bytes of its slice of the SG's output(s)

    def span(self) -> tuple[float, float]:
        return self.index / self.count, (self.index + 1) / self.count


def instance_graph(sgs: SubGraphs, splits: dict[int, Split | None], element_bytes: int):
    """(instances, edges): every SG's instances by its split, and producer -> consumer instance
    edges without the redundant ones (a consumer slice that reads nothing of a producer slice)."""
    graph = sgs.graph
    instances, first = [], {}
    for g in range(len(sgs.groups)):
        split = splits.get(g)
        count = split.f if split else 1
        _, _, outputs = sg_tensors(sgs, g)
        out_bytes = sum(math.prod(graph.tensors[t].shape) * element_bytes for t in outputs)
        first[g] = len(instances)
        instances += [Instance(g, i, count, split.d if split else None, out_bytes // count) for i in range(count)]
    edges = set()
    for c in range(len(sgs.groups)):
        for p in sgs.producers(c):
            for a in range(first[p], first[p] + instances[first[p]].count):
                for b in range(first[c], first[c] + instances[first[c]].count):
                    if _needs(instances[b], instances[a]):
                        edges.add((a, b))
    return instances, sorted(edges)


def _needs(consumer: Instance, producer: Instance) -> bool:
    if consumer.dim is None or producer.dim is None or consumer.dim != producer.dim:
        return True
    (c0, c1), (p0, p1) = consumer.span(), producer.span()
    return c0 < p1 and p0 < c1


def _topological(n: int, edges, depth_first: bool) -> list[int]:
    """Kahn's algorithm: a FIFO of ready instances gives BFS, a LIFO (the last ready first, as
    Algorithm 3 takes the last zero-in-degree instance) gives DFS."""
    indeg, succ = [0] * n, [[] for _ in range(n)]
    for a, b in edges:
        indeg[b] += 1
        succ[a].append(b)
    ready = [i for i in range(n) if indeg[i] == 0]
    order = []
    while ready:
        x = ready.pop() if depth_first else ready.pop(0)
        order.append(x)
        for y in succ[x]:
            indeg[y] -= 1
            if indeg[y] == 0:
                ready.append(y)
    return order


def bytes_in_flight(order: list[int], instances: list[Instance], edges) -> int:
    """Peak bytes produced by instances and still awaiting a consumer, over ``order``."""
    position = {x: k for k, x in enumerate(order)}
    last_reader = {}
    for a, b in edges:
        last_reader[a] = max(last_reader.get(a, -1), position[b])
    live, peak = 0, 0
    ends: dict[int, int] = {}
    for k, x in enumerate(order):
        if x in last_reader:
            live += instances[x].nbytes
            ends[last_reader[x]] = ends.get(last_reader[x], 0) + instances[x].nbytes
        peak = max(peak, live)
        live -= ends.pop(k, 0)
    return peak


def order_instances(instances: list[Instance], edges) -> tuple[list[int], str]:
    """Algorithm 3 and BFS; returns the order with fewer bytes in flight and its name (DFS on ties)."""
    dfs = _topological(len(instances), edges, depth_first=True)
    bfs = _topological(len(instances), edges, depth_first=False)
    if bytes_in_flight(bfs, instances, edges) < bytes_in_flight(dfs, instances, edges):
        return bfs, "bfs"
    return dfs, "dfs"


@register("graphturbo", Lowering(separable="stitched"))  # a pure reshape is a view on the host: sub-graphs end at it
def graphturbo(mod, hw, supported, options=None) -> list[KernelSpec]:
    """One stitched kernel per sub-graph of Algorithm 2's grouping of ``main``'s layers, with the
    sub-graph's best split (Eq. 1); layers the DSA cannot run stay single and on the host, and so
    do pure reshapes, as views (a Flatten between two sub-graphs: stitched, it was a layer copied
    in 16-byte pieces, and a small CNN ran 1.6x layerwise's cycles).

    Data parallelism comes first (§2.1): the batch is split across the clusters and Algorithms
    1 and 2 work on one cluster's share (``OpGraph.per_cluster``). A split of the outermost
    (batch) dimension is then made at least as fine as the number of cores (as far as the batch
    goes), so every cluster gets samples and, with a core per instance (Algorithm 4's factor 1),
    an instance's intermediates can stay in its core's LB; without a fitting split, the batch
    alone is split that way. With fewer samples than clusters (a sample's rows split over them),
    a sub-graph is cut before its windows (``window_cuts``) and reductions over all rows
    (``paying_cuts``); at a window over an image's rows whose exchange pays (``_exchange_pays``)
    it is not cut, and its instances exchange the halo rows instead (``StitchPlan.exchange``)."""
    whole = OpGraph.from_relax(mod)
    graph, share = whole.per_cluster(hw.clusters)
    esize = tvm_dtype_bytes(hw.storage_dtype)
    host = frozenset(n.index for n in graph.nodes if n.func not in supported)  # pure reshapes too: views
    alone = frozenset(n.index for n in graph.nodes if n.index not in host and not sample_wise(
        mod[n.func], _weights(graph, n)))
    sgs = group_two_levels(SubGraphs(graph), hw.lb_bytes, hw.gb_bytes, esize, host | alone)
    spread = whole.batch is not None and whole.batch < hw.clusters  # a sample's rows split over the clusters
    macs = {n.index: kernel_macs(mod[n.func]) for n in graph.nodes if n.index not in host} if spread else {}
    whole_groups = frozenset(sgs.groups)
    syncs = frozenset()
    if spread:
        windows = window_cuts(sgs, mod, hw, host, macs)
        syncs = frozenset(n for n in windows if _image_window(graph, mod, n)
                          and _exchange_pays(graph, mod, sorted(sgs.groups[sgs.owner[n]]), n))
        cuts = windows - syncs
        sgs = cut_before(sgs, paying_cuts(sgs, mod, hw, host, macs, cuts) | cuts)
    specs = []
    for g, members in enumerate(sgs.groups):
        if members & host:
            continue
        if members & alone:
            (n,) = members
            specs.append(KernelSpec(graph.nodes[n].func, (graph.nodes[n].name,)))
            continue
        best = best_split(split_info(sgs, g, hw.lb_bytes, esize))
        d, f = (best.d, best.f) if best else (0, 1)
        if d == 0:
            f = max(f * share, hw.clusters * hw.cores_per_cluster)
        calls = tuple(graph.nodes[n].name for n in sorted(members))
        rows = spread and spreading_saves(members, macs, hw) > hw.kernel_launch_cycles
        piece = spread and not rows and members not in whole_groups  # its launch is paid either way
        swap = exchanged(graph, mod, sorted(members), syncs) if rows or piece else ()
        specs.append(KernelSpec(f"sg{len(specs)}_{calls[0]}", calls, StitchPlan((d, f), rows, piece, swap)))
    return specs


def _image_window(graph: OpGraph, mod, n: int) -> bool:
    """Whether the first window from node ``n`` on (along its outputs' first readers) slides
    along an image's rows (the second-to-last dim of a 4-d tensor), the rows the instances
    exchange (``stitch.plan_instances``): not a 1-d signal's last dim (Conformer's tokens)."""
    while True:
        node = graph.nodes[n]
        k, axis = row_window_axis(mod[node.func], _weights(graph, node))
        if k > 1:
            return axis == -2 and len(graph.tensors[node.output].shape) == 4
        readers = sorted(graph.consumers(n))
        if not readers:
            return False
        n = readers[0]


def exchanged(graph: OpGraph, mod, order: list[int], syncs: frozenset) -> tuple[int, ...]:
    """Positions in ``order`` (a sub-graph's nodes) of the nodes whose outputs its row instances
    exchange through DDR at the ``syncs`` (the nodes ``window_cuts`` would cut before)."""
    at = {n: k for k, n in enumerate(order)}
    return tuple(sorted(at[p] for s in syncs if s in at for p in _halo_producers(graph, mod, order, s)))


def _halo_producers(graph: OpGraph, mod, order: list[int], s: int) -> set[int]:
    """The nodes of ``order`` before ``s`` whose outputs a node from ``s`` up to the first window
    at or after it reads: each instance would compute their rows of its halo again."""
    out: set[int] = set()
    before = set(order[:order.index(s)])
    for n in order[order.index(s):]:
        node = graph.nodes[n]
        out |= {graph.tensors[t].producer for t in node.inputs} & before
        if row_window_axis(mod[node.func], _weights(graph, node))[0] > 1:
            return out
    return out


def _exchange_pays(graph: OpGraph, mod, order: list[int], s: int) -> bool:
    """Whether the instances exchange halo rows at ``s`` rather than the sub-graph being cut there:
    where the tensors crossing ``s`` (computed before it, read at or after it) that no halo needs
    and that two or more of those nodes read (each cut would send them through DDR again:
    DenseNet-121's concatenated features, read by every later layer of a dense block) are at
    least as large as those exchanged (DenseNet-121 at batch 1: 674,276 -> 629,347 cycles). A
    residual read once at the end of its block (ResNet-50) is not: one kernel for the whole
    network then streams or promotes every weight alike, where kernels cut at each block choose
    each their own (ResNet-50 at batch 1: 803,860 -> 882,168 cycles exchanging wherever the
    tensors crossing are as large; the features DenseNet-121's last dense layer of a block reads
    once, exchanged, 609,563)."""
    at = order.index(s)
    before = set(order[:at])
    readers: dict = {}
    for n in order[at:]:
        for t in set(graph.nodes[n].inputs):
            if graph.tensors[t].producer in before:
                readers[t] = readers.get(t, 0) + 1
    halos = {graph.nodes[p].output for p in _halo_producers(graph, mod, order, s)}
    kept = {t for t, count in readers.items() if count > 1} - halos
    size = lambda names: sum(math.prod(graph.tensors[t].shape) for t in names)  # noqa: E731
    return size(kept) >= size(halos) > 0


def cut_before(sgs: SubGraphs, starts: frozenset) -> SubGraphs:
    """``sgs`` with each sub-graph cut before its nodes in ``starts``: each piece a run of the
    sub-graph's nodes in topological order (a path leaving a run and coming back would leave and
    re-enter the sub-graph, which is convex). With fewer samples than clusters a stitched kernel
    splits a sample's rows between instances (``kernelgen.stitch.plan_instances``), and a
    contraction of two computed tensors (attention's ``Q K^T`` and ``P V``) needs all rows of its
    second operand in every instance: within one sub-graph, every instance would compute all of
    it and what it reads (BERT-base's encoder ran as one kernel on one cluster at batch 1)."""
    groups = []
    for members in sgs.groups:
        run: list[int] = []
        for n in sorted(members):
            if run and n in starts:
                groups.append(frozenset(run))
                run = []
            run.append(n)
        groups.append(frozenset(run))
    return SubGraphs(sgs.graph, groups)


def spreading_saves(members, macs: dict, hw) -> float:
    """Cycles spreading the MACs of the nodes ``members`` (``macs``: per node) from one cluster
    over all would save at the MMEs' peak: what splitting a sample's rows can gain at most."""
    return sum(macs.get(n, 0) for n in members) / (hw.peak_macs_per_cycle / hw.clusters) * (1 - 1 / hw.clusters)


def paying_cuts(sgs: SubGraphs, mod, hw, host: frozenset, macs: dict, windows: frozenset) -> frozenset:
    """The nodes ``cut_before`` cuts a sub-graph before where a sample's rows are split over the
    clusters: its reductions that read all rows of an operand (``all_rows_read``) the piece since
    the last cut computes, where spreading it saves more than the launches of the kernels the cuts
    add (``spreading_saves``: DLRM's feature interaction, a few thousand MACs, is not cut into two
    kernels that each pay a launch); a piece starts at each of the ``windows`` (the window cuts,
    made first: a residual read across one is not counted). An operand
    computed before the last cut is read from DDR whole by every instance: ViT-B/16's ``P V``,
    its ``V`` computed before ``Q K^T``, stays with the softmax (cut there too, ViT-B/16 took
    2,790,875 cycles at batch 1, its probabilities through DDR, against 2,485,307).

    A contraction of two activations is cut before itself. A pooling over all rows (MobileNetV2's
    global average pooling) leaves a row to no cluster: kept with what comes before it, the whole
    sub-graph ran on one cluster. Its cut goes before the pooled tensor's producer where that
    reads no window and fewer bytes cross there (``cut_back``): the producer and the pooling split
    by channels, each cluster reading the producer's input whole (MobileNetV2 at batch 1: 186,946
    cycles as one kernel, 182,129 cut before the pooling, 179,285 before the 1 x 1 convolution
    whose 1,280 channels it pools)."""
    graph = sgs.graph
    cuts: set[int] = set()
    for members in sgs.groups:
        starts, run = set(), set()  # the cuts so far, the tensors the current piece computes
        for n in sorted(members):
            node = graph.nodes[n]
            if n in windows:
                run = set()
            whole = [node.inputs[i] for i in all_rows_read(mod[node.func], _weights(graph, node))
                     if i < len(node.inputs) and node.inputs[i] in run] if n not in host else []
            if whole:
                pair = pair_product(mod[node.func], _weights(graph, node))
                starts.add(n if pair or len(whole) > 1 else cut_back(graph, mod, n, whole[0], run))
                run = set()
            run.add(node.output)
        if starts and spreading_saves(members, macs, hw) > len(starts) * hw.kernel_launch_cycles:
            cuts |= starts
    return frozenset(cuts)


def cut_back(graph: OpGraph, mod, n: int, t: str, run: set) -> int:
    """Where a sub-graph is cut for node ``n``'s reduction over all rows of the tensor ``t``
    (computed in the piece whose tensors are ``run``): before ``n``, or before ``t``'s producer
    where that reads no window and the tensors it reads from the piece are smaller than ``t``."""
    producer = graph.nodes[graph.tensors[t].producer]
    size = lambda name: math.prod(graph.tensors[name].shape)  # noqa: E731
    if (row_window_axis(mod[producer.func], _weights(graph, producer))[0] <= 1
            and sum(size(i) for i in producer.inputs if i in run) < size(t)):
        return producer.index
    return n


def window_cuts(sgs: SubGraphs, mod, hw, host: frozenset, macs: dict) -> frozenset:
    """The nodes a sub-graph is cut before where a sample's rows are split over the clusters,
    for its windows over image rows or a sequence's positions (``row_window_axis``; Conformer's
    depthwise convolution over its 128 tokens, at batch 1: 79,248 -> 72,481 cycles cut before
    it). A window inside a sub-graph makes each row
    instance compute the rows of its halo again in every layer before it (since the last cut):
    with a cluster's share of ``r`` input rows, a window of ``k`` rows adds about (k - 1) / r of
    that work, and the windows after it add theirs. A cut writes the tensors crossing it to DDR
    and reads them back, and launches a kernel. In a sub-graph whose spreading saves more than a
    launch (``spreading_saves``), a window is cut from what comes before it where the
    recomputation, at the chip's peak, takes longer than that, or where it passes half of
    ``RECOMPUTE_LIMIT``'s share of the work since the last cut (past the limit the instances fall
    back to one cluster; tiles of several rows round each halo up to whole tiles, and
    DenseNet-121's first dense blocks, estimated within the limit, ran on one cluster). ResNet-50
    at batch 1 ran as one kernel on one cluster, its 14 or 7 rows split four ways recomputing
    more than they shared.

    The cut goes before the window, or earlier where that at least halves the bytes crossing it
    (``MOVE_SAVES``): before a node after the last window, the fewest bytes, where the piece it
    starts recomputes within those bounds, judged on its work up to the next window (the layers
    after a window recompute nothing for it). An inverted residual block is cut before its
    expansion, not before its depthwise convolution, which reads six times the channels
    (MobileNetV2 at batch 1 sent each expanded tensor through DDR: 272,193 -> 243,702 cycles)."""
    graph = sgs.graph
    esize = tvm_dtype_bytes(hw.storage_dtype)
    cuts: set[int] = set()
    for members in sgs.groups:
        if spreading_saves(members, macs, hw) <= hw.kernel_launch_cycles:
            continue  # not worth a second kernel however it splits
        order = sorted(members)
        windows = {}  # node -> (window rows, rows of the inputs it reads inside the sub-graph)
        for n in order:
            node = graph.nodes[n]
            k, axis = row_window_axis(mod[node.func], _weights(graph, node)) if n not in host else (0, -2)
            inside = [t for t in node.inputs if graph.tensors[t].producer in members]
            if k > 1 and inside:
                windows[n] = (k, max(graph.tensors[t].shape[axis] for t in inside))
        ahead, after = {}, 0.0  # per window, the MACs from it to the next window
        for n in reversed(order):
            after += macs.get(n, 0)
            if n in windows:
                ahead[n], after = after, 0.0
        last_read: dict[int, int] = {}  # node -> the last node inside reading its output
        for c in order:
            for t in graph.nodes[c].inputs:
                if graph.tensors[t].producer in members:
                    last_read[graph.tensors[t].producer] = c

        def crossing(cut: int) -> int:
            """Bytes a cut before node ``cut`` sends through DDR: produced before it inside, read
            at or after it inside."""
            return esize * sum(math.prod(graph.tensors[graph.nodes[m].output].shape)
                               for m, c in last_read.items() if m < cut <= c)

        def too_much(again: float, work: float, cut: int) -> bool:
            cost = 2 * crossing(cut) / hw.ddr_bytes_per_cycle + hw.kernel_launch_cycles  # written, read back
            return again / hw.peak_macs_per_cycle > cost or again > (RECOMPUTE_LIMIT - 1) * work / 2

        piece: list[int] = []  # the nodes since the last cut
        again = 0.0  # MACs computed again for the halos of the piece's windows
        for n in order:
            if n in windows and piece:
                k, rows = windows[n]
                more, work = _rework(piece, macs, k, rows, hw)
                if too_much(again + more, work, n):
                    free = list(itertools.takewhile(lambda m: m not in windows, reversed(piece[1:])))[::-1]

                    def instead(j: int) -> bool:  # a cut before free[j] (its piece up to the next window)
                        more, work = _rework(free[j:], macs, k, rows, hw)
                        return (MOVE_SAVES * crossing(free[j]) <= crossing(n)
                                and not too_much(more, work + ahead[n], free[j]))

                    cut = min([m for j, m in enumerate(free) if instead(j)] + [n], key=crossing)
                    cuts.add(cut)
                    piece = piece[piece.index(cut):] if cut != n else []
                    again = _rework(piece, macs, k, rows, hw)[0]
                else:
                    again += more
            piece.append(n)
    return frozenset(cuts)


MOVE_SAVES = 2  # a window's cut moves before an earlier node only where this many times fewer bytes cross it


def _rework(piece: list[int], macs: dict, k: int, rows: int, hw) -> tuple[float, float]:
    """(MACs computed again for the halo of a window of ``k`` over ``rows`` rows after the nodes
    ``piece``, their MACs)."""
    work = sum(macs.get(m, 0) for m in piece)
    return work * (k - 1) * hw.clusters / rows, work


def _weights(graph: OpGraph, node) -> frozenset:
    """The positions of ``node``'s constant inputs."""
    return frozenset(i for i, t in enumerate(node.inputs) if graph.tensors[t].constant)


def pair_product(func, weights: frozenset = frozenset()) -> bool:
    """Whether ``func`` contracts two activations: a reduction ``acc += a * b`` whose loads both
    read parameters not at the positions ``weights``."""
    constant = {p for i, p in enumerate(func.params) if i in weights}
    found = []

    def visit(realize):
        pair = contraction(realize.block)
        if pair and all(ld.source not in constant for ld in pair) and not pair[0].source.same_as(pair[1].source):
            found.append(realize)

    tvm_ffi.structural_walk(func.body, [(SBlockRealize, visit)])
    return bool(found)


def all_rows_read(func, weights: frozenset = frozenset()) -> frozenset:
    """The positions of ``func``'s activation parameters (not at the positions ``weights``) a
    reduction reads all the rows of, whatever rows of its output it computes. In a contraction
    of two activations ``acc += a * b``, a load whose second-to-last index uses none of the
    iterators of the store's (attention's keys ``K[j]`` in ``S[i, j]``, values ``V[j]`` in
    ``O[i]``); in a reduction that is not a contraction, a load whose second-to-last index uses
    reduced iterators alone (a global pooling's ``x[k2, k3]``). A row split's instance needs all
    of such an operand."""
    constant = {p for i, p in enumerate(func.params) if i in weights}
    found: set = set()

    def visit(realize):
        block = realize.block
        store = block.body
        reduced = {it.var for it in block.iter_vars if int(it.iter_type) == REDUCE_ITER}
        if not isinstance(store, tirx.BufferStore) or len(store.indices) < 2 or not reduced:
            return
        pair = contraction(block)
        if pair and (any(ld.source in constant for ld in pair) or pair[0].source.same_as(pair[1].source)):
            return  # a product with a weight (``x W``) or of a tensor with itself
        loads = []
        tvm_ffi.structural_walk(store.value, [(Load, loads.append)])
        rows = set(tirx.analysis.undefined_vars(store.indices[-2]))
        for ld in pair or loads:
            if len(ld.indices) < 2 or ld.source in constant:
                continue
            used = set(tirx.analysis.undefined_vars(ld.indices[-2]))
            if not used & rows and (pair or used and used <= reduced):
                found.update(i for i, p in enumerate(func.params) if ld.source.same_as(p))

    tvm_ffi.structural_walk(func.body, [(SBlockRealize, visit)])
    return frozenset(found)


def row_window_axis(func, weights: frozenset = frozenset()) -> tuple[int, int]:
    """(the rows of the window through which ``func`` reads an activation (not a parameter at the
    positions ``weights``), the axis of the load it slides along), (0, -2) if none: the extent of
    a reduction iterator that moves an index of a load's rows together with an output iterator
    (a 3 x 3 convolution's or pooling's ``oh * s + kh``: 3; a 1 x 1 convolution's, a matmul's or
    a global pooling's: 0), not through a division (a reshape's flat index folded into a
    contraction, ViT's heads: no window). The rows are an image's (the second-to-last dim) or a
    sequence's positions, the last dim of a 1-D signal (N, C, L) too: Conformer's convolution
    module slides its depthwise window along the tokens there."""
    constant = {p for i, p in enumerate(func.params) if i in weights}
    found = [(0, -2)]

    def visit(realize):
        block = realize.block
        moving = [iv for iv in block.iter_vars if int_value(iv.dom.extent) != 1]
        reduce = [iv for iv in moving if int(iv.iter_type) != 0]
        spatial = [iv.var for iv in moving if int(iv.iter_type) == 0]
        if not reduce or not isinstance(block.body, tirx.BufferStore):
            return
        loads = []
        tvm_ffi.structural_walk(block.body.value, [(Load, loads.append)])
        for ld in loads:
            if ld.source in constant or len(ld.indices) < 2:
                continue
            for axis in (-2, -1) if len(ld.indices) == 3 else (-2,):
                row = ld.indices[axis]
                divided = []
                tvm_ffi.structural_walk(row, [((tirx.FloorDiv, tirx.FloorMod), divided.append)])
                if not divided and any(uses_var(row, v) for v in spatial):
                    found.extend((int_value(iv.dom.extent) or 0, axis) for iv in reduce if uses_var(row, iv.var))

    tvm_ffi.structural_walk(func.body, [(SBlockRealize, visit)])
    return max(found)


def sample_wise(func, weights: frozenset = frozenset()) -> bool:
    """Whether each sample (a value of the leading dim) of ``func``'s output depends on the same
    sample of its inputs alone, as the batch split of stitched kernels and of the clusters
    assumes (§2.1): no reduction iterator indexes the leading dim of an access to an activation
    (not the parameters at positions ``weights``) of the output's rank. A softmax over axis 0 mixes the samples: it runs as a kernel of its own
    (stitched, ONNX's ``test_softmax_axis_0`` was wrong by 0.84)."""
    rank = len(func.params[-1].shape)
    constant = {p for i, p in enumerate(func.params) if i in weights}
    mixed = []

    def visit(realize):
        block = realize.block
        reduce = {iv.var for iv in block.iter_vars if int(iv.iter_type) != 0}
        if not reduce or not isinstance(block.body, tirx.BufferStore):
            return
        loads = []
        tvm_ffi.structural_walk(block.body.value, [(Load, loads.append)])
        for indices in [list(ld.indices) for ld in loads if ld.source not in constant] + [list(block.body.indices)]:
            if len(indices) == rank and any(uses_var(indices[0], v) for v in reduce):
                mixed.append(block)

    tvm_ffi.structural_walk(func.body, [(SBlockRealize, visit)])
    return not mixed


def tvm_dtype_bytes(dtype: str) -> int:
    import tvm

    return tvm.runtime.DataType(dtype).bits // 8
