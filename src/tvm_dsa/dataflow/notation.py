"""The relation-centric notation of seed 003 (TENET) as plain, validated declarations.

- ``TensorOp``: one statement in a perfect loop nest, e.g. ``Y[i,j] += A[i,k] * B[k,j]`` with the
  loop extents: its iteration domain D_S and its access relations A_S,F.
- ``Dataflow``: Θ_S,D, each loop instance to a space-time stamp, written as the seed writes it,
  ``PE[i % 8, j % 8] | T[i // 8, j // 8, i % 8 + j % 8 + k]`` (``{ S[i,j,k] -> (PE[..] | T[..]) }``
  and ``fl(x / c)`` are accepted too). Quasi-affine: floor-division and modulo by constants.
- ``Interconnect``: the PE-to-PE links as displacement vectors, with the stamps a value takes
  to cross one (1 for systolic / mesh links, 0 for a multicast wire).
- ``PEArray``: the array's shape, its interconnect and the scratchpad bandwidth.

These hold text and numbers only; ``relations`` turns them into isl sets and maps.
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass
from itertools import product
from typing import Mapping

from tvm_dsa.dataflow.expr import NotationError, constraint_to_isl, to_isl


def _subscripts(node: ast.Subscript) -> tuple[str, ...]:
    elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    return tuple(ast.unparse(e) for e in elts)


def _split_list(text: str, what: str) -> tuple[str, ...]:
    """The comma-separated expressions of ``text`` (commas inside calls do not split)."""
    if not text.strip():
        return ()
    try:
        tree = ast.parse(f"({text},)", mode="eval")
    except SyntaxError:
        raise NotationError(f"cannot parse the {what} {text!r}") from None
    return tuple(ast.unparse(e) for e in tree.body.elts)


@dataclass(frozen=True)
class Access:
    """``tensor[indices]``: one access of the statement, indices as quasi-affine expressions."""

    tensor: str
    indices: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.tensor}[{', '.join(self.indices)}]"


# Words of isl's syntax and of the dataflow notation.
_RESERVED = {"and", "or", "not", "mod", "floor", "ceil", "exists", "min", "max", "infty", "true", "false", "fl"}


@dataclass(frozen=True)
class TensorOp:
    """A statement ``output op= f(inputs)`` in a perfect nest of ``loops`` over ``0 <= loop < extent``,
    optionally cut by a constraint ``where`` (e.g. ``i + j + k <= 3``)."""

    name: str
    statement: str
    loops: tuple[str, ...]
    extents: tuple[int, ...]
    output: Access
    inputs: tuple[Access, ...]
    where: str = ""

    def __post_init__(self) -> None:
        reserved = sorted(set(self.loops) & _RESERVED)
        if reserved:
            raise NotationError(f"{self.name}: {', '.join(reserved)} cannot name a loop (reserved by the notation)")
        if len(self.loops) != len(self.extents) or len(set(self.loops)) != len(self.loops):
            raise NotationError(f"{self.name}: loops {self.loops} and extents {self.extents} do not pair up")
        for loop, extent in zip(self.loops, self.extents):
            if type(extent) is not int or extent < 1:
                raise NotationError(f"{self.name}: the extent of loop {loop!r} must be a positive integer, "
                                    f"got {extent!r}")
        for access in (self.output, *self.inputs):
            for index in access.indices:
                to_isl(index, self.loops)
        if self.output.tensor in {a.tensor for a in self.inputs}:
            raise NotationError(f"{self.name}: {self.output.tensor} is both read and written; "
                                "in-place statements are not modelled")
        if self.where:
            constraint_to_isl(self.where, self.loops)

    @classmethod
    def parse(cls, name: str, statement: str, sizes: Mapping[str, int], where: str = "") -> "TensorOp":
        """``TensorOp.parse("GEMM", "Y[i,j] += A[i,k] * B[k,j]", {"i": 4, "j": 4, "k": 8})``:
        the loops are the keys of ``sizes``, in order."""
        try:
            tree = ast.parse(statement.strip(), mode="exec")
        except SyntaxError:
            raise NotationError(f"{name}: cannot parse the statement {statement!r}") from None
        stmt = tree.body[0] if len(tree.body) == 1 else None
        target = (stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                  else stmt.target if isinstance(stmt, ast.AugAssign) else None)
        if not isinstance(target, ast.Subscript) or not isinstance(target.value, ast.Name):
            raise NotationError(f"{name}: expected 'Y[...] = ...' or 'Y[...] += ...', got {statement!r}")
        reads = sorted((n for n in ast.walk(stmt.value) if isinstance(n, ast.Subscript)),
                       key=lambda n: (n.lineno, n.col_offset))
        for n in reads:
            if not isinstance(n.value, ast.Name):
                raise NotationError(f"{name}: {ast.unparse(n)} does not subscript a tensor name")
        if not reads:
            raise NotationError(f"{name}: the statement {statement!r} reads no tensor")
        return cls(
            name=name, statement=statement.strip(), loops=tuple(sizes), extents=tuple(sizes.values()),
            output=Access(target.value.id, _subscripts(target)),
            inputs=tuple(Access(n.value.id, _subscripts(n)) for n in reads), where=where,
        )

    @property
    def tensors(self) -> tuple[str, ...]:
        """The output, then the inputs in the order the statement reads them."""
        return tuple(dict.fromkeys([self.output.tensor] + [a.tensor for a in self.inputs]))

    def accesses(self, tensor: str) -> tuple[Access, ...]:
        found = tuple(a for a in (self.output, *self.inputs) if a.tensor == tensor)
        if not found:
            raise NotationError(f"{self.name} has no tensor {tensor!r}; its tensors: {', '.join(self.tensors)}")
        return found

    @property
    def sizes(self) -> dict[str, int]:
        return dict(zip(self.loops, self.extents))


_DATAFLOW = re.compile(
    r"^\{?\s*(?:S\s*\[(?P<loops>[^\]]*)\]\s*->\s*)?\(?\s*PE\s*\[(?P<space>.*)\]\s*\|\s*T\s*\[(?P<time>.*)\]\s*\)?\s*\}?$",
    re.DOTALL,
)


@dataclass(frozen=True)
class Dataflow:
    """Θ_S,D = { S[n] -> (PE[space(n)] | T[time(n)]) }: where and when each loop instance runs.

    Instances run in the lexicographic order of their time stamps; a stamp is one cycle."""

    op: TensorOp
    space: tuple[str, ...]
    time: tuple[str, ...]
    name: str = ""

    def __post_init__(self) -> None:
        if not self.space or not self.time:
            raise NotationError(f"dataflow {self}: needs at least one space and one time dimension")
        for e in self.space + self.time:
            to_isl(e, self.op.loops)

    @classmethod
    def parse(cls, op: TensorOp, text: str, name: str = "") -> "Dataflow":
        m = _DATAFLOW.match(text.strip())
        if not m:
            raise NotationError(f"expected a dataflow 'PE[...] | T[...]', got {text!r}")
        if m["loops"] is not None:
            loops = _split_list(m["loops"], "loop list")
            if loops != op.loops:
                raise NotationError(f"the dataflow names the loops S[{', '.join(loops)}] but {op.name} has "
                                    f"S[{', '.join(op.loops)}]")
        return cls(op, _split_list(m["space"], "space stamp"), _split_list(m["time"], "time stamp"), name)

    def __str__(self) -> str:
        return f"PE[{', '.join(self.space)}] | T[{', '.join(self.time)}]"


@dataclass(frozen=True)
class Interconnect:
    """Links PE[p] -> PE[p + d] for each displacement ``d`` in ``offsets``; a value crossing a link
    reaches the next PE ``delay`` stamps later (1: a register on the link, as in a systolic array
    or a mesh; 0: a wire, as in a multicast bus)."""

    name: str
    offsets: tuple[tuple[int, ...], ...]
    delay: int = 1

    def __post_init__(self) -> None:
        if not self.offsets:
            raise NotationError(f"interconnect {self.name!r} has no links")
        if len({len(d) for d in self.offsets}) != 1:
            raise NotationError(f"interconnect {self.name!r}: offsets of different dimensions {self.offsets}")
        if any(not any(d) for d in self.offsets):
            raise NotationError(f"interconnect {self.name!r}: a zero offset links a PE to itself")
        if self.delay not in (0, 1):
            raise NotationError(f"interconnect {self.name!r}: delay must be 0 (wire) or 1 (register), "
                                f"got {self.delay!r}")
        if self.delay == 0 and any(d <= tuple(0 for _ in d) for d in self.offsets):
            # A value shared in the same stamp needs one PE to fetch it: links point forward.
            raise NotationError(f"interconnect {self.name!r}: same-stamp (delay 0) links must point to "
                                f"lexicographically larger PEs, got {self.offsets}")

    @property
    def ndim(self) -> int:
        return len(self.offsets[0])


def _unit(ndim: int, axis: int, step: int = 1) -> tuple[int, ...]:
    if not 0 <= axis < ndim:
        raise NotationError(f"axis {axis} is not an axis of a {ndim}-D array")
    return tuple(step if a == axis else 0 for a in range(ndim))


def systolic_1d(ndim: int = 1, axis: int = 0) -> Interconnect:
    """Values move one PE along ``axis`` per stamp."""
    return Interconnect(f"systolic-1d(axis {axis})" if ndim > 1 else "systolic-1d", (_unit(ndim, axis),))


def systolic_2d() -> Interconnect:
    """The seed's 2-D systolic array: PE[i,j] -> PE[i,j+1] and PE[i,j] -> PE[i+1,j]."""
    return Interconnect("systolic-2d", ((0, 1), (1, 0)))


