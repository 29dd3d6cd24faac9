"""Inference simplification: seed 004's NNVM passes in their Relax form.

SimplifyInference (batch-norm folding into the preceding convolution where it follows one, the
remaining batch norms decomposed into scale and shift), then constant folding, which also performs
the pre-computation of everything that depends only on weights.
"""

from __future__ import annotations

import tvm
from tvm import relax


def SimplifyInference() -> tvm.transform.Pass:  # noqa: N802 - TVM pass naming
    return tvm.transform.Sequential(
        [
            relax.transform.FoldBatchnormToConv2D(),
            relax.transform.DecomposeOpsForInference(),
            relax.transform.CanonicalizeBindings(),
            relax.transform.FoldConstant(),
        ],
        name="dsa.SimplifyInference",
    )
