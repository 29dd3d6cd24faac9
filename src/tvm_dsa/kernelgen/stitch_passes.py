"""Kernel generation of a stitched sub-graph (seed 000 §4), one named pass per step.

A sub-graph module (``kernelgen.stitch.subgraph_module``) holds one PrimFunc per layer, already
tiled around its anchor op with its tile operands in LB scopes (the per-layer passes TileForLB,
AssignScopes, LowerToDSA), the tensors behind its parameters, and the sub-graph's boundary. Each
pass here adds its decision to the module as an attribute of plain TVM containers, so that
``mod.attrs`` and ``mod.script()`` show it and each pass can be run and tested alone:

    StitchBuffers       §4.2    instances: the tiles of every layer each computes, so
                                a layer's output stays on chip as the next one's input   dsa.instances
    BindCores           Alg. 4  the cores of each instance (factors 8, 4, 2, 1)          dsa.cores
    AssignMemoryScopes  §4.1    LB / GB / DDR of each intermediate, the weights promoted
                                DDR -> GB, the LB share kept for intermediates           dsa.scopes
    OrderInstances      Alg. 3  dfs, bfs or rounds: the order that keeps more on chip    dsa.order
    CrossLayerSchedule  §4.4    how many steps early each cluster promotes each weight   dsa.prefetch
    AllocateBuffers     §4.3    every buffer's lifetime, level and offset; spills        dsa.allocation

``kernelgen.stitch.emit_stitched`` turns the annotated module into a DSA program.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import Counter

import numpy as np
import tvm

from tvm_dsa.kernel.ir import ALIGN, align
from tvm_dsa.kernelgen.stitch import (
    ORDERS, Buffer, Lifetime, allocate, allocation_attr, binding, cluster_rounds, instances_attr, plan_instances,
    read_cores, read_instances, read_subgraph, weight_owner
)
from tvm_dsa import isa, memory_plan
from tvm_dsa.kernel.attrs import GB_SCOPE, LB_SCOPE
from tvm_dsa.runtime.cost import ddr_effective_bytes

DDR_SCOPE = "global"
# where a sub-graph's weights and shared inputs do not fit the GB together, an input several
# clusters read is promoted only where a cluster's tiles would move this many times its part's
# bytes through DDR (reading it again, or in short runs, each a whole burst)
REREAD = 1.2
PROMOTE_SHARES = (1.0, 0.9, 0.75, 0.5)  # of the GB, that early promotions may fill (``_Kernel.promotions``)


def _annotating(name: str, decide):
    """A module pass named ``name`` adding the attributes ``decide(_Kernel)`` returns."""

    def transform(mod, _ctx):
        return mod.with_attrs(decide(_Kernel(mod)))

    return tvm.transform.module_pass(transform, opt_level=0, name=name)


class _Kernel:
    """A sub-graph module and the decisions taken so far, read when first needed."""

    def __init__(self, mod: tvm.IRModule):
        self.mod = mod

    def read(self, hw):
        self.hw = hw
        self.sg, self.prints = read_subgraph(self.mod, hw)
        return self

    @functools.cached_property
    def inst(self):
        return read_instances(self.mod, self.sg, self.prints, self.hw)

    @functools.cached_property
    def cores(self):
        return read_cores(self.mod)

    @functools.cached_property
    def scopes(self):
        attr = self.mod.attrs["dsa.scopes"]
        return ([{str(t): str(s) for t, s in m.items()} for m in attr["instances"]], frozenset(attr["promote"]),
                int(attr["lb_bytes"]), int(attr["gb_bytes"]))

    @functools.cached_property
    def clusters(self):
        return cluster_rounds(self.cores, self.hw.cores_per_cluster)

    def read_alike(self, tensors, dims: int | None = None, shared: bool = False, reread: float = 0.0) -> set:
        """Those of ``tensors`` whose part each cluster's instances read (the hull of their reads)
        is the same for every cluster, in its first ``dims`` dims (all by default); ``shared``:
        and which more than one cluster reads; ``reread``: and whose part some cluster's tiles,
        loading their boxes from DDR, would move that many times over (``_ddr_bytes``)."""
        hull: dict = {}  # (tensor, cluster) -> [low, high] corners
        moved: Counter = Counter()  # (tensor, cluster) -> DDR bytes its tiles' loads would move
        for t, c, lo, hi in self._reads(tensors):
            low, high = lo.min(axis=0), hi.max(axis=0)
            box = hull.setdefault((t, c), [low, high])
            box[:] = np.minimum(box[0], low), np.maximum(box[1], high)
            if reread:
                moved[t, c] += _ddr_bytes(hi - lo, self.sg.tensors[t][0], self.sg.stored[t], self.hw)
        parts: dict = {}
        for (t, _), (low, high) in hull.items():
            parts.setdefault(t, set()).add((tuple(low[:dims].tolist()), tuple(high[:dims].tolist())))
        readers = Counter(t for t, _ in hull)
        again = {t for (t, c), (low, high) in hull.items()
                 if moved[t, c] >= reread * np.prod(high - low) * self.sg.itemsize(t)}
        return {t for t in tensors if len(parts.get(t, ())) <= 1 and (readers[t] > 1 or not shared)
                and (not reread or t in again)}

    def read_once(self, tensors, each: bool = False) -> set:
        """Those of ``tensors`` that the tiles of all clusters together, loading their boxes from
        DDR, would move through it less than ``REREAD`` times over (``_ddr_bytes``); ``each``: the
        tiles of every cluster, a box several of its tiles load counted once (its cores load it
        as one DDR multicast, ``KernelEmitter(ddr_multicasts=True)``)."""
        moved: Counter = Counter()
        for t, c, lo, hi in self._reads(tensors):
            if each:
                boxes = np.unique(np.concatenate([lo, hi], axis=1), axis=0)
                lo, hi = boxes[:, :lo.shape[1]], boxes[:, lo.shape[1]:]
            moved[t, c if each else 0] += _ddr_bytes(hi - lo, self.sg.tensors[t][0], self.sg.stored[t], self.hw)
        most: Counter = Counter()
        for (t, _), b in moved.items():
            most[t] = max(most[t], b)
        return {t for t in tensors if most[t] < REREAD * self.nbytes({t})}

    def _reads(self, tensors):
        """(tensor, cluster, low corners, high corners) of each layer's reads of each of
        ``tensors`` by each cluster's tiles (one row a tile)."""
        for c, cr in self.clusters.items():
            for L in self.sg.layers:
                rows = np.concatenate([self.inst.rows[i][L.name] for i in cr.members])
                for param, (lo, hi) in self.prints[L.name].reads.items():
                    if L.args[param] in tensors and len(rows):
                        yield L.args[param], c, lo[rows], hi[rows]

    def nbytes(self, tensors) -> int:
        """Bytes of ``tensors`` where the kernel places them."""
        return sum(math.prod(self.sg.tensors[t][0]) * self.sg.itemsize(t) for t in tensors)

    def buffers(self, c: int, order: str, ahead: dict, spill: str) -> list[Buffer]:
        """Cluster ``c``'s buffers in instance order ``order`` with each weight's promotion issued
        ``ahead[weight]`` steps (default 0) before its first use: each instance's LB-scoped
        intermediates placed in its core's LB, what does not fit and the GB-scoped ones with the
        promoted weights in the cluster's GB (once per cluster, or in the ``rounds`` order once per
        round: ``weight_owner``), what does not fit there in DDR (offsets from 0: the kernel's
        scratch), but an output of the sub-graph, which is then read and written in its own DDR
        region."""
        sg, inst, hw = self.sg, self.inst, self.hw
        instance_scopes, promote, lb_bytes, gb_bytes = self.scopes
        cr = self.clusters[c]
        nl = len(sg.layers)
        step = cr.step(order, nl)
        index = {L.name: k for k, L in enumerate(sg.layers)}
        produced = {L.args[L.ir.params[-1][0]]: index[L.name] for L in sg.layers}
        readers: dict = {}
        for L in sg.layers:
            for p, t in L.args.items():
                if p != L.ir.params[-1][0]:
                    readers.setdefault(t, []).append(index[L.name])

        lives, in_lb, ddr_scoped = [], {}, set()
        sizes = self._padded_sizes(c)
        for i in cr.members:
            for t in inst.boxes[i]:
                last = max(step(cr.rnd[i], k) for k in readers.get(t, [produced[t]]))  # unread: copied out
                x = Lifetime(("t", t, i), sizes[i][t], step(cr.rnd[i], produced[t]), last)
                scope = instance_scopes[i][t]
                if scope == LB_SCOPE:
                    in_lb.setdefault(self.cores[i][0], []).append(x)
                else:
                    lives.append(x)
                    if scope == DDR_SCOPE:
                        ddr_scoped.add(x.key)
        kept = []
        for core, xs in in_lb.items():
            offsets, spilled = allocate(xs, lb_bytes, spill)
            kept += [Buffer(c, "t", x.key[1], x.key[2], x.first, x.last, x.nbytes, "lb", core, offsets[x.key])
                     for x in xs if x.key in offsets]
            lives += [x for x in xs if x.key in spilled]  # on to the GB
        uses: dict = {}  # (weight, owner) -> steps reading it
        for i in cr.members:
            owner = weight_owner(order, c, cr.rnd[i], hw.clusters)
            for k, L in enumerate(sg.layers):
                if len(inst.rows[i][L.name]):
                    for w in dict.fromkeys(L.args.values()):  # argument order: hash order moved offsets
                        if w in promote:
                            uses.setdefault((w, owner), []).append(step(cr.rnd[i], k))
        for (w, owner), u in uses.items():
            lives.append(Lifetime(("w", w, owner), sg.itemsize(w) * math.prod(sg.tensors[w][0]),
                                  max(0, min(u) - ahead.get(w, 0)), max(u)))
        offsets, _ = allocate([x for x in lives if x.key not in ddr_scoped], gb_bytes, spill)
        leave = (*sg.outputs, *sg.exchange)
        lives = [x for x in lives if x.key in offsets or x.key[1] not in leave]  # else written in DDR
        in_ddr = [x for x in lives if x.key not in offsets and x.key[0] == "t"]
        ddr_offsets, _ = allocate(in_ddr, 1 << 62, spill)

        def placed(x):
            level, offset = (("gb", offsets[x.key]) if x.key in offsets else
                             ("ddr", ddr_offsets.get(x.key, -1)))
            return Buffer(c, *x.key[:2], x.key[2], x.first, x.last, x.nbytes, level, c if level == "gb" else 0,
                          offset)

        return [placed(x) for x in lives] + kept


    def summary(self, c: int, order: str, ahead: dict, spill: str) -> tuple[int, int, int, int]:
        """(spills to DDR, intermediates kept in LBs, bytes of weights promoted, GB peak) of
        ``buffers(c, ...)``, worked out once for clusters whose parts are alike (a cluster's part
        is usually the first's moved along the batch: only sizes, scopes, rounds and cores within
        the cluster decide them)."""
        key = (self._alike(c), order, tuple(sorted(ahead.items())), spill)
        if key not in self._summaries:
            bufs = self.buffers(c, order, ahead, spill)
            self._summaries[key] = (sum(b.level == "ddr" for b in bufs), sum(b.level == "lb" for b in bufs),
                                    sum(b.nbytes for b in bufs if b.kind == "w" and b.level == "gb"),
                                    max((b.offset + align(b.nbytes) for b in bufs if b.level == "gb"), default=0))
        return self._summaries[key]

    def promotions(self, c: int, order: str, prefetch: int, spill: str) -> dict:
        """Steps early of each weight cluster ``c`` promotes (§4.4; 0s left out): in order of first
        use, each weight as early as ``prefetch`` steps while the GB's live bytes (those placed at
        first use and the earlier promotions) stay within a share of the GB, and no earlier than
        the promotion before it (the cluster DMA moves them in the order issued: a weight needed
        later must not hold up one needed sooner). The share is the largest of
        ``PROMOTE_SHARES`` whose plan spills no more to DDR than promoting at first use (a spilled
        weight is read from DDR by every tile; live bytes that fit may still not place). Worked
        out once for clusters alike (``summary``)."""
        key = (self._alike(c), order, prefetch, spill)
        if key not in self._promoted:
            self._promoted[key] = self._promotions(c, order, prefetch, spill)
        return self._promoted[key]

    def _promotions(self, c: int, order: str, prefetch: int, spill: str) -> dict:
        gb = [b for b in self.buffers(c, order, {}, spill) if b.level == "gb"]
        spills = self.summary(c, order, {}, spill)[0]
        for share in PROMOTE_SHARES:
            live = memory_plan.live_bytes([memory_plan.Lifetime(align(b.nbytes), b.first, b.last) for b in gb])
            ahead, issued = {}, 0  # the step the last promotion starts: the cluster DMA runs them in order
            for b in sorted((b for b in gb if b.kind == "w"), key=lambda b: b.first):
                size, a = align(b.nbytes), 0
                while a < min(prefetch, b.first - issued) and live[b.first - a - 1] + size <= share * self.scopes[3]:
                    a += 1
                issued = b.first - a
                for s in range(b.first - a, b.first):
                    live[s] += size
                ahead[b.tensor] = min(a, ahead.get(b.tensor, a))  # the rounds order: the least of its rounds'
            ahead = {w: a for w, a in ahead.items() if a}
            if not ahead or self.summary(c, order, ahead, spill)[0] <= spills:
                return ahead
        return {}

    @functools.cached_property
    def _summaries(self) -> dict:
        return {}

    @functools.cached_property
    def _promoted(self) -> dict:
        return {}

    def _padded_sizes(self, c: int) -> dict:
        """Per instance of cluster ``c``, per tensor, the bytes to place: the most any cluster of
        the same make (``_make``) places in the instance at that position. Clusters alike but for
        their share of the rows (ViT's 197 tokens: 50, 50, 50, 47) then place every buffer at the
        same offsets, so their promotions of a weight are one DDR multicast (``multicast_chains``
        pairs copies into the same place only). Worked out once per cluster (``buffers`` runs for
        every order and promotion plan)."""
        if c in self._padded:
            return self._padded[c]

        def sizes(i):
            return {t: self.sg.itemsize(t) * math.prod(h - l for l, h in zip(*box))
                    for t, box in self.inst.boxes[i].items()}
        own = [sizes(i) for i in self.clusters[c].members]
        for other in self.clusters:
            if other != c and self._make(other) == self._make(c):
                for mine, theirs in zip(own, self.clusters[other].members):
                    for t, n in sizes(theirs).items():
                        mine[t] = max(mine[t], n)
        self._padded[c] = dict(zip(self.clusters[c].members, own))
        return self._padded[c]

    @functools.cached_property
    def _padded(self) -> dict:
        return {}

    def _make(self, c: int) -> tuple:
        """``_alike`` without the sizes."""
        return tuple((rnd, core, tuple(t for t, _ in boxes), scopes, rows)
                     for rnd, core, boxes, scopes, rows in self._alike(c))

    def _alike(self, c: int) -> tuple:
        """What ``buffers`` reads of cluster ``c``'s instances, positions left out."""
        instance_scopes = self.scopes[0]
        cpc = self.hw.cores_per_cluster
        cr = self.clusters[c]
        return tuple((cr.rnd[i], self.cores[i][0] % cpc,
                      tuple((t, math.prod(h - l for l, h in zip(*box))) for t, box in self.inst.boxes[i].items()),
                      tuple(instance_scopes[i].items()),
                      tuple(bool(len(self.inst.rows[i][L.name])) for L in self.sg.layers))
                     for i in cr.members)


