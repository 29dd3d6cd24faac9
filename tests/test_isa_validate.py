"""The validator's rules on where operands live, the args and the int8 presets, each with its message."""

from __future__ import annotations

import re
import tomllib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tvm_dsa.isa import (
    Dma, Fill, Kernel, LayerMark, Mme, Operand, Program, ProgramError, Reduce, Replica, TensorArg, Vector,
    validate
)
from tvm_dsa.runtime import simulate

PRESETS = Path(__file__).resolve().parents[1] / "src" / "tvm_dsa" / "hardware" / "presets"
HW = tomllib.loads((PRESETS / "stcp920.toml").read_text())  # 4 clusters of 8 cores, 8 MiB GB each


def lb(off: int, dtype="float16", *strides: int, core: int = 0) -> Operand:
    return Operand("lb", core, off, dtype, strides or (1,))


def gb(off: int, dtype="float16", *strides: int, cluster: int = 0) -> Operand:
    return Operand("gb", cluster, off, dtype, strides or (1,))


def ddr(off: int, dtype="float16", *strides: int) -> Operand:
    return Operand("ddr", 0, off, dtype, strides or (1,))


def program(*instrs, args=(), hw=None, cores=None) -> Program:
    cores = cores or tuple(sorted({i.core for i in instrs}))
    return Program(hw or HW, 1 << 16, tuple(args), (Kernel("k", cores, tuple(instrs)),), name="t")


def error(*instrs, **kw) -> str:
    with pytest.raises(ProgramError) as info:
        validate(program(*instrs, **kw))
    return str(info.value)


VEC = Vector(0, "vme", "add", (64,), lb(256, "float32"), (lb(0), lb(128)))
MME = Mme(0, (4, 8, 16), (False, False, True), lb(1024, "float32", 8, 1, 0), lb(0, "float16", 16, 0, 1),
          lb(512, "float16", 0, 1, 8))
RED = Reduce(0, "vec", "max", (4, 16), (False, True), lb(1024, "float32", 1, 0), lb(0, "float16", 16, 1))


# -- compute instructions touch only their own core's LB ------------------------------------------

@pytest.mark.parametrize("ins, role, place", [
    (replace(MME, a=Operand("ddr", 0, 0, "float16", (16, 0, 1))), "src0", "ddr"),
    (replace(MME, b=Operand("gb", 0, 0, "float16", (0, 1, 8))), "src1", r"gb\[0\]"),
    (replace(MME, dst=Operand("lb", 3, 0, "float32", (8, 1, 0))), "dst", r"lb\[3\]"),
    (replace(VEC, srcs=(lb(0), gb(0))), "src1", r"gb\[0\]"),
    (replace(VEC, srcs=(ddr(0), 2.0)), "src0", "ddr"),
    (replace(VEC, dst=lb(0, "float32", core=1)), "dst", r"lb\[1\]"),
    (replace(RED, src=Operand("gb", 0, 0, "float16", (16, 1))), "src0", r"gb\[0\]"),
    (replace(RED, dst=Operand("ddr", 0, 0, "float32", (1, 0))), "dst", "ddr"),
    (replace(RED, dst=Operand("ddr", 0, 0, "float32", (1, 0)), accumulate=True), "dst", "ddr"),
])
def test_compute_only_touches_its_own_lb(ins, role, place):
    msg = error(ins, cores=(0, 1, 3))
    assert ins.core == 0
    assert msg.startswith(f"kernel k instruction 0 ({type(ins).__name__.lower()}): ")
    pattern = (rf"{role} is in {place}, but MME, vector and reduce instructions only touch their own "
               r"core's LB \(lb\[0\]\)")
    assert re.search(pattern, msg), msg


def test_compute_on_its_own_lb_is_valid():
    validate(program(VEC, MME, RED))
    on_core_9 = [replace(i, core=9, dst=replace(i.dst, index=9)) for i in (VEC, MME, RED)]
    on_core_9[0] = replace(on_core_9[0], srcs=(lb(0, core=9), 1.5))
    on_core_9[1] = replace(on_core_9[1], a=replace(MME.a, index=9), b=replace(MME.b, index=9))
    on_core_9[2] = replace(on_core_9[2], src=replace(RED.src, index=9))
    validate(program(*on_core_9))


