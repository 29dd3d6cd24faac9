"""A DSA program: the hardware it was compiled for, its DDR arguments, and a list of kernels.

This module and ``instructions`` are the whole contract between the compiler and the simulator.
A program is self-contained: it carries the hardware description as a dict, so it can be saved,
loaded, disassembled and run without the compiler.

Running a program: the host places each ``TensorArg`` in DDR at its ``offset`` (inputs converted to
the arg's storage ``dtype``; the args' byte ranges are pairwise disjoint), launches the kernels in
order (each kernel starts after the previous one finished on all cores, plus the launch cost), and
reads the outputs back, converted to ``host_dtype``. DDR outside the args is scratch for the kernels.
"""

from __future__ import annotations

import base64
import bisect
import json
import zlib
from dataclasses import dataclass, field, replace

from tvm_dsa.isa.instructions import (
    OPCODE_OF, OPCODES, Dma, Fill, Instruction, Mme, Operand, Reduce, Vector, moved, replaced
)

VERSION = 10  # 2: kernels may carry replicas; 3: a replica goes where it says, moved by ranges; 4: remaps deps;
# 5: a dma may end with 1 (prefetch queue); 6: ... with its flags, 1 prefetch + 2 multicast; 7: vector op mac;
# 8: a multicast dma's flags may be followed by its transfer group; 9: a kernel may be chained to the one before;
# 10: vector op clip
READS = (1, 3, 4, 5, 6, 7, 8, 9, 10)  # versions this runtime reads (3 is 4 without ``Replica.remap``, 4 is 5
# without prefetches, 5 is 6 without multicasts, 6 is 7 without ``mac``, 7 is 8 without groups, 8 is 9 without
# chains, 9 is 10 without ``clip``)
MAGIC = "DSAP"


class ProgramError(ValueError):
    """A program that is malformed, of another version, or invalid for its hardware."""


@dataclass(frozen=True)
class TensorArg:
    """A tensor in DDR that the host passes in (``input``) or reads back (``output``)."""

    name: str
    role: str  # "input" | "output"
    shape: tuple[int, ...]
    dtype: str  # storage dtype in DDR
    host_dtype: str
    offset: int

    @property
    def nbytes(self) -> int:
        from tvm_dsa.isa.instructions import DTYPES

        n = DTYPES[self.dtype]
        for e in self.shape:
            n *= e
        return n


@dataclass(frozen=True)
class LayerMark:
    """Instructions from ``first`` up to the next mark belong to layer ``name`` (output ``shape``):
    what a report or a trace attributes to a layer. Not part of the program's meaning."""

    first: int
    name: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Replica:
    """Instructions ``start``..``stop`` (exclusive) of the kernel's stream once more, inserted at
    position ``at`` of the stream (``stop <= at``), moved: cores by ``cores``; an operand in
    ``mem[index]`` at an offset in ``[lo, hi)`` of a ``moves`` entry ``(mem, index, lo, hi,
    to_index, shift)`` goes to ``mem[to_index]``, ``shift`` bytes on; any other LB operand to the
    LB of its core moved by ``cores``, the rest stays. A dependency on a position before ``start``
    that ``remap`` lists as ``(old, new)`` goes to ``new`` (before ``at``); every other dependency
    moves ``at - start`` on. A cluster that runs another's part on its own data, or a layer that
    repeats an earlier one on other tensors or other cores, costs one record, not a copy."""

    start: int
    stop: int
    at: int
    cores: int
    moves: tuple[tuple[str, int, int, int, int, int], ...]
    remap: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Kernel:
    """Instructions launched together on ``cores`` (global core ids); list order is their meaning.
    ``replicas`` are inserted among the ``instructions`` where they say: the kernel's stream is
    the instructions with the copies in place, and loading a program writes it out
    (``Program.expanded``). ``layers``: which layer each run of the stream computes (marks by
    increasing ``first``, positions in the stream). A ``chained`` kernel is not launched: it starts
    when the program's kernel before it has finished on all its cores (the kernels of one launch,
    a barrier between them on the chip)."""

    name: str
    cores: tuple[int, ...]
    instructions: tuple[Instruction, ...]
    layers: tuple[LayerMark, ...] = field(default=(), compare=False)
    replicas: tuple[Replica, ...] = ()
    chained: bool = False

    def layer_of_each(self) -> list[LayerMark | None]:
        """The mark of every instruction (None before the first mark); marks are stream
        positions, so a kernel with replicas is written out first (``Program.expanded``)."""
        out: list = [None] * len(self.instructions)
        for m, nxt in zip(self.layers, self.layers[1:] + (None,)):
            end = nxt.first if nxt else len(out)
            out[m.first:end] = [m] * (end - m.first)
        return out


