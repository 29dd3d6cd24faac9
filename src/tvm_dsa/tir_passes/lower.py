"""LowerToDSA: mark each stage (the loop nest under the tile/chunk loops) as one DSA operation.

A stage must be a perfect loop nest over one block; the block gets ``dsa.op`` = ``dma`` (copy,
padding, concatenation, constants), ``mme``, ``vector`` or ``reduce``; a contraction annotated
``dsa.vector_contraction`` is a ``reduce`` (a sum of products on the vector units). Compute stages must touch only
LB buffers (``AssignScopes`` guarantees it). The block keeps its body, so the lowered TIR still
builds and runs on llvm: each pass can be checked numerically against the original kernel.
"""

from __future__ import annotations

from tvm import s_tir

from tvm_dsa.kernel.analysis import StageKind, Unsupported, classify, sch_annotate, sch_get, sch_loops
from tvm_dsa.kernel.attrs import LB_SCOPE
from tvm_dsa.tir_passes.scopes import attach_index
from tvm_dsa.kernel.attrs import VECTOR_CONTRACTION
from tvm_dsa.tir_passes.tile import leaf_blocks

OP_OF_KIND = {"copy": "dma", "mme": "mme", "vector": "vector", "reduce": "reduce"}


def lower_to_dsa(sch: s_tir.Schedule) -> s_tir.Schedule:
    for block_rv in leaf_blocks(sch):
        block = sch_get(sch, block_rv)
        kind = classify(block)
        if kind.kind == "mme" and int(block.annotations.get(VECTOR_CONTRACTION, 0)):
            kind = StageKind("reduce", "sum")
        loops = sch_loops(sch, block_rv)
        at = attach_index(sch, block_rv)
        for lp in loops[at + 1:]:
            if "dsa.loop" in sch_get(sch, lp).annotations:
                raise Unsupported(f"stage {block.name_hint}: tile loop inside a stage")
        if kind.kind != "copy":
            touched = [r.source for r in block.reads] + [w.source for w in block.writes]
            far = [b.name for b in touched if b.scope() != LB_SCOPE]
            if far:
                raise Unsupported(f"stage {block.name_hint}: compute reads/writes {far} outside the LB")
        sch_annotate(sch, block_rv, "dsa.op", OP_OF_KIND[kind.kind])
        if kind.reduce_op:
            sch_annotate(sch, block_rv, "dsa.reduce", kind.reduce_op)
    return sch
