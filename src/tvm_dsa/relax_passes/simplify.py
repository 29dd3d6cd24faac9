"""Inference simplification: seed 004's NNVM passes in their Relax form.

SimplifyInference (batch-norm folding into the preceding convolution where it follows one, the
remaining batch norms decomposed into scale and shift), then constant folding, which also performs
the pre-computation of everything that depends only on weights: in numpy where it can
(``FoldWeights``), with TVM's compile-and-run ``FoldConstant`` for the rest (``FoldConstantsLeft``).
"""

from __future__ import annotations

import tvm
from tvm import relax

from tvm_dsa.relax_passes.fold import FoldConstantsLeft, FoldWeights


def FoldBatchNorms() -> tvm.transform.Pass:  # noqa: N802 - TVM pass naming
    """Batch norms folded into the convolutions before them, the others decomposed, and what
    depends only on weights evaluated in numpy (``FoldWeights``): the graph keeps its Relax ops
    (no op is legalized), as pattern matching needs (``byoc.partition``)."""
    return tvm.transform.Sequential(
        [
            relax.transform.FoldBatchnormToConv2D(),
            relax.transform.DecomposeOpsForInference(),
            relax.transform.CanonicalizeBindings(),
            FoldWeights,
        ],
        name="dsa.FoldBatchNorms",
    )


def SimplifyInference() -> tvm.transform.Pass:  # noqa: N802 - TVM pass naming
    return tvm.transform.Sequential([FoldBatchNorms(), FoldConstantsLeft], name="dsa.SimplifyInference")
