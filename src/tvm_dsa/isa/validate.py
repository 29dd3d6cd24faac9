"""Static checks of a program against its hardware: every error names the kernel and instruction."""

from __future__ import annotations

from .instructions import (
    DTYPES,
    MEMORIES,
    OP_ARITY,
    REDUCE_OPS,
    VEC_OPS,
    VME_OPS,
    Dma,
    Fill,
    Mme,
    Operand,
    Reduce,
    Vector,
    operands,
)
from .program import Program, ProgramError


def memory_size(hw: dict, ddr_bytes: int, mem: str) -> int:
    return {"ddr": ddr_bytes, "gb": hw["gb_bytes"], "lb": hw["lb_bytes"]}[mem]


def _check_operand(where: str, o: Operand, shape, hw: dict, ddr_bytes: int, role: str) -> None:
    if o.mem not in MEMORIES:
        raise ProgramError(f"{where}: {role} memory {o.mem!r} is not one of {MEMORIES}")
    if o.dtype not in DTYPES:
        raise ProgramError(f"{where}: {role} dtype {o.dtype!r} is not one of {sorted(DTYPES)}")
    if len(o.strides) != len(shape):
        raise ProgramError(f"{where}: {role} has {len(o.strides)} strides for a {len(shape)}-d shape")
    if any(s < 0 for s in o.strides):
        raise ProgramError(f"{where}: {role} has a negative stride {o.strides}")
    count = {"ddr": 1, "gb": hw["clusters"], "lb": hw["clusters"] * hw["cores_per_cluster"]}[o.mem]
    if not 0 <= o.index < count:
        raise ProgramError(f"{where}: {role} {o.mem}[{o.index}] does not exist (there are {count})")
    if o.offset % o.itemsize:
        raise ProgramError(f"{where}: {role} offset {o.offset} is not aligned to {o.dtype}")
    lo, hi = o.extent_bytes(shape)
    size = memory_size(hw, ddr_bytes, o.mem)
    if lo < 0 or hi > size:
        raise ProgramError(
            f"{where}: {role} touches {o.mem}[{o.index}] bytes [{lo}, {hi}) outside its {size} bytes"
        )


def _injective(o: Operand, shape, skip=()) -> bool:
    """True when distinct box points (ignoring dims in ``skip``) map to distinct elements."""
    dims = sorted((s, n) for d, (s, n) in enumerate(zip(o.strides, shape)) if n > 1 and d not in skip)
    span = 1
    for s, n in dims:
        if s < span:
            return False
        span = s * (n - 1) + span
    return True


def validate(program: Program) -> None:
    """Raise ``ProgramError`` on the first problem; return None for a valid program."""
    hw = program.hardware
    cores = hw["clusters"] * hw["cores_per_cluster"]
    vector_dtypes = ("float16", "float32")
    for a in program.args:
        if a.role not in ("input", "output"):
            raise ProgramError(f"arg {a.name}: role {a.role!r} is not input/output")
        if a.offset < 0 or a.offset + a.nbytes > program.ddr_bytes:
            raise ProgramError(f"arg {a.name}: DDR bytes [{a.offset}, {a.offset + a.nbytes}) outside {program.ddr_bytes}")
    for k in program.kernels:
        for c in k.cores:
            if not 0 <= c < cores:
                raise ProgramError(f"kernel {k.name}: core {c} does not exist (there are {cores})")
        for n, ins in enumerate(k.instructions):
            where = f"kernel {k.name} instruction {n} ({type(ins).__name__.lower()})"
            if ins.core not in k.cores:
                raise ProgramError(f"{where}: core {ins.core} is not among the kernel's cores {list(k.cores)}")
            if any(e <= 0 for e in ins.shape):
                raise ProgramError(f"{where}: empty or negative shape {ins.shape}")
            for d in ins.deps:
                if not 0 <= d < n:
                    raise ProgramError(f"{where}: dependency {d} is not an earlier instruction")
            srcs, dst = operands(ins)
            for role, o in [("dst", dst)] + [(f"src{j}", s) for j, s in enumerate(srcs)]:
                _check_operand(where, o, ins.shape, hw, program.ddr_bytes, role)
            for o in [dst] + srcs:
                if o.mem == "lb" and o.index != ins.core and not isinstance(ins, Dma):
                    raise ProgramError(f"{where}: compute reads or writes lb[{o.index}] of another core")
            skip = [d for d, r in enumerate(getattr(ins, "reduce", ())) if r]
            if not _injective(dst, ins.shape, skip):
                raise ProgramError(f"{where}: dst strides {dst.strides} write an element twice")
            if any(dst.strides[d] for d in skip):
                raise ProgramError(f"{where}: dst must have stride 0 on reduction dims")
            if isinstance(ins, Dma) and ins.dst.dtype != ins.src.dtype:
                raise ProgramError(f"{where}: DMA cannot convert {ins.src.dtype} to {ins.dst.dtype}")
            if isinstance(ins, Fill) and dst.mem != "lb":
                raise ProgramError(f"{where}: fill writes only the core's LB")
            if isinstance(ins, Mme):
                if len(ins.reduce) != len(ins.shape):
                    raise ProgramError(f"{where}: reduce mask length differs from the shape")
                if ins.a.dtype != hw["mme"]["dtype"] or ins.b.dtype != hw["mme"]["dtype"]:
                    raise ProgramError(f"{where}: MME operands must be {hw['mme']['dtype']}")
                if dst.dtype != hw["mme"]["accum_dtype"]:
                    raise ProgramError(f"{where}: MME accumulates into {hw['mme']['accum_dtype']}")
            if isinstance(ins, (Vector, Reduce)):
                allowed = {"vme": VME_OPS, "vec": VEC_OPS}.get(ins.unit)
                if allowed is None:
                    raise ProgramError(f"{where}: unit {ins.unit!r} is not vme/vec")
                if any(o.dtype not in vector_dtypes for o in [dst] + srcs):
                    raise ProgramError(f"{where}: vector operands must be float16/float32")
            if isinstance(ins, Vector):
                if ins.op not in allowed:
                    raise ProgramError(f"{where}: op {ins.op!r} does not run on the {ins.unit}")
                if len(ins.srcs) != OP_ARITY[ins.op]:
                    raise ProgramError(f"{where}: op {ins.op!r} takes {OP_ARITY[ins.op]} sources")
            if isinstance(ins, Reduce):
                if ins.op not in REDUCE_OPS:
                    raise ProgramError(f"{where}: reduction {ins.op!r} is not one of {sorted(REDUCE_OPS)}")
                if ins.unit == "vme" and ins.op not in ("sum", "max", "min"):
                    raise ProgramError(f"{where}: reduction {ins.op!r} does not run on the vme")
