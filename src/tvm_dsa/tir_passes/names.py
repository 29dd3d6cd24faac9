"""UniqueBufferNames: every buffer of a PrimFunc under a name of its own.

Kernel generation keys a kernel's buffers by name (a program's argument regions, LB buffers,
accesses), but TIR does not require names to be unique: ``LegalizeOps`` turns ``multiply(x, x)``
into a PrimFunc whose two parameters are both called ``x``, and ``FuseOps`` reuses that PrimFunc
for ``multiply(a, b)``, whose two inputs then meet in one region (the DSA computed ``b * b``).
TVMScript's printer names each buffer uniquely (``x``, ``x_1``), so a PrimFunc with a repeated
name is re-parsed from its script; names are not part of structural equality, so tuning records
still match it.
"""

from __future__ import annotations

import tvm
from tvm import tirx
from tvm.s_tir import SBlockRealize


def buffer_names(func: tirx.PrimFunc) -> list[str]:
    """The names of ``func``'s parameters and of the buffers its root block allocates."""
    names = [str(p.name) for p in func.params]
    if isinstance(func.body, SBlockRealize):
        names += [str(b.name) for b in func.body.block.alloc_buffers]
    return names


def unique_buffer_names(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func``, re-parsed from its script where two of its buffers share a name."""
    names = buffer_names(func)
    if len(set(names)) == len(names):
        return func
    return tvm.script.from_source(func.script())


UniqueBufferNames = tirx.transform.prim_func_pass(  # noqa: N816 - TVM pass naming
    lambda func, _mod, _ctx: unique_buffer_names(func), opt_level=0, name="dsa.UniqueBufferNames")
