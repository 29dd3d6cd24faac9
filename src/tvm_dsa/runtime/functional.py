"""Numerics of the instructions on explicit, byte-addressed memories (isa/instructions.py semantics).

DDR, one GB per cluster and one LB per core are ``uint8`` arrays; an operand is a strided numpy view
of its memory, so transposes, broadcasts and overlapping convolution windows cost no copies.
Sources are computed in float32 (the MME accumulates in float32, or exactly in int64 for an int32
accumulator) and results are rounded to the destination dtype when written through the view.
"""

from __future__ import annotations

import math
import string

import numpy as np

from tvm_dsa.hardware.model import Hardware
from tvm_dsa.isa.instructions import Dma, Fill, Instruction, Mme, Operand, Reduce, Vector


def erf(x: np.ndarray) -> np.ndarray:
    """Error function without scipy, absolute error below 1e-7: the Maclaurin series for
    |x| < 0.5, else 1 - erfc with the Chebyshev fit of Numerical Recipes (relative error 1.2e-7)."""
    x = np.asarray(x, dtype=np.float64)
    z = np.abs(x)
    z2 = z * z
    series = 0.0
    for n in range(9, -1, -1):  # sum (-1)^n z^(2n) / (n! (2n+1))
        series = series * z2 + (-1) ** n / (math.factorial(n) * (2 * n + 1))
    small = 2 / math.sqrt(math.pi) * z * series
    t = 1 / (1 + 0.5 * z)
    poly = 0.17087277
    for c in (-0.82215223, 1.48851587, -1.13520398, 0.27886807, -0.18628806, 0.09678418,
              0.37409196, 1.00002368, -1.26551223):
        poly = c + t * poly
    large = 1 - t * np.exp(-z2 + poly)
    return np.sign(x) * np.where(z < 0.5, small, large)


def _compare(f):
    return lambda a, b: f(a, b).astype(np.float32)


VECTOR_OPS = {
    "copy": lambda x: x,
    "neg": np.negative,
    "abs": np.abs,
    "relu": lambda x: np.maximum(x, np.float32(0)),
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: np.float32(1) / np.sqrt(x),
    "tanh": np.tanh,
    "sigmoid": lambda x: np.float32(1) / (np.float32(1) + np.exp(-x)),
    "erf": erf,
    "floor": np.floor,
    "ceil": np.ceil,
    "round": np.rint,  # half to even, as ONNX Round and TVM's nearbyint lowering
    "sin": np.sin,
    "cos": np.cos,
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "max": np.maximum,
    "min": np.minimum,
    "pow": np.power,
    "eq": _compare(np.equal),
    "ne": _compare(np.not_equal),
    "lt": _compare(np.less),
    "le": _compare(np.less_equal),
    "gt": _compare(np.greater),
    "ge": _compare(np.greater_equal),
    "select": lambda c, a, b: np.where(c != 0, a, b),
    "mac": lambda a, b, c: a * b + c,
    "clip": lambda a, lo, hi: np.minimum(np.maximum(a, lo), hi),
}
REDUCE_UFUNCS = {"sum": np.add, "max": np.maximum, "min": np.minimum}
_NP_DTYPES = {name: np.dtype(name) for name in ("float16", "float32", "int8", "int32")}


