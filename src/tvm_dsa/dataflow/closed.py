"""Closed forms of the MME dataflows' metrics: piecewise quasi-polynomials of the GEMM sizes M, N, K.

``metrics.analyse`` counts a dataflow's volumes on integer sets, milliseconds to a second per tile
shape. barvinok counts the same sets with the sizes as parameters (``relations.card``): each count
becomes a piecewise quasi-polynomial — polynomials in M, N, K and floor divisions of them by the array's
sides, on pieces bounded by affine conditions. ``derive`` computes them once, offline, for the standard
GEMM dataflows of the presets' MMEs; ``write`` stores them as plain Python functions in
the package ``closed_forms`` (generated, checked in), so that ``metrics`` evaluates a tile shape in microseconds
with neither isl nor barvinok.

A pipelined dataflow's time strides are the sizes themselves (tile t starts t·L stamps in, L the time
loop's size): a product of two unknowns, outside Presburger arithmetic, so barvinok cannot count it
with symbolic sizes. Its counts are composed from counts that it can:

- time stamps: consecutive tiles' wavefronts overlap into one run of stamps, so the count is the latest
  tile end, max over tiles t of t·L + stamps(tile t) (the tile alone: the "systolic" form at its shape);
- volumes: the sum over tiles of a tile's volumes alone, plus, for each pair of consecutive tiles, the
  accesses of the second reused only from the first (counted on the two tiles run together: a Θ in two
  pieces, the second L stamps later, which is Presburger, so counted symbolically). Over systolic links
  (one PE forward along an axis, one stamp later) only consecutive tiles can pass a value: a GEMM tile
  shares a tensor only with tiles in its row or column of tiles, and a value of the same time-loop index
  is L · (tiles apart) stamps away, reachable through one link only when L = 1 and the tiles are
  consecutive. Pipelined forms are derived over such links only (a mesh's diagonal links break it; the
  tests check the composition against enumeration).
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Mapping
from fractions import Fraction
from functools import lru_cache
from pathlib import Path
from typing import Callable

from tvm_dsa.dataflow.library import BENCHMARKS, VARIANTS, stationary
from tvm_dsa.dataflow.metrics import DataflowMetrics, TensorVolumes

PARAMS = {"i": "M", "j": "N", "k": "K"}  # the GEMM's loops and the names of their sizes
PIPELINED = ", systolic, pipelined"
STORED = Path(__file__).with_name("closed_forms")

Key = tuple[str, int, int, str]  # (dataflow name, rows, cols, interconnect name)
Counts = dict[str, int]          # "instances", "time_stamps", "total|reuse|temporal <tensor>" -> count
Forms = Mapping[Key, dict[str, Callable[..., int]]]  # dataflow -> count name -> its closed form of (M, N, K)


# -- evaluation (pure Python) -------------------------------------------------------------------


class _Stored(Mapping):
    """The closed forms shipped in the package ``closed_forms``, a dataflow's module imported when first
    used (Python compiles only the forms a chip needs)."""

    def __init__(self):
        from tvm_dsa.dataflow.closed_forms import INDEX
        self.index = INDEX

    def __getitem__(self, key: Key) -> dict[str, Callable[..., int]]:
        return importlib.import_module(f"{__package__}.closed_forms.{self.index[key]}").FORMS  # cached by Python

    def __iter__(self):
        return iter(self.index)

    def __len__(self) -> int:
        return len(self.index)


@lru_cache(maxsize=1)
def stored() -> Forms:
    """The closed forms shipped in the package ``closed_forms``."""
    return _Stored()


def counts(key: Key, m: int, n: int, k: int, forms: Forms | None = None) -> Counts:
    """The counts of dataflow ``key`` for the GEMM ``m x n x k`` from the closed forms (the stored ones
    by default)."""
    if min(m, n, k) < 1:
        raise ValueError(f"GEMM sizes must be positive, got {m} x {n} x {k}")
    forms = stored() if forms is None else forms
    if key[0].endswith(PIPELINED):
        return _pipelined(key, {"M": m, "N": n, "K": k}, forms)
    return {name: f(m, n, k) for name, f in forms[key].items()}


def metrics(key: Key, bandwidth: float, m: int, n: int, k: int, forms: Forms | None = None) -> DataflowMetrics:
    """``analyse``'s metrics of dataflow ``key`` for the GEMM ``m x n x k``, from the closed forms."""
    c = counts(key, m, n, k, forms)
    op = _gemm()
    return DataflowMetrics(
        op="gemm", dataflow=key[0], array=key[1:3], interconnect=key[3], bandwidth=bandwidth,
        instances=c["instances"], time_stamps=c["time_stamps"],
        tensors=tuple(TensorVolumes(t, t == op.output.tensor, c[f"total {t}"], c[f"temporal {t}"],
                                    c[f"reuse {t}"] - c[f"temporal {t}"]) for t in op.tensors))


