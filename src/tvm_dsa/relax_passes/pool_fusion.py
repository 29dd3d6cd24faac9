"""FusePooling: a pooling kernel joins the kernel that computes its input, where the DSA runs the
two as one.

TVM's fusion rules keep a pooling apart from the convolution before it (both are "out-elementwise
fusable"), so the convolution's whole output is written out and read back: cnn's stem writes S
bytes that its max pooling reduces to S/4, and both are live at once — the model's peak. Fused, the
DSA computes the convolution per tile of the pooling (``tile.find_anchor``: the pooling is the
anchor, the convolution's rows the tile's window needs, with their overlap, sit in the LB), and
the S bytes are never allocated. On the host the fused kernel would allocate them inside
(TVM's loops compute the whole intermediate first): no saving, so a pair is merged only where the
merged kernel lowers for the DSA (``offload_symbolic.kernel_text``, at the probe size where dims
are symbolic).

A pair: ``a = call_tir(f, ...)`` and ``p = call_tir(g, (a, ...))`` in one dataflow block of a
function, g a pooling (its anchor a reduction over a window, ``analysis.reads_window``), ``a``
used by nothing else in the function. The merged kernel is what TVM's ``FuseTIR`` makes of a
primitive function of the two calls; its ``call_tir`` takes the place of ``p``.

    mod = FusePooling(hw)(mod)   # after fusion, before the offload (dynamic models)
"""

from __future__ import annotations

import tvm
from tvm import relax, s_tir, tirx

from tvm_dsa.hardware import Hardware
from tvm_dsa.kernelgen.pair import fused_pair
from tvm_dsa.kernel.analysis import Unsupported
from tvm_dsa.kernel.analysis import reads_window, sch_get
from tvm_dsa.tir_passes.tile import find_anchor, leaf_blocks
from tvm_dsa.kernelgen.symbolic import kernel_text

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


def is_pooling(func: tirx.PrimFunc) -> bool:
    """Whether ``func``'s anchor is a reduction over a window (a max pooling; an average pooling's
    anchor is the division after its sum)."""
    sch = s_tir.Schedule(func)
    try:
        idx, kinds = find_anchor(sch)
    except Unsupported:
        return False
    return kinds[idx].kind == "reduce" and reads_window(sch_get(sch, leaf_blocks(sch)[idx]))


def _call_tir(binding) -> bool:
    return isinstance(binding.value, relax.Call) and binding.value.op.same_as(_CALL_TIR)


def _uses(func: relax.Function) -> dict:
    """Variable -> how many bindings (or the result) of ``func`` mention it, If branches included."""
    count: dict = {}

    def note(expr):
        for v in relax.analysis.free_vars(expr):
            count[v] = count.get(v, 0) + 1

    for block in func.body.blocks:
        for b in block.bindings:
            note(b.value)
    note(func.body.body)
    return count


def FusePooling(hw: Hardware) -> tvm.transform.Pass:  # noqa: N802 (a pass, named like TVM's)
    @tvm.transform.module_pass(opt_level=0, name="dsa.FusePooling")
    def fuse_pooling(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        builder = relax.BlockBuilder(mod.clone())
        merged = False
        for gv, func in mod.functions.items():
            if not isinstance(func, relax.Function):
                continue
            uses = _uses(func)
            blocks = []
            for block in func.body.blocks:
                bindings = list(block.bindings)
                if isinstance(block, relax.DataflowBlock):
                    bindings = _merge_pairs(bindings, uses, mod, builder, hw)
                    merged |= len(bindings) < len(block.bindings)
                blocks.append(type(block)(bindings))
            builder.update_func(gv, relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty,
                                                   func.is_pure, func.attrs, func.span))
        return relax.transform.DeadCodeElimination()(builder.get()) if merged else mod

    return fuse_pooling


def _merge_pairs(bindings: list, uses: dict, mod: tvm.IRModule, builder, hw: Hardware) -> list:
    """``bindings`` with each (producer, pooling) pair the DSA runs as one kernel replaced by a
    ``call_tir`` of that kernel (added to ``builder``)."""
    producers = {b.var: k for k, b in enumerate(bindings) if _call_tir(b)}
    out, dropped = list(bindings), set()
    for k, b in enumerate(bindings):
        if not (_call_tir(b) and is_pooling(mod[b.value.args[0]])):
            continue
        fed = [x for x in b.value.args[1].fields if isinstance(x, relax.Var) and x in producers]
        if len(fed) != 1 or uses.get(fed[0]) != 1:
            continue
        producer = bindings[producers[fed[0]]]
        name = f"{producer.value.args[0].name_hint}_{b.value.args[0].name_hint}"
        kernel, args, call = fused_pair(producer, b, mod, name)
        try:
            kernel_text(name, kernel, hw)
        except Unsupported:
            continue
        gv = builder.add_func(kernel, name)
        out[k] = relax.VarBinding(b.var, relax.Call(_CALL_TIR, [gv, *args], call.attrs, call.ty_args))
        dropped.add(producers[fed[0]])
    return [b for k, b in enumerate(out) if k not in dropped]
