"""Kernels launched together: a run of DSA calls that nothing on the host separates is one launch.

Each kernel launch costs the chip ``kernel_launch_cycles``. ``launch_together`` joins consecutive
DSA calls of ``main`` into one call whose program holds their kernels in order, all but the first
chained (``isa.Kernel.chained``): each starts once the one before has finished on all its cores,
as after a launch, but without one. A tensor only the run itself reads stays in the program's
DDR, or in a GB where that times faster (``resident.kept_in_gbs``); the VM no longer sees it. The
joined program's later kernels then load their weights ahead (``ahead.loaded_ahead``).

A run is joined only where that keeps ``main`` a DAG of calls: no host kernel (or any binding that
is not a layer) reads what one call of the run writes and writes what a later one reads (but a
view that only the run's next call reads: the run takes it in); and only of calls whose DDR
operands each lie in one tensor (``_confined``), as each tensor moves alone.
"""

from __future__ import annotations

import bisect
from dataclasses import replace

from tvm_dsa.isa import Dma, Operand, Program, TensorArg, moved
from tvm_dsa.kernel.ir import align
from tvm_dsa.kernelgen.ahead import loaded_ahead
from tvm_dsa.kernelgen.resident import kept_in_gbs
from tvm_dsa.kernelgen.rewrite import DSACall
from tvm_dsa.schedule.graph import OpGraph
from tvm_dsa.schedule.plan import KernelSpec


def launch_together(calls: list[DSACall], graph: OpGraph,
                    views: frozenset = frozenset()) -> tuple[list[DSACall], list]:
    """(the calls with runs of consecutive ones joined, the runs joined as tuples of their kernels'
    names). ``calls`` in the order ``main`` runs them; ``views``: the layers that are pure reshapes
    (the host's views), which a run takes in where only its next call reads them: the call reads
    the view's input in its place."""
    parsed: dict = {}  # text -> its program (sub-graphs of one form share one)
    programs = [_program(call, parsed) for call in calls]
    confined: dict = {}  # text -> whether its DDR operands move with its args (``_confined``)

    def movable(k: int) -> bool:
        text = calls[k].text
        if text not in confined:
            confined[text] = _confined(parsed[text])
        return confined[text]

    runs: list[list[int]] = []
    taken: list[set] = []  # per run, the views it takes in
    for k in range(len(calls)):
        inside = _taken_views(calls, runs[-1], k, graph, views) if runs else set()
        if runs and _joinable(calls, programs, runs[-1], k, graph, taken[-1] | inside) and \
                all(map(movable, (*runs[-1], k))):
            runs[-1].append(k)
            taken[-1] |= inside
        else:
            runs.append([k])
            taken.append(set())
    out = [_joined([calls[k] for k in run], [programs[k] for k in run], graph, seen) if len(run) > 1
           else calls[run[0]] for run, seen in zip(runs, taken)]
    return out, [tuple(calls[k].spec.name for k in run) for run in runs if len(run) > 1]


def _taken_views(calls: list[DSACall], run: list[int], k: int, graph: OpGraph, views: frozenset) -> set:
    """The views between ``run`` and call ``k``: of a tensor the run makes, read only by ``k``."""
    made = {c for j in run for c in calls[j].spec.calls}  # a layer is named after its output
    mine = _layers(graph, calls[k])
    return {v for v in views if graph.nodes[v].inputs[0] in made and graph.consumers(v)
            and graph.consumers(v) <= mine and graph.nodes[v].output not in graph.outputs}