def StitchBuffers(hw):  # noqa: N802 - TVM pass naming
    """§4.2: the sub-graph's instances. The output layer's tiles are grouped by the scheduler's
    split (Algorithm 1); every other layer's tiles an instance needs are found backwards from
    what its consumers read, so each instance keeps its layers' outputs to itself (a halo is
    computed by both neighbours: the recomputation, kept under ``RECOMPUTE_LIMIT``); of the
    splits within it, the first whose busiest core does an even share of the work, else the
    one whose busiest core does least (``makespan``)."""

    def decide(k):
        k.read(hw)
        inst = plan_instances(list(k.sg.layers), k.prints, [*k.sg.outputs, *k.sg.exchange], k.sg.split_loop,
                              k.sg.groups, hw, frozenset(k.sg.exchange))
        return {"dsa.instances": instances_attr(inst)}

    return _annotating("dsa.StitchBuffers", decide)


def _ddr_bytes(extents: np.ndarray, shape, dtype: str, hw) -> int:
    """Bytes DDR moves for boxes of ``extents`` (one row a box) of a row-major tensor of ``shape``,
    each loaded by one DMA (``runtime.cost.ddr_effective_bytes``: every contiguous run rounded up
    to whole bursts); an empty box (a tile reading none of it, ViT's class token for the tokens
    after it) moves none."""
    strides = tuple(int(math.prod(shape[d + 1:])) for d in range(len(shape)))
    view = isa.Operand("ddr", 0, 0, dtype, strides)
    boxes, counts = np.unique(extents, axis=0, return_counts=True)
    return sum(int(n) * ddr_effective_bytes(view, tuple(int(e) for e in box), hw) for box, n in zip(boxes, counts)
               if box.all())


