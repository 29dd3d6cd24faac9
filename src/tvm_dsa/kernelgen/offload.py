"""OffloadToDSA: each scheduled kernel's ``call_tir`` calls become one call that runs its program.

Every PrimFunc ``main`` calls is lowered as the scheduler's ``Lowering`` asks; the scheduler groups
the calls into kernels (``KernelSpec``s); each kernel's program is made by the generator for its
plan's type (``GENERATORS``: ``kernelgen.layer``, ``kernelgen.stitched``, ``kernelgen.tree``); then
``ReplaceWithDSACalls`` makes ``main`` call them. A PrimFunc the DSA cannot run keeps its
``call_tir`` and runs on the host; the reason is recorded in the ``OffloadResult``.
"""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass, field

import tvm
import tvm_ffi
from tvm import relax, tirx

from tvm_dsa import schedule as schedules
from tvm_dsa.hardware import Hardware
from tvm_dsa.kernel.analysis import INT_DTYPES, Unsupported, contraction_dtypes, param_dtypes
from tvm_dsa.kernel.attrs import VECTOR_CONTRACTION
from tvm_dsa.kernel.macs import kernel_macs
from tvm_dsa.kernelgen.blocks import FuseSeparableBlocks
from tvm_dsa.kernelgen.launch import launch_together
from tvm_dsa.kernelgen.layer import LayerKernels
from tvm_dsa.kernelgen.lowering import Lowered, lower_layer
from tvm_dsa.kernelgen.rewrite import ReplaceWithDSACalls
from tvm_dsa.kernelgen.stitched import StitchedKernels
from tvm_dsa.kernelgen.tree import TreeKernels
from tvm_dsa.schedule.graph import OpGraph
from tvm_dsa.schedule.plan import KernelSpec, LayerPlan, StitchPlan, TreePlan
from tvm_dsa.schedule.set.layers import LayerGraphError
from tvm_dsa.tir_passes.tile import on_vector_units

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # src/tvm_dsa
CALL_TIR = tvm.ir.Op.get("relax.call_tir")

#: plan type -> generator: made per module from its ``Lowered`` context, it turns a ``KernelSpec``
#: into a ``DSACall`` (recording what it decided in the result) or raises
GENERATORS = {LayerPlan: LayerKernels, StitchPlan: StitchedKernels, TreePlan: TreeKernels}


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
    finalists: dict = field(default_factory=dict)  # SET kernel name -> its finalists simulated (tree.Measured)
    unstitched: dict = field(default_factory=dict)  # sub-graph kernel run layer by layer -> why
    launches: list = field(default_factory=list)  # kernels launched as one (``kernelgen.launch``), their names
    model_ddr_bytes: int | None = None  # the model's inputs, weights, outputs (None: dynamic)
    weight_bytes: int = 0  # of those, its weights (a dynamic model's bound adds a run's inputs, outputs)
    schedule: str = ""  # the inter-layer schedule it was compiled with (the pipeline's choice)
    timed: dict = field(default_factory=dict)  # schedule -> DSA cycles, where the pipeline timed several
    blocks: list = field(default_factory=list)  # kernelgen.blocks.FusedBlock per separable pair timed
    layers: dict = field(default_factory=dict)  # DSA kernel name -> the layers (Relax names) it runs
    # a layer or constant of the graph the kernels were made of whose name differs in the module the
    # pass received (``FuseSeparableBlocks`` joins two layers, and constants are numbered again)
    # -> its names there: a fused pair's two layers, producer first (``graph_sources``)
    sources: dict = field(default_factory=dict)

    @property
    def host_kernels(self) -> int:
        """The kernels the host runs, not counting pure reshapes (views: no work)."""
        return sum(why != VIEW for why in self.host.values())

    @property
    def model_macs(self) -> int:
        """The MACs of the model's kernels, each once (on the DSA or the host)."""
        return self.dsa_macs + self.host_macs


VIEW = "a pure reshape: a view on the host, no data moves"


