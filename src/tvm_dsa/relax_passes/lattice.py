"""The lattice of Rank and Dimension Propagation (seed 001 §4.1, Fig. 2, Table 4).

One element, ``Dim``, describes one integer the analysis tracks — a dimension of a shape or an
element of a small integer tensor — as one of, from top to bottom::

    undef (⊤)   nothing known yet
    known constant         4
    symbolic constant      S              (a TIR variable: a function input's dim, or a name
                                           given where a value appears at run time)
    op-inferred constant   (S * 4) // 2   (an expression of the above)
    nac (⊥)     not a constant: differs between paths or cannot be known before execution

The three middle levels are incomparable with each other except by equality, so the meet is
``x ∧ ⊤ = x``, ``x ∧ ⊥ = ⊥``, ``x ∧ y = x`` if x = y (provably, as TIR expressions) else ⊥.

``Dims`` is the product lattice over a tuple of ``Dim`` with its own ⊤ (the length is not known
yet) and ⊥ (the length cannot be known): a shape is its rank plus its dims, a small integer
tensor's value is its elements. ``Fact`` pairs the two maps of the seed, S (shape) and V (value),
for one Relax variable; a tuple variable's fact has one fact per field.
"""

from __future__ import annotations

import enum
import re
import threading
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import tirx

_THREAD = threading.local()


def _analyzer() -> tvm.sym.Analyzer:
    """This thread's analyzer with no bounds known (an analyzer is not safe to share between
    threads)."""
    if not hasattr(_THREAD, "analyzer"):
        _THREAD.analyzer = tvm.sym.Analyzer()
    return _THREAD.analyzer


class Kind(enum.IntEnum):
    UNDEF = 0     # ⊤
    KNOWN = 1     # known constant
    SYMBOLIC = 2  # symbolic constant
    EXPR = 3      # op-inferred constant
    NAC = 4       # ⊥


@dataclass(frozen=True, eq=False)
class Dim:
    kind: Kind
    expr: tirx.PrimExpr | None = None  # an IntImm, a Var or an expression; None for ⊤ and ⊥

    @staticmethod
    def of(value, analyzer=None) -> "Dim":
        """The element for an int or a TIR expression, simplified (by ``analyzer`` if given:
        the caller's, which may know bounds of the variables)."""
        if isinstance(value, (int, bool)) or hasattr(value, "__index__"):
            return Dim(Kind.KNOWN, tirx.IntImm("int64", int(value)))
        expr = (analyzer or _analyzer()).simplify(value)
        if isinstance(expr, tirx.IntImm):
            return Dim(Kind.KNOWN, tirx.IntImm("int64", int(expr.value)))
        return Dim(Kind.SYMBOLIC if isinstance(expr, tirx.Var) else Kind.EXPR, expr)

    @property
    def determined(self) -> bool:
        """Known statically, as a number or an expression (not ⊤ or ⊥)."""
        return Kind.UNDEF < self.kind < Kind.NAC

    @property
    def value(self) -> int:
        if self.kind is not Kind.KNOWN:
            raise ValueError(f"{self} is not a known constant")
        return int(self.expr.value)

    def __eq__(self, other) -> bool:
        if not isinstance(other, Dim) or self.kind != other.kind:
            return False
        if self.expr is None or self.expr.same_as(other.expr):
            return True
        return tvm_ffi.structural_equal(self.expr, other.expr) or _analyzer().can_prove_equal(
            self.expr, other.expr)

    def __hash__(self) -> int:
        return hash((self.kind, self.value if self.kind is Kind.KNOWN else None))

    def __str__(self) -> str:
        return {Kind.UNDEF: "⊤", Kind.NAC: "⊥"}.get(self.kind) or show(self.expr)

    __repr__ = __str__

    def meet(self, other: "Dim") -> "Dim":
        if self.kind is Kind.UNDEF:
            return other
        if other.kind is Kind.UNDEF or self == other:
            return self
        return NAC


