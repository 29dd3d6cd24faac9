"""What the emitter is told: a kernel's layers (``Layer``: a lowered PrimFunc read into the kernel
IR, with its LB plan and the tensor behind each parameter) and where each tensor lives (a
``Region`` of one memory, or ``Pieces`` spread over several). The kernel generators build them, the
emitter (``emitter``), its dependency tokens (``deps``) and its compression (``compress``) read
them; they hold no emission state.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from tvm_dsa import isa
from tvm_dsa.hardware import Hardware
from tvm_dsa.kernel.analysis import Unsupported
from tvm_dsa.kernel.ir import Access, CodegenError, KernelIR, plan_lb, read_kernel


@dataclass(frozen=True)
class Region:
    """Where a tensor, or the box of it that a kernel keeps, lives: element ``origin + i`` of the
    box ``extents`` sits at ``base`` + row-major offset of ``i`` in memory ``mem``. ``index`` is
    the GB's cluster or the LB's core (0 for DDR)."""

    mem: str
    index: int
    base: int
    origin: tuple[int, ...]
    extents: tuple[int, ...]
    dtype: str

    @classmethod
    def whole(cls, mem: str, index: int, base: int, shape, dtype: str) -> "Region":
        return cls(mem, index, base, (0,) * len(shape), tuple(shape), dtype)

    @property
    def nbytes(self) -> int:
        return isa.DTYPES[self.dtype] * prod(self.extents)


@dataclass
class Pieces:
    """A tensor stored in pieces (a grid over its dims): piece ``(i0, i1, ...)`` is the box between
    ``cuts[d][i_d - 1]`` and ``cuts[d][i_d]`` along every dim ``d`` (0 and the extent implied at
    the ends) and lives in ``cells[(i0, i1, ...)]``: a box region in some core's LB, or the
    tensor's whole DDR region. What SET keeps on chip: a feature map spread over its consumers'
    LBs, weights pinned in their layer's LBs. DMA boxes touching it are split along the cuts
    (each such access must index a cut dim by loops with positive coefficients, or not vary in
    it).
    Cells change as the program goes (a chunk placed, a piece freed): the emitter reads them
    when it emits."""

    shape: tuple[int, ...]
    cuts: tuple[tuple[int, ...], ...]  # per dim: interior cut points, increasing
    cells: dict
    copies: dict = field(default_factory=dict)  # (cell index, core) -> that core's own copy of a piece

    def cell_index(self, point) -> tuple[int, ...]:
        return tuple(bisect.bisect_right(c, x) for c, x in zip(self.cuts, point))

    def cell(self, point, core: int | None = None) -> Region:
        index = self.cell_index(point)
        return self.copies.get((index, core)) or self.cells[index]

    def split(self, acc: Access, env, start, extent, core: int | None = None):
        """The sub-boxes of the stage box [start, start + extent) that each lie in one piece, with
        the piece's region (``core``'s own copy where it has one): [(start, extent, region)].
        Along a cut dim a box splits where its indices cross a cut: a strided access (a stride-2
        1 x 1 convolution's pixels) between its strided indices; one indexing the dim by several
        loops (a window's output rows and kernel rows) first into slices of one value of each
        loop but the longest, where the box crosses a cut."""
        boxes = [(list(start), list(extent))]
        for d, cuts in enumerate(self.cuts):
            loops = [(i, c) for i, c in enumerate(acc.inner[d]) if c]
            if not cuts or not loops:
                continue
            if any(c < 1 for _, c in loops):
                raise CodegenError(f"an access to a tensor kept in pieces indexes dim {d} by "
                                   f"{acc.inner[d]}, not by loops with positive coefficients")
            out = []
            for s, e in boxes:
                lo = acc.point(env, s)[d]  # the box's first index along d (coefficients positive)
                if not any(lo < x <= lo + sum(c * (e[i] - 1) for i, c in loops) for x in cuts):
                    out.append((s, e))
                    continue
                i, step = max(loops, key=lambda loop: e[loop[0]])
                for s1, e1 in _slices(s, e, [j for j, _ in loops if j != i]):
                    out += _split_run(s1, e1, i, step, acc.point(env, s1)[d], cuts)
            boxes = out
        return [(s, e, self.cell(acc.point(env, s), core)) for s, e in boxes]


def _slices(start: list, extent: list, loops: list[int]) -> list[tuple[list, list]]:
    """The boxes of one value of each of ``loops`` (the other loops whole) that tile a box."""
    out = [(start, extent)]
    for j in loops:
        out = [(s[:j] + [s[j] + k] + s[j + 1:], e[:j] + [1] + e[j + 1:]) for s, e in out for k in range(e[j])]
    return out


def _split_run(start: list, extent: list, i: int, step: int, lo: int, cuts) -> list[tuple[list, list]]:
    """A box whose loop ``i`` alone walks a cut dim, from index ``lo`` by ``step``, split where
    its indices cross the ``cuts``."""
    out, k = [], 0
    for cut in (x for x in cuts if lo < x <= lo + step * (extent[i] - 1)):
        upto = -(-(cut - lo) // step)  # the first iteration at or past the cut
        if upto > k:
            out.append((start[:i] + [start[i] + k] + start[i + 1:], extent[:i] + [upto - k] + extent[i + 1:]))
            k = upto
    out.append((start[:i] + [start[i] + k] + start[i + 1:], extent[:i] + [extent[i] - k] + extent[i + 1:]))
    return out


@dataclass(frozen=True)
class Layer:
    """One lowered PrimFunc in a kernel: its IR, its LB plan and the tensor behind each parameter."""

    name: str
    ir: KernelIR
    plan: object  # LBPlan
    args: dict  # parameter name -> tensor name

    @classmethod
    def of(cls, func, hw: Hardware, name: str, tensors=None, lb_bytes: int | None = None) -> "Layer":
        ir = read_kernel(func)
        args = dict(zip((p[0] for p in ir.params), tensors or (p[0] for p in ir.params)))
        return cls(name, ir, plan_lb(ir, hw, lb_bytes), args)


def stored_dtypes(layers, hw: Hardware, views: dict | None = None) -> dict[str, str]:
    """The type each tensor of a kernel of several ``layers`` (a stitched sub-graph, a SET tree;
    ``(name, KernelIR, parameter -> tensor)`` each) is stored in, in DDR, the GB or an LB: the
    one its layers store it in (``KernelIR.ddr_dtype``: the chip's storage type in a float model;
    in a quantized model's integer kernels each tensor's own, int8 activations, float32 tables and
    model inputs or outputs), so that a tensor one layer writes is read as written. ``views``: a
    reshaped tensor -> the tensor whose bytes it reinterprets (the same type). Raises
    ``Unsupported`` where two layers store one tensor at different types (on an fp16 chip, a
    float tensor between an integer kernel, which stores it at float32, and a float layer, fp16)."""
    views = views or {}

    def root(t: str) -> str:
        while t in views:
            t = views[t]
        return t

    found: dict = {}  # tensor -> (type, the first layer storing it so)
    for name, ir, args in layers:
        for pname, *_ in ir.params:
            t, dtype = root(args[pname]), ir.ddr_dtype(pname, hw)
            first = found.setdefault(t, (dtype, name))
            if first[0] != dtype:
                raise Unsupported(f"tensor {t} is stored as {first[0]} by layer {first[1]} and as {dtype} by {name}")
    return {t: found[root(t)][0] for t in [*found, *views] if root(t) in found}


def prod(shape) -> int:
    """The number of elements of a box of extents ``shape``."""
    n = 1
    for e in shape:
        n *= int(e)
    return n


def row_major(shape) -> list[int]:
    """Element strides of a row-major array of extents ``shape``."""
    strides, n = [], 1
    for e in reversed(list(shape)):
        strides.append(n)
        n *= int(e)
    return strides[::-1]
