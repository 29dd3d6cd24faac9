"""A module's layers lowered for the DSA, the context every kernel generator starts from.

``OffloadToDSA`` lowers each PrimFunc ``main`` calls as the scheduler's ``Lowering`` asks
(``lower_layer``), and keeps what it made in a ``Lowered``; the generators read it, with the
module, its layer graph, the chip and the pipeline's options, and record what they decide in its
``result``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import tvm

from tvm_dsa.hardware import Hardware
from tvm_dsa.kernel.analysis import Unsupported
from tvm_dsa.kernel.attrs import COPY_EACH
from tvm_dsa.kernel.ir import CodegenError
from tvm_dsa.kernelgen.layer import layer_program
from tvm_dsa.schedule.graph import OpGraph
from tvm_dsa.schedule.plan import KernelSpec
from tvm_dsa.tiling import lower_kernel
from tvm_dsa.tir_passes.scopes import read_twice


@dataclass
class Lowered:
    """What kernel generators read besides their plan. ``result`` is the ``OffloadResult`` they
    record in; ``options`` the pipeline's (``StitchOptions`` for stitched kernels)."""

    mod: tvm.IRModule
    graph: OpGraph
    hw: Hardware
    options: object
    result: object
    funcs: dict = field(default_factory=dict)  # PrimFunc name -> as lowered (with ``COPY_EACH`` where it takes one)
    lowered: dict = field(default_factory=dict)  # PrimFunc name -> (lowered, LB budget tiled to; None: the whole LB)
    built: dict = field(default_factory=dict)  # PrimFunc name -> its one-layer program where lowering built it
    parted: dict = field(default_factory=dict)  # SET: (PrimFunc name, partition, invocations, cores) -> as lowered
    on_vector: frozenset = frozenset()  # PrimFuncs whose contraction runs on the vector units, not the MME

    def nodes(self, spec: KernelSpec) -> list:
        """The layer graph's nodes of ``spec``'s calls, in its order."""
        return [self._node_of[c] for c in spec.calls]

    @functools.cached_property
    def _node_of(self) -> dict:
        return {n.name: n for n in self.graph.nodes}


def lower_layer(func, hw, lb_bytes, name: str, *, clamp: bool) -> tuple:
    """(the PrimFunc as lowered, ``lower_within`` of it, its one-layer program ``name`` where that
    was built to decide, else None): ``func``, or ``func`` with an LB copy of each DDR input per
    stage (``COPY_EACH``) where two stages read one input and the copy they would share holds only
    the box the first reads (a residual over the conv that reads it, a concat of two functions of
    one tensor): ``func`` does not lower, or its one-layer program does not emit."""
    each = func.with_attr(COPY_EACH, True)
    try:
        low = lower_within(func, hw, lb_bytes, clamp=clamp)
    except Unsupported as err:
        try:
            return each, lower_within(each, hw, lb_bytes, clamp=clamp), None
        except Unsupported:
            raise err from None
    if read_twice(func):
        try:
            return func, low, layer_program(low[0], hw, name)
        except CodegenError:
            return each, lower_within(each, hw, lb_bytes, clamp=clamp), None
    return func, low, None


def lower_within(func, hw, lb_bytes, vector: bool = False, *, clamp: bool, caps: tuple[int, ...] = ()):
    """(lowered PrimFunc, LB budget it was tiled to): within ``lb_bytes`` where it fits (graphturbo
    leaves the rest of the LB to stitched intermediates), else within the whole LB; the
    contraction on the unit ``vector`` says, tiles overlapping where ``clamp`` lets them, the
    leading loops' at most ``caps`` (``lower_kernel``)."""
    if lb_bytes is not None:
        try:
            return lower_kernel(func, hw, lb_bytes, vector=vector, clamp=clamp, caps=caps)[0], lb_bytes
        except Unsupported:
            pass
    return lower_kernel(func, hw, vector=vector, clamp=clamp, caps=caps)[0], None
