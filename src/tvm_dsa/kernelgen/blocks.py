"""FuseSeparableBlocks: a pointwise convolution and the layer before it that only it reads, a
depthwise convolution (the second half of a depthwise-separable block: MobileNet's, an inverted
residual's) or an elementwise layer (DenseNet's batch norm and ReLU before each 1 x 1
convolution), as one kernel, where that runs faster; and a contraction and a layout copy that only
it reads (a reshape and transpose: an attention's heads split or joined).

Layer by layer, the first layer's result goes out to the GB (or DDR) and comes back for the
pointwise convolution: of an inverted residual block's 26 bytes a pixel per input channel through
the GB's ports, 12. Fused, the pointwise convolution is the anchor and its reduction over the
first layer's channels the chunk loop; each chunk of the first layer's result is computed under it
(``TileForLB`` computes a producer of the anchor under its chunk loop, a contraction like any
other, ``AnchorInfo.producers``) and stays in the LB, on the vector units (a depthwise
convolution there where the MME accumulates in floating point: one PE column of the MME against
the VME's lanes, as ``tile.unit_choice`` reasons). The cost: a tile after a depthwise convolution
covers all output channels (each tile of them would compute the depthwise chunk again,
``AnchorInfo.whole``), so it has fewer rows, and a depthwise tile of fewer rows reads more halo;
an elementwise layer is computed again for each tile of output channels. Which wins depends on
the shapes, so each pair is timed both ways (``_cycles``) and fused only where the fused kernel is
faster. MobileNetV2 at batch 8 on stcp920: 16 of its 17 pairs fuse (docs/performance.md).

A layout copy is inlined into the contraction: its tiles load their boxes through the copy's
indices (strided DMAs), and the copy's trip through the GB, a layer of its own, is gone. A
contraction reading two copies (an attention's queries and keys) takes one a round.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx

from tvm_dsa.hardware import Hardware
from tvm_dsa.kernel.analysis import (
    FLOAT_DTYPES, Call, Load, Unsupported, call_name, classify, param_dtypes, sch_annotate, sch_get
)
from tvm_dsa.kernel.attrs import VECTOR_CONTRACTION
from tvm_dsa.kernel.ir import read_kernel
from tvm_dsa.kernelgen.pair import fused_pair
from tvm_dsa.tiling import TIMED_TILES, lower_kernel, lower_timed, timed_cycles
from tvm_dsa.tir_passes.tile import anchor_info, find_anchor, leaf_blocks

CALL_TIR = tvm.ir.Op.get("relax.call_tir")


@dataclass(frozen=True)
class FusedBlock:
    """A pair as decided: its two kernels and the chip's cycles each way (``_cycles``)."""

    producer: str  # the depthwise convolution, the elementwise layer or the layout copy
    consumer: str  # the pointwise convolution or the contraction
    fused_cycles: float
    parts_cycles: float


def _kind(func) -> str | None:
    """"pointwise" (a 1 x 1 convolution, or 1-D of width 1: an N loop), "depthwise" (a window,
    one input channel per output channel, no N loop), "contraction" (any other on the MME), "elementwise"
    (``_elementwise``), "layout" (``_layout``) or None."""
    if not isinstance(func, tirx.PrimFunc):
        return None
    try:
        info = anchor_info(func)
    except Unsupported:
        return None
    if info.kind.kind != "mme":  # an integer one keeps its own kernel: int8 tensors stay in the storage type
        if not param_dtypes(func) <= set(FLOAT_DTYPES):
            return None
        return "elementwise" if _elementwise(func) else "layout" if _layout(func) else None
    if info.producers:
        return None
    window = info.reduction[1:]  # a convolution's (1-D or 2-D) reduces channels, then its window
    if window and "N" in info.roles and math.prod(window) == 1:
        return "pointwise"
    if window and "N" not in info.roles and info.reduction[0] == 1 and math.prod(window) > 1:
        return "depthwise"
    return "contraction"


def _layout(func: tirx.PrimFunc) -> bool:
    """Every block of ``func`` copies an element of its input to another place (a transpose, a
    reshape), and ``func`` is not a pure reshape (a view on the host, no kernel to save)."""
    if relax.analysis.has_reshape_pattern(func):
        return False
    sch = s_tir.Schedule(func)
    return all(classify(sch_get(sch, b)).kind == "copy" and isinstance(sch_get(sch, b).body.value, Load)
               for b in leaf_blocks(sch))


