"""Relation-centric modelling of the MME's dataflow (TENET, seed 003; docs/tenet.md).

    op = TensorOp.parse("GEMM", "Y[i,j] += A[i,k] * B[k,j]", {"i": 2, "j": 2, "k": 4})
    df = Dataflow.parse(op, "PE[i, j] | T[i + j + k]")
    print(analyse(df, PEArray((2, 2), systolic_2d(), bandwidth=4)))
"""

from tvm_dsa.dataflow.expr import NotationError
from tvm_dsa.dataflow.metrics import DataflowMetrics, TensorVolumes, analyse
from tvm_dsa.dataflow.notation import (
    Access, Dataflow, Interconnect, PEArray, TensorOp, mesh, multicast, systolic_1d, systolic_2d
)

__all__ = [
    "NotationError", "DataflowMetrics", "TensorVolumes", "analyse", "Access", "Dataflow", "Interconnect",
    "PEArray", "TensorOp", "mesh", "multicast", "systolic_1d", "systolic_2d",
]
