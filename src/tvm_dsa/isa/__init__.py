"""The DSA program format: the only thing the compiler and the simulator share."""

from .asm import disassemble
from .instructions import (
    DTYPES, OP_ARITY, REDUCE_OPS, VEC_OPS, VME_OPS,
    Dma, Fill, Instruction, Mme, Operand, Reduce, Vector, macs, moved, operands, replaced, unit_of,
)
from .program import VERSION, Kernel, LayerMark, Program, ProgramError, Replica, TensorArg
from .validate import validate

__all__ = [
    "DTYPES", "OP_ARITY", "REDUCE_OPS", "VEC_OPS", "VME_OPS",
    "Dma", "Fill", "Instruction", "Mme", "Operand", "Reduce", "Vector", "macs", "moved", "operands", "replaced",
    "unit_of",
    "VERSION", "Kernel", "LayerMark", "Program", "ProgramError", "Replica", "TensorArg", "validate", "disassemble",
]
