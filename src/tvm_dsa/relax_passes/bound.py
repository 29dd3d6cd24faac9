"""The DDR half of a model's roofline: the bytes any schedule must move, its inputs, weights and
outputs through DDR once in the chip's storage type (the other half, its MACs at the peak rate,
is counted per kernel by ``OffloadToDSA``). A report's roofline is this bound, not the sum of its
kernels' arguments, which would count every intermediate a schedule spills as compulsory. A
dynamic model's inputs and outputs are counted when it runs (``MarkRunStart(io=True)``); its
weights, here."""

from __future__ import annotations

import math

import tvm
import tvm_ffi
from tvm import relax

from tvm_dsa.hardware import Hardware


def model_ddr_bytes(mod: tvm.IRModule, hw: Hardware) -> int | None:
    """Bytes of ``main``'s tensor inputs, the constants it uses (each once) and its outputs, at
    ``hw.storage_bytes`` an element; None where a shape is not static (the bound of a dynamic
    model depends on the run)."""
    func = mod["main"]
    elements = [_elements(p.ty) for p in func.params] + [_elements(func.ret_ty)]
    if any(n is None for n in elements):
        return None
    return sum(elements) * hw.storage_bytes + constant_bytes(mod, hw)


def constant_bytes(mod: tvm.IRModule, hw: Hardware) -> int:
    """Bytes of the constants ``main`` uses (its weights), each once, at ``hw.storage_bytes`` an element."""
    constants: set = set()

    def visit(c) -> None:
        if isinstance(c.value, tvm.runtime.Tensor):
            constants.add(c.value)

    tvm_ffi.structural_walk(mod["main"].body, [(tvm.ir.expr.Constant, visit)])
    return sum(math.prod(value.shape) for value in constants) * hw.storage_bytes


def _elements(ty) -> int | None:
    """Elements of the tensors of type ``ty`` (tuples flattened); None for a symbolic shape."""
    if isinstance(ty, relax.TupleType):
        parts = [_elements(f) for f in ty.fields]
        return None if any(p is None for p in parts) else sum(parts)
    if isinstance(ty, relax.TensorType):
        if not isinstance(ty.shape, relax.ShapeExpr):
            return None
        dims = [d.value if isinstance(d, tvm.tirx.IntImm) else None for d in ty.shape.values]
        return None if None in dims else math.prod(dims)
    return 0  # shapes, scalars known at compile time, objects: no tensor data
