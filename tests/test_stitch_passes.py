"""The kernel-generation passes of seed 000 §4 (``tvm_dsa.kernelgen.stitch_passes``), one at a time on
sub-graph modules of small hand-built graphs, each pass's decision derived in the test."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import tvm
from helpers import HW, KB, conv_chain, residual_block, sub_module, through

from tvm_dsa import hardware
from tvm_dsa.kernel.ir import ALIGN, align
from tvm_dsa import isa
from tvm_dsa.emit.emitter import place_arguments
from tvm_dsa.kernelgen.stitch import _runs, emit_stitched, read_allocation, read_instances, read_rows, read_subgraph
from tvm_dsa.runtime.timing import simulate_program
from tvm_dsa.emit.footprint import footprints
from tvm_dsa.kernel.attrs import GB_SCOPE, LB_SCOPE
from tvm_dsa.kernelgen.stitch_passes import (
    DDR_SCOPE, AssignMemoryScopes, BindCores, OrderInstances, StitchBuffers,
    stitch_passes
)

CPC = HW.cores_per_cluster


def run(mod, *passes):
    return tvm.transform.Sequential(list(passes))(mod)


def test_stitch_buffers_records_every_instances_tiles():
    """Batch 4 split four ways: instance i computes the tiles of sample i of both layers, each tile
    once, and its intermediate is sample i of the tensor."""
    mod = run(sub_module(lambda: conv_chain(batch=4), split=(0, 4)), StitchBuffers(HW))
    sg, prints = read_subgraph(mod, HW)
    attr = mod.attrs["dsa.instances"]
    assert len(attr["rows"]) == 4 and float(attr["recompute"]) == 1.0
    for L in sg.layers:
        fp = footprints(L)
        rows = [read_rows(attr["rows"][i][L.name]).tolist() for i in range(4)]
        assert sorted(r for rs in rows for r in rs) == list(range(len(fp.tiles)))
        for i, rs in enumerate(rows):  # the first tile loop walks the batch
            assert {fp.tiles[r][0] for r in rs} == {i}
    assert "dsa.instances" in mod.script()  # the decision prints with the module
    # rows are kept as [start, stop) runs, in their order
    rows = np.array([0, 1, 2, 5, 7, 8, 4])
    assert _runs(rows) == [0, 3, 5, 6, 7, 9, 4, 5] and read_rows(_runs(rows)).tolist() == rows.tolist()


def rounds_module():
    """Batch 64 of 8x8 images, tiled into 8 KiB of LB: a sample per tile, 64 instances."""
    return sub_module(lambda: conv_chain(batch=64, hw_=8), split=(0, 64), budget=8 * KB)


def test_bind_cores_follows_algorithm_4():
    """4 instances: a cluster each, on all its cores; 64: 16 per cluster, one core each, two rounds."""
    four = run(sub_module(lambda: conv_chain(batch=4), split=(0, 4)), StitchBuffers(HW), BindCores(HW))
    assert [list(c) for c in four.attrs["dsa.cores"]] == [list(range(c * CPC, (c + 1) * CPC)) for c in range(4)]
    many = run(rounds_module(), StitchBuffers(HW), BindCores(HW))
    cores = [tuple(c) for c in many.attrs["dsa.cores"]]
    assert all(len(c) == 1 for c in cores) and len(cores) == 64
    assert sorted(cores) == sorted((k,) for k in range(4 * CPC) for _ in range(2))
    assert all(c[0] // CPC == i // 16 for i, c in enumerate(cores))  # 16 consecutive instances a cluster


@pytest.mark.parametrize("gb, lb", [(True, False), (False, False), (True, True)])
def test_assign_memory_scopes(gb, lb):
    """GB where the instance spans cores (or lb is off), DDR without the GB, LB for one-core
    instances with the LB's rest below the layers' largest tile plan; weights promoted with the GB.
    At batch 4 the output too: its tiles of a few rows of 8 would store it in runs shorter than a
    DDR burst, its instances' samples in whole planes (``stitch._stored_short``; without the GB
    it is written in its own DDR region all the same)."""
    batch = 32 if lb else 4
    mod = run(sub_module(lambda: conv_chain(batch=batch, hw_=8), split=(0, batch)), StitchBuffers(HW), BindCores(HW),
              AssignMemoryScopes(HW, gb=gb, lb=lb))
    sg, _ = read_subgraph(mod, HW)
    mid, out = (L.args[L.ir.params[-1][0]] for L in sg.layers)
    attr = mod.attrs["dsa.scopes"]
    expected = LB_SCOPE if lb else GB_SCOPE if gb else DDR_SCOPE
    assert [dict(m) for m in attr["instances"]] == [{mid: expected} | ({} if lb else {out: expected})] * batch
    assert sorted(attr["promote"]) == (sorted(sg.inputs[1:]) if gb else [])
    assert int(attr["gb_bytes"]) == (HW.gb_bytes if gb else 0)
    top = max(L.plan.total_bytes for L in sg.layers)
    assert int(attr["lb_bytes"]) == ((HW.lb_bytes - top) // ALIGN * ALIGN if lb else 0)


def _gb_peak(mod):
    return max(b.offset + align(b.nbytes) for b in read_allocation(mod) if b.level == "gb")


def test_order_instances_keeps_the_smaller_gb_peak():
    """Batch 64, two rounds per core: depth first, a round's 8 intermediates (8x8x8 fp16 = 1 KiB
    each) die before the next round starts, while both weights (8x8x3x3 fp16, promoted at first use)
    are read in both rounds; breadth first, both rounds' intermediates are live while layer 2 runs
    round 0, and layer 1's weights are dead by then."""
    sub = rounds_module()
    mid, weight = 8 * 8 * 8 * 2, align(8 * 8 * 3 * 3 * 2)
    peaks = {o: _gb_peak(through(sub, o)) for o in ("dfs", "bfs")}
    assert peaks == {"dfs": 8 * mid + 2 * weight, "bfs": 16 * mid + weight}
    best = through(sub)
    assert str(best.attrs["dsa.order"]) == "dfs"
    with pytest.raises(ValueError, match="unknown instance order 'zigzag'"):
        OrderInstances(HW, "zigzag")