def _joinable(calls: list[DSACall], programs: list[Program], run: list[int], k: int, graph: OpGraph,
              inside: set) -> bool:
    """Whether call ``k`` may join ``run`` (the calls just before it): ``k`` reads no tensor some
    other binding than a layer makes (it may depend on the run), and each tensor the run shares
    with ``k`` is stored alike (a view as its input); no layer of the run reads what ``k``
    writes, and no path leaves the run's layers and comes back (a host kernel between two of its
    calls, but the views ``inside`` it)."""
    mine = _layers(graph, calls[k])
    before = set().union(*(_layers(graph, calls[j]) for j in run))
    for i in mine:
        for t in graph.nodes[i].inputs:
            tensor = graph.tensors[t]
            if tensor.producer is None and not tensor.constant and t not in graph.params:
                return False
    stored = {a.name: a.dtype for j in run for a in programs[j].args}
    stored.update((graph.nodes[v].output, stored.get(graph.nodes[v].inputs[0])) for v in inside)
    if any(stored.get(a.name, a.dtype) != a.dtype for a in programs[k].args):
        return False
    members = before | mine | inside
    if any(c in before for i in mine for c in graph.consumers(i)):
        return False
    seen, todo = set(), [c for i in members for c in graph.consumers(i) if c not in members]
    while todo:
        i = todo.pop()
        if i not in seen:
            seen.add(i)
            if graph.consumers(i) & members:
                return False
            todo += graph.consumers(i)
    return True


def _layers(graph: OpGraph, call: DSACall) -> set[int]:
    """The graph's nodes the call runs (a layer is named after its output)."""
    return {graph.tensors[c].producer for c in call.spec.calls}


def _program(call: DSACall, parsed: dict) -> Program:
    """The call's program as stored (replicas kept), its kernels named after the call, its args
    after the tensors the call passes in their place, its layers as at the call."""
    if call.text not in parsed:
        parsed[call.text] = Program.deserialize(call.text, written_out=False)
    tensors = {"input": iter(call.inputs), "output": iter(call.outputs)}
    program = parsed[call.text].renamed(call.spec.name, call.renames)
    return replace(program, args=tuple(replace(a, name=next(tensors[a.role])) for a in program.args))


def _confined(program: Program) -> bool:
    """Whether the args of ``program`` are apart and each of its DDR operands (replicas written out)
    lies in one arg, or in the DDR after them: the joined program places each tensor alone, so an
    operand over two args next to each other (a concatenation's inputs read as one box) cannot
    move with them."""
    spans = sorted((a.offset, a.offset + a.nbytes) for a in program.args)
    if any(lo < hi for (_, hi), (lo, _) in zip(spans, spans[1:])):
        return False
    end = max((hi for _, hi in spans), default=0)
    starts = [lo for lo, _ in spans]
    for k in program.expanded().kernels:
        for ins in k.instructions:
            if type(ins) is not Dma:
                continue
            for o in (ins.src, ins.dst):
                if o.mem != "ddr":
                    continue
                steps = [(n - 1) * s for n, s in zip(ins.shape, o.strides)]
                lo = o.offset + sum(d for d in steps if d < 0) * o.itemsize
                hi = o.offset + (sum(d for d in steps if d > 0) + 1) * o.itemsize
                i = bisect.bisect_right(starts, lo) - 1
                if not (lo >= end or (i >= 0 and hi <= spans[i][1])):
                    return False
    return True


def _joined(calls: list[DSACall], programs: list[Program], graph: OpGraph, views: set) -> DSACall:
    """One call running ``calls`` (in order), one launch, and the ``views`` between them: it takes
    what they take from outside the run and returns what is read outside it; its scratch kept in
    the GBs and its weights loaded ahead where faster."""
    layers = [c for call in calls for c in call.spec.calls] + [graph.nodes[v].name for v in sorted(views)]
    made = {t for call in calls for t in call.outputs} | {graph.nodes[v].output for v in views}
    _, read_outside = graph.boundary([graph.nodes[graph.tensors[c].producer] for c in layers])
    inputs = list(dict.fromkeys(t for call in calls for t in call.inputs if t not in made))
    outputs = [t for call in calls for t in call.outputs if t in read_outside]
    name = f"{calls[0].spec.name}..{calls[-1].spec.name}"
    aliases = {graph.nodes[v].output: graph.nodes[v].inputs[0] for v in views}
    places: list = []  # the GB places the regions kept there take
    program, tensors = joined_program(programs, inputs, outputs, name, aliases)
    program, timing = kept_in_gbs(program, places, tensors)
    program = loaded_ahead(program, places, timing)
    return DSACall(KernelSpec(name, tuple(layers), calls[0].spec.plan), program.serialize(), tuple(inputs),
                   tuple(outputs))


