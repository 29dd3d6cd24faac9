"""The DSA program format: the only thing the compiler and the simulator share."""

from tvm_dsa.isa.asm import disassemble
from tvm_dsa.isa.instructions import (
    DTYPES, OP_ARITY, REDUCE_OPS, VEC_OPS, VME_OPS, Dma, Fill, Instruction, Mme, Operand, Reduce, Vector, macs,
    moved, multicast_chains, multicast_groups, operands, replaced, stuck_multicasts, unit_of
)
from tvm_dsa.isa.program import (
    VERSION, Kernel, LayerMark, Program, ProgramError, Replica, TensorArg, expanded_stream
)
from tvm_dsa.isa.validation import validate

__all__ = [
    "DTYPES", "OP_ARITY", "REDUCE_OPS", "VEC_OPS", "VME_OPS",
    "Dma", "Fill", "Instruction", "Mme", "Operand", "Reduce", "Vector", "macs", "moved", "multicast_chains",
    "multicast_groups", "operands", "replaced", "stuck_multicasts", "unit_of",
    "VERSION", "Kernel", "LayerMark", "Program", "ProgramError", "Replica", "TensorArg", "expanded_stream", "validate",
    "disassemble",
]