@lru_cache(maxsize=1)
def _gemm():
    """The GEMM statement (its extents are the parameters ``PARAMS``)."""
    return BENCHMARKS["gemm"].op({"i": 1, "j": 1, "k": 1})


def _pipelined(key: Key, sizes: dict[str, int], forms: Forms) -> Counts:
    """Counts of a pipelined dataflow composed from its tiles alone and the reuse across consecutive tiles."""
    name, rows, cols, links = key
    kind = name[:-len(PIPELINED)]
    single, across = forms[(kind + ", systolic", rows, cols, links)], forms[key]
    (s0, s1), (t,) = BENCHMARKS["gemm"].stationary[kind]
    p0, p1 = PARAMS[s0], PARAMS[s1]
    e0, e1, steps = sizes[p0], sizes[p1], sizes[PARAMS[t]]

    @lru_cache(maxsize=None)
    def run(x0: int, x1: int, prefix: str = "") -> Counts:
        """The counts of a tile of extents x0, x1 run alone (with a prefix: the reuse across a pair of
        tiles that extend as far together)."""
        at = {**sizes, p0: x0, p1: x1}
        table = across if prefix else single
        return {c[len(prefix):]: f(at["M"], at["N"], at["K"]) for c, f in table.items() if c.startswith(prefix)}

    tiles0, tiles1 = -(-e0 // rows), -(-e1 // cols)
    last0, last1 = e0 - rows * (tiles0 - 1), e1 - cols * (tiles1 - 1)
    out = dict(run(e0, e1))       # instances and totals do not depend on the tiling
    out["time_stamps"] = max((a * tiles1 + b) * steps + run(last0 if a == tiles0 - 1 else rows,
                                                             last1 if b == tiles1 - 1 else cols)["time_stamps"]
                             for a in {tiles0 - 1, max(tiles0 - 2, 0)} for b in {tiles1 - 1, max(tiles1 - 2, 0)})
    volumes = {c: 0 for c in out if c.startswith(("reuse", "temporal"))}

    def add(counts_: Counts, times: int) -> None:
        for c in volumes:
            volumes[c] += times * counts_[c]

    extents0, extents1 = _extents(e0, rows), _extents(e1, cols)
    for x0, n0 in extents0.items():
        for x1, n1 in extents1.items():
            add(run(x0, x1), n0 * n1)
    # Consecutive tiles in row-major order: along a row of tiles, or down the only column of tiles;
    # the second tile of a pair is any but the first, the first of a pair is whole along that axis.
    if tiles1 > 1:
        for x0, n0 in extents0.items():
            for x1, n1 in _extents(e1 - cols, cols).items():
                add(run(x0, cols + x1, "across-1 "), n0 * n1)
    elif tiles0 > 1:
        for x0, n0 in _extents(e0 - rows, rows).items():
            add(run(rows + x0, e1, "across-0 "), n0)
    return {**out, **volumes}


def _extents(size: int, side: int) -> dict[int, int]:
    """Tile extents of ``size`` cut in ``side``-long tiles -> how many tiles have that extent."""
    whole, rest = divmod(size, side)
    return {e: n for e, n in ((side, whole), (rest, 1 if rest else 0)) if n}


# -- derivation (offline: islpy with barvinok) --------------------------------------------------

def preset_keys(chips) -> list[Key]:
    """Every standard GEMM dataflow on each distinct MME (array, interconnect) of ``chips`` (the
    shipped presets: ``[hardware.get(n) for n in hardware.names()]``); pipelined ones only over
    systolic links (``composable``)."""
    from tvm_dsa.dataflow.notation import interconnect

    meshes = sorted({(hw.mme.rows, hw.mme.cols, hw.mme.interconnect) for hw in chips})
    return [(kind + variant, rows, cols, links) for rows, cols, links in meshes
            for kind in BENCHMARKS["gemm"].stationary for variant in VARIANTS
            if variant != PIPELINED or composable(interconnect(links, 2))]


def composable(links) -> bool:
    """Whether a pipelined dataflow's counts compose from its tiles over ``links``: systolic links only."""
    return links.delay == 1 and all(sorted(d) == [0] * (len(d) - 1) + [1] for d in links.offsets)


def derive(key: Key) -> dict:
    """The closed forms (``isl.PwQPolynomial``, count name -> form) of dataflow ``key``."""
    from tvm_dsa.dataflow import relations as rel
    from tvm_dsa.dataflow.notation import PEArray, interconnect

    name, rows, cols, links = key
    op = _gemm()
    array = PEArray((rows, cols), interconnect(links, 2), 1.0)
    kind, _, variant = name.partition(",")
    (s0, s1), time = BENCHMARKS["gemm"].stationary[kind]
    if name.endswith(PIPELINED):
        if not composable(array.interconnect):
            raise ValueError(f"{key}: pipelined forms are composed over systolic links only")
        tile = stationary(op, (s0, s1), time, (rows, cols), skew=True, symbolic=True)
        out = {}
        for axis in (0, 1):
            first, second = _pair_theta(op, kind, (rows, cols), axis)
            out.update((f"across-{axis} {c}", form) for c, form in _across(tile, array, first, second).items())
        return out
    flags = VARIANTS["," + variant if variant else ""]
    return _cards(rel.SpaceTime(stationary(op, (s0, s1), time, (rows, cols), symbolic=True, **flags), array,
                                PARAMS))


def _cards(st) -> dict:
    from tvm_dsa.dataflow import relations as rel
    from tvm_dsa.dataflow.metrics import reuse_sets

    op = st.df.op
    out = {"instances": rel.card(rel.domain(op, PARAMS)), "time_stamps": rel.card(st.time_stamps)}
    for t in op.tensors:
        reuse, temporal = reuse_sets(st, t)
        out[f"total {t}"] = rel.card(rel.access(op, t, PARAMS))
        out[f"reuse {t}"], out[f"temporal {t}"] = rel.card(reuse), rel.card(temporal)
    return out


def _across(tile, array, first, second) -> dict:
    """Per tensor, the accesses reused (and temporally reused) across two consecutive tiles with Θ
    pieces ``first`` and ``second``: reused in the pair, not within either tile."""
    from tvm_dsa.dataflow import relations as rel
    from tvm_dsa.dataflow.metrics import overlap

    st = rel.SpaceTime(tile, array, PARAMS, first.union(second))
    out = {}
    for t in tile.op.tensors:
        access = rel.access(tile.op, t, PARAMS)
        whole, parts = st.assignment(t), [th.reverse().apply_range(access) for th in (first, second)]
        for name, links in (("reuse", st.neighbours), ("temporal", st.temporal_map)):
            within = overlap(parts[0], links).union(overlap(parts[1], links))
            out[f"{name} {t}"] = rel.card(overlap(whole, links).subtract(within))
    return out


def _pair_theta(op, kind: str, shape: tuple[int, int], axis: int):
    """The Θ pieces of two consecutive tiles of ``kind``'s pipelined dataflow, each skewed, the second
    ``axis``-wise after the first (whole along ``axis``: its extent is the array's side) and starting L
    stamps later."""
    import islpy as isl

    from tvm_dsa.dataflow import relations as rel
    from tvm_dsa.dataflow.notation import Dataflow

    (s0, s1), (t,) = BENCHMARKS["gemm"].stationary[kind]
    side, space = shape[axis], [s0, s1]
    moved = list(space)
    moved[axis] = f"{space[axis]} - {side}"
    first, second = (Dataflow.parse(op, f"PE[{a}, {b}] | T[{t} + {a} + {b}]") for a, b in (space, moved))
    loops, pt = ", ".join(op.loops), PARAMS[t]
    part = (lambda cmp: isl.Set(f"{{ S[{loops}] : {space[axis]} {cmp} {side} }}"))
    later = isl.Map(f"[{pt}] -> {{ {rel.STAMP}[a, b, c] -> {rel.STAMP}[a, b, c + {pt}] }}")
    sizes = {PARAMS[space[axis]]: (side, 2 * side), PARAMS[space[1 - axis]]: (0, shape[1 - axis])}
    pair = isl.Set(f"[{', '.join(PARAMS.values())}] -> {{ : "
                   + " and ".join(f"{lo} < {p} <= {hi}" for p, (lo, hi) in sizes.items()) + " }")
    return (rel.theta(first, PARAMS).intersect_domain(part("<")).intersect_params(pair),
            rel.theta(second, PARAMS).intersect_domain(part(">=")).apply_range(later).intersect_params(pair))


def python_source(key: Key, named: dict) -> str:
    """A module of dataflow ``key``'s closed forms: each a function of (M, N, K), and ``FORMS``, count
    name -> function."""
    lines = [f'"""Closed forms of the counts of {key!r} (generated by',
             '``tvm_dsa.dataflow.closed.write()`` from barvinok\'s parametric counts; do not edit)."""', "", ""]
    table = []
    for count, form in named.items():
        lines += _function(f"_f{len(table)}", form)
        table.append(f"    {count!r}: _f{len(table)},")
    return "\n".join(lines + ["FORMS = {", *table, "}", ""])


def _function(name: str, form) -> list[str]:
    body = []
    for domain, qp in form.coalesce().get_pieces():
        body += [f"    if {_condition(domain)}:", f"        return {_polynomial(qp)}"]
    return [f"def {name}(M, N, K):", *body, "    return 0", "", ""]


def _val(v) -> Fraction:
    return Fraction(str(v))


def _affine(aff) -> tuple[str, int]:
    """An isl affine expression of the parameters (and floor divisions) as (integer numerator, denominator)."""
    import islpy as isl

    den = _val(aff.get_denominator_val())
    terms = [(_val(aff.get_coefficient_val(isl.dim_type.param, i)) * den, aff.get_dim_name(isl.dim_type.param, i))
             for i in range(aff.dim(isl.dim_type.param))]
    for d in range(aff.dim(isl.dim_type.div)):  # a division may use earlier ones, not itself
        c = _val(aff.get_coefficient_val(isl.dim_type.div, d)) * den
        if c:
            terms.append((c, _floor(aff.get_div(d))))
    return _sum([(int(c), x) for c, x in terms if c] + [(int(_val(aff.get_constant_val()) * den), "1")]), int(den)


def _floor(aff) -> str:
    num, den = _affine(aff)
    return f"(({num}) // {den})" if den != 1 else f"({num})"


def _sum(terms: list[tuple[int, str]]) -> str:
    parts = [str(c) if x == "1" else x if c == 1 else f"{c}*{x}" for c, x in terms if c]
    return " + ".join(parts).replace("+ -", "- ") or "0"


def _condition(domain) -> str:
    """A piece's domain (parameters only) as a Python condition."""
    alternatives = []
    for bset in domain.compute_divs().get_basic_sets():
        facts = []
        for c in bset.get_constraints():
            num, _ = _affine(c.get_aff())
            facts.append(f"{num} {'==' if c.is_equality() else '>='} 0")
        alternatives.append(" and ".join(facts) or "True")
    if not alternatives:
        raise ValueError(f"empty piece {domain}")
    return " or ".join(f"({a})" for a in alternatives)


def _polynomial(qp) -> str:
    """A quasi-polynomial as a Python expression in exact integer arithmetic."""
    import islpy as isl

    terms = qp.get_terms()
    coefs = [_val(t.get_coefficient_val()) for t in terms]
    den = math.lcm(*(c.denominator for c in coefs)) if coefs else 1
    parts = []
    for t, c in zip(terms, coefs):
        factors = [qp.get_space().get_dim_name(isl.dim_type.param, i) + (f"**{e}" if e > 1 else "")
                   for i in range(t.dim(isl.dim_type.param)) if (e := t.get_exp(isl.dim_type.param, i))]
        factors += [_floor(t.get_div(d)) + (f"**{e}" if e > 1 else "")
                    for d in range(t.dim(isl.dim_type.div)) if (e := t.get_exp(isl.dim_type.div, d))]
        parts.append((int(c * den), "*".join(factors) or "1"))
    total = _sum(parts)
    return f"({total}) // {den}" if den != 1 else total


def write(keys: list[Key], path: Path = STORED) -> None:
    """Derive the closed forms of ``keys`` (the presets': ``preset_keys``) and store them in the
    package ``path``: a module per dataflow and ``INDEX``, dataflow -> module."""
    path.mkdir(exist_ok=True)
    for old in path.glob("*.py"):
        old.unlink()
    index = {}
    for key in keys:
        index[key] = re.sub(r"\W+", "_", "_".join(map(str, key))).strip("_")
        (path / f"{index[key]}.py").write_text(python_source(key, derive(key)))
    entries = "".join(f"    {key!r}: {name!r},\n" for key, name in index.items())
    (path / "__init__.py").write_text(
        '"""The stored closed forms (generated by ``tvm_dsa.dataflow.closed.write()``; do not edit): '
        'dataflow -> its module."""\n\nINDEX = {\n' + entries + "}\n")