def show(expr) -> str:
    """A TIR expression as text, integers without their ``T.int64(...)``."""
    return _INT64.sub(r"\1", str(expr))


_INT64 = re.compile(r"T\.int64\((-?\d+)\)")

UNDEF = Dim(Kind.UNDEF)
NAC = Dim(Kind.NAC)


@dataclass(frozen=True)
class Dims:
    """A tuple of elements of known length, or ⊤ / ⊥ for the whole tuple."""

    items: tuple[Dim, ...] | None = None
    undef: bool = False  # with items None: ⊤ if True, ⊥ if False

    @staticmethod
    def of(values, analyzer=None) -> "Dims":
        return Dims(tuple(v if isinstance(v, Dim) else Dim.of(v, analyzer) for v in values))

    @property
    def known(self) -> bool:
        """The length (for a shape: the rank) is known."""
        return self.items is not None

    @property
    def determined(self) -> bool:
        """Every element is known statically."""
        return self.items is not None and all(d.determined for d in self.items)

    def __len__(self) -> int:
        if self.items is None:
            raise ValueError(f"{self} has no known length")
        return len(self.items)

    def __getitem__(self, i) -> Dim:
        return self.items[i]

    def __iter__(self):
        return iter(self.items)

    def meet(self, other: "Dims") -> "Dims":
        if self.items is None and self.undef:
            return other
        if other.items is None and other.undef:
            return self
        if self.items is None or other.items is None or len(self.items) != len(other.items):
            return DIMS_NAC
        return Dims(tuple(a.meet(b) for a, b in zip(self.items, other.items)))

    def __str__(self) -> str:
        if self.items is None:
            return "⊤" if self.undef else "⊥"
        return "(" + ", ".join(map(str, self.items)) + ("," if len(self.items) == 1 else "") + ")"


DIMS_UNDEF = Dims(None, True)
DIMS_NAC = Dims(None, False)


@dataclass(frozen=True)
class Fact:
    """What RDP knows of one variable: its shape (S map) and its value (V map). Values are
    tracked for small integer tensors, shapes and integer scalars; elsewhere the value is ⊥
    (data). A tuple's fact has the fields' facts instead."""

    shape: Dims = DIMS_UNDEF
    value: Dims = DIMS_UNDEF
    fields: tuple["Fact", ...] | None = None

    @property
    def undef(self) -> bool:
        return self == FACT_UNDEF

    def meet(self, other: "Fact") -> "Fact":
        if self.undef:
            return other
        if other.undef:
            return self
        fields = None  # not a tuple, or tuples of different lengths: no fields (⊥)
        if self.fields is not None and other.fields is not None and len(self.fields) == len(other.fields):
            fields = tuple(a.meet(b) for a, b in zip(self.fields, other.fields))
        return Fact(self.shape.meet(other.shape), self.value.meet(other.value), fields)

    @property
    def pending(self) -> bool:
        """Some element is still ⊤."""
        if self.fields is not None:
            return any(f.pending for f in self.fields)
        return any(d.undef or (d.known and any(x.kind is Kind.UNDEF for x in d)) for d in (self.shape, self.value))

    def opened(self) -> "Fact":
        """The fact with its ⊥ elements made ⊤: what it still says once "not a constant" is
        read as "no information" (a backward constraint; a result computed from ⊤ inputs)."""
        def open_(dims: Dims) -> Dims:
            if not dims.known:
                return DIMS_UNDEF
            return Dims(tuple(UNDEF if d.kind is Kind.NAC else d for d in dims))
        fields = None if self.fields is None else tuple(f.opened() for f in self.fields)
        return Fact(open_(self.shape), open_(self.value), fields)

    def __str__(self) -> str:
        if self.fields is not None:
            return "(" + ", ".join(map(str, self.fields)) + ")"
        value = "" if self.value.items is None and not self.value.undef else f" = {self.value}"
        return f"{self.shape}{value}"


FACT_UNDEF = Fact()
FACT_NAC = Fact(DIMS_NAC, DIMS_NAC)