def _elementwise(func: tirx.PrimFunc) -> bool:
    """Every block of ``func`` computes each element of its output from the same element of its
    inputs (one of them, in a concatenation: shifted along the joined dim, which its condition
    picks), or of inputs broadcast to it (a batch norm's per-channel parameters): no reduction,
    no window, no transpose. Its result's chunks are then computed where a consumer loads them
    (DenseNet's concatenation, batch norm and ReLU before each 1 x 1 convolution)."""
    sch = s_tir.Schedule(func)
    for block_rv in leaf_blocks(sch):
        block = sch_get(sch, block_rv)
        store = block.body
        if classify(block).kind not in ("copy", "vector"):
            return False
        own = [v.var for v in block.iter_vars]
        if len(store.indices) != len(own) or not all(i.same_as(v) for i, v in zip(store.indices, own)):
            return False
        loads = []
        tvm_ffi.structural_walk(store.value, [(Load, loads.append)])
        joined = isinstance(store.value, Call) and call_name(store.value) == "if_then_else"
        if not all(len(ld.indices) == len(own) and all(_same_element(i, v, n, joined) for i, v, n in
                                                         zip(ld.indices, own, ld.source.shape)) for ld in loads):
            return False
    return True


def _same_element(index, var, extent, joined: bool) -> bool:
    """``index`` reads the element at ``var``: it is ``var``, 0 along a broadcast dim of extent 1,
    or (``joined``: a concatenation's pick) ``var`` shifted by a constant."""
    if index.same_as(var):
        return True
    if isinstance(index, tirx.IntImm):
        return int(index) == 0 and int(extent) == 1
    return joined and isinstance(index, tirx.Sub) and index.a.same_as(var) and isinstance(index.b, tirx.IntImm)


def pairs(mod: tvm.IRModule) -> list[tuple[relax.VarBinding, relax.VarBinding]]:
    """(producer, consumer) ``call_tir`` bindings of ``main`` where a pointwise convolution reads
    the result of a depthwise convolution or an elementwise layer as its data input, or a
    contraction that of a layout copy as any input, and nothing else reads it."""
    main = mod["main"]
    bindings = [b for block in main.body.blocks for b in block.bindings]
    readers: dict = {}
    for value in [b.value for b in bindings] + [main.body.body]:
        for v in relax.analysis.free_vars(value):
            readers[v] = readers.get(v, 0) + 1
    calls = {b.var: b for b in bindings if isinstance(b.value, relax.Call) and b.value.op.same_as(CALL_TIR)}
    out = []
    for b in calls.values():
        args = b.value.args[1].fields
        kind = _kind(mod[b.value.args[0]])
        for k, a in enumerate(args):
            first = calls.get(a)
            if first is None or readers.get(first.var) != 1 or sum(x.same_as(first.var) for x in args) != 1:
                continue
            made = _kind(mod[first.value.args[0]])
            if k == 0 and kind == "pointwise" and made in ("depthwise", "elementwise") \
                    or kind in ("pointwise", "contraction") and made == "layout":
                out.append((first, b))
    return out


def fused_function(mod: tvm.IRModule, pair, hw: Hardware, name: str = "block"):
    """(the pair's PrimFunc, its ``call_tir``'s arguments, the ``call_tir``: ``pair.fused_pair``),
    the depthwise convolution on the vector units where ``hw``'s MME accumulates in floating
    point, and plain copies inlined (a 1 x 1 convolution's unpadded ``pad_temp`` would be an
    LB-to-LB copy per chunk)."""
    kernel, args, call = fused_pair(*pair, mod, name)
    return _prepared(kernel, hw), args, call


def _prepared(func: tirx.PrimFunc, hw: Hardware) -> tirx.PrimFunc:
    """``func`` with its plain copies into its own buffers (a 1 x 1 convolution's unpadded
    ``pad_temp``, a layout copy's reshape and transpose) inlined into their readers, and the
    contractions before its anchor annotated for the vector units (a floating-point MME)."""
    sch = s_tir.Schedule(func)
    params = list(func.params)
    for block_rv in leaf_blocks(sch):
        block = sch_get(sch, block_rv)
        store = block.body
        if classify(block).kind == "copy" and isinstance(store.value, Load) \
                and not any(store.buffer.same_as(p) for p in params):
            sch.compute_inline(block_rv)
    if hw.mme.accum_dtype.startswith("float"):
        idx, kinds = find_anchor(sch)
        for i, block_rv in enumerate(leaf_blocks(sch)[:idx]):
            if kinds[i].kind == "mme":
                sch_annotate(sch, block_rv, VECTOR_CONTRACTION, 1)
    return sch.mod["main"]