def joined_program(programs: list[Program], inputs: list[str], outputs: list[str], name: str,
                   aliases: dict | None = None) -> tuple[Program, tuple[TensorArg, ...]]:
    """The kernels of ``programs`` (args named alike where they are one tensor) in one program,
    all but the first chained: args ``inputs`` then ``outputs``, the other tensors and each
    program's own DDR bytes after them; a tensor of ``aliases`` (view -> its input) in its
    input's place. With it, the other tensors as placed (their role ``output``: the kernels write
    them)."""
    aliases = aliases or {}
    shapes = {a.name: a for p in programs for a in p.args}
    args, offset = [], 0
    for role, names in (("input", inputs), ("output", outputs)):
        for t in names:
            a = shapes[t]
            args.append(TensorArg(t, role, a.shape, a.dtype, a.host_dtype, offset))
            offset = align(offset + a.nbytes)
    at = {a.name: a.offset for a in args}
    kept = []
    for t, a in shapes.items():
        if t not in at and t not in aliases:
            at[t] = offset
            kept.append(TensorArg(t, "output", a.shape, a.dtype, a.host_dtype, offset))
            offset = align(offset + a.nbytes)
    at.update((v, at[t]) for v, t in aliases.items())
    kernels = []
    for p in programs:
        end = max((a.offset + a.nbytes for a in p.args), default=0)
        move = _Move([(a.offset, a.offset + a.nbytes, at[a.name]) for a in p.args], end, offset)
        offset = align(offset + max(p.ddr_bytes - end, 0))
        for k in p.kernels:
            kernels.append(replace(k, instructions=tuple(moved(i, move.operand) if type(i) is Dma else i
                                                         for i in k.instructions),
                                   replicas=tuple(replace(r, moves=tuple(x for m in r.moves for x in move.ranges(m)))
                                                  for r in k.replicas),
                                   chained=bool(kernels)))
    return Program(programs[0].hardware, max(offset, 1), tuple(args), tuple(kernels), name), tuple(kept)


class _Move:
    """Where a program's DDR bytes go in the joined program: an arg's into its tensor's place
    (``spans``: old start, old end, new start), the rest (from ``end`` of its args) from ``scratch``."""

    def __init__(self, spans: list, end: int, scratch: int):
        self.spans, self.end, self.scratch = sorted(spans), end, scratch
        self.starts = [lo for lo, _, _ in self.spans]

    def _span(self, o: int) -> tuple | None:
        i = bisect.bisect_right(self.starts, o) - 1
        return self.spans[i] if i >= 0 and o < self.spans[i][1] else None

    def offset(self, o: int) -> int:
        span = self._span(o)
        if span is not None:
            return o - span[0] + span[2]
        if o < self.end:
            raise ValueError(f"DDR offset {o} lies between the program's args")
        return o - self.end + self.scratch

    def operand(self, o):
        if type(o) is not Operand or o.mem != "ddr":
            return o
        return replace(o, offset=self.offset(o.offset))

    def ranges(self, m: tuple) -> list[tuple]:
        """A replica's move of the DDR range ``[lo, hi)`` (``shift`` bytes on) as moves of the
        joined program: one per piece that lies in one tensor (or the scratch) and goes to one."""
        mem, index, lo, hi, to, shift = m
        if mem != "ddr":
            return [m]
        cuts = {lo, hi}
        for a, b, _ in self.spans:
            cuts.update(c for c in (a, b, a - shift, b - shift) if lo < c < hi)
        cuts.update(c for c in (self.end, self.end - shift) if lo < c < hi)
        out = []
        points = sorted(cuts)
        for a, b in zip(points, points[1:]):
            if self._placed(a) and self._placed(a + shift):  # else padding between args: no operand there
                new = self.offset(a)
                out.append((mem, index, new, new + b - a, to, self.offset(a + shift) - new))
        return out

    def _placed(self, o: int) -> bool:
        return o >= self.end or self._span(o) is not None