def mesh(ndim: int = 2) -> Interconnect:
    """The seed's mesh NoC: every PE within distance 1 in each coordinate (diagonals included)."""
    return Interconnect("mesh", tuple(d for d in product((-1, 0, 1), repeat=ndim) if any(d)))


def multicast(k: int, ndim: int = 1, axes: tuple[int, ...] = (0,)) -> Interconnect:
    """The seed's 1-D multicast along each of ``axes``: a wire reaching the PEs up to ``k`` further
    along the axis in the same stamp (|i' - i| <= k; the value is fetched once, by the first PE of
    the run that needs it, and shared forward). ``axes=(0, 1)`` gives row and column buses."""
    if type(k) is not int or k < 1:
        raise NotationError(f"multicast distance must be a positive integer, got {k!r}")
    return Interconnect(f"multicast-{k}" + (f"(axes {', '.join(map(str, axes))})" if ndim > 1 else ""),
                        tuple(_unit(ndim, a, s) for a in axes for s in range(1, k + 1)), delay=0)


INTERCONNECTS = ("systolic-1d", "systolic-2d", "mesh", "multicast-K")


def interconnect(name: str, ndim: int) -> Interconnect:
    """The interconnect called ``name`` (one of ``INTERCONNECTS``) on an ``ndim``-D array;
    ``systolic-1d`` runs along axis 0, ``multicast-K`` along every axis."""
    if name == "systolic-1d":
        return systolic_1d(ndim)
    if name == "systolic-2d" and ndim == 2:
        return systolic_2d()
    if name == "mesh":
        return mesh(ndim)
    m = re.fullmatch(r"multicast-(\d+)", name)
    if m:
        return multicast(int(m[1]), ndim, tuple(range(ndim)))
    raise NotationError(f"unknown interconnect {name!r} for a {ndim}-D array; known: {', '.join(INTERCONNECTS)}")


@dataclass(frozen=True)
class PEArray:
    """A PE array of ``shape`` (one MAC per PE per stamp), its ``interconnect``, and the scratchpad's
    ``bandwidth`` to the array in tensor elements per stamp."""

    shape: tuple[int, ...]
    interconnect: Interconnect
    bandwidth: float

    def __post_init__(self) -> None:
        if not self.shape or any(type(n) is not int or n < 1 for n in self.shape):
            raise NotationError(f"PE array shape must be positive integers, got {self.shape!r}")
        if self.interconnect.ndim != len(self.shape):
            raise NotationError(f"interconnect {self.interconnect.name!r} is {self.interconnect.ndim}-D but the "
                                f"PE array {self.shape} is {len(self.shape)}-D")
        if not self.bandwidth > 0:
            raise NotationError(f"scratchpad bandwidth must be positive, got {self.bandwidth!r}")

    @property
    def size(self) -> int:
        return math.prod(self.shape)
