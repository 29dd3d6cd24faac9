"""Stitched kernels (``StitchPlan``): a GraphTurbo sub-graph's program through the §4 passes.

A sub-graph's layers are lowered for it (``StitchedKernels.layer``), its sub-graph module goes
through the passes of ``kernelgen.stitch_passes`` (in micro-batches where the GB does not hold a
cluster's samples at once) and ``emit_stitched`` makes the program. Sub-graphs of one form (the
next transformer block) share the first's program under their own names.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import tvm
import tvm_ffi

from tvm_dsa import isa
from tvm_dsa.emit.placement import stored_dtypes
from tvm_dsa.hardware import Hardware
from tvm_dsa.kernel.analysis import Unsupported
from tvm_dsa.kernel.ir import ALIGN, plan_lb, read_kernel
from tvm_dsa.kernel.macs import kernel_macs
from tvm_dsa.kernelgen.lowering import lower_within
from tvm_dsa.kernelgen.rewrite import DSACall
from tvm_dsa.kernelgen.stitch import emit_stitched, read_allocation, subgraph_module
from tvm_dsa.kernelgen.stitch_passes import BindCores, StitchBuffers, stitch_passes
from tvm_dsa.runtime import timing_cycles
from tvm_dsa.tiling import lower_kernel, lower_timed


@dataclass(frozen=True)
class StitchOptions:
    """Kernel generation choices of stitched kernels (the ablation switches of seed 000 Fig. 15)."""

    gb: bool = True  # intermediates and weights in the GB (False: DDR, as layerwise)
    order: str = "best"  # instance order: dfs, bfs, rounds or best (Algorithm 3)
    spill: str = "longest"  # spill policy: longest (the seed) or largest (prior work)
    prefetch: int = 2  # cross-layer scheduling: weight promotions issued this many steps early
    # share of each core's LB kept for stitched intermediates (the "L1" level); the layers of
    # graphturbo are tiled to fit the rest. 0 (the default until it pays: the smaller tiles cost
    # about what the kept tensors save): intermediates go no closer than the GB
    lb_keep: float = 0.0

    def __post_init__(self):
        if not 0 <= self.lb_keep < 1:
            raise ValueError(f"lb_keep is a share of the LB in [0, 1), not {self.lb_keep}")

    def lb_budget(self, hw: Hardware) -> int | None:
        """Bytes of the LB a layer's tiles may use, None for all of it."""
        return int(hw.lb_bytes * (1 - self.lb_keep)) // ALIGN * ALIGN if self.lb_keep else None