def test_clusters_alike_share_their_buffers_summary(monkeypatch):
    """The order and prefetch decisions read each cluster's (spills, LB-kept, bytes promoted, GB
    peak); the four
    clusters of the 64-instance module are the first moved along the batch, so their buffers are
    worked out once per order, and each summary is what the cluster's own buffers give."""
    from tvm_dsa.kernelgen import stitch_passes as passes

    mod = through(rounds_module())
    k = passes._Kernel(mod).read(HW)
    assert len({k._alike(c) for c in k.clusters}) == 1
    calls = []
    buffers = passes._Kernel.buffers
    monkeypatch.setattr(passes._Kernel, "buffers", lambda self, *a: calls.append(a) or buffers(self, *a))
    for order in ("dfs", "bfs"):
        for c in sorted(k.clusters):
            bufs = buffers(k, c, order, {}, "longest")
            assert k.summary(c, order, {}, "longest") == (
                sum(b.level == "ddr" for b in bufs), sum(b.level == "lb" for b in bufs),
                sum(b.nbytes for b in bufs if b.kind == "w" and b.level == "gb"),
                max((b.offset + align(b.nbytes) for b in bufs if b.level == "gb"), default=0))
    assert calls == [(0, "dfs", {}, "longest"), (0, "bfs", {}, "longest")]


def test_clusters_alike_but_for_their_rows_place_their_buffers_alike():
    """One 29-row image over the four clusters: the instances take 8, 8, 8 and 5 output rows, so
    the intermediate's boxes (with their halos) hold 9, 10, 10 and 6 rows, and placed by their own
    sizes the second weight, allocated after them, took other GB offsets in the first and last
    clusters (17,728 and 16,320 against 18,176). Each buffer is placed at the largest size of its
    place among the clusters (``_padded_sizes``), so every buffer sits at one offset in all four
    GBs, and the weight's four promotions are one DDR multicast: DDR reads its bytes once."""
    mod = through(sub_module(lambda: conv_chain(batch=1, hw_=29), split=(2, 4)))
    buffers = read_allocation(mod)
    sg, prints = read_subgraph(mod, HW)
    boxes = read_instances(mod, sg, prints, HW).boxes
    own = [math.prod(h - l for l, h in zip(*boxes[i]["lv"])) * sg.itemsize("lv") for i in range(4)]
    assert own == [9 * 29 * 8 * 2, 10 * 29 * 8 * 2, 10 * 29 * 8 * 2, 6 * 29 * 8 * 2]
    places = {}
    for b in buffers:
        places.setdefault((b.kind, b.tensor), set()).add((b.level, b.offset, b.nbytes))
    assert all(len(p) == 1 for p in places.values())
    assert {b.nbytes for b in buffers if b.kind == "t"} == {max(own)}
    program, _ = emit_stitched(mod, HW)
    kernel = program.expanded().kernels[0]
    riders = simulate_program(program, HW, False).kernels[0].riders
    regions = place_arguments(sg.inputs, sg.outputs, sg.tensors, sg.stored)[0]
    read = sum(math.prod(ins.shape) * ins.src.itemsize for i, ins in enumerate(kernel.instructions)
               if type(ins) is isa.Dma and ins.src.mem == "ddr" and ins.dst.mem == "gb" and i not in riders
               and regions["a1"].base <= ins.src.offset < regions["a1"].base + regions["a1"].nbytes)
    assert read == regions["a1"].nbytes