def BindCores(hw, rounds: int = 1):  # noqa: N802
    """Algorithm 4: the cores of each instance — dealt over the clusters in consecutive blocks
    (``kernelgen.stitch.binding``), one core each where a cluster has as many instances as cores,
    else the largest balanced factor of 8, 4, 2, 1; with ``rounds`` > 1 a cluster's instances
    run in that many rounds (micro-batches), each round's on all the cores it balances over."""
    return _annotating("dsa.BindCores", lambda k: {"dsa.cores": [
        list(c) for c in binding(len(k.mod.attrs["dsa.instances"]["rows"]), hw, rounds)]})


def AssignMemoryScopes(hw, gb: bool = True, lb: bool = False, stream: bool = False):  # noqa: N802
    """§4.1 with Algorithm 4's scope rule: an intermediate of an instance bound to one core lives
    in that core's LB (``lb``: a share of the LB is set aside, below the layers' tiles); one whose
    producer and consumer tiles run on different cores lives in the cluster's GB (``gb``; else
    DDR, the layerwise placement). Learned weights are promoted DDR -> GB once per cluster, but
    for one the clusters read different parts of (a constant broadcast along the batch, as
    ViT's class token folds to): it stays in DDR, where each cluster reads its part and the
    clusters' parts of the kernel stay translates of one another (``emit_stitched``). So does a
    weight of the sub-graph's first layer that all the tiles together read about once
    (``read_once``): no step comes before it to promote it behind, and its tiles load it from
    DDR as they go instead of waiting for the whole copy (ResNet-50's classifier at batch 1,
    4 MB on one cluster: 53,162 -> 37,898 cycles). Read once by a later layer, a promotion
    issued steps ahead overlaps the layers before (ViT-B/16 at batch 1 took 10 % longer with
    those weights in DDR too). An input
    activation whose samples several clusters read, each all of them (one sample's rows split
    over the clusters), is promoted too: its tiles read it again and again, each output-channel
    tile all of its rows and halo (ResNet-50's stage transitions at batch 1 read their input 6-8
    times from DDR). Read by one cluster, it stays in DDR: its tiles start as their loads arrive,
    not after a promotion (MobileNetV2 at batch 1: 315,543 -> 355,115 cycles promoting them).
    Where the sub-graph's weights and such inputs do not fit the GB together, an input is promoted
    only where the tiles would move ``REREAD`` times its bytes through DDR: ViT-B/16's encoder
    kernels at batch 1 promoted the inputs their first and last layers read once, in whole rows,
    and those crowded the weights' pieces out of the GB (296,325 -> 325,183 cycles each). With
    ``stream``, every weight each cluster's tiles read about once (a box its cores load alike
    counted once) stays in DDR (``read_once(..., each=True)``): the clusters' tiles load its
    boxes as multicasts that read DDR once (``KernelEmitter(ddr_multicasts=True)``), and no
    layer waits for a promotion (``stitched._faster_weights`` keeps it where the kernel runs
    faster)."""

    def decide(k):
        k.read(hw)
        keep = lb and any(len(c) == 1 for c in k.cores)
        lb_bytes = hw.lb_bytes - max(L.plan.total_bytes for L in k.sg.layers) if keep else 0
        lb_bytes -= lb_bytes % ALIGN
        scopes = [{t: LB_SCOPE if keep and len(k.cores[i]) == 1 else GB_SCOPE if gb else DDR_SCOPE
                   for t in boxes} for i, boxes in enumerate(k.inst.boxes)]
        first = k.sg.weights & set(k.sg.layers[0].args.values())  # nothing runs before to hide a promotion
        streamed = k.read_once(k.sg.weights, each=True) if stream else k.read_once(first)
        weights, inputs = k.read_alike(k.sg.weights) - streamed, set(k.sg.inputs) - k.sg.weights
        shared = k.read_alike(inputs, dims=1, shared=True)
        if k.nbytes(weights | shared) > hw.gb_bytes:
            shared = k.read_alike(inputs, dims=1, shared=True, reread=REREAD)
        promote = weights | shared
        return {"dsa.scopes": {"instances": scopes, "promote": sorted(promote) if gb else [],
                               "lb_bytes": lb_bytes, "gb_bytes": hw.gb_bytes if gb else 0}}

    return _annotating("dsa.AssignMemoryScopes", decide)


