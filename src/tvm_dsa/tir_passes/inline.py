"""Intermediates a fused kernel computes for itself, inlined into their readers.

InlineMasks: ``Where(Greater(x, t), x, y)`` fuses into one PrimFunc whose first block writes a
bool intermediate, the mask, and whose second selects by it. The DSA has no bool storage, but the
vector core compares and selects (``isa.VEC_OPS``): inlined, the mask is the select's condition
and the kernel one vector stage. Masks that leave the kernel (a parameter) stay.

InlineProducts: a product that only a sum reads (a batch norm's ``x * scale + shift``, after
``relax_passes.simplify.FoldAffineChains``) is inlined into it: the stage is then ``a * b + c``,
one multiply-accumulate pass of the VME (``mac``) instead of a multiply and an add, with no
intermediate in the LB.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir import SBlockRealize

from tvm_dsa.kernel.analysis import sch_children, sch_get, sch_get_sblock, strip_cast


def _inlined(func: tirx.PrimFunc, wanted) -> tirx.PrimFunc:
    """``func`` with each block ``wanted(sch, block, its store)`` picks inlined into its readers
    (where TVM can inline it: a spatial block, one store; a parameter stays)."""
    sch = s_tir.Schedule(func)
    for block in sch_children(sch, sch_get_sblock(sch, "root")):
        store = sch_get(sch, block).body
        if isinstance(store, tirx.BufferStore) and wanted(sch, block, store):
            try:
                sch.compute_inline(block)
            except s_tir.ScheduleError:
                pass  # a parameter, or one TVM cannot inline: it stays
    return sch.mod["main"]


def inline_masks(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every block that writes a bool intermediate inlined into its readers."""
    if not isinstance(func.body, SBlockRealize) or not any(
            str(b.dtype) == "bool" for b in func.body.block.alloc_buffers):
        return func
    return _inlined(func, lambda sch, block, store: str(store.buffer.dtype) == "bool")


def _product_into_a_sum(sch, block, store) -> bool:
    if not isinstance(strip_cast(store.value), tirx.Mul):
        return False
    readers = sch.get_consumers(block)
    if len(readers) != 1:
        return False
    reader = sch_get(sch, readers[0])
    after = reader.body
    return isinstance(after, tirx.BufferStore) and isinstance(strip_cast(after.value), tirx.Add) and \
        all(v.iter_type == tirx.IterVar.DataPar for v in reader.iter_vars)  # a sum of terms, not a reduction


def inline_products(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every product that a sum alone reads inlined into it."""
    if not isinstance(func.body, SBlockRealize) or not func.body.block.alloc_buffers:
        return func
    return _inlined(func, _product_into_a_sum)


InlineMasks = tirx.transform.prim_func_pass(  # noqa: N816 - TVM pass naming
    lambda func, _mod, _ctx: inline_masks(func), opt_level=0, name="dsa.InlineMasks")
InlineProducts = tirx.transform.prim_func_pass(  # noqa: N816 - TVM pass naming
    lambda func, _mod, _ctx: inline_products(func), opt_level=0, name="dsa.InlineProducts")
