"""OffloadToDSA: replace each scheduled kernel's ``call_tir`` calls by one call that runs its program.

Every PrimFunc ``main`` calls is lowered by the TIR passes; the scheduler groups the calls into
kernels; each kernel becomes a DSA program (one layer: ``build_program``; a stitched sub-graph:
a sub-graph module through the §4 passes of ``kernelgen.stitch_passes``, then ``emit_stitched``) and its
calls become one
``call_dps_packed("tvm_dsa.execute", (program, info, *inputs))`` returning its outputs (a SET
schedule: ``build_tree_program``, all its layers in one program). The program
text lives in the VM bytecode, so ``export_library`` / ``load_module`` keep it. A PrimFunc the DSA
cannot run keeps its ``call_tir`` and runs on the host; the reason is recorded.
"""

from __future__ import annotations

import json
import os
import traceback
from dataclasses import dataclass, field, replace

import tvm
import tvm_ffi
from tvm import relax, tirx

from tvm_dsa import schedule as schedules
from tvm_dsa.schedule.plan import KernelSpec, LayerPlan, TreePlan
from tvm_dsa.emit.emitter import build_program
from tvm_dsa.emit.placement import Layer
from tvm_dsa.kernel.ir import ALIGN, CodegenError, plan_lb, read_kernel
from tvm_dsa.kernelgen.tree import TreeKernel, build_tree_program
from tvm_dsa.kernelgen.stitch import emit_stitched, read_allocation, subgraph_module
from tvm_dsa.hardware import Hardware
from tvm_dsa.isa.validation import validate
from tvm_dsa.schedule.graph import OpGraph
from tvm_dsa.schedule.set.layers import LayerGraphError
from tvm_dsa.kernel.analysis import Unsupported
from tvm_dsa.tiling import lower_kernel
from tvm_dsa.kernel.attrs import COPY_EACH
from tvm_dsa.tir_passes.scopes import read_twice
from tvm_dsa.tir_passes.tile import on_vector_units
from tvm_dsa.kernelgen.stitch_passes import BindCores, StitchBuffers, stitch_passes
from tvm_dsa.kernel.macs import kernel_macs
from tvm_dsa.packed import EXECUTE

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # src/tvm_dsa
CALL_TIR = tvm.ir.Op.get("relax.call_tir")


@dataclass
class OffloadResult:
    """What the pass decided, per kernel (``tvm_dsa.pipeline_result()`` returns the last one)."""

    dsa: list = field(default_factory=list)  # kernel names
    host: dict = field(default_factory=dict)  # PrimFunc name -> reason
    dsa_macs: int = 0
    host_macs: int = 0
    vector_macs: int = 0  # of dsa_macs, those of contractions on the vector units, not the MME
    stitched: dict = field(default_factory=dict)  # kernel name -> StitchInfo
    tuned: list = field(default_factory=list)  # PrimFunc names lowered with a tuning record
    trees: dict = field(default_factory=dict)  # kernel name -> (TreePlan, TreeProgram) of a SET kernel
    unstitched: dict = field(default_factory=dict)  # sub-graph kernel run layer by layer -> why


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