def OrderInstances(hw, order: str = "best", spill: str = "longest"):  # noqa: N802
    """Algorithm 3: run each cluster's instances depth first (instance by instance) or breadth
    first (layer by layer), or in ``rounds`` (depth first, each round promoting the weights it
    reads: micro-batches); ``best`` keeps the order that uses the on-chip buffers better: fewer
    spills to DDR, more intermediates kept in the LBs, fewer bytes promoted, then the smaller GB
    peak (weights promoted at first use: cross-layer scheduling comes after). Where every
    cluster runs its instances in one round the orders are one schedule: dfs, unscored."""
    if order not in (*ORDERS, "best"):
        raise ValueError(f"unknown instance order {order!r}; known: {ORDERS + ('best',)}")

    def decide(k):
        if order != "best":
            return {"dsa.order": order}
        k.read(hw)
        if all(cr.rounds == 1 for cr in k.clusters.values()):
            return {"dsa.order": "dfs"}

        def score(o):
            parts = [k.summary(c, o, {}, spill) for c in k.clusters]
            return sum(p[0] for p in parts), -sum(p[1] for p in parts), sum(p[2] for p in parts), max(p[3] for p in parts)

        return {"dsa.order": min(ORDERS, key=score)}

    return _annotating("dsa.OrderInstances", decide)


