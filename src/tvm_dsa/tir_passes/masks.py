"""InlineMasks: a boolean tensor a fused kernel computes for itself is inlined into its readers.

``Where(Greater(x, t), x, y)`` fuses into one PrimFunc whose first block writes a bool
intermediate, the mask, and whose second selects by it. The DSA has no bool storage, but the
vector core compares and selects (``isa.VEC_OPS``): inlined, the mask is the select's
condition and the kernel one vector stage. Masks that leave the kernel (a parameter) stay.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir import SBlockRealize

from tvm_dsa.kernel.analysis import sch_children, sch_get, sch_get_sblock


def inline_masks(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every block that writes a bool intermediate inlined into its readers (where
    TVM can inline it: a spatial block, one store)."""
    if not isinstance(func.body, SBlockRealize) or not any(
            str(b.dtype) == "bool" for b in func.body.block.alloc_buffers):
        return func
    sch = s_tir.Schedule(func)
    for block in sch_children(sch, sch_get_sblock(sch, "root")):
        store = sch_get(sch, block).body
        if isinstance(store, tirx.BufferStore) and str(store.buffer.dtype) == "bool":
            try:
                sch.compute_inline(block)
            except s_tir.ScheduleError:
                pass  # a parameter, or a mask TVM cannot inline: it stays, and the kernel on the host
    return sch.mod["main"]


InlineMasks = tirx.transform.prim_func_pass(  # noqa: N816 - TVM pass naming
    lambda func, _mod, _ctx: inline_masks(func), opt_level=0, name="dsa.InlineMasks")
