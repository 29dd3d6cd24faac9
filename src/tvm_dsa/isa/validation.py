"""Static checks of a program against its hardware: every error names the kernel and instruction.

``validate`` enforces what ``instructions`` and ``program`` define:

* args: role ``input``/``output``, a known dtype, inside DDR, pairwise disjoint in DDR;
* kernels: their cores exist; each instruction runs on one of its kernel's cores;
* every instruction: a non-empty box, dependencies on earlier instructions only, operands in an
  existing memory, with a known dtype, one non-negative stride per box dim, an offset aligned to
  the dtype and every byte touched inside the memory; ``dst`` writes each element once (ignoring
  reduction dims, on which it has stride 0);
* where data may live (see the unit table in ``instructions``): MME, vector and reduce instructions
  touch only the issuing core's own LB; a fill writes only that LB; a DMA has one side in that LB,
  or is a cluster DMA (both sides outside any LB): DDR <-> GB of the core's cluster, DDR <-> DDR,
  or, on a bus, the GB of the core's cluster <-> any GB;
* per class: DMA without conversion; MME operands in ``mme.dtype``, accumulator in
  ``mme.accum_dtype``; vector / reduce operands float16 or float32, an op the unit runs with its
  number of sources (immediates are numbers).

The checks are one pass over the instructions; whatever depends only on an operand's strides and
the box (its extent, whether it writes an element twice) is computed once per distinct pair.
"""

from __future__ import annotations

from numbers import Integral, Real

from tvm_dsa.isa.instructions import (
    DTYPES, MEMORIES, OP_ARITY, REDUCE_OPS, VEC_OPS, VME_OPS, Dma, Fill, Mme, Operand, Reduce, Vector
)
from tvm_dsa.isa.program import Program, ProgramError

UNIT_OPS = {"vme": VME_OPS, "vec": VEC_OPS}


def _place(o: Operand) -> str:
    return "ddr" if o.mem == "ddr" else f"{o.mem}[{o.index}]"


def _last_element(strides, shape) -> int | None:
    """Element index (relative to the offset) of the furthest box point, None when the strides
    do not fit the shape or one is not a non-negative integer."""
    if len(strides) != len(shape) or not all(isinstance(s, Integral) and s >= 0 for s in strides):
        return None
    return sum((n - 1) * s for n, s in zip(shape, strides))


def _injective(o: Operand, shape, skip=()) -> bool:
    """True when distinct box points (ignoring dims in ``skip``) map to distinct elements."""
    dims = sorted((s, n) for d, (s, n) in enumerate(zip(o.strides, shape)) if n > 1 and d not in skip)
    span = 1
    for s, n in dims:
        if s < span:
            return False
        span = s * (n - 1) + span
    return True


def _dst_problem(dst: Operand, shape, mask) -> str | None:
    skip = [d for d, r in enumerate(mask) if r]
    if not _injective(dst, shape, skip):
        return f"dst strides {dst.strides} write an element twice"
    if any(dst.strides[d] for d in skip):
        return "dst must have stride 0 on reduction dims"
    return None