@dataclass(frozen=True)
class Program:
    hardware: dict
    ddr_bytes: int
    args: tuple[TensorArg, ...]
    kernels: tuple[Kernel, ...]
    name: str = "program"
    version: int = VERSION

    # -- dict / JSON form ---------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "magic": MAGIC,
            "version": self.version,
            "name": self.name,
            "hardware": self.hardware,
            "ddr_bytes": self.ddr_bytes,
            "args": [[a.name, a.role, list(a.shape), a.dtype, a.host_dtype, a.offset] for a in self.args],
            "kernels": [
                {"name": k.name, "cores": list(k.cores),
                 "layers": [[m.first, m.name, list(m.shape)] for m in k.layers],
                 "instructions": [ins_to_list(i) for i in k.instructions],
                 **({"replicas": [[r.start, r.stop, r.at, r.cores, [list(m) for m in r.moves]]
                                  + ([[list(d) for d in r.remap]] if r.remap else []) for r in k.replicas]}
                    if k.replicas else {}),
                 **({"chained": True} if k.chained else {})}
                for k in self.kernels
            ],
        }

    @classmethod
    def from_dict(cls, d: dict, written_out: bool = True) -> "Program":
        """The program of ``to_dict``'s form, its replicas written out (unless not ``written_out``:
        as stored, for a tool that rewrites programs)."""
        if not isinstance(d, dict) or d.get("magic") != MAGIC:
            raise ProgramError("not a DSA program (missing magic 'DSAP')")
        if d.get("version") not in READS:
            raise ProgramError(f"program version {d.get('version')} is not supported (this runtime reads {READS})")
        try:
            args = tuple(TensorArg(a[0], a[1], tuple(a[2]), a[3], a[4], a[5]) for a in d["args"])
            kernels = []
            for k in d["kernels"]:
                marks = [LayerMark(int(m[0]), str(m[1]), tuple(int(e) for e in m[2])) for m in k.get("layers", ())]
                replicas = tuple(Replica(int(r[0]), int(r[1]), int(r[2]), int(r[3]),
                                         tuple((str(m[0]), *(int(x) for x in m[1:6])) for m in r[4]),
                                         tuple((int(a), int(b)) for a, b in (r[5] if len(r) > 5 else ())))
                                 for r in k.get("replicas", ()))
                kernel = Kernel(k["name"], tuple(int(c) for c in k["cores"]),
                                tuple(_ins_from_list(i) for i in k["instructions"]), tuple(marks), replicas,
                                bool(k.get("chained", False)))
                kernels.append(_written_out(kernel) if written_out else kernel)
            return cls(d["hardware"], int(d["ddr_bytes"]), args, tuple(kernels), d.get("name", "program"), VERSION)
        except (KeyError, IndexError, TypeError, ValueError) as err:
            raise ProgramError(f"malformed program: {type(err).__name__}: {err}") from None

    def expanded(self) -> "Program":
        """The program with every kernel's replicas written out as instructions (what loading it
        gives)."""
        if not any(k.replicas for k in self.kernels):
            return self
        try:
            kernels = tuple(_written_out(k) for k in self.kernels)
        except ValueError as err:
            raise ProgramError(f"malformed program: {err}") from None
        return Program(self.hardware, self.ddr_bytes, self.args, kernels, self.name, VERSION)

    def renamed(self, name: str, names: dict) -> "Program":
        """The program named ``name`` (its kernels too), its args and layer marks renamed by
        ``names`` (old -> new; a name not in it stays): what a sub-graph of the same form as the
        one it was made for runs."""
        kernels = tuple(replace(k, name=name, layers=tuple(replace(m, name=names.get(m.name, m.name)) for m in k.layers))
                        for k in self.kernels)
        return replace(self, name=name, args=tuple(replace(a, name=names.get(a.name, a.name)) for a in self.args),
                       kernels=kernels)

    def nameless(self) -> dict:
        """``to_dict`` without the names (the program's, its kernels', args' and layer marks'):
        two programs equal here run the same, whatever their layers were called."""
        d = self.to_dict()
        d["name"], d["args"] = "", [a[1:] for a in d["args"]]
        for k in d["kernels"]:
            k["name"], k["layers"] = "", [[m[0], m[2]] for m in k["layers"]]
        return d

    # -- compact text form for embedding (zlib-compressed JSON, base64) -------------------------
    def serialize(self) -> str:
        """The JSON of ``to_dict``, compressed.
        zlib level 3: a ResNet-50 batch-8 kernel's JSON compresses 2.6x faster than at 6, for
        23 % more bytes."""
        raw = json.dumps(self.to_dict(), separators=(",", ":")).encode()
        return MAGIC + base64.b64encode(zlib.compress(raw, 3)).decode("ascii")

    @classmethod
    def deserialize(cls, text: str, written_out: bool = True) -> "Program":
        text = str(text)
        if not text.startswith(MAGIC):
            raise ProgramError("not a serialized DSA program (missing 'DSAP' prefix)")
        try:
            raw = zlib.decompress(base64.b64decode(text[len(MAGIC):], validate=True))
            d = json.loads(raw)
        except (ValueError, zlib.error) as err:
            raise ProgramError(f"corrupt serialized program: {err}") from None
        return cls.from_dict(d, written_out)

    def save(self, path) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, separators=(",", ":"))

    @classmethod
    def load(cls, path) -> "Program":
        with open(path) as f:
            try:
                d = json.load(f)
            except json.JSONDecodeError as err:
                raise ProgramError(f"{path}: not a JSON DSA program: {err}") from None
        return cls.from_dict(d)

    @property
    def num_instructions(self) -> int:
        """Instructions stored: the stream's length once replicas are written out (``expanded``)."""
        return sum(len(k.instructions) for k in self.kernels)


