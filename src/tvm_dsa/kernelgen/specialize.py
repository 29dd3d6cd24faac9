"""DSA programs for kernels with symbolic dims: one program per concrete shape, built on first use.

A DSA program is a flat list of instructions per tile (no loops, addresses resolved), so it is
specific to one shape. A kernel whose shapes are symbolic (a dynamic model's fused PrimFunc,
after ``ApplyRDP``) is therefore carried in the executable as TIR (``SymbolicKernel.serialize``)
and turned into a program per shape at run time: the symbols are read off the call's tensors and
scalar arguments, substituted into the PrimFunc (``specialize``), and the result goes through
exactly the lowering and code generation a static kernel of that shape goes through
(``lower_kernel`` + ``build_program``). Programs are cached per (kernel, shapes); the Relax
module is compiled once.
"""

from __future__ import annotations

import collections
import json
import threading
import time
from dataclasses import dataclass, field
from functools import lru_cache

import tvm
import tvm_ffi
from tvm import tirx

from tvm_dsa.hardware import Hardware
from tvm_dsa.isa import Program
from tvm_dsa.runtime import timing_cycles
from tvm_dsa.kernel.analysis import Unsupported
from tvm_dsa.tir_passes.tile import anchor_info
from tvm_dsa.tiling import lower_kernel
from tvm_dsa.emit.emitter import build_program

_FOLDABLE = (tirx.Add, tirx.Sub, tirx.Mul, tirx.FloorDiv, tirx.FloorMod, tirx.Min, tirx.Max)


class ShapeMismatch(ValueError):
    """A call's tensors do not have the shapes its kernel's symbols imply."""


def is_buffer(param) -> bool:
    return hasattr(param.ty, "shape")


def free_symbols(func: tirx.PrimFunc) -> list:
    """The symbolic dims of ``func``'s signature: scalar parameters and variables in its buffers'
    shapes, in first-appearance order."""
    seen: dict = {}
    for p in func.params:
        for v in ([v for d in p.shape for v in tirx.analysis.undefined_vars(d)] if is_buffer(p) else [p]):
            seen.setdefault(v, None)
    return list(seen)


def bind(func: tirx.PrimFunc, shapes: list[tuple], scalars: list[int]) -> dict:
    """Symbol -> value from a call's buffer shapes (in buffer-parameter order) and its scalar
    arguments (in scalar-parameter order); every shape is checked against what the symbols imply."""
    buffers = [p for p in func.params if is_buffer(p)]
    env = {p: int(v) for p, v in zip((p for p in func.params if not is_buffer(p)), scalars, strict=True)}
    for p, shape in zip(buffers, shapes, strict=True):
        if len(shape) != len(p.shape):
            raise ShapeMismatch(f"{p.name}: rank {len(shape)}, the kernel expects {len(p.shape)}")
        for d, n in zip(p.shape, shape):
            if isinstance(d, tirx.Var):
                env.setdefault(d, int(n))
    analyzer = tvm.sym.Analyzer()
    for p, shape in zip(buffers, shapes):
        want = [_value(d, env, analyzer) for d in p.shape]
        if want != [int(n) for n in shape]:
            raise ShapeMismatch(f"{p.name} has shape {tuple(shape)}, but the kernel's symbols give {tuple(want)}")
    return env


def _value(expr, env, analyzer) -> int:
    folded = analyzer.simplify(_substitute(expr, _imms(env)))
    if not isinstance(folded, tirx.IntImm):
        raise ShapeMismatch(f"dim {expr} is not determined by the call's arguments")
    return int(folded)


def _substitute(node, imms: dict, *more):
    """``node`` with the variables of ``imms`` replaced (and the ``more`` callbacks applied)."""
    return tvm_ffi.structural_map(node, [(tirx.Var, lambda v: imms.get(v, v)), *more])


def _imm(var, n: int):
    return tirx.IntImm(var.ty.dtype, n)


def _imms(env: dict) -> dict:
    return {v: _imm(v, n) for v, n in env.items()}


def specialize(func: tirx.PrimFunc, env: dict) -> tirx.PrimFunc:
    """``func`` with every symbol of ``env`` replaced by its value: scalar parameters dropped,
    buffer shapes, loop extents and indices folded to constants (what ``LegalizeOps`` would have
    produced for that shape)."""
    scalars = {p: _imm(p, env[p]) for p in func.params if not is_buffer(p)}
    f = func.specialize(scalars) if scalars else func
    imms = _imms(env)
    analyzer = tvm.sym.Analyzer()

    def fold(e):
        return analyzer.simplify(e) if not tirx.analysis.undefined_vars(e) else e

    f = _substitute(f, imms, (_FOLDABLE, fold))
    return tvm.tirx.transform.StmtSimplify()(tvm.IRModule({"main": f}))["main"]