# -- what a DMA and a fill may move -------------------------------------------------------------

@pytest.mark.parametrize("ins", [
    Dma(0, (64,), lb(0), ddr(0)),  # DDR -> own LB
    Dma(0, (64,), ddr(0), lb(0)),  # own LB -> DDR
    Dma(0, (64,), lb(0), gb(0)),  # GB -> own LB
    Dma(9, (64,), gb(0, cluster=3), lb(0, core=9)),  # own LB -> a GB of another cluster
    Dma(0, (64,), lb(0, core=5), lb(0)),  # own LB -> another core's LB
    Dma(0, (64,), lb(0), lb(0, core=12)),  # another core's LB -> own LB
    Dma(0, (64,), gb(0), ddr(0)),  # cdma: DDR -> the cluster's GB
    Dma(9, (64,), ddr(0), gb(0, cluster=1)),  # cdma: the cluster's GB -> DDR (core 9 is in cluster 1)
    Dma(0, (64,), ddr(4096), ddr(0)),  # cdma: DDR -> DDR
    Dma(0, (64,), gb(0), gb(4096, cluster=1)),  # cdma: another cluster's GB -> its own, across the bus
    Dma(9, (64,), gb(0, cluster=3), gb(0, cluster=1)),  # cdma: its own GB -> another cluster's
    Fill(0, (64,), lb(0), 1.0),
])
def test_dma_and_fill_moves_allowed(ins):
    validate(program(ins, cores=(0, 5, 9, 12)))


@pytest.mark.parametrize("ins, message", [
    (Dma(0, (64,), lb(0, core=1), ddr(0)),
     r"DMA lb\[1\] <- ddr touches an LB but not the issuing core's own \(lb\[0\]\)"),
    (Dma(0, (64,), gb(0), lb(0, core=2)),
     r"DMA gb\[0\] <- lb\[2\] touches an LB but not the issuing core's own \(lb\[0\]\)"),
    (Dma(0, (64,), lb(0, core=1), lb(0, core=2)),
     r"DMA lb\[1\] <- lb\[2\] touches an LB but not the issuing core's own"),
    (Dma(0, (64,), gb(0, cluster=2), gb(4096, cluster=1)),
     r"DMA gb\[2\] <- gb\[1\]: core 0 is in cluster 0, and a cluster DMA only reaches its own cluster's GB"),
    (Dma(0, (64,), gb(0, cluster=1), ddr(0)),
     r"DMA gb\[1\] <- ddr: core 0 is in cluster 0, and a cluster DMA only reaches its own cluster's GB \(gb\[0\]\)"),
    (Dma(9, (64,), ddr(0), gb(0, cluster=0)),
     r"DMA ddr <- gb\[0\]: core 9 is in cluster 1, and a cluster DMA only reaches its own cluster's GB \(gb\[1\]\)"),
    (Fill(0, (64,), lb(0, core=1), 1.0), r"fill writes only the core's LB \(lb\[0\]\), not lb\[1\]"),
    (Fill(0, (64,), ddr(0), 1.0), r"fill writes only the core's LB \(lb\[0\]\), not ddr"),
    (Fill(0, (64,), gb(0), 1.0), r"fill writes only the core's LB \(lb\[0\]\), not gb\[0\]"),
])
def test_dma_and_fill_moves_rejected(ins, message):
    msg = error(ins, cores=(0, 1, 2, 9))
    assert msg.startswith(f"kernel k instruction 0 ({type(ins).__name__.lower()}): ")
    assert re.search(message, msg), msg


# -- args ---------------------------------------------------------------------------------------

def arg(name, offset, shape=(64,), dtype="float16", role="input"):
    return TensorArg(name, role, shape, dtype, "float32", offset)