class _Checker:
    """The hardware-dependent constants and the per-geometry caches of one ``validate`` call."""

    def __init__(self, program: Program):
        hw = program.hardware
        self.hw = hw
        self.cpc = hw["cores_per_cluster"]
        self.cores = hw["clusters"] * self.cpc
        self.sizes = {"ddr": program.ddr_bytes, "gb": hw["gb_bytes"], "lb": hw["lb_bytes"]}
        self.counts = {"ddr": 1, "gb": hw["clusters"], "lb": self.cores}
        self.mme_dtype = hw["mme"]["dtype"]
        self.prefetch = bool(hw.get("prefetch_dma", False))
        self.multicast = bool(hw.get("multicast_dma", False))
        self.bus = hw.get("interconnect", "bus") != "mesh"
        self.accum_dtype = hw["mme"]["accum_dtype"]
        self.last: dict = {}  # (strides, shape) -> _last_element
        self.dst_ok: dict = {}  # (strides, shape, reduce mask) -> _dst_problem is None

    # -- operands ---------------------------------------------------------------------------------
    def operand(self, o: Operand, shape, role: str) -> str | None:
        """The first problem of operand ``o`` over the box ``shape`` (None if there is none)."""
        try:
            size = self.sizes.get(o.mem)
            item = DTYPES.get(o.dtype)
            key = (o.strides, shape)
            last = self.last.get(key, -1)
            if last == -1:
                last = self.last[key] = _last_element(o.strides, shape)
            if (size is not None and item is not None and last is not None and 0 <= o.index < self.counts[o.mem]
                    and not o.offset % item and o.offset >= 0 and o.offset + (last + 1) * item <= size):
                return None
        except (AttributeError, TypeError):  # not an Operand, or strides that are not a tuple of ints
            pass
        return self._operand_problem(o, shape, role)

    def _operand_problem(self, o: Operand, shape, role: str) -> str:
        if not isinstance(o, Operand):
            return f"{role} is {o!r}, not an Operand"
        if type(o.strides) is not tuple or not all(isinstance(s, Integral) for s in o.strides):
            return f"{role} strides {o.strides!r} are not a tuple of ints"
        if o.mem not in MEMORIES:
            return f"{role} memory {o.mem!r} is not one of {MEMORIES}"
        if o.dtype not in DTYPES:
            return f"{role} dtype {o.dtype!r} is not one of {sorted(DTYPES)}"
        if len(o.strides) != len(shape):
            return f"{role} has {len(o.strides)} strides for a {len(shape)}-d shape"
        if any(s < 0 for s in o.strides):
            return f"{role} has a negative stride {o.strides}"
        count = self.counts[o.mem]
        if not 0 <= o.index < count:
            return f"{role} {o.mem}[{o.index}] does not exist (there are {count})"
        if o.offset % o.itemsize:
            return f"{role} offset {o.offset} is not aligned to {o.dtype}"
        lo, hi = o.extent_bytes(shape)
        size = self.sizes[o.mem]
        return f"{role} touches {o.mem}[{o.index}] bytes [{lo}, {hi}) outside its {size} bytes"

    def dst(self, dst: Operand, shape, mask) -> str | None:
        key = (dst.strides, shape, mask)
        ok = self.dst_ok.get(key)
        if ok is None:
            ok = self.dst_ok[key] = _dst_problem(dst, shape, mask) is None
        return None if ok else _dst_problem(dst, shape, mask)

    # -- instructions -----------------------------------------------------------------------------
    def instruction(self, ins, n: int, kernel_cores) -> str | None:
        """The first problem of instruction ``n`` of a kernel (None if there is none)."""
        core, shape = ins.core, ins.shape
        if type(shape) is not tuple:
            return f"shape {shape!r} is not a tuple"
        if core not in kernel_cores:
            return f"core {core} is not among the kernel's cores {sorted(kernel_cores)}"
        if shape and min(shape) <= 0:
            return f"empty or negative shape {shape}"
        for d in ins.deps:
            if not 0 <= d < n:
                return f"dependency {d} is not an earlier instruction"
        kind = type(ins)
        if kind is Dma:
            return (self.operand(ins.dst, shape, "dst") or self.operand(ins.src, shape, "src0")
                    or self._dma(ins) or self.dst(ins.dst, shape, ()))
        if kind is Fill:
            return (self.operand(ins.dst, shape, "dst") or self._fill(ins) or self.dst(ins.dst, shape, ()))
        if kind is Mme:
            if type(ins.reduce) is not tuple:
                return f"reduce mask {ins.reduce!r} is not a tuple"
            if len(ins.reduce) != len(shape):
                return "reduce mask length differs from the shape"
            srcs = (ins.a, ins.b, ins.dst) if ins.accumulate else (ins.a, ins.b)
            return (self._compute_operands(ins, srcs) or self.dst(ins.dst, shape, ins.reduce)
                    or self._mme(ins))
        if kind is Vector:
            srcs = []
            for j, s in enumerate(ins.srcs):
                if isinstance(s, Operand):
                    srcs.append(s)
                elif not isinstance(s, Real) or isinstance(s, bool):
                    return f"source {j} is {s!r}, neither an operand nor a number"
            return (self._compute_operands(ins, srcs) or self.dst(ins.dst, shape, ())
                    or self._vector(ins, srcs))
        if kind is Reduce:
            if type(ins.reduce) is not tuple:
                return f"reduce mask {ins.reduce!r} is not a tuple"
            if len(ins.reduce) != len(shape):
                return "reduce mask length differs from the shape"
            srcs = (ins.src, ins.dst) if ins.accumulate else (ins.src,)
            return (self._compute_operands(ins, srcs) or self.dst(ins.dst, shape, ins.reduce)
                    or self._reduce(ins, srcs))
        return f"{kind.__name__} is not an instruction"

    def _compute_operands(self, ins, srcs) -> str | None:
        """Bounds of every operand, then: compute touches only its own core's LB."""
        shape, core = ins.shape, ins.core
        problem = self.operand(ins.dst, shape, "dst")
        if problem:
            return problem
        for j, s in enumerate(srcs):
            problem = self.operand(s, shape, f"src{j}")
            if problem:
                return problem
        for j, o in enumerate((ins.dst, *srcs)):
            if o.index != core or o.mem != "lb":
                role = f"src{j - 1}" if j else "dst"
                return (f"{role} is in {_place(o)}, but MME, vector and reduce instructions only touch "
                        f"their own core's LB (lb[{core}])")
        return None

    def _dma(self, ins: Dma) -> str | None:
        core, src, dst = ins.core, ins.src, ins.dst
        if dst.dtype != src.dtype:
            return f"DMA cannot convert {src.dtype} to {dst.dtype}"
        if ins.prefetch and not self.prefetch:
            return "a prefetch DMA needs a chip whose cores have a prefetch queue (prefetch_dma)"
        if ins.prefetch and dst.mem != "lb" and src.mem != "lb":
            return "a prefetch DMA runs on a core's prefetch queue: one side must be in its LB"
        if ins.multicast and not self.multicast:
            return "a multicast DMA needs a chip whose DMAs can deliver one box to several memories (multicast_dma)"
        if ins.group and not ins.multicast:
            return f"a DMA names a transfer group ({ins.group}) only as a multicast"
        if ins.group < 0:
            return f"a multicast's transfer group is a positive number, not {ins.group}"
        if ins.multicast and (src.mem, dst.mem) not in (("ddr", "gb"), ("gb", "gb"), ("gb", "lb"), ("ddr", "lb"),
                                                         ("lb", "lb")):
            return f"a multicast DMA copies DDR or a GB to GBs or LBs, or an LB to LBs, not {src.mem} to {dst.mem}"
        own = (dst.mem == "lb" and dst.index == core) or (src.mem == "lb" and src.index == core)
        if own:
            return None
        move = f"{_place(dst)} <- {_place(src)}"
        if dst.mem == "lb" or src.mem == "lb":
            return (f"DMA {move} touches an LB but not the issuing core's own (lb[{core}]): a core's DMA "
                    f"moves data to or from its own LB")
        cluster = core // self.cpc
        if self.bus and dst.mem == src.mem == "gb" and cluster in (dst.index, src.index):
            return None  # between its cluster's GB and another's (or its own), across the bus
        for o in (dst, src):
            if o.mem == "gb" and o.index != cluster:
                return (f"DMA {move}: core {core} is in cluster {cluster}, and a cluster DMA only "
                        f"reaches its own cluster's GB (gb[{cluster}])")
        return None

    def _fill(self, ins: Fill) -> str | None:
        if ins.dst.mem != "lb" or ins.dst.index != ins.core:
            return f"fill writes only the core's LB (lb[{ins.core}]), not {_place(ins.dst)}"
        return None

    def _mme(self, ins: Mme) -> str | None:
        if ins.a.dtype != self.mme_dtype or ins.b.dtype != self.mme_dtype:
            return f"MME operands must be {self.mme_dtype}"
        if ins.dst.dtype != self.accum_dtype:
            return f"MME accumulates into {self.accum_dtype}"
        return None

    def _vector(self, ins: Vector, srcs) -> str | None:
        if ins.unit not in UNIT_OPS:
            return f"unit {ins.unit!r} is not vme/vec"
        if ins.op not in UNIT_OPS[ins.unit]:
            return f"op {ins.op!r} does not run on the {ins.unit}"
        if len(ins.srcs) != OP_ARITY[ins.op]:
            return f"op {ins.op!r} takes {OP_ARITY[ins.op]} sources"
        return None

    def _reduce(self, ins: Reduce, srcs) -> str | None:
        if ins.unit not in UNIT_OPS:
            return f"unit {ins.unit!r} is not vme/vec"
        if ins.op not in REDUCE_OPS:
            return f"reduction {ins.op!r} is not one of {sorted(REDUCE_OPS)}"
        return None