def offload(mod: tvm.IRModule, hw: Hardware, schedule: str = "layerwise", run_id: str = "model",
            options=None, tuned=None):
    """Return (new module, OffloadResult). ``options``: the scheduler's (``StitchOptions`` for
    graphturbo's stitched kernels, ``SetOptions`` for set); ``tuned(func)`` gives a PrimFunc
    lowered with its tuning record (``tvm_dsa.tuning``), or None to tile it by default."""
    result = OffloadResult()
    stitch = options if isinstance(options, StitchOptions) else StitchOptions()
    graph = OpGraph.from_relax(mod)
    lowered: dict = {}  # PrimFunc name -> (lowered, LB budget it was tiled to; None: the whole LB)
    funcs: dict = {}  # PrimFunc name -> the PrimFunc as lowered (with ``COPY_EACH`` where it takes one)
    built: dict = {}  # PrimFunc name -> its one-layer program where ``_lowered`` built it already
    scheduler = schedules.get(schedule)
    lowering = scheduler.lowering
    budget = lowering.lb_bytes(hw) if lowering.lb_bytes else None
    for name in dict.fromkeys(n.func for n in graph.nodes):
        func = mod[name]
        if not isinstance(func, tirx.PrimFunc):
            continue
        if lowering.views and relax.analysis.has_reshape_pattern(func):
            result.host[name] = "a pure reshape: a view on the host, no data moves"
            continue
        try:
            record = tuned(func) if tuned is not None and budget is None else None
            if record is not None:
                funcs[name], lowered[name] = func, (record, None)
                result.tuned.append(name)
            else:
                funcs[name], lowered[name], built[name] = _lowered(func, hw, budget, name, clamp=lowering.clamp)
        except Exception as err:  # noqa: BLE001 - a kernel the DSA path cannot build runs on the host
            result.host[name] = host_reason(err)
    on_vector = {name for name, (func, _) in lowered.items() if on_vector_units(func)}  # contraction not on the MME
    in_part: dict = {}  # PrimFunc name -> lowered within the LB share StitchOptions leaves to tiles

    def tiled_in_part(name):  # on the unit the whole-LB lowering took
        if name not in in_part:
            in_part[name] = _lower(funcs[name], hw, stitch.lb_budget(hw), name in on_vector, clamp=True)
        return in_part[name]

    # (PrimFunc name, LB budget, inputs on chip, first tile) -> lowered for stitched kernels
    overlapped: dict = {}

    def for_stitch(name, part: bool, on_chip: frozenset, first_tile: int | None = None):
        """A stitched kernel's layer, tiled to the LB share left to tiles (``part``) or the whole
        LB, its plans ranked with the inputs at positions ``on_chip`` read from the GB (where the
        kernel keeps its intermediates and promotes its weights: ``lower_kernel``); a contraction
        that loads from the GB with its chunk loads overlapping the MME (``overlap``; from DDR, as
        layerwise loads, a smaller chunk costs bursts). ``first_tile``: at most so many along the
        first loop (a micro-batch's samples, ``_micro_batched``) where the tiling holds more."""
        low, budget = tiled_in_part(name) if part else lowered[name]
        if first_tile is not None and _first_tile(low) <= first_tile:
            first_tile = None
        if first_tile is not None:
            low, budget = _lower(funcs[name], hw, stitch.lb_budget(hw) if part else budget, name in on_vector,
                                 clamp=True, first_tile=first_tile)
        on_chip = on_chip if stitch.gb else frozenset()
        key = (name, budget, on_chip, first_tile)
        if key not in overlapped:
            record = name in result.tuned and not part and first_tile is None
            if on_chip and not record:
                low = lower_kernel(funcs[name], hw, budget, vector=name in on_vector, on_chip=on_chip,
                                   first_tile=first_tile)[0]
            keep = (not stitch.gb or name in on_vector or record
                    or not kernel_macs(mod[name]) or plan_lb(read_kernel(low), hw, budget).double_buffered)
            overlapped[key] = (low if keep else lower_kernel(funcs[name], hw, budget, overlap=True, on_chip=on_chip,
                                                             first_tile=first_tile)[0], budget)
        return overlapped[key]
    try:
        specs = scheduler.schedule(mod, hw, set(lowered), options)
    except LayerGraphError as err:  # a model SET's layer graph does not describe runs layerwise
        result.unstitched[schedule] = f"the {schedule} schedule does not apply ({err}): layerwise"
        specs = schedules.get("layerwise").schedule(mod, hw, set(lowered), None)
    node_of = {n.name: n for n in graph.nodes}
    kernels = []  # (spec, program text, input exprs, output vars, names the call renames the program's by)
    programs: dict = {}  # PrimFunc name -> program text of its one-layer kernel
    generated: dict = {}  # a stitched sub-graph's form (``_form``) -> (names, program, info, text) of the first
    specs = list(specs)
    while specs:
        spec = specs.pop(0)
        nodes = [node_of[c] for c in spec.calls]
        if isinstance(spec.plan, TreePlan):
            try:
                tk = _tree_kernel(spec, nodes, graph, lowered, hw)
                lowered_tree = build_tree_program(tk, hw)
            except Exception as err:  # noqa: BLE001 - its layers run one kernel each, pure reshapes as views
                result.unstitched[spec.name] = host_reason(err)
                specs[:0] = [KernelSpec(n.func, (n.name,)) for n in nodes if n.func in lowered]
                continue
            result.dsa.append(spec.name)
            result.trees[spec.name] = (spec.plan, lowered_tree)
            kernels.append((spec, lowered_tree.program.serialize(), [graph.tensors[t] for t in tk.inputs], list(tk.outputs),
                            {}))
            continue
        if isinstance(spec.plan, LayerPlan):
            (node,) = nodes
            if node.func not in programs:
                try:
                    program = built.get(node.func) or _program(lowered[node.func][0], hw, node.func)
                    programs[node.func] = program.serialize()
                    result.dsa.append(node.func)
                except Exception as err:  # noqa: BLE001 - a kernel the DSA path cannot build runs on the host
                    result.host[node.func] = host_reason(err)
                    continue
            inputs = [graph.tensors[t] for t in node.inputs]
            kernels.append((spec, programs[node.func], inputs, [node.output], {}))
            continue
        form, names = _form(spec, nodes, graph)
        if form in generated:  # like an earlier sub-graph (the next transformer block): its program
            first, program, info, text = generated[form]
            used = {a.name for a in program.args} | {m.name for k in program.kernels for m in k.layers}
            renames = {a: b for a, b in zip(first, names) if a in used and a != b}
            program, info = _renamed(program, info, dict(zip(first, names)), spec.name)
        else:
            try:
                program, info = _stitched(spec, nodes, graph, for_stitch, hw, stitch)
            except Exception as err:  # noqa: BLE001
                # a layer the kernel cannot run (a flip walks its input backwards) sends only
                # itself to the host: the others run one kernel each
                result.unstitched[spec.name] = host_reason(err)
                specs[:0] = [KernelSpec(n.func, (n.name,)) for n in nodes]
                continue
            text, renames = program.serialize(), {}
            generated[form] = (names, program, info, text)
        result.dsa.append(spec.name)
        result.stitched[spec.name] = info
        kernels.append((spec, text, [graph.tensors[a.name] for a in program.args if a.role == "input"],
                        [a.name for a in program.args if a.role == "output"], renames))
    in_graph = {n.func for n in graph.nodes}
    for name in _called_prim_funcs(mod["main"]):
        if name not in in_graph:
            result.host[name] = "several outputs: the DSA runs kernels of one output"
    on_dsa = {c for spec, *_ in kernels for c in spec.calls}
    for node in graph.nodes:
        macs = kernel_macs(mod[node.func])
        if node.name in on_dsa:
            result.dsa_macs += macs
            if node.func in on_vector:
                result.vector_macs += macs
        else:
            result.host_macs += macs
            result.host.setdefault(node.func, "not scheduled on the DSA")
    return _rewrite(mod, kernels, graph, run_id), result


