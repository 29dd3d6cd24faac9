"""A design space (docs/dse.md): a base chip, the hardware fields and compiler choices a sweep varies,
and the points of it a search visits.

    space = load_space("examples/space-stcp920.toml")
    space.size                      # points of the grid
    space.point(0)                  # {"mme.rows": 16, ..., "schedule": "graphturbo"}
    space.sample(20, seed=0)        # 20 distinct points, the same for the same seed

Every axis is a finite list of values: a TOML list, or a range ``{min, max, step}`` (linear) or
``{min, max, factor}`` (geometric) expanded to one. An axis may name several fields that vary
together (``"storage_dtype,mme.dtype" = [["int8", "int8"], ...]``).
"""

from __future__ import annotations

import math
import random
import tomllib
from dataclasses import dataclass
from pathlib import Path

from tvm_dsa import hardware
from tvm_dsa.harness import InputError

SCHEDULES = ("auto", "layerwise", "graphturbo", "set")
# The compiler's choices an axis may name: the schedule and the stitched kernels' options
# (``kernelgen.stitched.StitchOptions``), as ``stitch.<option>``.
STITCH_OPTIONS = ("gb", "order", "spill", "prefetch", "lb_keep")
RANGE_KEYS = {"min", "max", "step", "factor"}


@dataclass(frozen=True)
class Axis:
    """One axis of the space: the dotted fields it sets (one, or several varied together) and the
    values it takes, each a tuple with one value per field."""

    fields: tuple[str, ...]
    values: tuple[tuple, ...]

    @property
    def name(self) -> str:
        return ",".join(self.fields)

    def assign(self, index: int) -> dict:
        """The fields' values at the axis's ``index``-th value."""
        return dict(zip(self.fields, self.values[index]))


@dataclass(frozen=True)
class Space:
    """A base chip (a preset's or a hardware file's description) and the axes varied over it:
    hardware fields (``mme.rows``), the ``schedule`` and ``stitch.<option>`` compiler choices."""

    base: hardware.Hardware
    axes: tuple[Axis, ...]

    @property
    def size(self) -> int:
        return math.prod(len(a.values) for a in self.axes)

    def point(self, index: int) -> dict:
        """The ``index``-th point of the grid (the last axis varies fastest): field -> value."""
        out = {}
        for axis in reversed(self.axes):
            index, i = divmod(index, len(axis.values))
            out = axis.assign(i) | out
        return out

    def grid(self) -> list[dict]:
        return [self.point(i) for i in range(self.size)]

    def sample(self, n: int, seed: int) -> list[dict]:
        """``n`` distinct points drawn uniformly (all of them, in grid order, if the grid has no
        more), the same for the same seed."""
        if n >= self.size:
            return self.grid()
        return [self.point(i) for i in random.Random(seed).sample(range(self.size), n)]

    def with_schedules(self, schedules: list[str]) -> "Space":
        """The space with its ``schedule`` axis replaced by ``schedules`` (``--schedule``)."""
        axes = tuple(a for a in self.axes if a.fields != ("schedule",))
        return Space(self.base, axes + (_axis(("schedule",), schedules, "schedule"),))


