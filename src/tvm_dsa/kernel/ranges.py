"""Which kernel outputs can leave the storage type's range, and so stay at the accumulator's width.

A chip that stores fp16 (max 65,504) holds activations, weights and normalised values, but not
what mixed-precision compilers keep in fp32: sums of squares, variances, reductions of powers
(magika's LayerNorm sums x * x to about 1.26e5 and the chip computed NaN for every input). A
kernel's output is *wide* where its value grows from a square (a product of a value with itself,
a power of at least 2) or from a wide input, through what keeps or grows magnitude: + - * max min
(so sums), casts, selects and the numerator of a division. A square root, an exponential or a division by the value bring it back (LayerNorm's
``(x - mean) * rsqrt(var + eps)``, softmax's ``exp(x) / sum``): the storage type holds those.
Wide tensors are stored in DDR at the accumulator's width (``Hardware.wide_dtype``) and read into
float32 LB buffers; everything else keeps the storage type.
"""

from __future__ import annotations

import tvm_ffi
from tvm import tirx
from tvm.s_tir import SBlockRealize

from tvm_dsa.kernel.analysis import Call, Load, call_name

WIDE = "dsa.wide"  # PrimFunc attribute: positions of the parameters stored wide
FP16_MAX = 65504.0


def _writers(func: tirx.PrimFunc) -> dict:
    """Buffer -> the leaf blocks that store into it."""
    out: dict = {}

    def visit(realize):
        body = realize.block.body
        if isinstance(body, tirx.BufferStore):
            out.setdefault(body.buffer, []).append(realize.block)

    tvm_ffi.structural_walk(func.body, [(SBlockRealize, visit)])
    return out


def wide_output(func: tirx.PrimFunc, wide_inputs=frozenset(), same: dict | None = None) -> bool:
    """Whether ``func``'s output (its last parameter) is wide, given the positions of its wide
    inputs; ``same`` maps a parameter's position to an earlier one that the call passes the same
    tensor (``multiply(x, x)``: {1: 0}), so that a product of the two is a square."""
    writers = _writers(func)
    params = list(func.params)
    wide = {params[i] for i in wide_inputs}
    alias = {params[i]: params[j] for i, j in (same or {}).items()}
    memo: dict = {}

    def squares(a, b) -> bool:
        if isinstance(a, Load) and isinstance(b, Load):
            return (alias.get(a.source, a.source).same_as(alias.get(b.source, b.source))
                    and tvm_ffi.structural_equal(list(a.indices), list(b.indices)))
        return tvm_ffi.structural_equal(a, b)

    def grows(e) -> bool:
        if isinstance(e, Load):
            buf = e.source
            if buf in wide:
                return True
            if buf not in memo:
                memo[buf] = False  # a reduction reads its own output: no cycle through it
                memo[buf] = any(grows(b.body.value) for b in writers.get(buf, ()))
            return memo[buf]
        if isinstance(e, tirx.Mul) and squares(e.a, e.b):
            return True
        if isinstance(e, Call) and call_name(e) == "pow":
            exponent = e.args[1]
            return not isinstance(exponent, (tirx.FloatImm, tirx.IntImm)) or exponent.value >= 2 or grows(e.args[0])
        if isinstance(e, tirx.Div):
            return grows(e.a)
        if isinstance(e, (tirx.Add, tirx.Sub, tirx.Mul, tirx.Max, tirx.Min, tirx.Cast, tirx.Select)) or (
                isinstance(e, Call) and call_name(e) == "if_then_else"):
            return any(grows(c) for c in _children(e))
        return False  # a constant, an index, or a call that brings the value back (sqrt, exp, ...)

    return any(grows(b.body.value) for b in writers.get(params[-1], ()))


def _children(e) -> list:
    if isinstance(e, (tirx.Add, tirx.Sub, tirx.Mul, tirx.Div, tirx.Max, tirx.Min)):
        return [e.a, e.b]
    if isinstance(e, tirx.Cast):
        return [e.value]
    if isinstance(e, tirx.Select):
        return [e.true_value, e.false_value]
    if isinstance(e, Call):
        return list(e.args)
    return []