def CrossLayerSchedule(hw, prefetch: int = 2, spill: str = "longest"):  # noqa: N802
    """§4.4: a weight's promotion is issued up to ``prefetch`` steps before the step that first
    reads it, so the cluster DMA moves it while earlier layers compute (its GB space held from
    then on), each weight as early as the GB holds it (``_Kernel.promotions``): per cluster, the
    steps early of each weight promoted before its first use."""

    def decide(k):
        k.read(hw)
        order = str(k.mod.attrs["dsa.order"])
        ahead = [{} for _ in range(hw.clusters)]
        for c in k.clusters:
            ahead[c] = k.promotions(c, order, prefetch, spill)
        return {"dsa.prefetch": ahead}

    return _annotating("dsa.CrossLayerSchedule", decide)


def AllocateBuffers(hw, spill: str = "longest"):  # noqa: N802
    """§4.3: liveness over the cluster's steps, offsets planned offline at each level, a buffer
    freed at its last use; where a level overflows, the tensor chosen by ``spill`` (longest: the
    seed's longest remaining lifetime; largest: prior work's) goes down a level, LB -> GB -> DDR
    (Fig. 12). Each cluster's DDR spills get their own part of the kernel's scratch."""

    def decide(k):
        k.read(hw)
        order = str(k.mod.attrs["dsa.order"])
        ahead = [{str(w): int(a) for w, a in m.items()} for m in k.mod.attrs["dsa.prefetch"]]
        out, scratch = [], 0
        for c in sorted(k.clusters):
            bufs = k.buffers(c, order, ahead[c], spill)
            ddr = [b.level == "ddr" and b.offset >= 0 for b in bufs]  # spilled intermediates
            out += [dataclasses.replace(b, offset=b.offset + scratch) if d else b for b, d in zip(bufs, ddr)]
            scratch += max((b.offset + align(b.nbytes) for b, d in zip(bufs, ddr) if d), default=0)
        return {"dsa.allocation": allocation_attr(out)}

    return _annotating("dsa.AllocateBuffers", decide)


def stitch_passes(hw, order: str = "best", spill: str = "longest", gb: bool = True, prefetch: int = 2,
                  lb: bool = False, stream: bool = False) -> tvm.transform.Pass:
    """The §4 passes in order."""
    return tvm.transform.Sequential([
        StitchBuffers(hw), BindCores(hw), AssignMemoryScopes(hw, gb, lb, stream), OrderInstances(hw, order, spill),
        CrossLayerSchedule(hw, prefetch, spill), AllocateBuffers(hw, spill)], name="dsa.StitchKernel")