def _written_out(k: Kernel) -> Kernel:
    """``k`` with its replicas written out as instructions, on the cores they reach (raises
    ``ValueError`` for a malformed replica)."""
    stream = _expand(k.instructions, k.replicas)
    return Kernel(k.name, tuple(sorted(set(k.cores) | {i.core for i in stream})), tuple(stream), k.layers,
                  chained=k.chained)


def expanded_stream(instructions, replicas) -> tuple[list, list[int]]:
    """(stream, origins): a kernel's instructions with its replicas written out (as loading the
    program gives), and per instruction of the stream the position in ``instructions`` of the
    one it is or copies (raises ``ValueError`` for a malformed replica)."""
    origins: list[int] = []
    return _expand(instructions, replicas, origins), origins


def _expand(instructions, replicas, origins: list | None = None) -> list:
    """A kernel's stream: its instructions with each replica's copy inserted. A copy shares what
    it does not move with the instruction it copies (shapes, strides, unmoved operands), so a
    stream of millions of copies stays small. ``origins``, where given, gets the position in
    ``instructions`` each instruction of the stream is or copies."""
    out, taken = [], 0
    for r in replicas:
        start, stop, at, cores = r.start, r.stop, r.at, r.cores
        if not 0 <= start <= stop <= at:
            raise ValueError(f"replica [{start}, {stop}) at {at}: must copy a range before where it goes")
        remap = dict(r.remap)
        if any(not (0 <= old < start and 0 <= new < at) for old, new in remap.items()):
            raise ValueError(f"replica at {at}: a remapped dependency must go from before {start} to before {at}")
        need = at - len(out)  # the kernel's own instructions before the copy
        if need < 0:
            raise ValueError(f"replica at {at}: replicas must go in increasing order, after the last copy")
        if need > len(instructions) - taken:
            raise ValueError(f"replica at {at} lies beyond the kernel's stream")
        out += instructions[taken:taken + need]
        if origins is not None:
            origins += range(taken, taken + need)
            origins += origins[start:stop]
        taken += need
        table: dict = {}
        for mem, index, lo, hi, to, shift in sorted(r.moves):
            ranges = table.setdefault((mem, index), ([], []))
            if ranges[0] and lo < ranges[0][-1][1]:
                raise ValueError(f"replica at {at}: moves of {mem}[{index}] overlap at offset {lo}")
            ranges[0].append((lo, hi, to, shift))
            ranges[1].append(lo)

        done: dict = {}  # operand -> where it goes (a tile buffer's operands recur tile after tile)

        def move(o: Operand) -> Operand:
            dst = done.get(o)
            if dst is None:
                dst = o
                ranges = table.get((o.mem, o.index))
                i = bisect.bisect_right(ranges[1], o.offset) - 1 if ranges else -1
                if i >= 0 and o.offset < ranges[0][i][1]:
                    _, _, to, shift = ranges[0][i]
                    dst = replaced(o, index=to, offset=o.offset + shift)
                elif o.mem == "lb" and cores:
                    dst = replaced(o, index=o.index + cores)
                done[o] = dst
            return dst

        dep = at - start
        for ins in out[start:stop]:
            deps = [remap.get(d, d + dep) if d < start else d + dep for d in ins.deps]
            out.append(moved(ins, move, core=ins.core + cores, deps=tuple(sorted(set(deps)) if remap else deps)))
    if origins is not None:
        origins += range(taken, len(instructions))
    return out + list(instructions[taken:])