class Machine:
    """The memories of one chip and the execution of instructions on them."""

    def __init__(self, hw: Hardware, ddr_bytes: int):
        self.hw = hw
        self.ddr = np.zeros(ddr_bytes, dtype=np.uint8)
        self.gb: dict[int, np.ndarray] = {}
        self.lb: dict[int, np.ndarray] = {}
        # (position in the last ``run_all``, largest |value|) of the first instruction whose finite
        # float32 result did not fit its destination's type and became inf (fp16 overflows at 65,504)
        self.overflow: tuple[int, float] | None = None

    def memory(self, mem: str, index: int) -> np.ndarray:
        if mem == "ddr":
            return self.ddr
        bank, size = (self.gb, self.hw.gb_bytes) if mem == "gb" else (self.lb, self.hw.lb_bytes)
        if index not in bank:
            bank[index] = np.zeros(size, dtype=np.uint8)
        return bank[index]

    def view(self, o: Operand, shape: tuple[int, ...], dims=None) -> np.ndarray:
        """Strided view of ``o`` over the box ``shape`` (restricted to ``dims`` when given)."""
        dtype = _NP_DTYPES.get(o.dtype) or np.dtype(o.dtype)
        item = dtype.itemsize
        if dims is None:
            return np.ndarray(shape, dtype, self.memory(o.mem, o.index), o.offset,
                              tuple([s * item for s in o.strides]))
        return np.ndarray(tuple([shape[d] for d in dims]), dtype, self.memory(o.mem, o.index),
                          o.offset, tuple([o.strides[d] * item for d in dims]))

    def run(self, ins: Instruction) -> None:
        with np.errstate(all="ignore"):
            self._run(ins)

    def run_all(self, instructions) -> None:
        """Run ``instructions`` one after the other, noting the first that overflowed (``overflow``)."""
        run = self._run
        self.overflow = None
        with np.errstate(all="ignore"):
            for position, ins in enumerate(instructions):
                largest = run(ins)
                if largest is not None and self.overflow is None:
                    self.overflow = (position, largest)

    def _run(self, ins: Instruction) -> float | None:
        """Apply ``ins``; the largest |value| of a result that overflowed its destination, else None."""
        kind = type(ins)
        if kind is Dma:
            self.view(ins.dst, ins.shape)[...] = self.view(ins.src, ins.shape)
        elif kind is Fill:
            self.view(ins.dst, ins.shape)[...] = ins.value
        elif kind is Mme:
            self._mme(ins)
        elif kind is Vector:
            srcs = [self.view(s, ins.shape).astype(np.float32) if isinstance(s, Operand) else np.float32(s)
                    for s in ins.srcs]
            return _store(self.view(ins.dst, ins.shape), VECTOR_OPS[ins.op](*srcs))
        else:
            return self._reduce(ins)
        return None

    def _mme(self, ins: Mme) -> None:
        """Contract ``a`` and ``b`` with einsum over their non-broadcast dims (one letter per box dim)."""
        acc = np.float32 if ins.dst.dtype.startswith("float") else np.int64
        terms = []
        for o in (ins.a, ins.b):
            dims = [d for d, (n, s) in enumerate(zip(ins.shape, o.strides)) if n > 1 and s]
            terms.append((dims, self.view(o, ins.shape, dims).astype(acc)))
        present = set(terms[0][0]) | set(terms[1][0])
        out = [d for d, r in enumerate(ins.reduce) if not r]
        letters = string.ascii_letters
        spec = ",".join("".join(letters[d] for d in dims) for dims, _ in terms)
        spec += "->" + "".join(letters[d] for d in out if d in present)
        result = np.einsum(spec, terms[0][1], terms[1][1], optimize=True)
        # reduce dims where both operands broadcast add up equal products
        factor = math.prod(n for d, (n, r) in enumerate(zip(ins.shape, ins.reduce)) if r and d not in present)
        if factor != 1:
            result = result * factor
        result = result.reshape([ins.shape[d] if d in present else 1 for d in out])
        dst = self.view(ins.dst, ins.shape, out)
        dst[...] = dst.astype(acc) + result if ins.accumulate else result

    def _reduce(self, ins: Reduce) -> float | None:
        ufunc = REDUCE_UFUNCS[ins.op]
        axes = tuple(d for d, r in enumerate(ins.reduce) if r)
        result = ufunc.reduce(self.view(ins.src, ins.shape).astype(np.float32), axis=axes)
        dst = self.view(ins.dst, ins.shape, [d for d, r in enumerate(ins.reduce) if not r])
        return _store(dst, ufunc(dst.astype(np.float32), result) if ins.accumulate else result)


def _store(dst: np.ndarray, values) -> float | None:
    """Write float32 results into ``dst``: floats round to nearest even on the cast, integers are
    rounded half to even and saturated to their type's range (requantisation). Returns the largest
    |value| where a finite value became inf in a narrower float type, else None."""
    values = np.asarray(values, dtype=np.float32)
    if np.issubdtype(dst.dtype, np.integer):
        info = np.iinfo(dst.dtype)  # clip in float64: float32 cannot hold int32's bounds exactly
        values = np.clip(np.rint(values.astype(np.float64)), info.min, info.max).astype(dst.dtype)
    dst[...] = values
    if dst.dtype == np.float16 and np.isinf(dst).any():
        values = np.broadcast_to(values, dst.shape)
        lost = np.isinf(dst) & np.isfinite(values)
        if lost.any():
            return float(np.abs(values[lost]).max())
    return None