def _called_prim_funcs(func: relax.Function) -> list[str]:
    """The PrimFuncs ``func`` calls with ``call_tir``, by name."""
    found = []
    tvm_ffi.structural_walk(func.body, [(relax.Call, lambda c: found.append(c.args[0].name_hint)
                                         if c.op.same_as(CALL_TIR) else None)])
    return list(dict.fromkeys(found))


def host_reason(err: Exception) -> str:
    """Why a kernel (or a schedule) was left to the host: what the DSA path refuses
    (``Unsupported``) or, for any other error while building it, the error and the line of tvm_dsa
    it came from. The offload is a fault barrier per kernel: a kernel the DSA path cannot build
    runs on the host, the model compiles."""
    if isinstance(err, Unsupported):
        return str(err)
    lines = str(err).strip().splitlines()
    ours = [f for f in traceback.extract_tb(err.__traceback__) if f"{os.sep}tvm_dsa{os.sep}" in f.filename]
    where = f" ({os.path.relpath(ours[-1].filename, _PACKAGE)}:{ours[-1].lineno})" if ours else ""
    return f"the DSA path failed: {type(err).__name__}: {lines[0] if lines else ''}".rstrip(": ") + where


def _program(lowered, hw, name: str):
    """The one-layer program of a lowered kernel, validated now (an invalid program's kernel runs
    on the host, not the model's run into an error)."""
    program = build_program(lowered, hw, name)
    validate(program)
    return program


