"""Names of the packed functions a model compiled for the DSA calls: the interface between the
compiled module and ``tvm_dsa.execution``, which implements them (``tvm_dsa.plugin`` registers
them at ``import tvm``)."""

BEGIN_RUN = "tvm_dsa.begin_run"  # a run of main starts (MarkRunStart)
END_RUN = "tvm_dsa.end_run"  # a run of a dynamic model's main ends: its outputs (MarkRunStart)
EXECUTE = "tvm_dsa.execute"  # one DSA kernel call: its program, its info, its tensors
EXECUTE_SHAPED = "tvm_dsa.execute_shaped"  # the same for a kernel with symbolic dims, built per shape
ARENA_PLAN = "tvm_dsa.arena_plan"  # plans a symbolic arena at run time (PlanArena)
BYOC_EXECUTE = "tvm_dsa.byoc_execute"  # one function RunCodegen offloaded: its composite's id, its tensors
CODEGEN = "relax.ext.dsa"  # the BYOC codegen RunCodegen calls for functions marked "dsa"