@dataclass(frozen=True)
class SymbolicKernel:
    """What the executable carries for a kernel with symbolic dims: its PrimFunc and the chip;
    ``whole_rows``: no tile splits a row of the output (it overwrites an input it reads by rows,
    ``arena.PlanArena``)."""

    name: str
    func: tirx.PrimFunc
    hw: Hardware
    whole_rows: bool = False

    def serialize(self) -> str:
        return json.dumps({"name": self.name, "hardware": self.hw.to_dict(), "func": tvm.ir.save_json(self.func),
                           "whole_rows": self.whole_rows})

    @staticmethod
    @lru_cache(maxsize=1024)
    def deserialize(text: str) -> "SymbolicKernel":
        d = json.loads(text)
        return SymbolicKernel(d["name"], tvm.ir.load_json(d["func"]), Hardware.from_dict(d["hardware"]),
                              d["whole_rows"])

    def program(self, env: dict, parallel: bool = True) -> Program:
        """The DSA program of this kernel at the shapes ``env`` gives its symbols (lowered with the
        largest LB tiling that fits, as a static kernel of that shape is; ``parallel``: split
        further so every core gets a tile)."""
        return build_program(lower_kernel(specialize(self.func, env), self.hw, parallel=parallel,
                                          whole_rows=self.whole_rows)[0], self.hw, self.name)


def shape_class(func: tirx.PrimFunc) -> str | None:
    """``thin``, ``regular`` or ``fat`` for a contraction (conv / matmul) by the aspect of its
    output as a matrix — rows M (the spatial loops only the data operand uses, and batch loops)
    over columns N (those only the weights use): M < N / 4 thin, M > 4 N fat; None for other
    kernels (a static ``func``)."""
    info = anchor_info(func)
    if info.kind.kind != "mme":
        return None
    m = n = 1
    for extent, role in zip(info.spatial, info.roles):
        if role == "N":
            n *= extent
        else:
            m *= extent
    return "thin" if 4 * m < n else "fat" if m > 4 * n else "regular"


@dataclass
class Versions:
    """The programs built so far per kernel and shape (the last ``keep``), and the time spent
    building them; thread-safe (a program is built once, by the first call that needs it).

    Multi-version code (seed 001 §4.4.2), with ``multi_version``: a contraction's lowering has two
    versions, every core a tile (``parallel``) or the largest tile that fits (``whole``: fewer,
    larger tiles, less per-tile overhead). The first shape of each (kernel, shape class) builds
    both and simulates them (timing only); the faster becomes that class's version, which later
    shapes of the class are built with directly."""

    programs: collections.OrderedDict = field(default_factory=collections.OrderedDict)  # (kernel text, shapes, scalars) -> Program
    chosen: dict = field(default_factory=dict)    # (kernel text, class) -> "parallel" or "whole"
    seconds: float = 0.0
    multi_version: bool = True
    keep: int = 1024
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def get(self, text: str, shapes: tuple, scalars: tuple) -> Program:
        key = (text, shapes, scalars)
        with self._lock:
            if key in self.programs:
                self.programs.move_to_end(key)
                return self.programs[key]
            kernel = SymbolicKernel.deserialize(text)
            start = time.perf_counter()
            try:
                program = self._build(text, kernel, bind(kernel.func, list(shapes), list(scalars)))
            except Unsupported as err:
                raise Unsupported(f"kernel {kernel.name} at shapes {list(shapes)}: {err}") from None
            self.seconds += time.perf_counter() - start
            self.programs[key] = program
            while len(self.programs) > self.keep:
                self.programs.popitem(last=False)
            return program

    def clear(self) -> None:
        """Forget every program and choice (a benchmark's fresh start)."""
        with self._lock:
            self.programs.clear()
            self.chosen.clear()

    def _build(self, text: str, kernel: SymbolicKernel, env: dict) -> Program:
        cls = shape_class(specialize(kernel.func, env)) if self.multi_version else None
        if cls is None:
            return kernel.program(env)
        if (text, cls) in self.chosen:
            return kernel.program(env, parallel=self.chosen[text, cls] == "parallel")
        versions = {v: kernel.program(env, parallel=v == "parallel") for v in ("parallel", "whole")}
        best = min(versions, key=lambda v: timing_cycles(versions[v]))
        self.chosen[text, cls] = best
        while len(self.chosen) > self.keep:
            self.chosen.pop(next(iter(self.chosen)))
        return versions[best]


VERSIONS = Versions()  # the process's cache (what ``tvm_dsa.execute_shaped`` calls use)