def _lowered(func, hw, lb_bytes, name: str, *, clamp: bool) -> tuple:
    """(the PrimFunc as lowered, ``_lower`` of it, its one-layer program ``name`` where that was
    built to decide, else None): ``func``, or ``func`` with an LB copy of each DDR input per stage
    (``COPY_EACH``) where two stages read one input and the copy they would share holds only the
    box the first reads (a residual over the conv that reads it, a concat of two functions of one
    tensor): ``func`` does not lower, or its one-layer program does not emit."""
    each = func.with_attr(COPY_EACH, True)
    try:
        low = _lower(func, hw, lb_bytes, clamp=clamp)
    except Unsupported as err:
        try:
            return each, _lower(each, hw, lb_bytes, clamp=clamp), None
        except Unsupported:
            raise err from None
    if read_twice(func):
        try:
            return func, low, _program(low[0], hw, name)
        except CodegenError:
            return each, _lower(each, hw, lb_bytes, clamp=clamp), None
    return func, low, None


def _lower(func, hw, lb_bytes, vector: bool = False, *, clamp: bool, first_tile: int | None = None):
    """(lowered PrimFunc, LB budget it was tiled to): within ``lb_bytes`` where it fits (graphturbo
    leaves the rest of the LB to stitched intermediates), else within the whole LB; the
    contraction on the unit ``vector`` says, tiles overlapping where ``clamp`` lets them, the
    first loop's at most ``first_tile`` (``lower_kernel``)."""
    if lb_bytes is not None:
        try:
            return lower_kernel(func, hw, lb_bytes, vector=vector, clamp=clamp, first_tile=first_tile)[0], lb_bytes
        except Unsupported:
            pass
    return lower_kernel(func, hw, vector=vector, clamp=clamp, first_tile=first_tile)[0], None