def _check_args(program: Program) -> None:
    spans = []
    for a in program.args:
        if a.role not in ("input", "output"):
            raise ProgramError(f"arg {a.name}: role {a.role!r} is not input/output")
        if a.dtype not in DTYPES:
            raise ProgramError(f"arg {a.name}: dtype {a.dtype!r} is not one of {sorted(DTYPES)}")
        if any(e < 0 for e in a.shape):
            raise ProgramError(f"arg {a.name}: negative shape {a.shape}")
        if a.offset < 0 or a.offset + a.nbytes > program.ddr_bytes:
            raise ProgramError(f"arg {a.name}: DDR bytes [{a.offset}, {a.offset + a.nbytes}) outside {program.ddr_bytes}")
        if a.nbytes:
            spans.append((a.offset, a.offset + a.nbytes, a.name))
    spans.sort()
    for (lo1, hi1, n1), (lo2, hi2, n2) in zip(spans, spans[1:]):
        if lo2 < hi1:
            raise ProgramError(f"args {n1} and {n2} overlap in DDR: bytes [{lo1}, {hi1}) and [{lo2}, {hi2})")


def _check_groups(k) -> None:
    """The multicast DMAs of one named transfer group copy one source box, each to another memory."""
    first: dict[int, int] = {}
    dests: dict[int, set] = {}
    for n, ins in enumerate(k.instructions):
        if type(ins) is not Dma or not ins.group:
            continue
        f = first.setdefault(ins.group, n)
        head = k.instructions[f]
        if (ins.src, ins.shape) != (head.src, head.shape):
            raise ProgramError(f"kernel {k.name} instruction {n} (dma): its transfer group {ins.group} copies "
                               f"another box than instruction {f}: one transfer reads one source box")
        if (ins.dst.mem, ins.dst.index) in dests.setdefault(ins.group, set()):
            raise ProgramError(f"kernel {k.name} instruction {n} (dma): transfer group {ins.group} already writes "
                               f"{_place(ins.dst)}: a transfer writes each memory once")
        dests[ins.group].add((ins.dst.mem, ins.dst.index))


def validate(program: Program) -> None:
    """Raise ``ProgramError`` on the first problem (replicas included); return None for a valid program."""
    program = program.expanded()
    _check_args(program)
    checker = _Checker(program)
    if program.kernels and program.kernels[0].chained:
        raise ProgramError(f"kernel {program.kernels[0].name}: the first kernel of a program is launched, not chained")
    for k in program.kernels:
        for c in k.cores:
            if not 0 <= c < checker.cores:
                raise ProgramError(f"kernel {k.name}: core {c} does not exist (there are {checker.cores})")
        firsts = [m.first for m in k.layers]
        if any(not 0 <= f < len(k.instructions) for f in firsts) or firsts != sorted(set(firsts)):
            raise ProgramError(f"kernel {k.name}: layer marks must start at increasing instruction indices "
                               f"below {len(k.instructions)}, not {firsts}")
        kernel_cores = frozenset(k.cores)
        check = checker.instruction
        for n, ins in enumerate(k.instructions):
            problem = check(ins, n, kernel_cores)
            if problem:
                raise ProgramError(f"kernel {k.name} instruction {n} ({type(ins).__name__.lower()}): {problem}")
        _check_groups(k)