class StitchedKernels:
    """The generator of ``StitchPlan`` kernels over a ``Lowered`` module, with the pipeline's
    ``StitchOptions``; it keeps the layers it lowered and the programs it made for the kernels
    after."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.options = ctx.options if isinstance(ctx.options, StitchOptions) else StitchOptions()
        self.in_part: dict = {}  # PrimFunc name -> lowered within the LB share the options leave to tiles
        # (PrimFunc name, LB budget, inputs on chip, first tile) -> lowered for stitched kernels
        self.overlapped: dict = {}
        self.generated: dict = {}  # a sub-graph's form (``_form``) -> (names, program, info, text) of the first

    def __call__(self, spec) -> DSACall:
        ctx = self.ctx
        nodes = ctx.nodes(spec)
        form, names = _form(spec, nodes, ctx.graph)
        if form in self.generated:  # like an earlier sub-graph (the next transformer block): its program
            first, program, info, text = self.generated[form]
            used = {a.name for a in program.args} | {m.name for k in program.kernels for m in k.layers}
            renames = {a: b for a, b in zip(first, names) if a in used and a != b}
            program, info = _renamed(program, info, dict(zip(first, names)), spec.name)
        else:
            program, info = _stitched(spec, nodes, ctx.graph, self.layer, ctx.hw, self.options)
            text, renames = program.serialize(), {}
            self.generated[form] = (names, program, info, text)
        ctx.result.dsa.append(spec.name)
        ctx.result.stitched[spec.name] = info
        return DSACall(spec, text, tuple(a.name for a in program.args if a.role == "input"),
                       tuple(a.name for a in program.args if a.role == "output"), renames)

    def tiled_in_part(self, name):
        """Layer ``name`` lowered within the LB share the options leave to tiles, on the unit the
        whole-LB lowering took."""
        ctx = self.ctx
        if name not in self.in_part:
            self.in_part[name] = lower_within(ctx.funcs[name], ctx.hw, self.options.lb_budget(ctx.hw),
                                              name in ctx.on_vector, clamp=True)
        return self.in_part[name]

    def layer(self, name, part: bool, on_chip: frozenset, first_tile: int | None = None,
              shares: tuple[int, ...] = (), spread: bool = True):
        """A stitched kernel's layer, tiled to the LB share left to tiles (``part``) or the whole
        LB, for the inputs at positions ``on_chip`` read from the GB (where the kernel keeps its
        intermediates and promotes its weights). Its plans are ranked with those reads from the
        GB where another input comes from DDR (``lower_kernel``); a contraction that loads from
        the GB with its chunk loads overlapping the MME (``overlap``; from DDR, as layerwise
        loads, a smaller chunk costs bursts); then the fastest of that and other plans timed in
        place for a contraction on the MME with ``TIMED_MACS`` or more (``TIMED_MACS_SPREAD``
        where ``spread``), the faster unit for a depthwise one, and tiles whose loads fit twice
        for a layer off the MME
        (``tiling.lower_timed``). ``first_tile``: at most so many along the first loop (a
        micro-batch's samples, ``_micro_batched``) where the tiling holds more; ``shares``: at
        most so many along the leading loops (an instance's share of a sample's rows,
        ``_row_shares``), the timed plans too. ``spread``: the layer's tiles are dealt over the
        clusters (fewer samples than clusters: a sample's rows split, or the instances of a
        kernel whose output has fewer rows than clusters its channels), and each plan is timed
        with a cluster's share of them rather than a tuning record's tiles kept (a record tiles
        the whole layer: MobileNetV2's 1 x 1 convolution to 1,280 channels, pooled after it,
        kept the record's tiles on a cluster's cores, and the timed plans of 160 channels left
        three clusters idle; timed for its share, 179,285 -> 178,219 cycles at batch 1)."""
        ctx, stitch, hw = self.ctx, self.options, self.ctx.hw
        vector = name in ctx.on_vector
        low, budget = self.tiled_in_part(name) if part else ctx.lowered[name]
        if first_tile is not None and _first_tile(low) <= first_tile:
            first_tile = None
        caps = shares if first_tile is None else (first_tile,)
        if caps:
            low, budget = lower_within(ctx.funcs[name], hw, stitch.lb_budget(hw) if part else budget, vector,
                                       clamp=True, caps=caps)
        gb = on_chip if stitch.gb else frozenset()
        ranked = gb if len(gb) < len(ctx.funcs[name].params) - 1 else frozenset()
        spread = hw.clusters if spread and first_tile is None else 1
        key = (name, budget, gb, caps, spread)
        if key not in self.overlapped:
            record = name in ctx.result.tuned and not part and first_tile is None and spread == 1
            if ranked and not record:
                low = lower_kernel(ctx.funcs[name], hw, budget, vector=vector, on_chip=ranked, caps=caps)[0]
            macs = kernel_macs(ctx.mod[name])
            keep = (not stitch.gb or vector or record or not macs
                    or plan_lb(read_kernel(low), hw, budget).double_buffered)
            if not keep:
                low = lower_kernel(ctx.funcs[name], hw, budget, overlap=True, on_chip=ranked, caps=caps)[0]
            if stitch.gb and not vector and not record:
                least = TIMED_MACS if spread == 1 else TIMED_MACS_SPREAD
                low = lower_timed(ctx.funcs[name], hw, budget, gb, low, caps, plans=macs >= least, spread=spread)
            self.overlapped[key] = (low, budget)
        return self.overlapped[key]


# a smaller layer keeps the search's plan: timing others costs more compile time than it saves;
TIMED_MACS = 1 << 24
# not where its tiles are dealt over the clusters (fewer samples than clusters), whose few tiles a
# cluster make the search's largest leave cores idle: there every contraction's plans are timed
# (a layer's MACs counted once per cluster, Conformer at batch 1 went 63,165 -> 55,414 cycles,
# MobileNetV2 235,616 -> 228,163; all of them, ResNet-50's classifier, 2 M MACs, loaded its
# weights in chunks of the whole LB with the MME waiting for each: 805,686 -> 803,860, DenseNet-121
# 677,638 -> 674,276, MobileNetV2 178,219 -> 176,572; DenseNet-121's build 67 -> 74 s)
TIMED_MACS_SPREAD = 0


def _first_tile(lowered) -> int:
    """The tile of a lowered kernel's first loop (along its output's first dim)."""
    kernel = read_kernel(lowered)
    return -(-kernel.params[-1][1][0] // kernel.tile_loops()[0].extent)


def _stitched(spec, nodes, graph, layer, hw, stitch) -> tuple:
    """(Program, StitchInfo) of a stitched kernel: its sub-graph module through the §4 passes;
    ``layer(PrimFunc name, part, on_chip)``: the layer lowered for it, within the LB share the
    options leave to tiles if ``part``, its plans ranked with the inputs at the positions
    ``on_chip`` read from the GB (those the sub-graph computes and its weights) where another
    comes from DDR (a sub-graph's first layers). A layer reading only the GB keeps the plan
    ranked as layerwise ranks it: ranking it so too changed no cycles of the seven models of
    ``benchmarks/graphturbo.py`` and cost ResNet-50's build 0.6 s. ``layer(..., first_tile)``:
    with at most so many samples a tile (micro-batches, ``_micro_batched``). With fewer samples
    than clusters a sample's rows are split over the clusters, and every layer's plans, the
    timed ones too, stay within a cluster's share of the rows (``_row_shares``): timed with no
    such cap, tiles of several rows recomputed more in each halo (ResNet-50's first sub-graph at
    batch 1 ran on one cluster instead of two: 1,745,711 -> 1,908,712 cycles), so the layers
    kept the search's tiles; timed within the shares, ResNet-50 at batch 1 takes 1,005,924 ->
    963,728 cycles, BERT-128 2,463,083 -> 2,239,643 (ViT-B/16 3,456,499 -> 3,482,132). A
    sub-graph whose plan says ``rows_if_faster`` is generated both ways, and the program
    ``timing_cycles`` finds faster is kept: DenseNet-121's dense layers at batch 1 are cut before
    each 3 x 3 convolution so that their rows can split, yet each piece saves less than a launch
    by the MACs (985,040 -> 919,422 cycles split), while a chain of 3 x 3 convolutions at 7 x 7,
    cut alike, runs 15 % slower split (every cluster loads every weight)."""
    if spec.plan.rows_if_faster:
        ways = [_stitched(replace(spec, plan=replace(spec.plan, rows=rows, rows_if_faster=False)), nodes, graph,
                          layer, hw, stitch) for rows in (False, True)]
        return min(ways, key=lambda way: timing_cycles(way[0]))
    inputs, outputs = graph.boundary(nodes)
    batch = graph.tensors[outputs[0]].shape[0]  # the first dim of the layers that have it (§2.1)
    shares = _row_shares(nodes, graph, outputs[0], hw, bool(spec.plan.exchange)) if spec.plan.rows else {}

    def lowered(part: bool, first_tile: int | None, stream: bool = False, spread: bool = True) -> dict:
        """Each node's layer; ``stream``: its weights ranked as loaded from DDR (where the streamed
        variant leaves those each cluster reads about once, ``planned``), as are those of a first layer
        of one output row (a classifier at batch 1: every plan reads each weight once, so they
        stay there either way; ranked as in the GB, ViT-B/16's took tiles of 25 columns, loads of
        50-byte runs, 17,991 cycles against 15,028); ``spread``: its plans timed
        with a cluster's share of the tiles (``StitchedKernels.layer``) where the samples are
        fewer than the clusters."""
        out, read = {}, []
        for n in nodes:
            once = n is nodes[0] and math.prod(graph.tensors[n.output].shape[:-1]) == 1
            on_chip = frozenset(i for i, t in enumerate(n.inputs)
                                if t not in inputs or (graph.tensors[t].constant and not stream and not once))
            cap = first_tile if graph.tensors[n.output].shape[0] == batch else None
            out[n.name] = layer(n.func, part, on_chip, cap, shares.get(n.name, ()), spread and batch < hw.clusters)
            kernel = read_kernel(out[n.name][0])
            why = kernel.unplaceable()
            if why:
                raise Unsupported(f"layer {n.name} {why}")
            read.append((n.name, kernel, dict(zip((p[0] for p in kernel.params), (*n.inputs, n.output)))))
        stored_dtypes(read, hw)  # each tensor at one type, or the sub-graph runs layer by layer
        return out

    def planned(rounds: int, stream: bool = False, ranked: bool | None = None):
        """The sub-graph through the stitch passes, each cluster's instances in ``rounds`` rounds,
        its layers' tiles holding no more than a round's share of the samples (``stream``:
        ``AssignMemoryScopes``'; ``ranked``: the layers' weights ranked as loaded from DDR,
        ``lowered``'s ``stream``, by default where they stream)."""
        ranked = stream if ranked is None else ranked
        share, rest = divmod(batch, hw.clusters * rounds)
        first_tile = share if rounds > 1 and share and not rest else None
        bind = tvm.transform.Sequential([StitchBuffers(hw), BindCores(hw, rounds)])
        sub = bind(_subgraph(spec, nodes, graph, lowered(False, first_tile, ranked)))
        spread = True
        if shares:  # plans for a cluster's share of the tiles may halo into fewer instances
            alone = bind(_subgraph(spec, nodes, graph, lowered(False, first_tile, ranked, False)))
            if _instances(alone) > _instances(sub):
                sub, spread = alone, False
        # the LB level (Fig. 15's "L1") pays only where Algorithm 4 gives every instance one
        # core (it keeps the intermediates in that core's LB); elsewhere the tiles keep the LB
        lb = stitch.lb_keep > 0 and all(len(c) == 1 for c in sub.attrs["dsa.cores"])
        if lb:
            sub = bind(_subgraph(spec, nodes, graph, lowered(True, first_tile, ranked, spread)))
        later = stitch_passes(hw, stitch.order, stitch.spill, stitch.gb, stitch.prefetch, lb, stream).passes[2:]
        return tvm.transform.Sequential(list(later))(sub)  # the passes after BindCores

    samples = batch // hw.clusters  # a cluster's
    if samples:
        return emit_stitched(_micro_batched(planned, hw, samples), hw)
    return _faster_weights(_micro_batched(planned, hw, samples),
                           [_micro_batched(functools.partial(planned, stream=True, ranked=r), hw, samples)
                            for r in (True, False)], hw)


def _instances(sub) -> int:
    """The instances a sub-graph module's ``StitchBuffers`` planned."""
    return len(sub.attrs["dsa.instances"]["rows"])


def _faster_weights(sub, streamed: list, hw) -> tuple:
    """(Program, StitchInfo) of the fastest (``_faster_loads``) of annotated sub-graph modules:
    ``sub``, and each of ``streamed`` that keeps in DDR weights ``sub`` promotes (the weights each
    cluster reads about once, ``AssignMemoryScopes(..., stream=True)``; a module like one before
    it is not emitted again). Promoted, a weight is copied DDR -> GB before its layer's tiles load
    it, ahead of the layer as far as the GB has room; streamed, the clusters' tiles load its boxes
    from DDR as multicasts, read once, with no copy to wait for. BERT-128 at batch 1 (its 128
    tokens split over the clusters, every weight read once by each): 2,759,499 -> 2,463,095
    cycles, DLRM 15,591 -> 13,622; ResNet-50 1,075,856 -> 1,005,924 (its last stage's 2 MB
    weights, which a cluster's cores load alike; 1,022,775 of that with the streamed variant's
    layers tiled as for weights in the GB, the rest from tiling them for DDR). ViT-B/16's encoder
    kernels (197 tokens) run faster promoted (streamed, the model took 3,803,015 against
    3,456,499). ``_stitched`` passes the streamed module both ways, its layers tiled for weights
    in DDR and as ``sub``'s: at batch 1 ResNet-50's later kernels run faster the first way (one
    131,445 cycles against 192,771), DenseNet-121's stem and second transition the second (the
    model 423,020 -> 417,997)."""
    ways, seen = [_faster_loads(sub, hw)], []
    promoted = tuple(sub.attrs["dsa.scopes"]["promote"])
    for mod in streamed:
        if tuple(mod.attrs["dsa.scopes"]["promote"]) == promoted or any(
                tvm_ffi.structural_equal(mod, m) for m in seen):
            continue
        seen.append(mod)
        ways.append(_faster_loads(mod, hw))
    return min(ways, key=lambda way: timing_cycles(way[0]))


def _faster_loads(sub, hw) -> tuple:
    """(Program, StitchInfo) of the annotated sub-graph module ``sub``: of its program whose tiles'
    loads from the GBs are multicasts (``hw.multicast_dma``) and the one whose loads are plain,
    the faster. A multicast starts when each core's load of it may, and the cores' n-th loads
    of one box can belong to different rounds of tiles: where the GB's port is the bound the
    reads saved pay for the waits (ResNet-50's last stages at batch 1), elsewhere a core waits a
    tile for a load another core makes a round later (ResNet-50's first blocks at batch 1, a
    sample's rows split over the clusters and a row's two channel tiles dealt to cores six
    apart: 67,283 cycles against 45,835). Only with fewer samples than clusters: at batch 8 it
    changed none of the seven models of ``benchmarks/graphturbo.py`` but DLRM (18,848 ->
    18,827 cycles), and timing BERT-128's kernels twice took its build from 15 to 70 s. The
    multicasts include a clamped layer's boxes that do not move with its clamped loop
    (``steady_multicasts``): ViT-B/16's 197 tokens, a cluster's two tiles of them loading each
    weight chunk at once (3,482,132 -> 2,858,927 cycles; at batch 8, where the cores' tiles of
    the tokens do not line up, 16.2M against 12.7M, so only here, where the plain loads are
    timed too). Both ways no multicast is left waiting for ever (``unstick``): pairings across
    rounds made transfers wait on each other in DenseNet-121's kernels at batch 1; at batch 8 the
    seven models' kernels had none, and the check took half of BERT-128's build there.
    The faster way is emitted once more with the weights' loads on the cores' second DMA queues
    (``emit_stitched(..., queued_weights=True)``, on chips with ``prefetch_dma``) and kept where
    that is faster still: a weight chunk then moves beside the activations' loads, not queued
    behind one waiting for other cores' outputs or a halo (DenseNet-121 at batch 1: 417,997 ->
    393,413 cycles, its dense blocks 2-4 86.8k -> 79.7k, 110.0k -> 102.4k, 50.7k -> 42.8k). It
    does not pay everywhere (the loads then wait behind the stores of the queue: re-timed with
    every weight load moved so, DenseNet-121's first dense block took 60,862 -> 62,089 cycles),
    hence a timing per kernel."""
    first = emit_stitched(sub, hw, steady_multicasts=True, unstick=True)
    ways = [(first, {"steady_multicasts": True})]
    if hw.multicast_dma and any(type(i) is isa.Dma and i.multicast and i.src.mem == "gb"
                                for k in first[0].kernels for i in k.instructions):
        ways.append((emit_stitched(sub, hw, gb_multicasts=False, unstick=True), {"gb_multicasts": False}))
    timed = [(timing_cycles(way[0]), n) for n, (way, _) in enumerate(ways)]
    cycles, n = min(timed)
    best, options = ways[n]
    if hw.prefetch_dma:
        queued = emit_stitched(sub, hw, unstick=True, queued_weights=True, **options)
        if timing_cycles(queued[0]) < cycles:
            return queued
    return best


def _row_shares(nodes, graph, output: str, hw, own: bool = False) -> dict:
    """Per node, caps on the tiles of its output's leading dims: at most a cluster's share of a
    sample's rows (the sub-graph output's second-to-last dim: a sequence's tokens, an image's
    rows) along the first dim of that extent (in row-major order the rows come before the
    columns: attention's scores are queries x keys), where the sample has rows for every cluster.
    With fewer samples than clusters, instances split a sample's rows (``stitch.plan_instances``),
    and a layer's tile across two instances' rows is computed by both: BERT-base's encoder layers
    at batch 1 took tiles of 64 or 128 tokens, which no split into four cuts between. A layer
    with a whole multiple of those rows (before a pooling of stride 2: a transition) is capped
    at as many times the share: DenseNet-121's first transition at batch 1 tiled its batch norm
    and ReLU by channels, all 56 rows a tile, and ran on one cluster (124,372 -> 43,787 cycles).
    With ``own`` (instances that exchange tensors: a kernel over several resolutions, each
    layer's rows split four ways), an image layer's cap is its own rows' share."""
    shape = graph.tensors[output].shape
    rows = shape[-2] if len(shape) >= 2 else 0
    if rows < hw.clusters:
        return {}

    def cap_of(rows: int) -> int:
        # where the share does not divide the rows (ViT's 197 tokens: 50), the last tile is clamped
        # to end with them: it must start in the last share, or it overlaps the share before (tokens
        # 147-196) and a four-way split computes 42 % more; the largest divisor of the share that
        # does (25, the rows' tiles still meeting at the multiples of 50)
        share = -(-rows // hw.clusters)
        return max(d for d in range(1, share + 1) if share % d == 0 and rows - d >= (hw.clusters - 1) * share)

    cap = cap_of(rows)
    out = {}
    for n in nodes:
        dims = graph.tensors[n.output].shape
        if own and len(dims) >= 3 and dims[-2] >= hw.clusters:
            out[n.name] = (*dims[:-2], cap_of(dims[-2]))
        elif rows in dims[1:]:
            at = dims.index(rows, 1)
            out[n.name] = (*dims[:at], cap)
        elif len(dims) >= 3 and dims[-2] % rows == 0:
            out[n.name] = (*dims[:-2], cap * (dims[-2] // rows))
    return out


def _micro_batched(planned, hw, samples: int):
    """``planned(rounds)`` (a sub-graph module through the stitch passes, each cluster's
    instances bound to run in ``rounds`` rounds) that moves the fewest bytes through DDR
    (``ddr_bytes``), the fewest rounds among those: 1, or where the GB does not hold what a
    cluster's instances keep at once, twice as many while that spills and a cluster has
    ``samples`` or instances for them. Micro-batches: each round's intermediates live for the
    round, and in the ``rounds`` order each round promotes the weights it reads again (BERT-128
    at batch 16: four samples a cluster spilled each FFN1 output, 3 MB, beside FFN2's 4.5 MB of
    weights; two rounds of two spill nothing). A spill is weighed against the weights a round
    promotes again: ViT-B/16's encoder as one kernel spills one 1.2 MB MLP activation per sample
    in one round and promotes 170 MB of weights twice in two."""
    best, rounds = None, 1
    while True:
        sub = planned(rounds)
        allocation = read_allocation(sub)
        cost = ddr_bytes(allocation, hw)
        if best is None or cost < best[0]:
            best = (cost, sub)
        cores = sub.attrs["dsa.cores"]
        if not any(b.level == "ddr" for b in allocation) \
                or 2 * rounds > max(samples, len(cores) // min(len(cores), hw.clusters)):
            return best[1]
        rounds *= 2


def ddr_bytes(allocation, hw) -> int:
    """Bytes a stitched kernel's allocation moves through DDR beyond its inputs and outputs: each
    intermediate spilled to DDR written and read once, and each weight promotion read (once for
    all clusters in a round where ``hw.multicast_dma`` lets their promotions share the read)."""
    spilled = sum(2 * b.nbytes for b in allocation if b.kind == "t" and b.level == "ddr")
    reads = {(b.tensor, b.owner // hw.clusters if hw.multicast_dma else b.owner): b.nbytes
             for b in allocation if b.kind == "w"}
    return spilled + sum(reads.values())


def _form(spec, nodes, graph) -> tuple:
    """(form, names) of a stitched sub-graph: all that kernel generation reads of it but the
    names — its split, its layers' PrimFuncs and the tensors they read and write, numbered by
    first appearance, with their shapes and dtypes, which of them are weights and which leave —
    and the names of those tensors and layers in that order. Sub-graphs of one form get one
    program, their names aside."""
    inputs, outputs = graph.boundary(nodes)
    ids: dict = {}
    for t in [*inputs, *(t for n in nodes for t in (*n.inputs, n.output))]:
        ids.setdefault(t, len(ids))
    tensors = tuple((graph.tensors[t].shape, graph.tensors[t].dtype, graph.tensors[t].constant) for t in ids)
    layers = tuple((n.func, tuple(ids[t] for t in n.inputs), ids[n.output]) for n in nodes)
    form = (spec.plan, layers, tensors, tuple(ids[t] for t in inputs), tuple(ids[t] for t in outputs))
    return form, [*ids, *(n.name for n in nodes)]


def _renamed(program, info, names: dict, name: str) -> tuple:
    """``program`` and ``info`` made for a sub-graph of the same form, named after another one
    (``names``: its tensor and layer names -> the other's; ``name``: the other kernel's)."""
    spilled = tuple((kind, names[t], owner) for kind, t, owner in info.spilled)
    return program.renamed(name, names), replace(info, spilled=spilled, on_vector=tuple(names[n] for n in info.on_vector))


def _subgraph(spec, nodes, graph, lowered) -> tvm.IRModule:
    """The sub-graph module of ``spec`` for kernel generation, its layers from ``lowered``
    (call-site name -> (lowered PrimFunc, LB budget))."""
    inputs, outputs = graph.boundary(nodes)
    tensors = {t: (graph.tensors[t].shape, graph.tensors[t].dtype) for n in nodes for t in (*n.inputs, n.output)}
    layers = [(n.name, lowered[n.name][0], (*n.inputs, n.output), lowered[n.name][1]) for n in nodes]
    weights = frozenset(t for t in inputs if graph.tensors[t].constant)
    split_loop, groups = spec.plan.split
    exchange = [nodes[k].output for k in spec.plan.exchange if nodes[k].output not in outputs] if spec.plan.rows else []
    return subgraph_module(spec.name, layers, inputs, outputs, tensors, weights, split_loop, groups, exchange)