def test_args_must_be_disjoint_in_ddr():
    validate(program(args=[arg("a", 0), arg("b", 128), arg("c", 256, role="output")]))  # touching is fine
    validate(program(args=[arg("a", 0), arg("e", 64, shape=(0,)), arg("b", 128)]))  # an empty arg overlaps nothing
    assert error(args=[arg("a", 0), arg("b", 126), arg("c", 1024, role="output")]) == (
        "args a and b overlap in DDR: bytes [0, 128) and [126, 254)")
    # not neighbours by offset order: a big arg containing two others
    assert error(args=[arg("x", 256), arg("big", 0, shape=(1024,)), arg("y", 1024)]) == (
        "args big and x overlap in DDR: bytes [0, 2048) and [256, 384)")
    assert error(args=[arg("a", 512), arg("b", 512, role="output")]).startswith("args a and b overlap in DDR")


def test_arg_dtype_and_shape_are_checked():
    assert error(args=[arg("a", 0, dtype="bfloat16")]) == (
        "arg a: dtype 'bfloat16' is not one of ['float16', 'float32', 'int32', 'int8']")
    assert error(args=[arg("a", 0, shape=(4, -2))]) == "arg a: negative shape (4, -2)"


# -- other checks -------------------------------------------------------------------------------

def test_reduce_mask_must_match_the_shape():
    assert error(replace(RED, reduce=(True,))).endswith("(reduce): reduce mask length differs from the shape")
    assert error(replace(MME, reduce=(False, True))).endswith("(mme): reduce mask length differs from the shape")


def test_vector_immediates_are_numbers():
    validate(program(replace(VEC, srcs=(lb(0), 2)), replace(VEC, srcs=(np.float32(0.5), lb(0)))))
    assert error(replace(VEC, srcs=(lb(0), "2"))).endswith("(vector): source 1 is '2', neither an operand nor a number")
    assert error(replace(VEC, srcs=(lb(0), None))).endswith("source 1 is None, neither an operand nor a number")


def test_every_reduction_runs_on_both_vector_units():
    validate(program(*[replace(RED, unit=u, op=op) for u in ("vme", "vec") for op in ("sum", "max", "min")]))
    assert error(replace(RED, op="prod")).endswith("reduction 'prod' is not one of ['max', 'min', 'sum']")
    assert error(replace(RED, unit="mme")).endswith("unit 'mme' is not vme/vec")


# -- int8 presets: integer MME, float-only vector units, timing-only float models -------------

INT8 = tomllib.loads((PRESETS / "set-edge16.toml").read_text())


def test_int8_preset_mme_types():
    mme = replace(MME, dst=replace(MME.dst, dtype="int32"), a=replace(MME.a, dtype="int8"),
                  b=replace(MME.b, dtype="int8"))
    validate(program(mme, hw=INT8))
    assert error(MME, hw=INT8).endswith("(mme): MME operands must be int8")
    assert error(replace(mme, dst=replace(mme.dst, dtype="float32")), hw=INT8).endswith(
        "(mme): MME accumulates into int32")
    assert error(mme).endswith("(mme): MME operands must be float16")  # and the other way round


@pytest.mark.parametrize("ins", [
    Vector(0, "vme", "add", (64,), lb(256, "float32"), (lb(0, "int32"), 1.0)),
    Vector(0, "vme", "copy", (64,), lb(256, "int8"), (lb(0, "float16"),)),
    Reduce(0, "vme", "sum", (4, 16), (False, True), lb(1024, "float32", 1, 0), lb(0, "int8", 16, 1)),
])
def test_int8_preset_vector_work_reads_and_writes_integers(ins):
    """The int8 datapath's vector units requantise: integer operands are valid."""
    validate(program(ins, hw=INT8))


