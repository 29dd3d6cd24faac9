"""Assembler-level text form of a program (the disassembler), one instruction per line.

    kernel fused_conv2d_add_relu cores=0..7
      12 c3 mme   [4,32,8,16,3,3] r=.....rr dst=lb3+0x0:f32[..] a=lb3+0x4000:f16[..] b=... acc @7,9
"""

from __future__ import annotations

from tvm_dsa.isa.instructions import Dma, Fill, Mme, Operand, Reduce, Vector
from tvm_dsa.isa.program import Program

_SHORT = {"float16": "f16", "float32": "f32", "int8": "i8", "int32": "i32"}


def fmt_operand(o: Operand | float) -> str:
    if not isinstance(o, Operand):
        return f"#{o:g}"
    where = "ddr" if o.mem == "ddr" else f"{o.mem}{o.index}"
    return f"{where}+{o.offset:#x}:{_SHORT[o.dtype]}{list(o.strides)}"


def fmt_instruction(n: int, ins) -> str:
    shape = ",".join(str(s) for s in ins.shape)
    head = f"{n:5d} c{ins.core:<3d}"
    if isinstance(ins, Dma):
        body = f"{'pdma' if ins.prefetch else 'dma':<7s}[{shape}] {fmt_operand(ins.dst)} <- {fmt_operand(ins.src)}"
    elif isinstance(ins, Fill):
        body = f"fill   [{shape}] {fmt_operand(ins.dst)} <- #{ins.value:g}"
    elif isinstance(ins, Mme):
        mask = "".join("r" if r else "." for r in ins.reduce)
        op = "+=" if ins.accumulate else "="
        body = (f"mme    [{shape}] r={mask} {fmt_operand(ins.dst)} {op} "
                f"{fmt_operand(ins.a)} * {fmt_operand(ins.b)}")
    elif isinstance(ins, Vector):
        srcs = ", ".join(fmt_operand(s) for s in ins.srcs)
        body = f"{ins.unit:<4s}.{ins.op:<7s}[{shape}] {fmt_operand(ins.dst)} <- {srcs}"
    else:
        assert isinstance(ins, Reduce)
        mask = "".join("r" if r else "." for r in ins.reduce)
        op = f"{ins.op}=" if ins.accumulate else "="
        body = f"{ins.unit:<4s}.r{ins.op:<6s}[{shape}] r={mask} {fmt_operand(ins.dst)} {op} {fmt_operand(ins.src)}"
    deps = f"  @{','.join(str(d) for d in ins.deps)}" if ins.deps else ""
    return f"{head} {body}{deps}"


def disassemble(program: Program) -> str:
    lines = [f"; DSA program {program.name!r} v{program.version} for {program.hardware['name']}, "
             f"DDR {program.ddr_bytes} bytes"]
    for a in program.args:
        lines.append(f"; {a.role:6s} {a.name} {a.dtype}{list(a.shape)} @ddr+{a.offset:#x}")
    for k in program.kernels:
        lines.append(f"kernel {k.name} cores={','.join(str(c) for c in k.cores)}")
        lines.extend(fmt_instruction(n, ins) for n, ins in enumerate(k.instructions))
    return "\n".join(lines) + "\n"
