"""Which inputs of a TIR kernel its output may overwrite: the elementwise inputs and the row inputs.

An output may take an input's bytes (``PlanArena`` gives both one place in the arena when the
input dies at the call) when element ``e`` of the output depends on element ``e`` of that input
only, through blocks that each read and write at identical indices:

* the kernel writes one parameter (its output), in one block, and never reads it;
* the input has the output's shape and dtype (the same bytes at the same offsets);
* every block that reads the input is *pointwise*: spatial iterators only, each over
  ``[0, extent)`` of the buffers it touches, no predicate, the store and every load of the
  input at the iterators themselves, in order; and what it writes is the output or an
  intermediate whose every reader is pointwise in turn (a fused ``add → relu``, a residual add
  after a convolution).

Then each element of the input is read only where the same element of the output is computed,
before it is written. On the host (TVM's loops, in order) that holds per element; on the DSA
every tile loads exactly the input region it stores (the same indices), so no tile can read what
another tile wrote. An input read through a window (a convolution's input, a pooling, a
transpose) or by a reduction (softmax, layer norm) is not elementwise, even when the kernel
also has an elementwise input.

A *row input* is the same with rows for elements (a row: all dims but the last): row ``r`` of
the output depends on row ``r`` of the input only (a softmax or layer norm over the last axis, a
matmul whose output rows have the input's length). Its blocks may reduce; each stores at its
spatial iterators (over the whole buffer) and reads the input, and the intermediates it feeds
(rows, or one value per row), in the store's row. Overwriting such an input is safe where every
row is read whole before any of it is written: on the DSA when no tile splits a row (each tile
loads its rows, computes in the LB, then stores them: ``lower_kernel(whole_rows=True)``), not on
the host, where TVM's loops get there only through a whole-tensor temporary (softmax's
``exp``, a matmul's accumulator) and the bytes saved would be spent inside the kernel.

    out, inputs = elementwise_inputs(func)   # parameter indices; None when the kernel is not analysable
    out, inputs = row_inputs(func)           # a superset of the elementwise inputs
"""

from __future__ import annotations

from functools import lru_cache

import tvm
import tvm_ffi
from tvm import tirx
from tvm.s_tir import SBlockRealize

from tvm_dsa.kernel.analysis import Load


def _blocks(func: tirx.PrimFunc, rows: bool):
    """(block, stored buffer var, store indices, loads) of every leaf block, the block None where
    it cannot be part of a chain (a predicate, an iterator not from 0, a reduction unless
    ``rows``); None when a block with iterators is not a single store (nothing to decide from)."""
    out, ok = [], [True]

    def visit(realize):
        block = realize.block
        if isinstance(block.body, tirx.BufferStore):
            loads = []
            for stmt in (block.body, block.init):
                if stmt is not None:
                    tvm_ffi.structural_walk(stmt, [(Load, loads.append)])
            usable = (isinstance(realize.predicate, tirx.IntImm) and int(realize.predicate.value) == 1
                      and all((rows or iv.iter_type == 0) and isinstance(iv.dom.min, tirx.IntImm)
                              and int(iv.dom.min.value) == 0 for iv in block.iter_vars))
            out.append((block if usable else None, block.body.buffer, block.body.indices, loads))
        elif block.iter_vars:
            ok[0] = False

    tvm_ffi.structural_walk(func.body, [(SBlockRealize, visit)])
    return out if ok[0] else None


def _identity(block, indices, shape, analyzer) -> bool:
    """``indices`` are ``block``'s spatial iterators in order, each over the whole of ``shape``'s dim."""
    ivs = [iv for iv in block.iter_vars if iv.iter_type == 0]
    return (len(indices) == len(ivs) == len(shape)
            and all(i.same_as(iv.var) for i, iv in zip(indices, ivs))
            and all(analyzer.can_prove_equal(iv.dom.extent, d) for iv, d in zip(ivs, shape)))


@lru_cache(maxsize=4096)
def elementwise_inputs(func: tirx.PrimFunc) -> tuple[int, frozenset] | None:
    """(index of the output parameter, indices of the parameters it may overwrite element for
    element) of ``func``, or None when it does not write exactly one parameter or has blocks this
    cannot read."""
    return _inputs(func, rows=False)


@lru_cache(maxsize=4096)
def row_inputs(func: tirx.PrimFunc) -> tuple[int, frozenset] | None:
    """(index of the output parameter, indices of the parameters whose rows alone its rows depend
    on) of ``func`` (rank 2 or more), or None as for ``elementwise_inputs``."""
    return _inputs(func, rows=True)


def _inputs(func: tirx.PrimFunc, rows: bool) -> tuple[int, frozenset] | None:
    blocks = _blocks(func, rows)
    if blocks is None:
        return None
    params = [p for p in func.params if isinstance(p.ty, tirx.BufferType)]
    written = [p for p in params if any(buf.same_as(p) for _, buf, _, _ in blocks)]
    if len(written) != 1:
        return None
    out = written[0]
    analyzer = tvm.sym.Analyzer()
    shape = lambda buf: buf.ty.shape  # noqa: E731
    rank = len(shape(out))
    if sum(buf.same_as(out) for _, buf, _, _ in blocks) != 1 or any(
            ld.source.same_as(out) for _, _, _, loads in blocks for ld in loads) or (rows and rank < 2):
        return None

    def key(buf, indices):
        """What a store or load must agree on: the indices, or with ``rows`` the row (all the
        indices of a buffer of one value per row); None for a buffer of another rank."""
        if not rows:
            return tuple(indices)
        n = len(shape(buf))
        return tuple(indices[:rank - 1]) if n in (rank, rank - 1) else None

    def same(a, b) -> bool:
        return a is not None and b is not None and len(a) == len(b) and all(x.same_as(y) for x, y in zip(a, b))

    memo: dict = {}

    def feeds_output(buf) -> bool:
        """Every element (row) of ``buf`` reaches the output only at its own index (row)."""
        if buf.same_as(out):
            return True
        handle = buf.__chandle__()
        if handle not in memo:
            memo[handle] = False  # a buffer that reaches itself is not a chain
            stores = [(b, idx) for b, sb, idx, _ in blocks if sb.same_as(buf)]
            memo[handle] = (len(stores) == 1 and stores[0][0] is not None
                            and _identity(stores[0][0], stores[0][1], shape(buf), analyzer) and read_along(buf))
        return memo[handle]

    def read_along(buf) -> bool:
        """Every block reading ``buf`` (a reduction's own accumulator aside) reads it at its store's
        index (row) and feeds the output."""
        readers = [(b, sb, idx, [ld for ld in loads if ld.source.same_as(buf)]) for b, sb, idx, loads in blocks
                   if not sb.same_as(buf)]
        readers = [r for r in readers if r[3]]
        return bool(readers) and all(
            b is not None and _identity(b, idx, shape(sb), analyzer)
            and all(same(key(buf, list(ld.indices)), key(sb, list(idx))) for ld in lds)
            and (rows or all(_identity(b, ld.indices, shape(buf), analyzer) for ld in lds)) and feeds_output(sb)
            for b, sb, idx, lds in readers)

    like = lambda p: (str(p.ty.dtype) == str(out.ty.dtype) and len(shape(p)) == rank  # noqa: E731
                      and all(analyzer.can_prove_equal(a, b) for a, b in zip(shape(p), shape(out))))
    inputs = frozenset(i for i, p in enumerate(func.params)
                       if isinstance(p.ty, tirx.BufferType) and not p.same_as(out) and like(p) and read_along(p))
    return next(i for i, p in enumerate(func.params) if p.same_as(out)), inputs