def test_int8_preset_float_vector_program_runs_timing_only():
    """A float model compiled for an int8 preset: int8 DMAs and MMEs, float16/float32 vector work."""
    instrs = [
        Dma(0, (64,), lb(0, "int8"), ddr(0, "int8")),
        Dma(0, (64,), lb(64, "int8"), ddr(64, "int8"), deps=()),
        Mme(0, (4, 4, 16), (False, False, True), lb(1024, "int32", 4, 1, 0), lb(0, "int8", 16, 0, 1),
            lb(64, "int8", 0, 1, 4), deps=(0, 1)),
        Fill(0, (16,), lb(2048, "float16"), 0.5),
        Vector(0, "vme", "relu", (16,), lb(2112, "float32"), (lb(2048, "float16"),), deps=(3,)),
        Vector(0, "vec", "exp", (16,), lb(2112, "float32"), (lb(2112, "float32"),), deps=(4,)),
        Reduce(0, "vme", "sum", (16,), (True,), lb(2176, "float32", 0), lb(2112, "float32"), deps=(5,)),
        Dma(0, (16,), ddr(128, "int8"), lb(1024, "int8"), deps=(2,)),
    ]
    p = program(*instrs, hw=INT8, args=[TensorArg("x", "input", (128,), "int8", "float32", 0),
                                        TensorArg("y", "output", (16,), "int8", "float32", 128)])
    validate(p)
    r = simulate(p, mode="timing")
    assert r.outputs == [] and r.report.instructions == len(instrs) and r.report.vector_lane_ops == 3 * 16
    with pytest.raises(ValueError, match="only timing"):
        simulate(p, [np.zeros(128, np.float32)])


def test_malformed_fields_get_a_message_not_a_crash():
    assert error(replace(VEC, shape=[64])).endswith("(vector): shape [64] is not a tuple")
    assert error(replace(VEC, dst=replace(VEC.dst, strides=[1]))).endswith(
        "(vector): dst strides [1] are not a tuple of ints")
    assert error(replace(VEC, srcs=(lb(0), replace(lb(128), strides=(1.5,))))).endswith(
        "(vector): src1 strides (1.5,) are not a tuple of ints")
    assert error(Dma(0, (64,), lb(0), None)).endswith("(dma): src0 is None, not an Operand")
    assert error(replace(RED, reduce=[False, True])).endswith("(reduce): reduce mask [False, True] is not a tuple")


# -- replicas: a range of the stream again, moved ----------------------------------------------------

def _replicated(*replicas, tail=()) -> Program:
    """Core 0 loads 64 fp16 from DDR 0 into its LB, adds, stores to DDR 4096, then runs ``tail``;
    ``replicas`` go among them where they say."""
    load = Dma(0, (64,), lb(0), ddr(0))
    add = Vector(0, "vme", "add", (64,), lb(128), (lb(0), 1.0), (0,))
    store = Dma(0, (64,), ddr(4096), lb(128), (1,))
    kernel = Kernel("k", (0,), (load, add, store, *tail), replicas=replicas)
    return Program(HW, 1 << 16, (), (kernel,), name="t")


def test_a_replica_at_the_end_is_the_range_moved_to_another_cluster():
    """Cores +8 (cluster 1): the LB operands go with the core; DDR by the ranges."""
    compact = _replicated(Replica(0, 3, 3, 8, (("ddr", 0, 0, 128, 0, 128), ("ddr", 0, 4096, 4224, 0, 128))))
    (k,) = Program.deserialize(compact.serialize()).kernels
    assert k.cores == (0, 8) and len(k.instructions) == 6 and k.replicas == ()
    load, add, store = k.instructions[3:]
    assert (load.core, load.dst, load.src) == (8, lb(0, core=8), ddr(128))
    assert (add.deps, add.srcs) == ((3,), (lb(0, core=8), 1.0))
    assert (store.deps, store.dst) == ((4,), ddr(4224))
    assert compact.expanded().kernels == Program.deserialize(compact.serialize()).kernels
    validate(compact)  # the copies are checked too


def test_a_replica_goes_where_it_says_and_its_dependencies_follow_it():
    """The add and store again at position 3, on other LB bytes and DDR, before the kernel's own
    fourth instruction: the copy's dependencies (on the load and the add) move by 3 - 1 = 2, so
    the copied add waits for the stream's instruction 2, the first store; the kernel's own
    instruction after the copy is at position 5."""
    tail = (Dma(0, (64,), ddr(8192), lb(256), (4,)),)
    moves = (("lb", 0, 128, 256, 0, 128), ("ddr", 0, 4096, 4224, 0, 4096))
    compact = _replicated(Replica(1, 3, 3, 0, moves), tail=tail)
    (k,) = compact.expanded().kernels
    assert len(k.instructions) == 6 and k.cores == (0,)
    add, store = k.instructions[3:5]
    assert (add.deps, add.dst, add.srcs) == ((2,), lb(256), (lb(0), 1.0))  # lb(0) is not in a move
    assert (store.deps, store.dst, store.src) == ((3,), ddr(8192), lb(256))
    assert k.instructions[5] == tail[0]
    validate(compact)