def load_space(path: str | Path) -> Space:
    """The space a TOML file describes (docs/dse.md); an ``InputError`` naming what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"no such space file: {path}")
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise InputError(f"space file {path}: not valid TOML: {err}") from None
    try:
        return parse_space(data)
    except InputError as err:
        raise InputError(f"space file {path}: {err}") from None


def parse_space(data: dict) -> Space:
    """A ``Space`` from the parsed TOML: ``base``, ``[hardware]`` and ``[compiler]``."""
    unknown = sorted(set(data) - {"base", "hardware", "compiler"})
    if unknown:
        raise InputError(f"unknown key(s) {unknown}; a space has base, [hardware] and [compiler]")
    if not isinstance(data.get("base"), str):
        raise InputError("'base' must name a preset (e.g. \"stcp920\") or a hardware file")
    try:
        base = hardware.chip(data["base"])
    except hardware.HardwareError as err:
        raise InputError(f"base: {err}") from None
    known = _fields(base.to_dict())
    axes = []
    for section in ("hardware", "compiler"):
        table = data.get(section, {})
        if not isinstance(table, dict):
            raise InputError(f"[{section}] must be a table")
        for key, values in _flatten(table):
            fields = tuple(f.strip() for f in key.split(","))
            for f in fields:
                allowed = f in known if section == "hardware" else (
                    f == "schedule" or f.removeprefix("stitch.") in STITCH_OPTIONS and f.startswith("stitch."))
                if not allowed:
                    raise InputError(f"[{section}] has no field {f!r}; "
                                     + ("the hardware format's fields are in docs/hardware-format.md"
                                        if section == "hardware" else
                                        "the compiler's are schedule and stitch.<" + "|".join(STITCH_OPTIONS) + ">"))
            axes.append(_axis(fields, values, key))
    names = [f for a in axes for f in a.fields]
    twice = sorted({f for f in names if names.count(f) > 1})
    if twice:
        raise InputError(f"field(s) {twice} on more than one axis")
    return Space(base, tuple(axes))


def _axis(fields: tuple[str, ...], values, key: str) -> Axis:
    values = _expand(values, key)
    if len(fields) > 1:
        if any(not isinstance(v, list) or len(v) != len(fields) for v in values):
            raise InputError(f"{key!r}: each value must be a list of {len(fields)} values, one per field")
        values = [tuple(v) for v in values]
    else:
        values = [(v,) for v in values]
    if fields == ("schedule",) and (bad := [v for (v,) in values if v not in SCHEDULES]):
        raise InputError(f"schedule: unknown {bad}; one of {', '.join(SCHEDULES)}")
    if len(set(map(repr, values))) != len(values):
        raise InputError(f"{key!r}: a value is given twice")
    return Axis(fields, tuple(values))


def _expand(values, key: str) -> list:
    """A list as it is; a range table as the list it stands for."""
    if isinstance(values, list):
        if not values:
            raise InputError(f"{key!r}: an empty list of values")
        return values
    if not isinstance(values, dict) or not {"min", "max"} <= set(values) or set(values) - RANGE_KEYS or (
            ("step" in values) == ("factor" in values)):
        raise InputError(f"{key!r}: give a list of values or a range {{min, max, step}} or {{min, max, factor}}")
    lo, hi = values["min"], values["max"]
    step, factor = values.get("step"), values.get("factor")
    if any(not isinstance(v, (int, float)) or isinstance(v, bool) for v in values.values()):
        raise InputError(f"{key!r}: a range's min, max, step and factor are numbers")
    if lo > hi or (step is not None and step <= 0) or (factor is not None and (factor <= 1 or lo <= 0)):
        raise InputError(f"{key!r}: a range needs min <= max and a positive step, or a factor above 1 and min > 0")
    out, v = [], lo
    while v <= hi * (1 + 1e-12):
        out.append(v)
        v = v + step if step is not None else v * factor
        if len(out) > 10_000:
            raise InputError(f"{key!r}: the range has more than 10,000 values")
    return out


def _fields(d: dict, prefix: str = "") -> set[str]:
    """The dotted names of a hardware description's fields (``mme.rows``)."""
    out = set()
    for k, v in d.items():
        if isinstance(v, dict) and k != "notes":
            out |= _fields(v, f"{prefix}{k}.")
        else:
            out.add(prefix + k)
    return out


def _flatten(table: dict, prefix: str = ""):
    """(dotted key, values) of a TOML table whose sub-tables are field groups (``[hardware.mme]``,
    ``mme.rows = ...``) and whose leaves are lists or range tables."""
    for k, v in table.items():
        if isinstance(v, dict) and not set(v) & RANGE_KEYS:
            yield from _flatten(v, f"{prefix}{k}.")
        else:
            yield prefix + k, v
