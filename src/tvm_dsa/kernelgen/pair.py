"""Two ``call_tir`` bindings, the second reading the first's result, as one PrimFunc: what TVM's
``FuseTIR`` makes of a primitive function of the two calls (a pooling joined to the convolution
before it, ``relax_passes.pool_fusion``; a pointwise convolution to the depthwise one before it,
``kernelgen.blocks``)."""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax, tirx

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


def _primitive(producer: relax.VarBinding, consumer: relax.VarBinding) -> tuple[relax.Function, list]:
    """A primitive function of the two calls (its parameters the tensors they read, the producer's
    result a local) and the arguments to call it with."""
    params, args = [], []

    def param(arg):
        if not isinstance(arg, (relax.Var, tvm.ir.expr.Constant)):
            return arg  # a symbol (PrimValue) stays in the call; the tensors' shapes define it
        v = relax.Var(f"p{len(params)}", arg.ty)
        params.append(v)
        args.append(arg)
        return v

    a, p = producer.value, consumer.value
    local = relax.Var(producer.var.name, producer.var.ty)
    out = relax.Var(consumer.var.name, consumer.var.ty)
    first = relax.Call(_CALL_TIR, [a.args[0], relax.Tuple([param(x) for x in a.args[1].fields])], a.attrs, a.ty_args)
    second = relax.Call(_CALL_TIR, [p.args[0], relax.Tuple([local if x.same_as(producer.var) else param(x)
                                                             for x in p.args[1].fields])], p.attrs, p.ty_args)
    body = relax.SeqExpr([relax.DataflowBlock([relax.VarBinding(local, first), relax.VarBinding(out, second)])], out)
    return relax.Function(params, body, consumer.var.ty, True).with_attr("Primitive", True), args


def fused_pair(producer: relax.VarBinding, consumer: relax.VarBinding, mod: tvm.IRModule, name: str):
    """(the PrimFunc FuseTIR makes of the pair, its ``call_tir``'s arguments, the ``call_tir``):
    ``consumer`` reads ``producer``'s result, which becomes a buffer of the kernel."""
    prim, args = _primitive(producer, consumer)
    kernels = {gv: mod[gv] for gv in (producer.value.args[0], consumer.value.args[0])}
    builder = relax.BlockBuilder(tvm.IRModule(kernels))
    gv = builder.add_func(prim, name)
    params = [relax.Var(f"a{k}", a.ty) for k, a in enumerate(args)]
    with builder.function("main", params):
        with builder.dataflow():
            out = builder.emit_output(relax.Call(gv, params))
        builder.emit_func_output(out)
    fused = relax.transform.FuseTIR()(builder.get())
    call = fused["main"].body.blocks[0].bindings[0].value
    actual = dict(zip(params, args))
    fields = [actual.get(x, x) if isinstance(x, relax.Var) else x for x in call.args[1].fields]
    return _unique_names(fused[call.args[0]]), (relax.Tuple(fields), *call.args[2:]), call


def _unique_names(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with an intermediate buffer renamed where its name is taken (FuseTIR keeps each
    kernel's names: a convolution's ``pad_temp`` and a pooling's; the codegen knows buffers by
    name)."""
    taken = {str(p.name) for p in func.params}
    renamed = {}
    for buf in func.body.block.alloc_buffers:
        name, n = str(buf.name), 1
        while name in taken:
            name, n = f"{buf.name}_{n}", n + 1
        taken.add(name)
        if name != buf.name:
            renamed[buf] = tvm.ir.Var(name, buf.ty)
    return tvm_ffi.structural_map(func, [(tvm.ir.Var, lambda v: renamed.get(v, v))]) if renamed else func
