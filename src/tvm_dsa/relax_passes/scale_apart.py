"""ScaleApart: a per-channel vector computed from a run-time scalar is a kernel of its own.

onnxruntime's dynamic quantization rescales a MatMulInteger's int32 product by ``x_scale *
w_scale``: a run-time scalar (DynamicQuantizeLinear's scale) times the per-channel weight scales, a
vector of the output's last dimension. ``FuseOps`` fuses that multiply into the matmul's kernel,
where it is a stage over the channels alone inside the epilogue of a contraction over rows and
channels: no tiling of such a kernel emits ("stage T_multiply1: access to
matmul_intermediate_local.dsa_lb leaves its region", on every chip, float models too). With the
multiply opaque, ``FuseOps`` leaves it a kernel of its own (one element a channel; on an int8
chip a float kernel, on the host) and the matmul's kernel reads the vector: on the DSA.

    mod = ScaleApart(mod)   # after AnnotateTIROpPattern, before FuseOps
"""

from __future__ import annotations

import tvm
from tvm import relax

from tvm_dsa.relax_passes.concat import INJECTIVE, OPAQUE
from tvm_dsa.relax_passes.rewrite import with_copies

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


def _ndim(expr) -> int | None:
    return getattr(expr.ty, "ndim", None)


@tvm.transform.module_pass(opt_level=0, name="dsa.ScaleApart")
def ScaleApart(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 (a pass, named like TVM's)
    main = mod["main"]
    bindings = [b for block in main.body.blocks for b in block.bindings]
    readers: dict = {}
    for b in bindings:
        if isinstance(b.value, relax.Call) and b.value.op.same_as(_CALL_TIR):
            for a in b.value.args[1].fields:
                readers.setdefault(a, []).append(b.var)
    apart = {}
    for b in bindings:
        value = b.value
        if not (isinstance(value, relax.Call) and value.op.same_as(_CALL_TIR) and _ndim(b.var) == 1):
            continue
        func = mod[value.args[0]]
        if func.attrs is None or int(func.attrs.get("op_pattern", OPAQUE)) > INJECTIVE:
            continue
        scalar = any(isinstance(a, relax.Var) and _ndim(a) == 0 for a in value.args[1].fields)
        if scalar and any((_ndim(r) or 0) > 1 for r in readers.get(b.var, [])):
            apart[value] = ("op_pattern", OPAQUE)
    return with_copies(mod, apart, "apart")
