"""The DSA instruction set: affine tensor instructions over byte-addressed memories.

Every instruction iterates over a box ``shape`` (a tuple of extents). Each operand is an
``Operand``: a memory (``ddr``, ``gb`` of a cluster, ``lb`` of a core), a byte offset, an element
type, and one element stride per box dimension, so the element at box point ``p`` sits at byte
``offset + itemsize * sum(p[d] * strides[d])``. A stride of 0 broadcasts; a negative stride is not
allowed. Transposes, reshapes of contiguous data, broadcasts and convolution windows (a stride per
window dimension) are therefore all just operands.

Units. Every instruction names the core that issues it (``core``, a global core id; its cluster is
``core // cores_per_cluster``) and runs on exactly one unit, which fixes where its operands may be
(``lb[c]`` is core ``c``'s own LB, ``gb[k]`` the GB of cluster ``k``):

==========  ==========================  =====================================================
unit        runs                        operands
==========  ==========================  =====================================================
``dma``     ``Dma`` with an LB side     one side in ``lb[core]``, the other in DDR, any GB or
(per core)  (not ``prefetch``),         any LB (another core's LB: through the GBs on a bus,
            ``Fill``                    over the NoC on a mesh); a fill writes ``lb[core]``
``pdma``    ``Dma`` with an LB side     as ``dma``: the core's second DMA queue, on chips with
(per core)  and ``prefetch``            ``prefetch_dma`` (a later layer's weights loaded, or
                                        a tile's stores, while the core's ``dma`` moves the
                                        tiles' loads)
``cdma``    ``Dma`` without an LB side  DDR <-> ``gb[cluster of core]``, DDR <-> DDR or within
                                        ``gb[cluster of core]`` (a copy between on-chip tensors)
(per
cluster)
``mme``     ``Mme``                     all in ``lb[core]``
``vme``     ``Vector`` with an op in    all in ``lb[core]``, any dtype
            ``VME_OPS``, ``Reduce``
``vec``     ``Vector`` (any op),        all in ``lb[core]``, any dtype
            ``Reduce``
==========  ==========================  =====================================================

Compute instructions (MME, vector, reduce) never touch DDR, a GB or another core's LB; data gets to
a core's LB by DMA. Each unit executes its instructions in list order, one at a time. ``deps`` are
indices of earlier instructions of the same kernel (on any unit or core) that must have finished
before this one starts: the dependency tokens of a decoupled access/execute machine. List order is
the program's meaning; the simulator checks that the tokens order every pair of instructions whose
memory ranges conflict, and reports a hazard otherwise.

Arithmetic. A DMA copies bytes (source and destination have the same dtype); a fill converts its
value to the destination dtype (to a float: rounded to nearest even; to an integer: truncated
toward zero). The MME multiplies operands of the hardware's ``mme.dtype`` and
accumulates in its ``mme.accum_dtype``: float32 on the float presets (fp16 products summed in
float32), int32 on the int8 presets (exact integer products and sums, kept modulo 2**32); with
``accumulate`` the old destination value is added in the same type. Vector and reduce instructions
compute in float32: operands of any dtype are read and converted to float32, and results are
stored in the destination dtype — floats rounded to nearest even, integers rounded half to even
and saturated to the type's range (how an int8 datapath requantises int32 accumulators);
immediates are numbers. Comparisons give 1.0 or 0.0, ``select(c, a, b)`` takes ``a``
where ``c != 0``, ``round`` rounds half to even (as ONNX Round and numpy's ``rint``), ``floor`` and
``ceil`` as usual; ``mac(a, b, c)`` is ``a * b + c`` (the product rounded to float32, then the sum:
a multiply-accumulate, as a ``mul`` then an ``add``, in one pass over the lanes); ``clip(a, lo, hi)``
is ``min(max(a, lo), hi)`` in one pass (a ReLU6); IEEE rules for infinities and NaN (division by
zero gives inf, not an error).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MEMORIES = ("ddr", "gb", "lb")
DTYPES = {"float16": 2, "float32": 4, "int8": 1, "int32": 4}

# Vector operations. The VME runs cheap arithmetic; the vector core runs everything.
VME_OPS = frozenset({"copy", "neg", "abs", "relu", "add", "sub", "mul", "div", "max", "min", "mac", "clip"})
VEC_OPS = VME_OPS | frozenset({
    "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "floor", "ceil", "round", "sin", "cos",
    "pow", "eq", "ne", "lt", "le", "gt", "ge", "select",
})
OP_ARITY = {
    **{op: 1 for op in ("copy", "neg", "abs", "relu", "exp", "log", "sqrt", "rsqrt", "tanh",
                        "sigmoid", "erf", "floor", "ceil", "round", "sin", "cos")},
    **{op: 2 for op in ("add", "sub", "mul", "div", "max", "min", "pow",
                        "eq", "ne", "lt", "le", "gt", "ge")},
    "select": 3,
    "mac": 3,
    "clip": 3,
}
# Lane operations an element of an op costs (energy): a multiply-accumulate is a multiply and an add,
# a clip a max and a min.
LANE_OPS = {"mac": 2, "clip": 2}
REDUCE_OPS = frozenset({"sum", "max", "min"})


@dataclass(frozen=True, slots=True)
class Operand:
    """An affine view of one memory: ``offset`` in bytes, ``strides`` in elements per box dim."""

    mem: str
    index: int  # which LB (global core id) or GB (cluster id); 0 for DDR
    offset: int
    dtype: str
    strides: tuple[int, ...]

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype]

    def extent_bytes(self, shape: tuple[int, ...]) -> tuple[int, int]:
        """[first, last) byte range the operand touches over the box ``shape``."""
        last = sum((n - 1) * s for n, s in zip(shape, self.strides))
        return self.offset, self.offset + (last + 1) * self.itemsize

    def space(self) -> tuple[str, int]:
        return self.mem, self.index


Scalar = float  # an immediate source of a vector instruction


@dataclass(frozen=True, slots=True)
class Dma:
    """dst[p] = src[p] for p in shape (same dtype, no conversion). Unit: the core's ``dma`` when a
    side is in an LB, and then one side is the core's own LB; else the cluster's ``cdma``, between
    DDR and the cluster's GB, within DDR or within the cluster's GB, or (on a bus) between the
    cluster's GB and another cluster's, through both GBs' ports. With ``prefetch`` (an LB side;
    chips with ``prefetch_dma``) the core's second queue ``pdma`` runs it, beside the transfers of
    its ``dma``. With ``multicast`` (DDR -> GB, GB -> GB, GB -> LB, DDR -> LB or LB -> LB; chips with
    ``multicast_dma``) it is one destination's share of a transfer to several: the multicast DMAs
    of one source box to one place in several GBs (or LBs), the n-th into each since the source
    was last written, are one transfer (``multicast_groups``), which starts when each of them may,
    reads the source once and writes every destination; or, where the compiler names it, the
    multicast DMAs of the kernel with the same nonzero ``group`` (one box, one destination each).
    A transfer one of whose DMAs waits in its queue behind a DMA of another transfer that waits
    for it never starts (``stuck_multicasts``): the simulator moves such transfers alone, each
    reading its source, once nothing else can run.
    Each still copies the box: the values are a plain DMA's. (The JSON form ends with their flags,
    1 prefetch, 2 multicast, then the group where there is one.)"""

    core: int
    shape: tuple[int, ...]
    dst: Operand
    src: Operand
    deps: tuple[int, ...] = ()
    prefetch: bool = False  # on the core's second queue (``pdma``), beside its tile transfers
    multicast: bool = False  # one transfer with the other destinations' copies (``multicast_groups``)
    group: int = 0  # with multicast: the transfer, named (the kernel's DMAs of this group); 0: inferred


@dataclass(frozen=True, slots=True)
class Fill:
    """dst[p] = value (converted to dst's dtype) for p in shape; dst is the core's own LB. Unit:
    the core's ``dma``."""

    core: int
    shape: tuple[int, ...]
    dst: Operand
    value: float
    deps: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Mme:
    """dst[s] (+)= sum over reduction dims r of a[s, r] * b[s, r]. ``reduce`` flags the reduction
    dims of ``shape``; ``dst`` has stride 0 on them. Without ``accumulate`` dst is overwritten.
    ``a`` and ``b`` are of the hardware's ``mme.dtype``, ``dst`` of its ``mme.accum_dtype`` (the
    type of the products' sum); all three in the core's own LB. Unit: the core's ``mme``."""

    core: int
    shape: tuple[int, ...]
    reduce: tuple[bool, ...]
    dst: Operand
    a: Operand
    b: Operand
    accumulate: bool = False
    deps: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Vector:
    """dst[p] = op(srcs[0][p], ...) elementwise over shape, in float32; ``len(srcs)`` is
    ``OP_ARITY[op]`` and a source may be a scalar immediate. Operands are in the core's own LB
    (any dtype; see the module docstring for conversions). Unit ``vme`` (ops in VME_OPS) or ``vec`` (ops in VEC_OPS) of the core."""

    core: int
    unit: str
    op: str
    shape: tuple[int, ...]
    dst: Operand
    srcs: tuple[Operand | float, ...]
    deps: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Reduce:
    """dst[s] (op)= reduce over reduction dims r of src[s, r], in float32; op in REDUCE_OPS. ``dst``
    has stride 0 on reduction dims. Without ``accumulate`` the old dst value is ignored. Operands
    are in the core's own LB (any dtype). Unit ``vme`` or ``vec`` of the core (both run every
    reduction)."""

    core: int
    unit: str
    op: str
    shape: tuple[int, ...]
    reduce: tuple[bool, ...]
    dst: Operand
    src: Operand
    accumulate: bool = False
    deps: tuple[int, ...] = ()


Instruction = Dma | Fill | Mme | Vector | Reduce
OPCODES = {"dma": Dma, "fill": Fill, "mme": Mme, "vector": Vector, "reduce": Reduce}
OPCODE_OF = {cls: name for name, cls in OPCODES.items()}


def unit_of(ins: Instruction, cores_per_cluster: int) -> tuple[str, int]:
    """(unit kind, index) that executes ``ins``: per-core units indexed by global core id,
    ``cdma`` by cluster id."""
    if isinstance(ins, Dma):
        if ins.dst.mem != "lb" and ins.src.mem != "lb":
            return "cdma", ins.core // cores_per_cluster
        return ("pdma" if ins.prefetch else "dma"), ins.core
    if isinstance(ins, Fill):
        return "dma", ins.core
    if isinstance(ins, Mme):
        return "mme", ins.core
    return ins.unit, ins.core


OPERAND_FIELDS = {Dma: ("dst", "src"), Fill: ("dst",), Mme: ("dst", "a", "b"), Vector: ("dst",), Reduce: ("dst", "src")}


def replaced(obj, **changes):
    """A copy of an instruction or operand with ``changes``, without running the constructor again
    (streams of copies: a replica written out, a layer replayed). Fields not changed are shared."""
    new = object.__new__(type(obj))
    put = object.__setattr__
    for f in obj.__slots__:
        put(new, f, getattr(obj, f))
    for f, v in changes.items():
        put(new, f, v)
    return new


def moved(ins: Instruction, move, **changes) -> Instruction:
    """``ins`` with each operand (a vector's sources too) replaced by ``move(operand)``, and
    ``changes``."""
    kind = type(ins)
    for f in OPERAND_FIELDS[kind]:
        changes[f] = move(getattr(ins, f))
    if kind is Vector:
        changes["srcs"] = tuple(move(o) if type(o) is Operand else o for o in ins.srcs)
    return replaced(ins, **changes)


def operands(ins: Instruction) -> tuple[list[Operand], Operand]:
    """(sources read, destination written). An accumulating destination is also a source."""
    if isinstance(ins, Dma):
        return [ins.src], ins.dst
    if isinstance(ins, Fill):
        return [], ins.dst
    if isinstance(ins, Mme):
        return [ins.a, ins.b] + ([ins.dst] if ins.accumulate else []), ins.dst
    if isinstance(ins, Vector):
        return [s for s in ins.srcs if isinstance(s, Operand)], ins.dst
    return [ins.src] + ([ins.dst] if ins.accumulate else []), ins.dst


GRANULE = 64  # bytes: how finely ``multicast_chains`` tells which writes touch a source box


def _span(o: Operand, shape: tuple[int, ...]) -> tuple[int, int]:
    """The granules of ``o``'s memory from its box's first byte to its last."""
    first, end = o.extent_bytes(shape)
    return first // GRANULE, -(-end // GRANULE)


def multicast_chains(instructions) -> dict[int, tuple]:
    """Per multicast DMA of a kernel's stream (written out), its chain: the source box, counted
    since the source's bytes were last written, and the place it goes to (offsets, strides, box).
    The n-th DMA of a chain into each memory are one transfer (``multicast_groups``). (Counted
    from the kernel's start instead, a core's load of one sample's rows paired with another
    instance's load of another tensor that later took the same GB place, and the core's queue
    waited for it: ResNet-50 at batch 8.)"""
    chains: dict[int, tuple] = {}
    written: dict[tuple[str, int], np.ndarray] = {}  # memory -> per granule, the last write's position

    def granules(mem: tuple[str, int], hi: int) -> np.ndarray:
        arr = written.get(mem)
        if arr is None or len(arr) < hi:
            grown = np.full(max(hi, 2 * len(arr) if arr is not None else hi), -1, dtype=np.int64)
            if arr is not None:
                grown[:len(arr)] = arr
            arr = written[mem] = grown
        return arr

    # LB writes (by every unit) matter only where a multicast reads an LB (a mesh's pieces)
    lb_sources = any(type(ins) is Dma and ins.multicast and ins.src.mem == "lb" for ins in instructions)
    for i, ins in enumerate(instructions):
        dst = ins.dst
        if type(ins) is Dma and ins.multicast and not ins.group:
            src = ins.src
            lo, hi = _span(src, ins.shape)
            epoch = int(granules((src.mem, src.index), hi)[lo:hi].max())
            chains[i] = (src.mem, src.index, src.offset, src.strides, src.dtype, dst.mem, dst.offset, dst.strides,
                         ins.shape, epoch)
        if dst.mem != "lb" or lb_sources:
            lo, hi = _span(dst, ins.shape)
            granules((dst.mem, dst.index), hi)[lo:hi] = i
    return chains


def multicast_groups(instructions, chains: dict[int, tuple] | None = None) -> dict[int, tuple[int, ...]]:
    """Per multicast DMA of a kernel's stream (written out), the positions of its transfer's DMAs
    (``Dma.multicast``), first the one that reads the source for all: those of its ``group``
    where it names one, else the n-th multicast DMA of one chain (``multicast_chains``, unless
    given) into each memory (a GB, an LB). A DMA no other memory's matches is a transfer of its
    own."""
    groups: dict[tuple, list[int]] = {}
    seen: dict[tuple, int] = {}
    for i, chain in (multicast_chains(instructions) if chains is None else chains).items():
        at = (chain, instructions[i].dst.index)
        n = seen.get(at, 0)
        seen[at] = n + 1
        groups.setdefault((chain, n), []).append(i)
    for i, ins in enumerate(instructions):
        if type(ins) is Dma and ins.multicast and ins.group:
            groups.setdefault(("group", ins.group), []).append(i)
    return {i: tuple(members) for members in groups.values() for i in members}


def stuck_multicasts(instructions, cores_per_cluster: int) -> set[int]:
    """The multicast DMAs of a kernel's stream (written out) whose transfer never starts: each DMA
    of a transfer (``multicast_groups``) waits at the head of its queue for the others, and one
    of them is behind a DMA of another transfer in its queue that waits likewise (a core's n-th
    load of a box paired with another core's load of a later round). Run in queue order, every
    instruction done once it may start; where nothing else can, the transfers left waiting are
    stuck (a machine would hang; the simulator then moves them alone, each reading its source)
    and their DMAs count as plain from there on."""
    groups = {i: g for i, g in multicast_groups(instructions).items() if len(g) > 1}
    if not groups:
        return set()
    index: dict = {}
    queues: list[list[int]] = []
    queue_of = []
    pending = []
    dependents: list[list[int]] = [[] for _ in instructions]
    for i, ins in enumerate(instructions):
        q = index.setdefault(unit_of(ins, cores_per_cluster), len(index))
        if q == len(queues):
            queues.append([])
        queues[q].append(i)
        queue_of.append(q)
        deps = set(ins.deps)
        pending.append(len(deps))
        for d in deps:
            dependents[d].append(i)
    pos = [0] * len(queues)
    ready = list(range(len(queues)))
    waiting: set[int] = set()
    stuck: set[int] = set()
    while True:
        while ready:
            q = ready.pop()
            if pos[q] == len(queues[q]):
                continue
            i = queues[q][pos[q]]
            if pending[i] or i in waiting:
                continue
            members = groups.get(i, (i,))
            if len(members) > 1:
                waiting.add(i)
                if not waiting.issuperset(members):
                    continue
                waiting.difference_update(members)
            for m in members:
                pos[queue_of[m]] += 1
                ready.append(queue_of[m])
                for d in dependents[m]:
                    pending[d] -= 1
                    if not pending[d]:
                        ready.append(queue_of[d])
        if not waiting:
            return stuck
        for i in waiting:
            for m in groups.pop(i, ()):
                groups.pop(m, None)
                stuck.add(m)
        ready.extend(queue_of[i] for i in waiting)
        waiting.clear()


def macs(ins: Instruction) -> int:
    """Multiply-accumulates an MME instruction performs (0 for the others)."""
    if not isinstance(ins, Mme):
        return 0
    n = 1
    for e in ins.shape:
        n *= e
    return n