def test_cross_layer_schedule_promotes_each_weight_early_where_the_gb_holds_it():
    """The residual block, a sample per cluster: the 1x1 conv's weights and bias are first read at
    step 1. At step 0 the 3x3 conv's weights and output take 6656 bytes of GB; the 1x1 weights
    (512 B) fill a 7 KiB GB exactly, so they are promoted a step early and the bias at first use;
    an 8 KiB GB takes both early."""
    w1, out1, w2, bias = 16 * 16 * 9 * 2, 16 * 8 * 8 * 2, 16 * 16 * 2, 16 * 2
    assert w1 + out1 + w2 == 7 * KB < w1 + out1 + w2 + align(bias) <= 8 * KB
    sub = sub_module(residual_block, split=(0, 4))
    for kib, early in ((7, {"a2": 1}), (8, {"a2": 1, "a3": 1})):
        hw = hardware.register(dataclasses.replace(HW, name=f"stcp920-gb{kib}k", gb_bytes=kib * KB), override=True)
        mod = through(sub, prefetch=2, hw=hw)
        assert [dict(m) for m in mod.attrs["dsa.prefetch"]] == [early] * 4
        assert all(b.level == "gb" for b in read_allocation(mod))
        weights = {b.tensor: b.first for b in read_allocation(mod) if b.kind == "w" and b.cluster == 0}
        assert weights == {"a1": 0, "a2": 0, "a3": 1 - early.get("a3", 0)}


def test_cross_layer_schedule_issues_promotions_in_the_order_of_first_use():
    """A 10 KiB GB; 6 KiB live through steps 0-3 and 2 KiB at step 1; weights of 1, 3 and 1 KiB
    first read at steps 1, 2 and 3, two steps early at most. w1 goes a step early (7 KiB at
    step 0); w2 does not fit at step 1 (12 KiB), so it is issued at step 2; w3
    would fit two steps early (10 KiB at step 1), but the cluster DMA runs promotions in the order
    issued, and one issued at step 1 for step 3 would hold up the one step 2 waits for: it goes
    one step early, with w2."""
    from tvm_dsa.kernelgen.stitch import Buffer
    from tvm_dsa.kernelgen.stitch_passes import _Kernel

    def buf(kind, name, first, last, kib):
        return Buffer(0, kind, name, 0, first, last, kib * KB, "gb", 0, 0)

    gb = [buf("t", "x", 0, 3, 6), buf("t", "y", 1, 1, 2), buf("w", "w1", 1, 1, 1), buf("w", "w2", 2, 2, 3),
          buf("w", "w3", 3, 3, 1)]
    k = _Kernel(None)
    k.scopes = ([], frozenset(), 0, 10 * KB)
    k.buffers = lambda c, order, ahead, spill: gb  # placed as they come: nothing spills
    k.summary = lambda c, order, ahead, spill: (0, 0, 0)
    k._alike = lambda c: ()
    assert k.promotions(0, "dfs", 2, "longest") == {"w1": 1, "w3": 1}


def test_allocate_buffers_spills_each_cluster_to_its_own_scratch():
    """A 1 KiB GB holds none of the 2 KiB intermediates (16x8x8 fp16): each cluster's goes to
    DDR, at its own aligned offset of the kernel's scratch. Of the promoted weights, the 3x3
    conv's (4.5 KiB) is read where it is; the 1x1 conv's (512 B) and the bias (32 B) fit."""
    hw = hardware.register(dataclasses.replace(HW, name="stcp920-gb1k", gb_bytes=1 * KB), override=True)
    mod = through(sub_module(residual_block, split=(0, 4)), hw=hw)
    buffers = read_allocation(mod)
    inter = sorted((b.owner, b.offset) for b in buffers if b.kind == "t")
    assert inter == [(i, i * align(16 * 8 * 8 * 2)) for i in range(4)]
    assert {b.level for b in buffers if b.kind == "t"} == {"ddr"}
    weights = sorted((b.nbytes, b.level, b.offset) for b in buffers if b.kind == "w" and b.cluster == 0)
    assert weights == [(32, "gb", 0), (512, "gb", align(32)), (16 * 16 * 9 * 2, "ddr", -1)] or \
        weights == [(32, "gb", 512), (512, "gb", 0), (16 * 16 * 9 * 2, "ddr", -1)]


def test_stitch_passes_are_the_six_in_order():
    names = []

    @tvm.instrument.pass_instrument
    class Names:
        def run_before_pass(self, _mod, info):
            names.append(info.name)

    with tvm.transform.PassContext(instruments=[Names()]):
        mod = stitch_passes(HW)(sub_module(lambda: conv_chain(batch=4), split=(0, 4)))
    six = ["dsa.StitchBuffers", "dsa.BindCores", "dsa.AssignMemoryScopes", "dsa.OrderInstances",
           "dsa.CrossLayerSchedule", "dsa.AllocateBuffers"]
    assert [n for n in names if n.startswith("dsa.") and n != "dsa.StitchKernel"] == six
    assert {"dsa.instances", "dsa.cores", "dsa.scopes", "dsa.order", "dsa.prefetch", "dsa.allocation"} <= set(mod.attrs.keys())