def test_a_replica_remaps_the_dependencies_it_lists():
    """A second load (into LB 512) and a fill follow the kernel's store; the add and store again
    at position 5 read the second load's data. Shifted by 5 - 1 = 4, the add's dependency on the
    first load would go to the fill; the remap sends it to the second load instead (what emitting
    the copy would wait for); the store's dependency on the add, inside the range, shifts."""
    tail = (Dma(0, (64,), lb(512), ddr(8192), (2,)), Fill(0, (64,), lb(1024), 0.0))
    moves = (("lb", 0, 0, 128, 0, 512), ("lb", 0, 128, 256, 0, 128), ("ddr", 0, 4096, 4224, 0, 4096))
    compact = _replicated(Replica(1, 3, 5, 0, moves, ((0, 3),)), tail=tail)
    (k,) = Program.deserialize(compact.serialize()).kernels
    add, store = k.instructions[5:]
    assert (add.deps, add.srcs, add.dst) == ((3,), (lb(512), 1.0), lb(256))
    assert (store.deps, store.src) == ((5,), lb(256))
    assert compact.expanded().kernels == (k,)
    validate(compact)


@pytest.mark.parametrize("replicas, message", [
    ((Replica(1, 3, 3, 0, (), ((1, 0),)),), "a remapped dependency must go from before 1 to before 3"),
    ((Replica(1, 3, 3, 0, (), ((0, 3),)),), "a remapped dependency must go from before 1 to before 3"),
    ((Replica(1, 3, 2, 0, ()),), r"replica \[1, 3\) at 2: must copy a range before where it goes"),
    ((Replica(0, 3, 4, 0, ()),), "replica at 4 lies beyond the kernel's stream"),
    ((Replica(0, 1, 3, 0, ()), Replica(0, 1, 2, 0, ())), "replicas must go in increasing order"),
    ((Replica(0, 3, 3, 0, (("ddr", 0, 0, 128, 0, 64), ("ddr", 0, 64, 256, 0, 0))),),
     r"moves of ddr\[0\] overlap at offset 64"),
])
def test_a_malformed_replica_is_refused(replicas, message):
    with pytest.raises(ProgramError, match=message):
        Program.deserialize(_replicated(*replicas).serialize())


def test_a_renamed_program_renames_its_args_and_layers_and_keeps_the_rest():
    """``renamed``: what a sub-graph of the same form runs (``host.execute`` with a call's
    ``info.names``): the program, its kernels, the args and layer marks ``names`` lists get the
    new names, everything else is the program it was, instructions and replicas the same tuples."""
    base = _replicated(Replica(0, 3, 3, 8, (("ddr", 0, 0, 128, 0, 128), ("ddr", 0, 4096, 4224, 0, 128))))
    args = (TensorArg("x", "input", (64,), "float16", "float32", 0), TensorArg("y", "output", (64,), "float16", "float32", 4096))
    layers = (LayerMark(0, "conv", (64,)), LayerMark(1, "add", (64,)))
    a = replace(base, args=args, kernels=(replace(base.kernels[0], layers=layers),))
    b = Program.deserialize(a.serialize()).renamed("other", {"x": "x2", "add": "add2", "unused": "z"})
    assert b.name == "other" and [k.name for k in b.kernels] == ["other"]
    assert [t.name for t in b.args] == ["x2", "y"] and [m.name for m in b.kernels[0].layers] == ["conv", "add2"]
    assert b.args[0] == replace(args[0], name="x2") and b.kernels[0].layers[1] == replace(layers[1], name="add2")
    assert b.kernels[0].instructions == a.expanded().kernels[0].instructions
    c = a.renamed("t", {})
    assert c == replace(a, kernels=(replace(a.kernels[0], name="t"),)) and c.kernels[0].layers == layers
    assert c.kernels[0].instructions is a.kernels[0].instructions and c.kernels[0].replicas is a.kernels[0].replicas