def _first_tile(lowered) -> int:
    """The tile of a lowered kernel's first loop (along its output's first dim)."""
    kernel = read_kernel(lowered)
    return -(-kernel.params[-1][1][0] // kernel.tile_loops()[0].extent)


def _boundary(nodes, graph) -> tuple[list[str], list[str]]:
    """(inputs, outputs) of a group of calls: tensors they read from outside, tensors they produce
    that something outside reads or ``main`` returns."""
    members = {n.output for n in nodes}
    inputs, outputs = [], []
    for n in nodes:
        for t in n.inputs:
            if t not in members and t not in inputs:
                inputs.append(t)
        consumers = [m for m in graph.nodes if n.output in m.inputs and m.output not in members]
        if consumers or n.output in graph.outputs:
            outputs.append(n.output)
    return inputs, outputs


def _stitched(spec, nodes, graph, layer, hw, stitch) -> tuple:
    """(Program, StitchInfo) of a stitched kernel: its sub-graph module through the §4 passes;
    ``layer(PrimFunc name, part, on_chip)``: the layer lowered for it, within the LB share the
    options leave to tiles if ``part``, its plans ranked with the inputs at the positions
    ``on_chip`` read from the GB (those the sub-graph computes and its weights) where another
    comes from DDR (a sub-graph's first layers). A layer reading only the GB keeps the plan
    ranked as layerwise ranks it: ranking it so too changed no cycles of the seven models of
    ``benchmarks/graphturbo.py`` and cost ResNet-50's build 0.6 s. ``layer(..., first_tile)``:
    with at most so many samples a tile (micro-batches, ``_micro_batched``)."""
    inputs, outputs = _boundary(nodes, graph)
    batch = graph.tensors[outputs[0]].shape[0]  # the first dim of the layers that have it (§2.1)

    def lowered(part: bool, first_tile: int | None) -> dict:
        out = {}
        for n in nodes:
            on_chip = frozenset(i for i, t in enumerate(n.inputs) if t not in inputs or graph.tensors[t].constant)
            cap = first_tile if graph.tensors[n.output].shape[0] == batch else None
            out[n.name] = layer(n.func, part, on_chip if len(on_chip) < len(n.inputs) else frozenset(), cap)
            if read_kernel(out[n.name][0]).wide:  # stitched tensors are placed in the storage type
                raise Unsupported(f"layer {n.name} keeps a tensor wide (kernel.ranges)")
        return out

    def planned(rounds: int):
        """The sub-graph through the stitch passes, each cluster's instances in ``rounds`` rounds,
        its layers' tiles holding no more than a round's share of the samples."""
        share, rest = divmod(batch, hw.clusters * rounds)
        first_tile = share if rounds > 1 and share and not rest else None
        bind = tvm.transform.Sequential([StitchBuffers(hw), BindCores(hw, rounds)])
        sub = bind(_subgraph(spec, nodes, graph, lowered(False, first_tile)))
        # the LB level (Fig. 15's "L1") pays only where Algorithm 4 gives every instance one
        # core (it keeps the intermediates in that core's LB); elsewhere the tiles keep the LB
        lb = stitch.lb_keep > 0 and all(len(c) == 1 for c in sub.attrs["dsa.cores"])
        if lb:
            sub = bind(_subgraph(spec, nodes, graph, lowered(True, first_tile)))
        later = stitch_passes(hw, stitch.order, stitch.spill, stitch.gb, stitch.prefetch, lb).passes[2:]
        return tvm.transform.Sequential(list(later))(sub)  # the passes after BindCores

    return emit_stitched(_micro_batched(planned, hw, batch // hw.clusters), hw)


def _micro_batched(planned, hw, samples: int):
    """``planned(rounds)`` (a sub-graph module through the stitch passes, each cluster's
    instances bound to run in ``rounds`` rounds) with the fewest buffers spilled to DDR, the
    fewest rounds among those: 1, or where the GB does not hold what a cluster's instances keep
    at once, twice as many while that spills and a cluster has ``samples`` or instances for
    them. Micro-batches: each round's intermediates live for the round, and in the ``rounds``
    order each round promotes the weights it reads (BERT-128 at batch 16: four samples a cluster
    spilled each FFN1 output, 3 MB, beside FFN2's 4.5 MB of weights; two rounds of two spill
    nothing)."""
    best, rounds = None, 1
    while True:
        sub = planned(rounds)
        spills = sum(b.level == "ddr" for b in read_allocation(sub))
        if best is None or spills < best[0]:
            best = (spills, sub)
        cores = sub.attrs["dsa.cores"]
        if not spills or 2 * rounds > max(samples, len(cores) // min(len(cores), hw.clusters)):
            return best[1]
        rounds *= 2


def _form(spec, nodes, graph) -> tuple:
    """(form, names) of a stitched sub-graph: all that kernel generation reads of it but the
    names — its split, its layers' PrimFuncs and the tensors they read and write, numbered by
    first appearance, with their shapes and dtypes, which of them are weights and which leave —
    and the names of those tensors and layers in that order. Sub-graphs of one form get one
    program, their names aside."""
    inputs, outputs = _boundary(nodes, graph)
    ids: dict = {}
    for t in [*inputs, *(t for n in nodes for t in (*n.inputs, n.output))]:
        ids.setdefault(t, len(ids))
    tensors = tuple((graph.tensors[t].shape, graph.tensors[t].dtype, graph.tensors[t].constant) for t in ids)
    layers = tuple((n.func, tuple(ids[t] for t in n.inputs), ids[n.output]) for n in nodes)
    form = (spec.plan.split, layers, tensors, tuple(ids[t] for t in inputs), tuple(ids[t] for t in outputs))
    return form, [*ids, *(n.name for n in nodes)]


def _renamed(program, info, names: dict, name: str) -> tuple:
    """``program`` and ``info`` made for a sub-graph of the same form, named after another one
    (``names``: its tensor and layer names -> the other's; ``name``: the other kernel's)."""
    return program.renamed(name, names), replace(info, spilled=tuple((kind, names[t], owner) for kind, t, owner in info.spilled))


def _subgraph(spec, nodes, graph, lowered) -> tvm.IRModule:
    """The sub-graph module of ``spec`` for kernel generation, its layers from ``lowered``
    (call-site name -> (lowered PrimFunc, LB budget))."""
    inputs, outputs = _boundary(nodes, graph)
    tensors = {t: (graph.tensors[t].shape, graph.tensors[t].dtype) for n in nodes for t in (*n.inputs, n.output)}
    layers = [(n.name, lowered[n.name][0], (*n.inputs, n.output), lowered[n.name][1]) for n in nodes]
    weights = frozenset(t for t in inputs if graph.tensors[t].constant)
    split_loop, groups = spec.plan.split
    return subgraph_module(spec.name, layers, inputs, outputs, tensors, weights, split_loop, groups)


def _tree_kernel(spec, nodes, graph, lowered, hw) -> TreeKernel:
    """A SET kernel: one ``emit.Layer`` per layer of the plan's layer graph, the other calls
    (pure reshapes, not lowered) as views."""
    inputs, outputs = _boundary(nodes, graph)
    tensors = {t: (graph.tensors[t].shape, graph.tensors[t].dtype) for n in nodes for t in (*n.inputs, n.output)}
    layers = []
    for lay in spec.plan.graph.layers:
        n = graph.nodes[lay.node]
        layers.append(Layer.of(lowered[n.func][0], hw, n.name, (*n.inputs, n.output), lowered[n.func][1]))
        if layers[-1].ir.wide:  # the tree's tensors are placed in the storage type
            raise Unsupported(f"layer {n.name} keeps a tensor wide (kernel.ranges)")
    views = {n.output: n.inputs[0] for n in nodes if n.func not in lowered}
    weights = frozenset(t for t in inputs if graph.tensors[t].constant)
    return TreeKernel(spec.name, tuple(layers), views, tuple(inputs), tuple(outputs), tensors, spec.plan.schedule,
                      weights)


def _rewrite(mod, kernels, graph, run_id):
    """``main`` with each kernel's calls replaced by one DSA call. Bindings are re-ordered
    topologically with each kernel as one unit, keeping the original order where they are free
    (a sub-graph is convex, so the units form a DAG)."""
    func = mod["main"]
    owner = {c: k for k, (spec, *_) in enumerate(kernels) for c in spec.calls}
    emitted = [0]
    blocks = []
    for block in func.body.blocks:
        units: dict = {}  # unit id -> [position, bindings]
        for pos, b in enumerate(block.bindings):
            name = graph.names.get(b.var)
            uid = ("k", owner[name]) if name in owner and graph.tensors[name].expr.same_as(b.var) else ("b", pos)
            units.setdefault(uid, [pos, []])
            units[uid][0] = pos
            units[uid][1].append(b)
        where = {b.var: uid for uid, (_, bs) in units.items() for b in bs}
        needs = {uid: {where[v] for b in bs for v in relax.analysis.free_vars(b.value)
                       if v in where and where[v] != uid} for uid, (_, bs) in units.items()}
        done, out = set(), []
        while len(done) < len(units):
            ready = [u for u in units if u not in done and needs[u] <= done]
            uid = min(ready, key=lambda u: units[u][0])
            done.add(uid)
            if uid[0] == "k":
                out += _kernel_bindings(kernels[uid[1]], emitted[0], len(kernels), block, graph, run_id)
                emitted[0] += 1
            else:
                out += units[uid][1]
        cls = relax.DataflowBlock if isinstance(block, relax.DataflowBlock) else relax.BindingBlock
        blocks.append(cls(out))
    new_main = relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty, func.is_pure,
                              func.attrs)
    mod = mod.clone()  # the caller's module is not modified
    mod["main"] = new_main
    return relax.transform.DeadCodeElimination(["main"])(mod)


def _kernel_bindings(kernel, index, count, block, graph, run_id):
    """The bindings of one DSA call. Sub-graphs of one form share the first's program text, and
    their call's info names what the program's args and layers are called here (``names``, read by
    ``host.execute``): one text to compress, embed and parse for a model's repeated blocks."""
    spec, text, inputs, outputs, renames = kernel
    info = json.dumps({"run": run_id, "kernel": spec.name, "index": index, "count": count,
                       **({"names": renames} if renames else {})})
    args = [tvm.ir.StringImm(text), tvm.ir.StringImm(info), *(t.expr for t in inputs)]
    out_vars = [graph.tensors[t].expr for t in outputs]
    types = [v.ty for v in out_vars]
    if len(out_vars) == 1:
        return [relax.VarBinding(out_vars[0], relax.call_dps_packed(EXECUTE, args, out_ty=types[0]))]
    call = relax.call_dps_packed(EXECUTE, args, out_ty=types)
    var_cls = relax.DataflowVar if isinstance(block, relax.DataflowBlock) else relax.Var
    tup = var_cls(f"{spec.name}_out", relax.TupleType(types))
    return [relax.VarBinding(tup, call)] + [relax.VarBinding(v, relax.TupleGetItem(tup, j))
                                            for j, v in enumerate(out_vars)]
