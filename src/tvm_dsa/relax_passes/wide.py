"""KeepWide: tensors whose values can leave the chip's storage type are stored at its accumulator's width.

Each ``call_tir`` of ``main`` (and of the functions it branches into), in order: its output is wide
where ``kernel.ranges.wide_output`` says so given which of its inputs are wide (a view or an
alias of a wide tensor is wide; so are constants with values beyond fp16). Such a call gets a copy of its PrimFunc (``NAME_wide``, one per set of
positions) with the positions of its wide parameters as the ``dsa.wide`` attribute, which kernel
generation reads. Calls that pass one tensor twice (``multiply(x, x)``) are read
with those parameters as one buffer, so the square shows.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from tvm_dsa.kernel.ranges import FP16_MAX, WIDE, wide_output
from tvm_dsa.relax_passes.fold import constant_value
from tvm_dsa.relax_passes.rewrite import with_copies

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


def _bindings(expr):
    """The bindings of a Relax function body, those inside If branches too, in order."""
    if isinstance(expr, relax.SeqExpr):
        for block in expr.blocks:
            for b in block.bindings:
                yield b
                if isinstance(b.value, relax.If):
                    yield from _bindings(b.value.true_branch)
                    yield from _bindings(b.value.false_branch)


def _beyond_fp16(arg) -> bool:
    """A constant (weights) with values fp16 cannot hold."""
    values = constant_value(arg)
    if values is None or values.dtype.kind != "f":
        return False
    return bool(np.abs(values[np.isfinite(values)], dtype=np.float64).max(initial=0) > FP16_MAX)


def _positions(mod: tvm.IRModule) -> dict:
    """``call_tir`` call -> the positions of its PrimFunc's wide parameters (calls with any)."""
    wide: set = set()  # wide Relax variables
    out: dict = {}
    decided: dict = {}  # (PrimFunc, wide inputs, same) -> wide output: a model's repeated blocks ask alike
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        for b in _bindings(func.body):
            value = b.value
            if isinstance(value, relax.Var) and value in wide:
                wide.add(b.var)
            if not (isinstance(value, relax.Call) and value.op.same_as(_CALL_TIR)):
                continue
            args = list(value.args[1].fields) if isinstance(value.args[1], relax.Tuple) else [value.args[1]]
            prim = mod[value.args[0]]
            if not isinstance(b.var.ty, relax.TensorType) or len(prim.params) != len(args) + 1:
                continue  # several outputs, or scalar parameters: kept at the storage type
            inputs = frozenset(i for i, a in enumerate(args) if a in wide or _beyond_fp16(a))
            first = {}
            same = {i: first.setdefault(a, i) for i, a in enumerate(args) if isinstance(a, relax.Var)}
            same = tuple((i, j) for i, j in same.items() if i != j)
            key = (value.args[0].name_hint, inputs, same)
            if key not in decided:
                decided[key] = wide_output(prim, inputs, dict(same))
            if decided[key]:
                wide.add(b.var)
                out[value] = (*sorted(inputs), len(args))
            elif inputs:
                out[value] = tuple(sorted(inputs))
    return out


@tvm.transform.module_pass(opt_level=0, name="dsa.KeepWide")
def KeepWide(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 (a pass, named like TVM's)
    positions = _positions(mod)
    return with_copies(mod, {call: (WIDE, [int(i) for i in wide]) for call, wide in positions.items()}, "wide")