def op_to_list(o: Operand | float):
    if isinstance(o, Operand):
        return [o.mem, o.index, o.offset, o.dtype, o.strides]
    return float(o)


def _op_from_list(v) -> Operand | float:
    if isinstance(v, (list, tuple)):
        return Operand(v[0], int(v[1]), int(v[2]), v[3], tuple(int(s) for s in v[4]))
    return float(v)


def ins_to_list(i: Instruction) -> list:
    """The instruction as JSON values (tuples serialise as lists)."""
    head = [OPCODE_OF[type(i)], i.core, i.deps, i.shape]
    if isinstance(i, Dma):
        flags = int(i.prefetch) | 2 * int(i.multicast)
        return head + [op_to_list(i.dst), op_to_list(i.src)] + ([flags] if flags else []) + ([i.group] if i.group else [])
    if isinstance(i, Fill):
        return head + [op_to_list(i.dst), i.value]
    if isinstance(i, Mme):
        return head + [[int(r) for r in i.reduce], op_to_list(i.dst), op_to_list(i.a),
                       op_to_list(i.b), int(i.accumulate)]
    if isinstance(i, Vector):
        return head + [i.unit, i.op, op_to_list(i.dst), [op_to_list(s) for s in i.srcs]]
    return head + [i.unit, i.op, [int(r) for r in i.reduce], op_to_list(i.dst),
                   op_to_list(i.src), int(i.accumulate)]


def _ins_from_list(v: list) -> Instruction:
    opcode, core, deps, shape, *rest = v
    if opcode not in OPCODES:
        raise ValueError(f"unknown opcode {opcode!r}")
    core, deps, shape = int(core), tuple(int(d) for d in deps), tuple(int(s) for s in shape)
    if opcode == "dma":
        flags = int(rest[2]) if rest[2:] else 0
        return Dma(core, shape, _op_from_list(rest[0]), _op_from_list(rest[1]), deps, bool(flags & 1), bool(flags & 2),
                   int(rest[3]) if rest[3:] else 0)
    if opcode == "fill":
        return Fill(core, shape, _op_from_list(rest[0]), float(rest[1]), deps)
    if opcode == "mme":
        return Mme(core, shape, tuple(bool(r) for r in rest[0]), _op_from_list(rest[1]),
                   _op_from_list(rest[2]), _op_from_list(rest[3]), bool(rest[4]), deps)
    if opcode == "vector":
        return Vector(core, rest[0], rest[1], shape, _op_from_list(rest[2]),
                      tuple(_op_from_list(s) for s in rest[3]), deps)
    return Reduce(core, rest[0], rest[1], shape, tuple(bool(r) for r in rest[2]),
                  _op_from_list(rest[3]), _op_from_list(rest[4]), bool(rest[5]), deps)