def _cycles(func, hw: Hardware, stitched: bool) -> float:
    """Cycles of ``func`` on the chip as its schedule runs it: ``stitched``, every tensor in the GB
    and tiled as a stitched kernel tiles its layers (``lower_timed``: the fastest of the plans it
    times, a depthwise convolution on the faster unit), else a one-layer kernel as ``lower_kernel``
    tiles it, its inputs in DDR. A round of tiles on a cluster's cores, as ``timed_cycles`` times
    it, times the rounds the chip's cores take (a fused kernel's tiles cover all output channels:
    fewer of them, and the last round may leave cores idle), and a launch (a layer kernel pays
    it; a stitched kernel's layer waits about as long for the one before at a layer change: 4.5k
    cycles on ResNet-50 at batch 8, ``benchmarks/idle.py``). With fewer samples (the output's
    first dim) than clusters the timing keeps the search's tiles: a stitched kernel there splits
    a sample's rows over the clusters and times its layers' plans within a cluster's share of
    them (``stitched._row_shares``), which ``lower_timed``'s tiles for the whole layer do not
    follow. MobileNetV2's depthwise pairs decided on those took it at batch 1 from 243,105
    cycles to 254,209 (when the stitched layers kept the search's tiles too, 315,543 to 357,181)."""
    gb = frozenset(range(len(func.params) - 1)) if stitched else frozenset()
    lowered = lower_kernel(func, hw)[0]
    if stitched and int(func.params[-1].shape[0]) >= hw.clusters:
        lowered = lower_timed(func, hw, None, gb, lowered)
    tiles = math.prod(lp.extent for lp in read_kernel(lowered).tile_loops())
    timed = min(tiles, TIMED_TILES)
    per_round = timed_cycles(lowered, hw, None, gb) * timed / tiles / -(-timed // hw.cores_per_cluster)
    return per_round * -(-tiles // (hw.clusters * hw.cores_per_cluster)) + hw.kernel_launch_cycles


def FuseSeparableBlocks(hw: Hardware, stitched: bool, decided: list | None = None) -> tvm.transform.Pass:  # noqa: N802
    """Pass: every pair of ``main`` (``pairs``) whose fused kernel is faster on ``hw`` (``_cycles``,
    as layers of a stitched kernel where ``stitched``, else as one-layer kernels) becomes one
    ``call_tir`` of it, a consumer with one producer a round until none is left; ``decided``
    hears a ``FusedBlock`` for each pair timed. A pair whose kernels do not lower stays apart."""

    @tvm.transform.module_pass(opt_level=0, name="dsa.FuseSeparableBlocks")
    def fuse_blocks(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        timed, seen = {}, set()
        while True:
            chosen = {}
            for pair in pairs(mod):
                first, consumer = (b.value.args[0].name_hint for b in pair)
                if (pair[0].var, consumer) in seen or pair[1].var in chosen:
                    continue  # decided in an earlier round, or its consumer fuses another this round
                seen.add((pair[0].var, consumer))
                try:
                    fused = fused_function(mod, pair, hw, _name(pair))
                    if (first, consumer) not in timed:  # the same two kernels elsewhere (a transformer's layers)
                        parts = _cycles(mod[first], hw, stitched) + _cycles(mod[consumer], hw, stitched)
                        timed[(first, consumer)] = (_cycles(fused[0], hw, stitched), parts)
                except Exception:  # noqa: BLE001 - TVM's schedule errors too: a pair that does not lower stays apart
                    continue
                block = FusedBlock(first, consumer, *timed[(first, consumer)])
                if decided is not None:
                    decided.append(block)
                if block.fused_cycles < block.parts_cycles:
                    chosen[pair[1].var] = (pair, fused)
            if not chosen:
                return mod
            mod = _rewrite(mod, chosen)

    return fuse_blocks


def _name(pair) -> str:
    """The fused kernel's name: its two kernels'."""
    first, consumer = (b.value.args[0].name_hint for b in pair)
    return f"{first}_{consumer.removeprefix('fused_')}"


def _rewrite(mod: tvm.IRModule, chosen: dict) -> tvm.IRModule:
    """``mod`` with each chosen pair's two bindings in ``main`` one ``call_tir`` of its kernel."""
    builder = relax.BlockBuilder(mod.clone())
    main = mod["main"]
    dropped = {pair[0].var for pair, _ in chosen.values()}
    blocks = []
    for block in main.body.blocks:
        bindings = []
        for b in block.bindings:
            if b.var in chosen:
                pair, (kernel, args, call) = chosen[b.var]
                gv = builder.add_func(kernel, _name(pair))
                b = relax.VarBinding(b.var, relax.Call(CALL_TIR, [gv, *args], call.attrs, call.ty_args))
            if b.var not in dropped:
                bindings.append(b)
        blocks.append(type(block)(bindings))
    builder.update_func(builder.get().get_global_var("main"),
                        relax.Function(main.params, relax.SeqExpr(blocks, main.body.body), main.ret_ty, main.is_pure,
                                       main.attrs, main.span))
    return relax.transform.DeadCodeElimination()(builder.get())
