"""``partition_for_dsa``: the BYOC partitioning as the ``dsa`` pipeline sees a model, the way
``partition_for_cutlass`` is for cutlass."""

from __future__ import annotations

import tvm
from tvm import relax

from tvm_dsa.byoc.patterns import patterns
from tvm_dsa.relax_passes.simplify import FoldBatchNorms


def partition_for_dsa(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with its batch norms folded as the ``dsa`` pipeline does first (into the
    convolutions before them; weights pre-computed in numpy; no op legalized, so that patterns
    match) and dead bindings gone (an imported batch norm's unused mean and variance would keep
    its convolution's group apart), then its groups
    the DSA runs made functions for the ``dsa`` codegen (``FuseOpsByPattern`` with the ``dsa.``
    patterns, ``annotate_codegen``). ``relax.transform.RunCodegen()`` then compiles them."""
    mod = relax.transform.DeadCodeElimination()(FoldBatchNorms()(mod))
    return relax.transform.FuseOpsByPattern(patterns(), annotate_codegen=True)(mod)