def OffloadToDSA(hw: Hardware, schedule: str = "layerwise", options=None, tuned=None,  # noqa: N802
                 run_id: str = "model", on_result=None) -> tvm.transform.Pass:
    """Pass: the kernels of ``schedule`` run on the DSA chip ``hw``. ``options``: the scheduler's and
    its generator's (``StitchOptions`` for graphturbo's stitched kernels, ``SetOptions`` for set);
    ``tuned(func)`` gives a PrimFunc lowered with its tuning record (``tvm_dsa.tuning``), or None to
    tile it by default. ``on_result(OffloadResult)`` hears what each run decided: a pass object
    holds no state, so one can run on several modules, or inside a ``Sequential``."""
    scheduler = schedules.get(schedule)

    @tvm.transform.module_pass(opt_level=0, name="dsa.OffloadToDSA")
    def offload_to_dsa(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        result = OffloadResult(schedule=schedule)
        received = mod
        if scheduler.lowering.separable:
            mod = FuseSeparableBlocks(hw, scheduler.lowering.separable == "stitched", result.blocks)(mod)
        ctx = Lowered(mod, OpGraph.from_relax(mod), hw, options, result)
        if mod is not received:
            result.sources = graph_sources(OpGraph.from_relax(received), ctx.graph)
        _lower_layers(ctx, scheduler.lowering, tuned)
        try:
            specs = scheduler.schedule(mod, hw, set(ctx.lowered), options)
        except LayerGraphError as err:  # a model SET's layer graph does not describe runs layerwise
            result.unstitched[schedule] = f"the {schedule} schedule does not apply ({err}): layerwise"
            specs = schedules.get("layerwise").schedule(mod, hw, set(ctx.lowered), None)
        generators = {plan: make(ctx) for plan, make in GENERATORS.items()}
        calls = []
        specs = list(specs)
        while specs:
            spec = specs.pop(0)
            try:
                calls.append(generators[type(spec.plan)](spec))
                result.layers[spec.name] = result.layers.get(spec.name, ()) + spec.calls
            except Exception as err:  # noqa: BLE001 - a kernel the DSA path cannot build runs otherwise
                specs[:0] = _fall_back(ctx, spec, host_reason(err))
        _account(ctx, {c for call in calls for c in call.spec.calls})
        if scheduler.launch_together:
            views = frozenset(n.index for n in ctx.graph.nodes if result.host.get(n.func) == VIEW)
            calls, result.launches = launch_together(calls, ctx.graph, views)
        mod = ReplaceWithDSACalls(calls, ctx.graph, run_id)(mod)
        if on_result is not None:
            on_result(result)
        return mod

    return offload_to_dsa


def graph_sources(before: OpGraph, after: OpGraph) -> dict[str, tuple[str, ...]]:
    """Each layer and constant of ``after`` (the graph of a module some of whose layers are
    ``before``'s joined, as ``FuseSeparableBlocks`` joins them: the consumer's variable stays, the
    producer's goes) whose names in ``before`` are not its own -> those names: a joined layer's, in
    order, a constant's (the same Relax constant) where it was numbered otherwise."""
    index = {node.output: node.index for node in before.nodes}
    kept = {index[before.names[var]] for var in after.names if var in before.names and before.names[var] in index}
    into: dict[int, list[int]] = {}  # a layer of ``before`` that stays -> the layers joined into it
    for node in before.nodes:
        k = node.index
        while k is not None and k not in kept:  # a joined producer has one reader (a dead layer none)
            readers = before.consumers(k)
            k = min(readers) if len(readers) == 1 else None
        if k is not None:
            into.setdefault(k, []).append(node.index)
    out = {}
    for node in after.nodes:
        k = index.get(before.names.get(after.tensors[node.output].expr))
        if k is None:  # a layer of its own making: no names to follow
            continue
        layers = tuple(before.nodes[j].name for j in into[k])
        if layers != (node.name,):
            out[node.name] = layers
        consts = [t for j in into[k] for t in before.nodes[j].inputs if before.tensors[t].constant]
        for t in node.inputs:
            if after.tensors[t].constant:
                same = next((c for c in consts if before.tensors[c].expr.same_as(after.tensors[t].expr)), t)
                if same != t:
                    out[t] = (same,)
    return out


def offload(mod: tvm.IRModule, hw: Hardware, schedule: str = "layerwise", **options) -> tuple:
    """(new module, OffloadResult): ``OffloadToDSA(hw, schedule, **options)`` run once on ``mod``,
    for the callers that keep what it decided (the pipeline, the BYOC codegen)."""
    decided = []
    mod = OffloadToDSA(hw, schedule, on_result=decided.append, **options)(mod)
    return mod, decided[0]


def _lower_layers(ctx: Lowered, lowering, tuned) -> None:
    """Every PrimFunc ``main`` calls, lowered into ``ctx`` as ``lowering`` asks (with its tuning
    record where ``tuned`` has one and the layer gets the whole LB), or sent to the host."""
    hw, result = ctx.hw, ctx.result
    budget = lowering.lb_bytes(hw) if lowering.lb_bytes else None
    names = [n for n in dict.fromkeys(n.func for n in ctx.graph.nodes) if isinstance(ctx.mod[n], tirx.PrimFunc)]
    quantized = any("int8" in param_dtypes(ctx.mod[n]) for n in names)  # int32 alone: indices of a float model
    for name in names:
        func = ctx.mod[name]
        if relax.analysis.has_reshape_pattern(func):
            result.host[name] = VIEW
            continue
        unheld = None if hw.is_float else _unheld(func, quantized)
        if unheld:
            result.host[name] = unheld
            continue
        try:
            record = tuned(func) if tuned is not None and budget is None else None
            if record is not None:
                ctx.funcs[name], ctx.lowered[name] = func, (record, None)
                result.tuned.append(name)
            else:
                ctx.funcs[name], ctx.lowered[name], ctx.built[name] = lower_layer(func, hw, budget, name,
                                                                                  clamp=lowering.clamp)
        except Exception as err:  # noqa: BLE001 - a kernel the DSA path cannot build runs on the host
            result.host[name] = host_reason(err)
    ctx.on_vector = frozenset(name for name, (func, _) in ctx.lowered.items() if on_vector_units(func))


def _unheld(func: tirx.PrimFunc, quantized: bool) -> str | None:
    """Why an integer chip cannot compute ``func`` exactly in a quantized model (one with int8
    tensors, ``quantized``), else None: a float kernel there (its float tensors the chip cannot hold; in a
    float model the chip times them, ``--timing-only``), or an integer kernel's contraction of
    other values than int8 (the MME multiplies int8)."""
    if not quantized:
        return None
    if not param_dtypes(func) & set(INT_DTYPES):
        return "a float kernel of a quantized model: the int8 chip holds no float tensor"
    if contraction_dtypes(func) - {"int8"}:
        return (f"a contraction of {sorted(contraction_dtypes(func) - {'int8'})} values: the int8 chip's MME "
                "multiplies int8")
    return None


def _fall_back(ctx: Lowered, spec: KernelSpec, reason: str) -> list[KernelSpec]:
    """The kernels to build instead of ``spec``, which did not build: none for one layer (it runs
    on the host); for a stitched sub-graph or a SET tree, its lowered layers one kernel each (a
    layer the kernel cannot run, a flip walking its input backwards, sends only itself to the
    host)."""
    nodes = ctx.nodes(spec)
    if isinstance(spec.plan, LayerPlan):
        ctx.result.host[nodes[0].func] = reason
        return []
    ctx.result.unstitched[spec.name] = reason
    return [KernelSpec(n.func, (n.name,)) for n in nodes if n.func in ctx.lowered]


def _account(ctx: Lowered, on_dsa: set) -> None:
    """The MACs on the DSA, on its vector units and on the host, and why each host kernel is there
    (``on_dsa``: the calls the DSA runs)."""
    result, graph = ctx.result, ctx.graph
    in_graph = {n.func for n in graph.nodes}
    for name in _called_prim_funcs(ctx.mod["main"]):
        if name not in in_graph:
            result.host[name] = "several outputs: the DSA runs kernels of one output"
    stitched_on_vector = {layer for info in result.stitched.values() for layer in info.on_vector}
    for node in graph.nodes:
        macs = kernel_macs(ctx.mod[node.func])
        if node.name in on_dsa:
            result.dsa_macs += macs
            # a fused block's depthwise contraction is marked before lowering; a layer's one, by it
            marked = kernel_macs(ctx.mod[node.func], VECTOR_CONTRACTION)
            result.vector_macs += marked or (macs if node.func in ctx.on_vector or node.name in stitched_on_vector
                                             else 0)
        else:
            result.host_macs += macs
            result.host.setdefault(node.func, "not scheduled on the DSA")


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
