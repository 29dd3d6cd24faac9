"""A SET schedule lowered to one DSA program (seed 002 §3.3: tile groups become cores).

``build_tree_program`` emits every layer invocation of a resource allocation tree — layer ``v``
on the samples ``[q * b_v, (q + 1) * b_v)`` — with the ``KernelEmitter`` the other schedules use,
in the tree's invocation order (``schedule.set.evaluate.invocation_order``: each cut runs
sub-batch k of all its children before sub-batch k + 1). A layer's tiles run on the cores of its
tile group that its intra-layer partition uses (stripe ids mapped to mesh positions), dealt
round-robin. The emitter's dependency tokens then let S-cut children on disjoint cores overlap
as a pipeline, and make T-cut children follow one another on shared cores.

Which invocation computes a tile: the one holding the last sample the tile writes, postponed
while a producer invocation it reads from comes later in the order (a tile may span several
samples when the lowering tiled the batch coarsely). Samples are found from the leading dimension
of every activation, which must carry the batch (checked).

What the lowered program does not do yet (docs/set.md): feature maps between layers all go
through DDR (the evaluator sends the immediately consumed ones over the NoC) and weights are
loaded per tile (the evaluator pins them in the tiles' buffers).
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import isa
from ..hardware import Hardware
from ..schedule.set.alloc import stripe_order
from ..schedule.set.evaluate import Slot, invocation_order
from .emit import KernelEmitter, Region, place_arguments
from .kernel_ir import ALIGN, CodegenError, align
from .stitch import footprints


@dataclass(frozen=True)
class TreeKernel:
    """What kernel generation needs for a SET schedule: ``layers[i]`` is the ``emit.Layer`` of
    layer ``i`` of the schedule's layer graph (its parameters named by tensors); ``views`` maps a
    reshaped tensor to the tensor whose bytes it reinterprets; ``inputs`` / ``outputs`` are the
    program's arguments in order; ``tensors`` gives every tensor's (shape, host dtype)."""

    name: str
    layers: tuple
    views: dict
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    tensors: dict
    schedule: object  # schedule.set.Schedule


@dataclass(frozen=True)
class Span:
    """Instructions ``[first, last)`` of the program's kernel compute invocation ``invocation`` of
    ``layer`` on ``cores``."""

    layer: int
    invocation: int
    first: int
    last: int
    cores: tuple[int, ...]


def core_of_stripe(hw) -> list[int]:
    """Core index of each stripe id (cores are numbered row by row on the mesh, like
    ``runtime.cost.mesh_hops``)."""
    width, height = hw.mesh
    return [y * width + x for x, y in stripe_order(width, height)]


def _samples(box_lo: int, box_hi: int, dim0: int, batch: int) -> tuple[int, int]:
    """Samples [first, last] a box spanning rows [box_lo, box_hi) of a leading dimension holds."""
    return box_lo * batch // dim0, (box_hi * batch - 1) // dim0


def _assign(k: TreeKernel, batch: int) -> dict:
    """(layer, invocation) -> tile-loop values of the tiles it computes."""
    sched, layers = k.schedule, k.layers
    plans = sched.leaves
    position = {key: n for n, key in enumerate(invocation_order(sched.tree))}
    produced = {L.args[L.ir.params[-1][0]]: i for i, L in enumerate(layers)}

    def root(t: str) -> str:
        while t in k.views:
            t = k.views[t]
        return t

    def dim0(t: str) -> int:
        shape = k.tensors[t][0]
        if not shape or shape[0] % batch:
            raise CodegenError(f"SET lowering: tensor {t} of shape {list(shape)} does not carry the batch "
                               f"{batch} in its leading dimension")
        return shape[0]

    work: dict = {}
    ready: list = []  # per layer, per sample: position of the invocation completing it
    for v, L in enumerate(layers):
        fp = footprints(L)
        out = L.args[L.ir.params[-1][0]]
        bv, n = plans[v].batch, plans[v].invocations
        reads = [(fp.reads[p], produced[root(L.args[p])], dim0(L.args[p])) for p in fp.reads
                 if root(L.args[p]) in produced]
        done = [-1] * batch
        for row, tile in enumerate(fp.tiles):
            first, last = _samples(int(fp.write[0][row][0]), int(fp.write[1][row][0]), dim0(out), batch)
            need = max((max(ready[u][a:b + 1]) for (lo, hi), u, d in reads
                        for a, b in [_samples(int(lo[row][0]), int(hi[row][0]), d, batch)]), default=-1)
            q = last // bv
            while q < n and position[(v, q)] < need:
                q += 1
            if q == n:
                raise CodegenError(f"SET lowering: a tile of {L.name} reads samples its producers compute "
                                   "after its last invocation")
            work.setdefault((v, q), []).append(tile)
            done[first:last + 1] = [max(x, position[(v, q)]) for x in done[first:last + 1]]
        ready.append(done)
    return work


@dataclass(frozen=True)
class TreeProgram:
    """A lowered SET schedule: the program (one kernel) and every invocation's instructions."""

    program: isa.Program
    spans: tuple[Span, ...]
    schedule: object  # schedule.set.Schedule

    def timeline(self, check_hazards: bool = False) -> tuple[Slot, ...]:
        """The S-T graph's rectangles as the simulator runs the program (timing only): each
        invocation from its first instruction's start to its last one's end, in cycles from the
        kernel's start."""
        from ..runtime.timing import simulate_program

        hw = Hardware.from_dict(self.program.hardware)
        kt = simulate_program(self.program, hw, check_hazards).kernels[0]
        out = []
        for s in self.spans:
            if s.first == s.last:
                continue
            plan = self.schedule.leaves[s.layer]
            idx = range(s.first, s.last)
            out.append(Slot(s.layer, s.invocation, plan.batch, plan.used,
                            min(kt.start[i] for i in idx), max(kt.end[i] for i in idx)))
        return tuple(out)


def build_tree_program(k: TreeKernel, hw) -> TreeProgram:
    """The program of a SET schedule (one kernel) and the instruction span of every invocation."""
    sched = k.schedule
    batch = sched.tree.batch
    regions, args, offset = place_arguments(k.inputs, k.outputs, k.tensors, hw)
    for L in k.layers:  # intermediates: DDR scratch after the arguments
        t = L.args[L.ir.params[-1][0]]
        if t not in regions:
            regions[t] = Region.whole("ddr", 0, offset, k.tensors[t][0], hw.storage_dtype)
            offset = align(offset + regions[t].nbytes)
    emitter = KernelEmitter(hw, k.name)
    for t, r in regions.items():
        emitter.claim(r, ("ddr", t))
    for view in k.views:  # a reshape reads the bytes of what it reshapes (resolved in any order)
        src = view
        while src in k.views:
            src = k.views[src]
        regions[view] = Region.whole("ddr", 0, regions[src].base, k.tensors[view][0], hw.storage_dtype)

    cores = core_of_stripe(hw)
    work = _assign(k, batch)
    spans = []
    for v, q in invocation_order(sched.tree):
        tiles = work.get((v, q), [])
        lo, hi = sched.leaves[v].used
        group = tuple(cores[i] for i in range(lo, hi))
        first = len(emitter.instructions)
        if tiles:
            emitter.layer(k.layers[v], [(t, group[n % len(group)]) for n, t in enumerate(tiles)], regions)
        spans.append(Span(v, q, first, len(emitter.instructions), group))
    program = isa.Program(hw.to_dict(), max(offset, ALIGN), tuple(args), (emitter.kernel(),), k.name)
    return TreeProgram(program, tuple(spans), sched)
