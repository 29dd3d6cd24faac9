"""Stitched kernels (seed 000 §4.2-4.3): allocation with spilling, instances with recomputation, and
whole sub-graphs on the simulator against llvm."""

import dataclasses
import functools
import importlib
import itertools
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import tvm
import tvm_ffi
from helpers import HW, KB, conv_chain, fuse, relax_graph, residual_block, single_sample_block
from tvm import relax

import tvm_dsa
from tvm_dsa import hardware, isa
from tvm_dsa.kernelgen import stitch, stitch_passes, stitched
from tvm_dsa.kernelgen.stitch_passes import _ddr_bytes
from tvm_dsa.emit.emitter import PROMOTE, build_program, place_arguments
from tvm_dsa.emit.placement import Layer
from tvm_dsa.isa import Program
from tvm_dsa.kernelgen.stitch import (
    RECOMPUTE_LIMIT, SLAB_BYTES, Instances, Lifetime, allocate, binding, cluster_rounds, emit_stitched, makespan,
    plan_instances, write_out_slabs
)
from tvm_dsa.emit.footprint import footprints
from tvm_dsa.kernelgen.stitched import StitchOptions
from tvm_dsa.packed import EXECUTE
from tvm_dsa.runtime import simulate, timing_cycles
from tvm_dsa.runtime.cost import ddr_effective_bytes
from tvm_dsa.runtime.timing import simulate_program
from tvm_dsa.schedule import graphturbo
from tvm_dsa.schedule.graph import OpGraph, SubGraphs
from tvm_dsa.tir_passes.tile import TilePlan
from tvm_dsa.tiling import lower_kernel
from tvm_dsa.tir_passes import lower_with_plan, plan_of

# -- allocation and spilling ---------------------------------------------------------------------
def test_dead_tensors_space_is_reused():
    lives = [Lifetime("a", 4 * KB, 0, 1), Lifetime("b", 4 * KB, 1, 2), Lifetime("c", 4 * KB, 2, 3)]
    offsets, spilled = allocate(lives, 8 * KB)
    # a dies after step 1, so c (written at step 2) takes its place; b sits beside them
    assert offsets == {"a": 0, "b": 4 * KB, "c": 0} and spilled == []


def test_spill_policies_pick_different_victims():
    # four tensors live at step 2 need 10 KiB of an 8 KiB level
    lives = [Lifetime("long_small", 1 * KB, 0, 9), Lifetime("big", 5 * KB, 1, 3),
             Lifetime("mid", 2 * KB, 1, 4), Lifetime("new", 2 * KB, 2, 3)]
    _, longest = allocate(lives, 8 * KB, "longest")
    _, largest = allocate(lives, 8 * KB, "largest")
    # the seed spills the longest remaining lifetime: long_small (7 steps left) frees 1 KiB, 9 KiB
    # still do not fit, then mid (2 steps left): 7 KiB fit. Prior work spills the largest: big alone.
    assert longest == ["long_small", "mid"]
    assert largest == ["big"]


def test_spilling_stops_when_the_rest_fits():
    lives = [Lifetime(k, 3 * KB, 0, 5) for k in "abcd"]
    offsets, spilled = allocate(lives, 8 * KB)
    assert len(spilled) == 2 and all(offsets[k] + 3 * KB <= 8 * KB for k in offsets)
    with pytest.raises(ValueError, match="unknown spill policy 'fifo'"):
        allocate(lives, 8 * KB, "fifo")


# -- instances -------------------------------------------------------------------------------
def _fused_layers(build):
    """Lowered layers of a Relax graph, with their call-site tensors, in program order."""
    mod = fuse(build())
    graph = OpGraph.from_relax(mod)
    layers = [Layer.of(lower_kernel(mod[n.func], HW)[0], HW, n.name, (*n.inputs, n.output)) for n in graph.nodes]
    return mod, graph, layers


def test_batch_instances_partition_without_recomputation():
    _, graph, layers = _fused_layers(lambda: conv_chain(batch=4))
    prints = {L.name: footprints(L) for L in layers}
    inst = plan_instances(layers, prints, [graph.outputs[0]], loop=0, groups=4)
    assert inst.count == 4 and inst.recompute == 1.0
    mid = layers[0].args[layers[0].ir.params[-1][0]]
    # instance i holds sample i of the intermediate, whole
    for i in range(4):
        assert inst.boxes[i][mid] == ((i, 0, 0, 0), (i + 1, 8, 16, 16))
    # every tile of every layer is computed exactly once
    for L in layers:
        tiles = [prints[L.name].tiles[r] for i in range(4) for r in inst.rows[i][L.name]]
        assert sorted(tiles) == sorted(prints[L.name].tiles)


@pytest.mark.parametrize("elements", [stitch.PROPAGATE_ELEMENTS, 1])  # all instances at once, one at a time
def test_row_instances_recompute_the_halo(monkeypatch, elements):
    monkeypatch.setattr(stitch, "PROPAGATE_ELEMENTS", elements)
    _, graph, layers = _fused_layers(lambda: conv_chain(batch=1, k=3, hw_=32))
    prints = {L.name: footprints(L) for L in layers}
    first, last = layers
    rows = [lp.extent for lp in first.ir.tile_loops()][2]
    assert rows == [lp.extent for lp in last.ir.tile_loops()][2] == 8  # 8 row tiles of 4 rows each
    # 2 instances of 4 row tiles: the second 3x3 conv reads one row past its half, so each computes
    # one more row tile of the first layer: (5 + 5 + 4 + 4) / (8 + 8) tiles of equal work
    two = plan_instances(layers, prints, [graph.outputs[0]], loop=2, groups=2)
    assert two.count == 2 and two.recompute == (5 + 5 + 4 + 4) / 16
    mid = first.args[first.ir.params[-1][0]]
    assert two.boxes[0][mid] == ((0, 0, 0, 0), (1, 8, 20, 32))  # rows 0..15 and the halo tile 16..19
    assert two.boxes[1][mid] == ((0, 0, 12, 0), (1, 8, 32, 32))
    # 4 instances of 2 tiles would compute (3 + 4 + 4 + 3 + 8) / 16 = 1.375 > RECOMPUTE_LIMIT:
    # coarsened to the 2 above
    four = plan_instances(layers, prints, [graph.outputs[0]], loop=2, groups=4)
    assert (3 + 4 + 4 + 3 + 8) / 16 > RECOMPUTE_LIMIT and four.count == 2 and four.recompute == two.recompute


def test_an_output_the_sub_graph_reads_has_boxes_only_where_each_instance_reads_its_own():
    """conv -> conv with the first conv's output leaving the sub-graph too. Split by samples, each
    instance reads only the sample it writes: it keeps the output (a box, like an intermediate's)
    and copies it out. Split by rows with no recomputation, the second 3 x 3 conv of each half
    reads a halo row the other half wrote: no box, the output is read in DDR. The last output
    never has one."""
    _, graph, layers = _fused_layers(lambda: conv_chain(batch=4))
    prints = {L.name: footprints(L) for L in layers}
    mid, last = (L.args[L.ir.params[-1][0]] for L in layers)
    inst = plan_instances(layers, prints, [mid, last], loop=0, groups=4)
    assert [b for b in inst.boxes] == [{mid: ((i, 0, 0, 0), (i + 1, 8, 16, 16))} for i in range(4)]

    _, graph, layers = _fused_layers(lambda: conv_chain(batch=1, k=3, hw_=32))
    prints = {L.name: footprints(L) for L in layers}
    mid, last = (L.args[L.ir.params[-1][0]] for L in layers)
    halves = [{L.name: np.array([r for r, t in enumerate(prints[L.name].tiles) if (t[2] < 4) == (h == 0)])
               for L in layers} for h in (0, 1)]  # row tiles of 4 rows: 0-15 and 16-31
    assert [b[mid] for b in Instances.of(layers, prints, [last], halves, 1.0).boxes] == \
        [((0, 0, 0, 0), (1, 8, 16, 32)), ((0, 0, 16, 0), (1, 8, 32, 32))]  # an intermediate: its halves
    assert Instances.of(layers, prints, [mid, last], halves, 1.0).boxes == [{}, {}]
    whole = [{L.name: np.arange(len(prints[L.name].tiles)) for L in layers}]
    assert Instances.of(layers, prints, [mid, last], whole, 1.0).boxes == [{mid: ((0, 0, 0, 0), (1, 8, 32, 32))}]


def test_an_output_its_tiles_store_in_runs_shorter_than_a_burst_is_copied_out_of_the_gb():
    """The second conv's output (1 x 8 x 32 x 32, fp16) leaves the sub-graph and nothing in it
    reads it. Tiles of 4 x 4 pixels would store it in runs of 4 elements (8 bytes, an eighth of a
    burst); an instance's box of whole rows lengthens them, so the instance keeps it in the GB and
    copies it out. Tiles of whole rows, or instances no wider than the tiles, store as they are."""
    _, graph, layers = _fused_layers(lambda: conv_chain(batch=1, k=3, hw_=32))
    last = layers[1].args[layers[1].ir.params[-1][0]]
    corners = np.array([(0, 0, r, c) for r in range(0, 32, 4) for c in range(0, 32, 4)])
    narrow = (corners, corners + (1, 8, 4, 4))
    whole = [{last: ((0, 0, 0, 0), (1, 8, 32, 32))}]
    assert 4 * 2 < HW.ddr_burst_bytes <= 32 * 32 * 2
    assert stitch._stored_short(layers[1], narrow, whole, last, HW)
    assert not stitch._stored_short(layers[1], narrow, whole, last, None)  # no chip: no bursts
    assert not stitch._stored_short(layers[1], narrow, [{last: ((0, 0, 0, 0), (1, 8, 4, 4))}], last, HW)
    rows = np.array([(0, 0, r, 0) for r in range(0, 32, 4)])
    assert not stitch._stored_short(layers[1], (rows, rows + (1, 8, 4, 32)), whole, last, HW)


def test_a_single_sample_is_split_by_rows_when_its_channels_cannot_be():
    """At batch 1 the scheduler's split (channels, loop 1) gives one instance, and a channel split
    would have every instance compute all of its producer's channels. Given the chip, the batch
    with the rows cut alone is tried too: the two row halves of the test above, within the limit,
    so two clusters work where one did."""
    _, graph, layers = _fused_layers(lambda: conv_chain(batch=1, k=3, hw_=32))
    prints = {L.name: footprints(L) for L in layers}
    alone = plan_instances(layers, prints, [graph.outputs[0]], loop=1, groups=8)
    assert alone.count == 1
    rows = plan_instances(layers, prints, [graph.outputs[0]], loop=1, groups=8, hw=HW)
    assert rows.count == 2 and rows.recompute == (5 + 5 + 4 + 4) / 16 <= RECOMPUTE_LIMIT
    mid = layers[0].args[layers[0].ir.params[-1][0]]
    assert [b[mid] for b in rows.boxes] == [((0, 0, 0, 0), (1, 8, 20, 32)), ((0, 0, 12, 0), (1, 8, 32, 32))]
    assert [c[0] // HW.cores_per_cluster for c in binding(rows.count, HW)] == [0, 1]


def test_boxes_cut_by_the_edges_say_so_and_are_no_translates():
    """A padded 3x3 conv's row tiles: the first reads its input from row 0 with the padding above,
    the last to the end with it below, the others neither. Two clusters whose instances are the
    first and last rows (boxes of one height, a translate as boxes) are not copies of each other."""
    _, graph, layers = _fused_layers(lambda: conv_chain(batch=1, k=3, hw_=32))
    prints = {L.name: footprints(L) for L in layers}
    first = layers[0]
    fp = prints[first.name]
    x = first.ir.params[0][0]  # the padded input
    rows = np.asarray([t[2] for t in fp.tiles])  # the row tile of each tile
    cut_above, cut_below = fp.cut[x][:, 2], fp.cut[x][:, 4 + 2]
    np.testing.assert_array_equal(cut_above, rows == rows.min())
    np.testing.assert_array_equal(cut_below, rows == rows.max())
    top, bottom = np.flatnonzero(rows == rows.min()), np.flatnonzero(rows == rows.max())
    heights = fp.reads[x][1][:, 2] - fp.reads[x][0][:, 2]
    assert (heights[top] == heights[bottom]).all()  # translates as boxes
    both = Instances([{first.name: top}, {first.name: bottom}], [{}, {}], 1.0)
    assert stitch._translation(SimpleNamespace(layers=[first]), prints, both, [(0, 1)], frozenset()) is None


def _rms_norm(shape=(2, 3, 4, 5)):
    """RMS normalization over all but the first dim (ONNX's RMSNormalization, axis 1)."""
    return relax_graph([shape, shape[1:]],
                       lambda x, w: relax.op.nn.rms_norm(x, w, axes=list(range(1, len(shape))), epsilon=1e-5))


def test_row_tiles_that_load_the_whole_sample_and_read_their_rows_are_no_translates():
    """A row tile of an RMS normalization over (C, H, W) loads its whole sample (the reduction)
    and reads its own rows of it: the first and third row tiles load alike (the input's boxes do
    not move) but read apart in the LB (``Footprint.relative``), so two clusters running them are
    not copies of each other. Tiles of two samples do move alike."""
    _, graph, layers = _fused_layers(_rms_norm)
    (norm,) = layers
    fp = footprints(norm)
    x = norm.ir.params[0][0]
    tiles = np.asarray(fp.tiles)
    first = np.flatnonzero((tiles[:, 0] == 0) & (tiles[:, 2] == 0))
    third = np.flatnonzero((tiles[:, 0] == 0) & (tiles[:, 2] == 2))
    other_sample = np.flatnonzero((tiles[:, 0] == 1) & (tiles[:, 2] == 0))
    assert len(first) == len(third) > 0
    assert (fp.reads[x][0][first] == fp.reads[x][0][third]).all()  # the whole sample, both
    assert (fp.relative[first] != fp.relative[third]).any()
    rows = Instances([{norm.name: first}, {norm.name: third}], [{}, {}], 1.0)
    assert stitch._translation(SimpleNamespace(layers=[norm]), {norm.name: fp}, rows, [(0, 1)], frozenset()) is None
    samples = Instances([{norm.name: first}, {norm.name: other_sample}], [{}, {}], 1.0)
    moved = stitch._translation(SimpleNamespace(layers=[norm]), {norm.name: fp}, samples, [(0, 1)], frozenset())
    assert moved[norm.args[x]] == (1, 0, 0, 0)


def test_an_rms_normalization_split_by_rows_matches_numpy(rng):
    """End to end: graphturbo splits the two samples' rows over the clusters and every row is
    right (the third and fourth rows' cluster was a wrong copy of the first's). Splits into 8
    and into 4 instances keep the busiest core alike; the fewest on every cluster is kept: one
    instance a cluster, half a sample's rows each."""
    mod = _rms_norm()
    x, w = rng.standard_normal((2, 3, 4, 5)).astype("float32"), rng.standard_normal((3, 4, 5)).astype("float32")
    vm, result = _run(mod, "graphturbo")
    out = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(w)).numpy()
    (info,) = result.stitched.values()
    assert info.instances == HW.clusters
    ref = x / np.sqrt((x.astype("float64") ** 2).mean(axis=(1, 2, 3), keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(out, ref, rtol=1e-2, atol=1e-2 * np.abs(ref).max())


def test_a_split_whose_sample_recomputes_too_much_is_not_propagated_in_full(monkeypatch):
    """conv 3x3 (16 row tiles) -> transpose H/W (8 channel tiles): every instance of a channel
    split needs all of the conv's rows, so n instances compute the conv n times. With
    SAMPLE_SEEDS = 2, the 8-instance split is judged from 2 of its instances (each recomputing the
    whole conv: their work scaled by 8 / 2 is over twice RECOMPUTE_LIMIT) and never propagated in
    full; splits of 4 and 2 are propagated (too few to sample) and fail; the instances chosen are
    those of the search without sampling. Worked out a few instances first, a split stops once
    its work is over the limit, with the same choice. A coarser split with too many seeds at the
    work per seed already sampled is ruled out unsampled."""
    op = relax.op
    _, graph, layers = _fused_layers(lambda: relax_graph(
        [(1, 16, 64, 64), (16, 16, 3, 3)],
        lambda x, w: op.permute_dims(op.nn.relu(op.nn.conv2d(x, w, padding=1)), [0, 1, 3, 2])))
    prints = {L.name: footprints(L) for L in layers}
    assert [len(prints[L.name].tiles) for L in layers] == [16, 8]
    real, sizes = stitch._propagate, []

    def spy(layers, prints, outputs, primary, seeds, *limit, **owned):
        out = real(layers, prints, outputs, primary, seeds, *limit, **owned)
        sizes.append((len(seeds), None if out is None else out.recompute))
        return out

    def plan():
        sizes.clear()
        return plan_instances(layers, prints, [graph.outputs[0]], loop=1, groups=8)

    monkeypatch.setattr(stitch, "_propagate", spy)
    monkeypatch.setattr(stitch, "SAMPLE_SEEDS", 1000)
    full = plan()
    assert [n for n, _ in sizes] == [8, 4, 2, 1] and sizes[0][1] > 2 * RECOMPUTE_LIMIT
    whole = list(sizes)
    # worked out 2 instances at a time, the splits of 8 and 4 stop as soon as their work is over
    # the limit: what they report is a lower bound, over the limit, and the choice is the same
    monkeypatch.setattr(stitch, "FIRST_SEEDS", 2)
    early = plan()
    assert [n for n, _ in sizes] == [8, 4, 2, 1] and sizes[2:] == whole[2:]
    assert all(RECOMPUTE_LIMIT < r < w for (_, r), (_, w) in zip(sizes[:2], whole[:2]))
    assert early.count == full.count and early.recompute == full.recompute
    monkeypatch.setattr(stitch, "SAMPLE_SEEDS", 2)
    sampled = plan()
    assert [n for n, _ in sizes] == [2, 4, 2, 1]  # the first: the sample of the 8-instance split
    assert sizes[0][1] * 8 / 2 > 2 * RECOMPUTE_LIMIT
    assert sampled.count == full.count == 1 and sampled.recompute == full.recompute == 1.0
    # one seed sampled: the 4-instance split is too many seeds at the work per seed of the
    # 8-instance split's sample (its seeds are unions of those), so it is not propagated at all
    monkeypatch.setattr(stitch, "SAMPLE_SEEDS", 1)
    floored = plan()
    assert [n for n, _ in sizes] == [1, 2, 1] and sizes[0][1] * 4 > 2 * RECOMPUTE_LIMIT
    assert floored.count == full.count and floored.recompute == full.recompute



def test_a_split_leaving_cores_idle_gives_way_to_a_coarser_even_one():
    """Two matmuls, 8 samples of 96 rows, each layer in 32 x 32 tiles: 3 row x 4 column tiles a
    sample. Cut by row ranges, the 24 instances (6 a cluster) get a core each and leave 2 of every
    8 idle: the busiest core runs 4 tiles of each layer. Cut by samples, the 8 instances get 4
    cores each, which run 12 / 4 = 3 tiles of each layer: an even share of the chip's 32 cores,
    no recomputation either way. Without the chip the first split is kept (the finest within
    the limit); with it, the one whose busiest core does least."""
    op = relax.op
    mod = fuse(relax_graph([(8, 96, 64), (64, 128), (128, 128)],
                           lambda x, w1, w2: op.matmul(op.nn.relu(op.matmul(x, w1)), w2)))
    graph = OpGraph.from_relax(mod)
    layers = [Layer.of(lower_with_plan(mod[n.func], TilePlan((1, 32, 32), None)), HW, n.name, (*n.inputs, n.output))
              for n in graph.nodes]
    prints = {L.name: footprints(L) for L in layers}
    assert [len(prints[L.name].tiles) for L in layers] == [8 * 3 * 4] * 2
    per_tile = sum(prints[L.name].work for L in layers)  # one tile of each layer
    rows = plan_instances(layers, prints, [graph.outputs[0]], loop=1, groups=3)
    assert rows.count == 24 and rows.recompute == 1.0
    assert makespan(layers, prints, rows, binding(24, HW)) == 4 * per_tile
    samples = plan_instances(layers, prints, [graph.outputs[0]], loop=1, groups=3, hw=HW)
    assert samples.count == 8 and samples.recompute == 1.0
    assert binding(8, HW)[0] == (0, 1, 2, 3)
    assert makespan(layers, prints, samples, binding(8, HW)) == 3 * per_tile == 8 * 12 * per_tile // HW.cores



# -- whole sub-graphs against llvm -------------------------------------------------------------
def _run(mod, schedule, hw="dsa/stcp920", options=None):
    ex = tvm.compile(mod, target=hw, relax_pipeline=tvm_dsa.pipeline(schedule, options=options))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm, tvm_dsa.pipeline_result()


def _llvm(mod, args):
    ex = tvm.compile(mod, target="llvm")
    return relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()


@pytest.mark.parametrize("options", [StitchOptions(), StitchOptions(order="bfs"), StitchOptions(gb=False)])
def test_residual_block_is_one_kernel_and_matches_llvm(rng, options):
    mod = residual_block()
    args = [rng.standard_normal([int(s) for s in p.ty.shape]).astype("float32") * 0.3 for p in mod["main"].params]
    ref = _llvm(mod, args)
    vm, result = _run(mod, "graphturbo", options=options)
    out = vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()
    assert np.abs(out - ref).max() / np.abs(ref).max() < 5e-3
    assert len(result.dsa) == 1 and result.host == {}
    (info,) = result.stitched.values()
    assert info.instances == 4 and info.recompute == 1.0  # the batch of 4, one per cluster
    report = tvm_dsa.last_report()
    if options.gb:
        # nothing between the layers goes to DDR: it reads the input (per cluster its samples, the
        # 3x3 window's halo re-read from DDR by the first layer), weights once per cluster, and
        # writes the output once
        assert report.ddr_write == 4 * 16 * 8 * 8 * 2
        assert report.gb_write > 0
    else:
        assert report.gb_write == 0 and report.ddr_write > 4 * 16 * 8 * 8 * 2


def test_layer_marks_attribute_instructions_to_layers(rng):
    mod = residual_block()
    args = [rng.standard_normal([int(s) for s in p.ty.shape]).astype("float32") for p in mod["main"].params]
    # constant weights, so that they are promoted to the GB
    mod = relax.transform.BindParams("main", {f"a{i}": tvm.runtime.tensor(args[i]) for i in (1, 2, 3)})(mod)
    vm, _ = _run(mod, "graphturbo")
    tvm_dsa.set_mode("functional", trace=True)
    try:
        vm["main"](tvm.runtime.tensor(args[0]))
    finally:
        tvm_dsa.set_mode("functional", trace=False)
    events = [e for e in tvm_dsa.last_trace() if e["ph"] == "X"]
    layers = {e["args"]["layer"] for e in events}
    # the cluster DMAs are the weights' promotions; the rest are the two fused layers (3x3 conv +
    # relu; 1x1 conv + bias + residual + relu), each convolution's MACs counted once (no recomputation
    # across samples), all of them writing the block's shape
    assert {e["args"]["layer"] for e in events if e["cat"] == "cdma"} == {PROMOTE}
    assert len(layers) == 3 and PROMOTE in layers
    macs: dict = {}
    for e in events:
        macs[e["args"]["layer"]] = macs.get(e["args"]["layer"], 0) + e["args"].get("macs", 0)
    assert sorted(macs[name] for name in layers - {PROMOTE}) == [4 * 16 * 8 * 8 * 16, 4 * 16 * 8 * 8 * 16 * 9]
    assert {tuple(e["args"]["output"]) for e in events if e["args"]["layer"] != PROMOTE} == {(4, 16, 8, 8)}


def test_gb_too_small_spills_to_ddr_and_stays_exact(rng):
    mod = residual_block()
    args = [rng.standard_normal([int(s) for s in p.ty.shape]).astype("float32") * 0.3 for p in mod["main"].params]
    ref = _llvm(mod, args)
    small = hardware.register(dataclasses.replace(HW, name="stcp920-gb1k", gb_bytes=1 * KB), override=True)
    vm, result = _run(mod, "graphturbo", hw="dsa/stcp920-gb1k")
    out = vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()
    assert np.abs(out - ref).max() / np.abs(ref).max() < 5e-3
    (info,) = result.stitched.values()
    # per cluster one sample, whose 2 KiB intermediate (16 x 8 x 8 fp16) cannot stay in a 1 KiB GB:
    # each instance's goes to DDR; of the weights (parameters here, read whole by every cluster,
    # so promoted) the 3x3 one (4.5 KiB) does not fit either, and each cluster reads it in DDR
    assert sorted(k[2] for k in info.spilled if k[0] == "t") == [0, 1, 2, 3]
    assert sorted((k[1], k[2]) for k in info.spilled if k[0] == "w") == [("a1", c) for c in range(HW.clusters)]
    assert info.gb_peak == 16 * 16 * 2 + 64 < small.gb_bytes  # the 1x1 weights, the bias (32 B) aligned to 64


def _two_outputs(rng, body):
    """``main(x, w)`` returning the tuple of the vars ``body(bb, x, w)`` emits (x: a sample a
    cluster, each 8 x 8 x 8; w: a 1 x 1 convolution's weights), its arguments and llvm's outputs."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((HW.clusters, 8, 8, 8), "float32"))
    w = relax.Var("w", relax.TensorType((8, 8, 1, 1), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(relax.Tuple(body(bb, x, w)))
        bb.emit_func_output(out)
    mod = bb.get()
    args = [rng.standard_normal((HW.clusters, 8, 8, 8)).astype("float32"), rng.standard_normal((8, 8, 1, 1)).astype("float32") * 0.3]
    ref = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())["main"](*[tvm.runtime.tensor(v) for v in args])
    return mod, args, [r.numpy() for r in ref]


def _outputs_close(vm, args, ref) -> bool:
    out = vm["main"](*[tvm.runtime.tensor(v) for v in args])
    return all(np.abs(o.numpy() - r).max() / np.abs(r).max() < 5e-3 for o, r in zip(out, ref))


def test_two_outputs_leave_one_kernel_as_a_tuple(rng):
    op = relax.op

    def body(bb, x, w):
        a = bb.emit(op.nn.relu(op.nn.conv2d(x, w)))
        return [a, bb.emit(op.nn.relu(op.nn.conv2d(a, w)))]

    mod, args, ref = _two_outputs(rng, body)
    vm, result = _run(mod, "graphturbo")
    assert len(result.dsa) == 1 and result.host == {}
    (info,) = result.stitched.values()
    # each sample an instance, which also computes its sample's tiles of the second output (they
    # read that sample's tiles of the first: ``_owners``), each tile once
    assert info.instances == HW.clusters and info.recompute == 1.0
    assert _outputs_close(vm, args, ref)


def test_an_output_no_instance_reads_goes_to_the_instance_computing_its_inputs(rng, monkeypatch):
    """conv -> (relu: an output nothing else reads; conv: the last output), one sub-graph. The
    instances split the last output by samples and compute the first conv's tiles of their
    sample; each tile of the relu output then goes to the instance holding the conv tiles it reads
    (``_owners``): both outputs split, nothing computed twice, the values llvm's."""
    op = relax.op

    def body(bb, x, w):
        c = bb.emit(op.nn.conv2d(x, w))
        return [bb.emit(op.nn.relu(c)), bb.emit(op.nn.relu(op.nn.conv2d(c, w)))]

    mod, args, ref = _two_outputs(rng, body)
    monkeypatch.setattr(graphturbo, "group_two_levels",
                        lambda sgs, *_: SubGraphs(sgs.graph, [frozenset(range(len(sgs.graph.nodes)))]))
    vm, result = _run(mod, "graphturbo")
    (info,) = result.stitched.values()
    assert info.instances == HW.clusters and info.recompute == 1.0
    assert _outputs_close(vm, args, ref)


def _attention(rng, batch: int, t: int = 256, d: int = 128, values: bool = True):
    """A self-attention block (``t`` tokens of ``d`` features, softmax(Q K^T) V, a projection and
    the residual), its weights constants, and an input of ``batch`` samples; without ``values``
    the input itself is ``V`` (no projection computes it)."""
    op = relax.op
    ws = [relax.const(rng.standard_normal((d, d)).astype("float32") * 0.05) for _ in range(4)]
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((batch, t, d), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            q, k = (bb.emit(op.matmul(x, w)) for w in ws[:2])
            v = bb.emit(op.matmul(x, ws[2])) if values else x
            s = bb.emit(op.matmul(q, op.permute_dims(k, [0, 2, 1])))
            o = bb.emit(op.matmul(op.nn.softmax(s, axis=-1), v))
            out = bb.emit_output(op.add(op.matmul(o, ws[3]), x))
        bb.emit_func_output(out)
    return bb.get(), rng.standard_normal((batch, t, d)).astype("float32")


def test_a_single_sample_attention_splits_its_rows_over_the_clusters(rng):
    """One sample of a self-attention block (256 tokens): ``Q K^T`` and ``P V`` read all rows of
    ``K`` and ``V``, which the sub-graph computes (``V`` after the softmax, in the graph's order),
    so each starts a sub-graph (``graphturbo.cut_before``: its 33.6 M MACs on one cluster take
    8,192 cycles, spread over four they save 6,144, more than the launches of the two kernels the
    cuts add), whose instances split the tokens over the clusters, every layer tiled within a
    cluster's 64 tokens (``stitched._row_shares``); a sub-graph with several outputs has each tile
    of them computed by the instance of its tokens (``stitch._owners``). The values are llvm's.
    Where ``V`` is the block's input, ``P V`` is not cut from the softmax whose rows it takes
    (an instance reads all of ``V`` from DDR): two kernels. With a sample per cluster nothing is
    cut: the block is one kernel whose instances are the samples."""
    mod, arg = _attention(rng, 1)
    ref = _llvm(mod, [arg])
    vm, result = _run(mod, "graphturbo")
    out = vm["main"](tvm.runtime.tensor(arg)).numpy()
    assert np.abs(out - ref).max() / np.abs(ref).max() < 5e-3
    assert result.host == {} and len(result.dsa) == 3
    # each kernel's instances split the tokens over several clusters, none computing a row twice
    assert all(info.instances > 1 and info.recompute == 1.0 for info in result.stitched.values())
    mod, arg = _attention(rng, 1, values=False)
    ref = _llvm(mod, [arg])
    vm, result = _run(mod, "graphturbo")
    out = vm["main"](tvm.runtime.tensor(arg)).numpy()
    assert np.abs(out - ref).max() / np.abs(ref).max() < 5e-3
    assert len(result.dsa) == 2
    assert all(info.instances > 1 and info.recompute == 1.0 for info in result.stitched.values())
    mod, arg = _attention(rng, HW.clusters)
    _, result = _run(mod, "graphturbo")
    (info,) = result.stitched.values()
    assert info.instances % HW.clusters == 0 and info.recompute == 1.0


def test_a_single_samples_classifier_splits_its_columns_over_the_clusters(rng):
    """A classifier at batch 1 (ReLU, then 1 x 1280 @ 1280 x 1000 + bias) has one row to split:
    its columns are cut instead, one range a cluster (``stitch.plan_instances``: the instances
    tried include one a cluster), each cluster reading its own quarter of the weight where one
    cluster read all of it through its GB's port. The values are llvm's."""
    op = relax.op
    w = relax.const((rng.standard_normal((1280, 1000)) * 0.05).astype("float32"))
    b = relax.const(rng.standard_normal(1000).astype("float32"))
    mod = relax_graph([(1, 1280)], lambda x: op.add(op.matmul(op.nn.relu(x), w), b))
    arg = rng.standard_normal((1, 1280)).astype("float32")
    ref = _llvm(mod, [arg])
    vm, result = _run(mod, "graphturbo")
    out = vm["main"](tvm.runtime.tensor(arg)).numpy()
    assert np.abs(out - ref).max() / np.abs(ref).max() < 5e-3
    (info,) = result.stitched.values()
    assert info.instances == HW.clusters and info.recompute <= RECOMPUTE_LIMIT


def _transition(rng, c: int = 128, rows: int = 56):
    """relu(x * s + b) -> a 1 x 1 convolution to c / 2 channels -> 2 x 2 average pooling -> a
    1 x 1 convolution to c / 4 and relu (a DenseNet transition and the next block's first
    layer), its weights constants, and one sample of ``c`` x ``rows`` x ``rows``."""
    op = relax.op
    k = lambda *shape: relax.const((rng.standard_normal(shape) * 0.1).astype("float32"))  # noqa: E731
    s, b, w1, w2 = k(1, c, 1, 1), k(1, c, 1, 1), k(c // 2, c, 1, 1), k(c // 4, c // 2, 1, 1)
    mod = relax_graph([(1, c, rows, rows)], lambda x: op.nn.relu(op.nn.conv2d(op.nn.avg_pool2d(
        op.nn.conv2d(op.nn.relu(op.add(op.multiply(x, s), b)), w1), pool_size=2, strides=2), w2)))
    return mod, rng.standard_normal((1, c, rows, rows)).astype("float32")


def test_layers_before_a_pooling_are_tiled_within_twice_a_clusters_share_of_rows(rng):
    """One sample through a transition: the instances split the pooled output's 28 rows over the
    clusters, so each needs 14 of the 56 rows the layers before the pooling compute. Those layers
    are tiled within that share (``stitched._row_shares``); tiled on their own, the elementwise
    layer took whole-image tiles of a few channels and every instance computed them all (10-19 %
    of the work again). The values are llvm's."""
    mod, arg = _transition(rng)
    ref = _llvm(mod, [arg])
    vm, result = _run(mod, "graphturbo")
    out = vm["main"](tvm.runtime.tensor(arg)).numpy()
    assert np.abs(out - ref).max() / np.abs(ref).max() < 5e-3
    (info,) = result.stitched.values()
    assert info.instances == HW.clusters and info.recompute == 1.0


def test_binding_balances_instances_over_cores():
    cpc = HW.cores_per_cluster
    # 4 instances: one per cluster, each on all 8 cores of it
    assert binding(4, HW) == [tuple(range(c * cpc, (c + 1) * cpc)) for c in range(4)]
    # 8 instances: two consecutive ones per cluster, 4 cores each
    b8 = binding(8, HW)
    assert b8[0] == (0, 1, 2, 3) and b8[1] == (4, 5, 6, 7) and b8[2] == (8, 9, 10, 11)
    # 6 instances: blocks of 1 or 2, in order
    assert [c[0] // cpc for c in binding(6, HW)] == [0, 1, 1, 2, 3, 3]
    # 64 instances: 16 per cluster, one core each, every core twice
    b64 = binding(64, HW)
    assert all(len(c) == 1 for c in b64) and sorted(c for (c,) in b64) == sorted(list(range(32)) * 2)
    # 16 instances in two rounds: a cluster's four run two at a time, 4 cores each, the second
    # two on the first two's cores
    b16 = binding(16, HW, rounds=2)
    assert b16[:4] == [(0, 1, 2, 3), (4, 5, 6, 7), (0, 1, 2, 3), (4, 5, 6, 7)]
    assert cluster_rounds(b16, cpc)[0].rnd == {0: 0, 1: 0, 2: 1, 3: 1}
    assert binding(16, HW, rounds=1) == binding(16, HW) and all(len(c) == 2 for c in binding(16, HW))


@pytest.mark.parametrize("lb_keep", [0.0, 0.5])
def test_lb_level_keeps_single_core_instances_intermediates(rng, lb_keep):
    """Batch 32 on 32 cores: one sample per instance and core (Algorithm 4's factor 1), so the
    conv's output stays in that core's LB (the "L1" level) and the 1x1 conv reads it in place."""
    op = relax.op
    mod = relax_graph([(32, 16, 8, 8), (16, 16, 3, 3), (16, 16, 1, 1)],
                      lambda x, w1, w2: op.nn.relu(op.nn.conv2d(op.nn.relu(op.nn.conv2d(x, w1, padding=1)), w2)))
    args = [rng.standard_normal([int(s) for s in p.ty.shape]).astype("float32") * 0.3 for p in mod["main"].params]
    ref = _llvm(mod, args)
    vm, result = _run(mod, "graphturbo", options=StitchOptions(lb_keep=lb_keep))
    out = vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()
    assert np.abs(out - ref).max() / np.abs(ref).max() < 5e-3
    (info,) = result.stitched.values()
    assert info.instances == 32 and info.cores_per_instance == 1
    report = tvm_dsa.last_report()
    sample = 16 * 8 * 8 * 2  # one sample of the intermediate, fp16
    # the weights (parameters here, which every cluster reads whole) are promoted to each GB
    weights = HW.clusters * (16 * 16 * 9 + 16 * 16) * 2
    if lb_keep:
        # the layers were tiled into the other half, so at least the kept share is free for it
        assert info.lb_kept == 32 and HW.lb_bytes * lb_keep <= info.lb_bytes < HW.lb_bytes
        assert report.gb_write == weights  # nothing else goes to the GB
    else:
        assert info.lb_kept == 0 and report.gb_write == 32 * sample + weights


def test_lb_keep_is_a_share_of_the_lb():
    assert StitchOptions(lb_keep=0.5).lb_budget(HW) == HW.lb_bytes // 2
    assert StitchOptions(lb_keep=0).lb_budget(HW) is None
    with pytest.raises(ValueError, match=r"lb_keep is a share of the LB in \[0, 1\), not 1.5"):
        StitchOptions(lb_keep=1.5)


def test_lb_level_only_where_instances_have_a_core_each(rng):
    """Batch 4 on 4 clusters: each instance spans a cluster's 8 cores, so its intermediates go to
    the GB (Algorithm 4's scope rule); reserving LB for them would only shrink the tiles."""
    mod = residual_block()
    args = [tvm.runtime.tensor(rng.standard_normal([int(s) for s in p.ty.shape]).astype("float32"))
            for p in mod["main"].params]
    cycles = {}
    for lb_keep in (0.0, 0.5):
        vm, result = _run(mod, "graphturbo", options=StitchOptions(lb_keep=lb_keep))
        (info,) = result.stitched.values()
        assert info.cores_per_instance == 8 and info.lb_kept == 0 and info.lb_bytes == 0
        vm["main"](*args)
        cycles[lb_keep] = tvm_dsa.last_report().cycles
    assert cycles[0.5] == cycles[0.0]


def residual_blocks(n: int):
    op = relax.op

    def block(x, w1, w2, b):
        return op.nn.relu(op.add(op.add(op.nn.conv2d(op.nn.relu(op.nn.conv2d(x, w1, padding=1)), w2), b), x))

    def chain(x, *ws):
        for k in range(n):
            x = block(x, *ws[3 * k:3 * k + 3])
        return x

    return relax_graph([(4, 16, 8, 8)] + [(16, 16, 3, 3), (16, 16, 1, 1), (1, 16, 1, 1)] * n, chain)


def test_a_block_like_the_one_before_is_replayed_or_copied_as_emitting_it_gives(monkeypatch, rng):
    """Eight residual blocks of one shape (two layers each) in one stitched kernel. A layer of a
    later block is the previous block's with other weights and intermediates. Block 1 reads the
    input from DDR, so block 2 has nothing like it before: these are emitted; every other layer
    is an earlier block's same layer again, block 8's last one too (its tiles of a few rows would
    store the output in runs of 16 bytes, so it is kept in the GB like the intermediates and
    copied out: ``stitch._stored_short``).
    Some of the first later blocks find memory their predecessors found fresh (the intermediates'
    memory is reused from block to block), so those layers are pushed again (replayed) with
    dependencies worked out anew; where the dependency tracker holds for a layer's objects what
    it held for an earlier block's, unit for unit, the layer is a copy record (``isa.Replica``),
    from block 5 on always (what the compressor reports: ``Compressor.reused``). Written out, the
    program is the one emitting every layer gives, instruction for instruction, but where one
    instruction of the earlier layer stood for two of the later one's, the copy waits for the
    later of the two (a few in a hundred); it takes the same cycles, and computes what llvm does
    (the run checks every hazard)."""
    import importlib

    generator = importlib.import_module("tvm_dsa.kernelgen.stitched")
    seen = []
    monkeypatch.setattr(generator, "emit_stitched", lambda mod, *a, **k: seen.append(mod) or stitch.emit_stitched(mod, *a, **k))
    mod = residual_blocks(8)
    args = [rng.standard_normal([int(s) for s in p.ty.shape]).astype("float32") * 0.3 for p in mod["main"].params]
    hw = _one_queue()
    vm, _ = _run(mod, "graphturbo", hw=f"dsa/{hw.name}")
    out = vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()
    ref = _llvm(mod, args)
    assert np.abs(out - ref).max() / np.abs(ref).max() < 5e-3
    (sub,) = seen
    layers = stitch.read_subgraph(sub, hw)[0].layers
    emitted, compression = _emitted(monkeypatch, sub, hw, replay=False)
    assert compression.reused == []
    compact, compression = _emitted(monkeypatch, sub, hw)
    replays = [r for r in compression.reused if r.kind == "replay"]
    copies = [r for r in compression.reused if r.kind != "replay"]
    names = [L.name for L in layers]
    assert len(names) == 16
    again = {names.index(r.layer): names.index(r.source) for r in replays + copies}
    assert sorted(again) == list(range(4, 16))  # cluster 0's layers of blocks 3-8, each once
    assert all(a < b and a % 2 == b % 2 for b, a in again.items())  # from the same layer of an earlier block
    assert set(range(8, 15)) <= {names.index(r.layer) for r in copies}  # copies from block 5 on
    (a,), (b,) = emitted.expanded().kernels, compact.expanded().kernels
    assert a.layers == b.layers and a.cores == b.cores and len(a.instructions) == len(b.instructions)
    unit = [isa.unit_of(x, HW.cores_per_cluster) for x in a.instructions]
    later = 0
    for x, y in zip(a.instructions, b.instructions):
        assert dataclasses.replace(x, deps=()) == dataclasses.replace(y, deps=())
        latest: dict = {}
        for d in y.deps:
            latest[unit[d]] = max(latest.get(unit[d], -1), d)
        assert all(latest.get(unit[d], -1) >= d for d in x.deps)  # what emission waits for, or later in its queue
        later += x.deps != y.deps
    assert later < len(a.instructions) // 20
    assert simulate(compact, mode="timing").report.cycles == simulate(emitted, mode="timing").report.cycles
    copied = sum(r.instructions for r in copies)
    assert len(compact.kernels[0].instructions) + copied == len(emitted.kernels[0].instructions)


def _one_queue():
    """stcp920 with one DMA queue per core (``prefetch_dma`` off), registered: where the stores
    have a queue of their own, the memory a layer reuses was last read on other units than its
    predecessor's was, and the compressor's tests below would pin other copies (correct ones)."""
    return hardware.register(dataclasses.replace(HW, name="stcp920-one-queue", prefetch_dma=False), override=True)


def _emitted(monkeypatch, sub, hw=HW, **options):
    """(program, its emitter's ``Compressor``) of ``stitch.emit_stitched(sub, hw, **options)``."""
    from tvm_dsa.emit.emitter import KernelEmitter

    compressions = []
    kernel = KernelEmitter.kernel
    with monkeypatch.context() as m:
        m.setattr(KernelEmitter, "kernel", lambda self: compressions.append(self.compression) or kernel(self))
        program, _ = stitch.emit_stitched(sub, hw, **options)
    (compression,) = compressions
    return program, compression


def test_a_flip_in_a_sub_graph_is_refused_for_its_negative_stride(rng):
    """A flip reads its input backwards; DSA operands have no negative strides, so it runs on the
    host, with that reason (not an out-of-region access). Only the flip: the sub-graph it was
    stitched into runs layer by layer instead, its conv + relu still on the DSA; and the model
    still computes what llvm does."""
    op = relax.op
    mod = relax_graph([(4, 16, 8, 8), (16, 16, 3, 3)], lambda x, w: op.flip(op.nn.relu(op.nn.conv2d(x, w, padding=1)), axis=3))
    args = [rng.standard_normal([int(s) for s in p.ty.shape]).astype("float32") for p in mod["main"].params]
    vm, result = _run(mod, "graphturbo")
    reason = "walked backwards along loop 3 (stride -1); DSA operands have no negative strides"
    assert reason in result.host["flip"] and list(result.host) == ["flip"]
    (sub_graph, why), = result.unstitched.items()
    assert reason in why and sub_graph not in result.dsa and result.dsa == ["fused_conv2d_relu"]
    out = vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()
    ref = _llvm(mod, args)
    assert np.abs(out - ref).max() / np.abs(ref).max() < 5e-3  # the conv in fp16 on the DSA


def _mlp(monkeypatch, batch, rows, hidden, timed: bool = False):
    """A two-matmul MLP with a residual, batch x rows x 256 -> hidden -> 256, and the list the
    sub-graph modules graphturbo emits go into once it is compiled. Unless ``timed``, its layers
    keep the tiling search's first fitting plans (the compressor's cases below are built on
    them), not the faster ones timed in place (``tiling.lower_timed``)."""
    import importlib

    op = relax.op
    generator = importlib.import_module("tvm_dsa.kernelgen.stitched")
    if not timed:
        monkeypatch.setattr(generator, "TIMED_MACS", math.inf)
        monkeypatch.setattr(generator, "TIMED_MACS_SPREAD", math.inf)
    seen = []
    monkeypatch.setattr(generator, "emit_stitched", lambda mod, *a, **k: seen.append(mod) or stitch.emit_stitched(mod, *a, **k))
    mod = relax_graph([(batch, rows, 256), (256, hidden), (hidden, 256)],
                      lambda x, w1, w2: op.add(op.matmul(op.nn.relu(op.matmul(x, w1)), w2), x))
    return mod, seen


@pytest.mark.parametrize("batch, rows, hidden, rounds_run, swaps", [(8, 256, 512, True, True),
                                                                    (8, 128, 384, False, False),
                                                                    (24, 16, 512, True, False)])
def test_rounds_and_other_cores_copied_give_what_emitting_them_gives(monkeypatch, rng, batch, rows, hidden,
                                                                     rounds_run, swaps):
    """The MLP (``_mlp``): its layers run many
    rounds of tiles on several clusters. Rounds that repeat earlier rounds translated are copies
    (at 256 x 512 also whole runs of rounds: the run since the last emitted round), and calls on
    other cores copy calls on the first. At 128 x 384 a round finds the weight tile its
    predecessor left in the LB, which its model round did not: only the tile buffers' state tells
    them apart. At batch 24 (six samples a cluster) runs of rounds on different cores are joined
    and copied (its layers grouped at the LB level only, as two kernels, the first of 192
    instances: merged at the GB level, one kernel's chunk loops are too short for the copies of
    runs of chunks below). At 256 x 512 a round is also copied from one whose double-buffered
    tile buffers were in each other's copies (an odd number of tiles before): the copy trades the
    two copies' places (``Reuse.swapped``). Weights
    are promoted whole (a round reading another piece waits for another transfer), on a chip with
    one DMA queue a core (``_one_queue``). Every layer holds a tile's stores back behind its
    core's next tile's loads, so a
    round's copy also releases what its model round did. The chunks of an emitted tile's
    reduction are copies: of its second chunk, then of the run since it, or of the core's tile
    before (``Compressor.chunks``). Written out, each kernel is the one
    emitting every tile gives: the same instructions, every dependency emission's or a later
    instruction of its unit, the same simulated cycles; and the model computes what llvm does."""
    from tvm_dsa.emit import emitter as emit

    import tvm_dsa.schedule.graphturbo as scheduler

    if batch == 24:
        monkeypatch.setattr(scheduler, "group_two_levels", lambda sgs, lb, gb, esize, fixed: scheduler.group(sgs, lb, esize, fixed))
    mod, seen = _mlp(monkeypatch, batch, rows, hidden)
    monkeypatch.setattr(stitch, "PIECE_BYTES", 1 << 40)  # weights promoted whole: rounds of one piece
    args = [rng.standard_normal([int(s) for s in p.ty.shape]).astype("float32") * 0.1 for p in mod["main"].params]
    hw = _one_queue()
    vm, _ = _run(mod, "graphturbo", hw=f"dsa/{hw.name}")
    out = vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()
    ref = _llvm(mod, args)
    assert np.abs(out - ref).max() / np.abs(ref).max() < 5e-3
    assert seen
    runs = []  # per copy of rounds or of a call: (rounds copied, cores moved)
    chunks = []  # per copy of a tile's chunks (``Compressor.chunks``): (chunks copied, from another tile)
    swapped = []  # per copy of rounds or of a call: whether its tile buffers' two copies trade places
    loops = []  # per layer call recorded and core: the chunk loops of the tiles it emits
    for sub in seen:
        # the layers hold each tile's stores back behind its core's next tile's loads
        layers = stitch.read_subgraph(sub, hw)[0].layers
        assert all(emit.store_split(L.ir.tile_loops()[-1].body, L.plan) for L in layers)
        compression = _copies_are_emission(monkeypatch, sub, hw)
        for r in compression.reused:
            if r.kind == "chunks":
                chunks.append((r.runs, r.tile[0][:-1] != r.source_tile[0][:-1]))
            elif r.kind in ("call", "rounds"):
                runs.append((r.runs, r.tile[1] - r.source_tile[1]))
                swapped.append(r.swapped)
        loops += compression.recorded_chunk_loops.values()
    assert any(moved for _, moved in runs) and any(n > 1 for n, _ in runs) == rounds_run
    assert any(swapped) == swaps
    # a core's first tile's chunk loop: its second chunk emitted, the third its copy, then runs
    # since it doubling; a later tile's, a copy of the core's tile before
    assert {1, 2, 4} <= {n for n, other in chunks if not other}
    assert any(other for _, other in chunks) == (max(loops) > 1)


def _copies_are_emission(monkeypatch, sub, hw=HW):
    """The sub-graph's kernel with copies is, written out, the one emitting every tile gives: the
    same instructions, every dependency emission's or a later instruction of its unit, the same
    simulated cycles. Returns the ``Compressor`` that made the copies."""
    emitted, plain = _emitted(monkeypatch, sub, hw, replay=False)
    assert plain.reused == []
    compact, compression = _emitted(monkeypatch, sub, hw)
    (a,), (b,) = emitted.expanded().kernels, compact.expanded().kernels
    assert a.layers == b.layers and a.cores == b.cores and len(a.instructions) == len(b.instructions)
    assert len(compact.kernels[0].instructions) < len(a.instructions)
    unit = [isa.unit_of(x, HW.cores_per_cluster) for x in a.instructions]
    for x, y in zip(a.instructions, b.instructions):
        assert dataclasses.replace(x, deps=()) == dataclasses.replace(y, deps=())
        latest: dict = {}
        for d in y.deps:
            latest[unit[d]] = max(latest.get(unit[d], -1), d)
        assert all(latest.get(unit[d], -1) >= d for d in x.deps)
    assert simulate(compact, mode="timing").report.cycles == simulate(emitted, mode="timing").report.cycles
    return compression


def test_rounds_moved_along_an_overlapping_loop_are_copies(monkeypatch, rng):
    """The MLP (``_mlp``) over 197 tokens (prime: tiles that overlap at the end,
    ``ClampTiles``): its first layer's tiles, dealt to a cluster's 8 cores in turn, are 8 column
    tiles of each of 6 token tiles for each of 2 samples, so a round of 8 holds half a token
    tile's, and the rounds repeat every two moved along the tokens (by a tile, or less into the
    last one: ``KernelIR.moves``' ``at``). A call's first copy is of the two rounds emitted
    before it (``Compressor.rounds``' ``emitted``: with one round as the model no copy is found);
    written out, the copies are what emission gives, and the model computes what llvm does.
    Weights promoted whole, one DMA queue a core, as in the test above."""
    mod, seen = _mlp(monkeypatch, 8, 197, 512)
    monkeypatch.setattr(stitch, "PIECE_BYTES", 1 << 40)  # weights promoted whole: rounds of one piece
    args = [rng.standard_normal([int(s) for s in p.ty.shape]).astype("float32") * 0.1 for p in mod["main"].params]
    hw = _one_queue()
    vm, _ = _run(mod, "graphturbo", hw=f"dsa/{hw.name}")
    out = vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()
    assert np.abs(out - _llvm(mod, args)).max() / np.abs(out).max() < 5e-3
    (sub,) = [s for s in seen if any(L.ir.clamped for L in stitch.read_subgraph(s, hw)[0].layers)]
    layers = stitch.read_subgraph(sub, hw)[0].layers
    first, ir = layers[0], {L.name: L.ir for L in layers}
    assert [lp.extent for lp in first.ir.tile_loops()][1:] == [6, 8] and first.ir.clamped
    compression = _copies_are_emission(monkeypatch, sub, hw)
    # per copy of rounds in a call: (the call, rounds copied, whether it moves along a clamped loop)
    copies = []
    for r in compression.reused:
        if r.kind == "rounds":
            (v0, _), (v1, _) = r.source_tile, r.tile
            loops = ir[r.layer].tile_loops()
            along = any(a != b for lp, a, b in zip(loops, v0, v1) if lp.slot in ir[r.layer].clamped)
            copies.append((r.call, r.runs, along))
    assert any(along for *_, along in copies)
    firsts = {}
    for call, n, _ in copies:
        firsts.setdefault(call, n)
    assert 2 in firsts.values()


def test_a_copy_waits_for_what_emission_would_unit_for_unit():
    """``compress.remap``: a dependency of the earlier layer on an instruction before it goes where the
    tracker now names the same object's entry for the copy's unit (cores moved: ``unit``), the
    latest such where one instruction stood for several; with no entry for that unit now, to the
    position the copy's shift gives if that runs on the unit. No copy where the tracker now names
    a unit the earlier entry did not (the copy would not wait for it; of an object only read, the
    readers do not count), where a shifted position runs on another unit, or where an object's
    ssa-ness differs."""
    from types import SimpleNamespace

    from tvm_dsa.emit import compress
    from tvm_dsa.emit.deps import Deps

    tracker = Deps()
    units = [("dma", 4)] * 10 + [("mme", 4)] * 10
    a, b = ("gb", "a"), ("gb", "b")
    keys = {a: a, b: b}
    dma0, mme0, dma4, mme4 = ("dma", 0), ("mme", 0), ("dma", 4), ("mme", 4)

    def unit(u):  # cores moved by 4
        return (u[0], u[1] + 4)

    def remap(before, writers, readers=None, ssa=(), written=(a, b)):
        tracker.writers, tracker.readers, tracker.ssa = writers, readers or {}, set(ssa)
        return compress.remap(SimpleNamespace(before=before, read=(a, b), written=written), keys, unit, 5, tracker,
                              units)

    # position 3 was the last writer of a and of b; now a's is 6 and b's 8: the copy waits for 8
    assert remap({a: ({dma0: 3}, {}, False), b: ({dma0: 3}, {}, False)}, {a: {dma4: 6}, b: {dma4: 8}}) == {3: 8}
    assert remap({a: ({dma0: 3}, {mme0: 12}, False)}, {a: {dma4: 6}}, {a: {mme4: 15}}) == {3: 6, 12: 15}
    assert remap({a: ({dma0: 3}, {}, False)}, {}) == {3: 8}  # no entry now: 3 + 5 is a DMA of core 4
    assert remap({a: ({dma0: 7}, {}, False)}, {}) is None  # 7 + 5 is an MME
    assert remap({a: ({dma0: 3}, {}, False)}, {a: {dma4: 6, mme4: 12}}) is None  # emission would wait for the MME
    assert remap({a: ({dma0: 3}, {}, False)}, {a: {dma4: 6}}, ssa=[a]) is None
    # an object the earlier layer only read: its readers are not waited for, whoever they are
    assert remap({a: ({dma0: 3}, {}, False)}, {a: {dma4: 6}}, {a: {mme4: 12}}, written=()) == {3: 6}


def test_a_tensor_written_once_is_written_without_waiting_for_its_own_readers():
    """``Deps``: a tensor written once in disjoint pieces (ssa) is read only where it was written,
    so a write of another piece waits for what read the memory before the tensor took it, not for
    the tensor's readers since (a cluster's store of its rows of a sub-graph output waited for the
    other clusters' reads of theirs: ResNet-50's rows at batch 1 ran one cluster after another).
    A buffer rewritten in place still waits for them, and so does the object that takes the
    tensor's memory next."""
    from tvm_dsa.emit.deps import Deps

    old, t, buf, nxt = ("gb", "old"), ("gb", "t"), ("gb", "buf"), ("gb", "next")
    a, b, c, d = ("dma", 0), ("dma", 8), ("dma", 16), ("cdma", 0)
    tracker = Deps()
    tracker.record(0, [old], [], a)  # the memory's previous tensor, read
    for key, ssa in ((t, True), (buf, False)):
        tracker.inherit(key, [old], ssa)
        tracker.record(1, [], [key], b)  # b writes its piece
        tracker.record(2, [key], [], a)  # a reads it
        assert tracker.deps([key], [], c) == {1}
    assert tracker.deps([], [t], c) == {0}  # not 1 (another piece) nor 2 (a read of b's piece)
    assert tracker.deps([], [buf], c) == {1, 2}
    tracker.inherit(nxt, [t], ssa=True)
    assert tracker.deps([], [nxt], d) == {1, 2}  # the memory's next owner waits for t's accesses


def test_sub_graphs_of_one_form_share_one_program(monkeypatch, rng):
    """Three residual blocks with a cumulative sum between them (host-only TIR: it cuts the
    graph) are three stitched kernels of one form: the same PrimFuncs over tensors of the same
    shapes, wired alike. The first is generated; the other two get its program under their own
    tensor, layer and kernel names, which is the program generating them gives, and the model
    computes what llvm does. The three calls carry one program text; the later two's info names
    what its args and layers are called there, and what they run (``host.execute``) is the
    renamed program."""
    import importlib

    generator = importlib.import_module("tvm_dsa.kernelgen.stitched")
    forms, made, renamed = [], [], []
    form, stitched, rename = generator._form, generator._stitched, generator._renamed
    monkeypatch.setattr(generator, "_form", lambda spec, nodes, graph: forms.append((spec, nodes, graph))
                        or form(spec, nodes, graph))
    monkeypatch.setattr(generator, "_stitched", lambda *a: made.append(a) or stitched(*a))
    monkeypatch.setattr(generator, "_renamed", lambda *a: renamed.append(rename(*a)) or renamed[-1])
    op = relax.op

    def chain(x, *ws):
        for k in range(3):
            w1, w2, b = ws[3 * k:3 * k + 3]
            x = op.nn.relu(op.add(op.add(op.nn.conv2d(op.nn.relu(op.nn.conv2d(x, w1, padding=1)), w2), b), x))
            x = op.cumsum(x, axis=3) if k < 2 else x
        return x

    mod = relax_graph([(4, 16, 8, 8)] + [(16, 16, 3, 3), (16, 16, 1, 1), (1, 16, 1, 1)] * 3, chain)
    args = [rng.standard_normal([int(s) for s in p.ty.shape]).astype("float32") * 0.3 for p in mod["main"].params]
    vm, result = _run(mod, "graphturbo")
    out = vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()
    ref = _llvm(mod, args)
    assert np.abs(out - ref).max() / np.abs(ref).max() < 5e-3
    assert len(result.stitched) == 3 and len(forms) == 3 and len(made) == 1 and len(renamed) == 2
    rest = made[0][3:]  # lowered, tiled_in_part, hardware, options
    for (spec, nodes, graph), (program, info) in zip(forms[1:], renamed):
        own, own_info = stitched(spec, nodes, graph, *rest)
        assert program.name == spec.name and {a.name for a in program.args} >= {n.output for n in nodes[-1:]}
        assert (program, info) == (own, own_info) and program.kernels[0].layers == own.kernels[0].layers
    specs, programs, calls = [spec for spec, _, _ in forms], [p for p, _ in renamed], []  # compiling again adds more
    with tvm.target.Target("dsa/stcp920"):
        lowered = tvm_dsa.pipeline("graphturbo")(mod)
    tvm_ffi.structural_walk(lowered["main"].body, [(relax.Call, lambda c: calls.append(c)
                                                    if isinstance(c.op, relax.ExternFunc) else None)])
    dsa = {json.loads(c.args[1].value)["kernel"]: c for c in calls if str(c.op.global_symbol) == EXECUTE}
    assert len({dsa[spec.name].args[0].value for spec in specs}) == 1
    assert "names" not in json.loads(dsa[specs[0].name].args[1].value)
    ran = {run.name: run.program for run in tvm_dsa.last_kernel_runs()}
    for spec, program in zip(specs[1:], programs):
        names = json.loads(dsa[spec.name].args[1].value)["names"]
        assert names and all(a != b for a, b in names.items())
        assert ran[spec.name] == program.expanded() and ran[spec.name].kernels[0].layers == program.kernels[0].layers


def test_clusters_copy_the_first_clusters_instructions(monkeypatch):
    """Four clusters, one sample each: clusters 1-3 run cluster 0's instructions moved to their
    cores, their GB and their samples. The copy is what emitting them gives, less the dependencies
    emission adds between clusters' disjoint pieces of one DDR tensor."""
    import importlib

    from tvm_dsa.emit import emitter as emit
    from tvm_dsa.kernelgen import stitch

    generator = importlib.import_module("tvm_dsa.kernelgen.stitched")
    seen = []
    monkeypatch.setattr(generator, "emit_stitched", lambda mod, *a, **k: seen.append(mod) or stitch.emit_stitched(mod, *a, **k))
    _run(residual_block(), "graphturbo")
    (mod,) = seen
    calls = []
    layer = emit.KernelEmitter.layer
    monkeypatch.setattr(emit.KernelEmitter, "layer",
                        lambda self, L, work, *a, **k: calls.append(work) or layer(self, L, work, *a, **k))
    emitted, _ = stitch.emit_stitched(mod, HW, replicate=False, replay=False)
    emitted_calls, calls[:] = list(calls), []
    compact, _ = stitch.emit_stitched(mod, HW)
    assert len(compact.kernels[0].replicas) == 3 and compact.num_instructions * 4 == emitted.num_instructions
    copied = Program.deserialize(compact.serialize())  # loading writes the replicas out
    cpc = HW.cores_per_cluster
    assert {core // cpc for work in emitted_calls for _, core in work} == {0, 1, 2, 3}
    assert {core // cpc for work in calls for _, core in work} == {0}  # only cluster 0 emitted
    (a,), (b,) = emitted.kernels, copied.kernels
    assert a.cores == b.cores and len(a.instructions) == len(b.instructions)
    assert [m.name for m in a.layers] == [m.name for m in b.layers]
    for x, y in zip(a.instructions, b.instructions):
        assert dataclasses.replace(x, deps=()) == dataclasses.replace(y, deps=())
        assert set(y.deps) <= set(x.deps)
        assert all(a.instructions[d].core // cpc != x.core // cpc for d in set(x.deps) - set(y.deps))


def _mlp_with_weights(monkeypatch, rng, rows):
    """(the stitched-kernel generator module, the MLP at batch 8 x ``rows``, 256 -> 256 -> 256
    with its weights bound as constants, the sub-graph modules it emits, an input, llvm's output)."""
    import importlib

    generator = importlib.import_module("tvm_dsa.kernelgen.stitched")
    mod, seen = _mlp(monkeypatch, 8, rows, 256)
    x, w1, w2 = [rng.standard_normal([int(s) for s in p.ty.shape]).astype("float32") * 0.1 for p in mod["main"].params]
    ref = _llvm(mod, [x, w1, w2])
    mod = relax.transform.BindParams("main", {"a1": tvm.runtime.tensor(w1), "a2": tvm.runtime.tensor(w2)})(mod)
    return generator, mod, seen, x, ref


def test_a_gb_too_small_for_a_clusters_samples_runs_them_in_rounds(monkeypatch, rng):
    """The MLP (``_mlp``) at batch 8 x 256 rows, 256 -> 256 -> 256, its weights constants (128 KiB
    each, fp16): two samples a cluster, each sample's hidden tensor 128 KiB. Run at once, a
    cluster's instances keep both samples' hidden tensors beside a weight: 128 + 256 KiB, over a
    320 KiB GB, so the plan spills. In two rounds (micro-batches of one sample, each round's
    instances on twice the cores) a round keeps 128 + 128 KiB and promotes the weights it reads
    itself: nothing spills, each weight is promoted twice per cluster, and the model computes
    what llvm does (the functional run checks every dependency). Two rounds are kept because they
    move fewer bytes through DDR (``stitched.ddr_bytes``): the weights once more (256 KiB, the
    clusters' promotions multicast) against the spilled pieces written and read."""
    generator, mod, seen, x, ref = _mlp_with_weights(monkeypatch, rng, 256)
    tried = []
    micro = generator._micro_batched

    def recorded(planned, hw, samples):
        def plan(rounds):
            sub = planned(rounds)
            tried.append((rounds, sum(b.level == "ddr" for b in stitch.read_allocation(sub))))
            return sub
        return micro(plan, hw, samples)

    monkeypatch.setattr(generator, "_micro_batched", recorded)
    hardware.register(dataclasses.replace(HW, name="stcp920-gb320k", gb_bytes=320 * KB), override=True)
    vm, result = _run(mod, "graphturbo", hw="dsa/stcp920-gb320k")
    out = vm["main"](tvm.runtime.tensor(x)).numpy()
    assert np.abs(out - ref).max() / np.abs(ref).max() < 5e-3
    (info,) = result.stitched.values()
    assert tried[0][0] == 1 and tried[0][1] > 0 and tried[1] == (2, 0) and len(tried) == 2
    weight, hidden = 256 * 256 * 2, 256 * 256 * 2
    assert info.order == "rounds" and info.spilled == () and info.gb_peak == weight + hidden

    def promotions(sub):  # (weight, cluster) -> how many times the cluster promotes it
        counts: dict = {}
        for b in stitch.read_allocation(sub):
            if b.kind == "w":
                counts[b.tensor, b.cluster] = counts.get((b.tensor, b.cluster), 0) + 1
        return counts

    promoted = promotions(seen[-1])
    assert len(promoted) == 2 * HW.clusters and set(promoted.values()) == {2}
    _run(mod, "graphturbo")  # the whole GB: one round, each weight promoted once
    (whole,) = tvm_dsa.pipeline_result().stitched.values()
    assert whole.order == "dfs" and whole.cores_per_instance * 2 == info.cores_per_instance
    assert set(promotions(seen[-1]).values()) == {1}


def test_a_spill_cheaper_than_promoting_the_weights_again_stays_in_one_round(monkeypatch, rng):
    """The MLP at batch 8 x 64 rows (each sample's hidden tensor 32 KiB) on a 176 KiB GB: at once,
    a cluster spills a 16 KiB piece of a hidden tensor, written and read: 32 KiB a cluster,
    128 KiB in all, against the 256 KiB two rounds would promote again (both weights, the
    clusters' promotions multicast). One round is kept, its spill in DDR, and the model still
    computes what llvm does."""
    generator, mod, seen, x, ref = _mlp_with_weights(monkeypatch, rng, 64)
    costs = []
    measured = generator.ddr_bytes
    monkeypatch.setattr(generator, "ddr_bytes", lambda allocation, hw: costs.append(measured(allocation, hw)) or costs[-1])
    hardware.register(dataclasses.replace(HW, name="stcp920-gb176k", gb_bytes=176 * KB), override=True)
    vm, result = _run(mod, "graphturbo", hw="dsa/stcp920-gb176k")
    out = vm["main"](tvm.runtime.tensor(x)).numpy()
    assert np.abs(out - ref).max() / np.abs(ref).max() < 5e-3
    weights = 2 * 256 * 256 * 2
    spilled = [b for b in stitch.read_allocation(seen[-1]) if b.level == "ddr"]
    assert {b.cluster for b in spilled} == set(range(HW.clusters)) and {b.nbytes for b in spilled} == {16 * KB}
    assert costs == [weights + 2 * 16 * KB * HW.clusters, 2 * weights]
    (info,) = result.stitched.values()
    assert info.order == "dfs" and len(info.spilled) == HW.clusters


def test_promotions_come_later_where_early_ones_would_spill(rng):
    """The residual block with constant weights, one sample per cluster: the 3x3 conv's weights
    (16x16x3x3 fp16) and its output (16x8x8 fp16) are live at step 0; promoting the 1x1 conv's
    weights and bias there too (prefetch) needs a 7232-byte GB. A 7 KiB GB gets the weights early
    and the bias a step later instead of spilling; an 8 KiB one holds both early."""
    from tvm_dsa.kernel.ir import align

    mod = residual_block()
    args = [rng.standard_normal([int(s) for s in p.ty.shape]).astype("float32") for p in mod["main"].params]
    mod = relax.transform.BindParams("main", {f"a{i}": tvm.runtime.tensor(args[i]) for i in (1, 2, 3)})(mod)
    w1, out1, w2, bias = 16 * 16 * 9 * 2, 16 * 8 * 8 * 2, 16 * 16 * 2, 16 * 2
    peaks = {}
    for kib in (7, 8):
        hardware.register(dataclasses.replace(HW, name=f"stcp920-gb{kib}k", gb_bytes=kib * KB), override=True)
        _, result = _run(mod, "graphturbo", hw=f"dsa/stcp920-gb{kib}k", options=StitchOptions(prefetch=2))
        (info,) = result.stitched.values()
        assert info.spilled == ()
        peaks[kib] = info.gb_peak
    assert peaks[7] == w1 + out1 + w2 == 7 * KB < w1 + out1 + w2 + align(bias) == peaks[8]


def test_a_constant_the_clusters_read_apart_stays_in_ddr_and_clusters_still_copy(monkeypatch, rng):
    """A constant broadcast along the batch (ViT's class token folds to one row per sample) is
    read in part by each cluster: it is not promoted whole to every cluster's GB (a weight read
    alike still is), and clusters 1-3 still copy cluster 0's instructions — the tiles of the
    concatenation's class-token row read no patch, in every cluster alike."""
    import importlib

    generator = importlib.import_module("tvm_dsa.kernelgen.stitched")
    seen = []
    monkeypatch.setattr(generator, "emit_stitched", lambda mod, *a, **k: seen.append(mod) or stitch.emit_stitched(mod, *a, **k))
    cls = np.repeat(rng.standard_normal((1, 1, 64)).astype("float32"), 4, axis=0)
    w = rng.standard_normal((64, 32, 2, 2)).astype("float32") * 0.1
    pos = rng.standard_normal((1, 257, 64)).astype("float32")
    op = relax.op
    patches = lambda x: op.permute_dims(op.reshape(op.nn.conv2d(x, relax.const(w), strides=2), (4, 64, 256)), [0, 2, 1])
    mod = relax_graph([(4, 32, 32, 32)], lambda x: op.add(op.concat([relax.const(cls), patches(x)], axis=1),
                                                        relax.const(pos)))
    x = rng.standard_normal((4, 32, 32, 32)).astype("float32")
    vm, result = _run(mod, "graphturbo")
    out = vm["main"](tvm.runtime.tensor(x)).numpy()
    ref = _llvm(mod, [x])
    assert np.abs(out - ref).max() / np.abs(ref).max() < 5e-3
    (sub,) = seen
    sg, _ = stitch.read_subgraph(sub, HW)
    promoted = set(sub.attrs["dsa.scopes"]["promote"])
    by_shape = {sg.tensors[t][0]: t for t in sg.weights}
    assert by_shape[(64, 32 * 2 * 2, 1, 1)] in promoted and by_shape[(4, 1, 64)] not in promoted  # of the patches
    # the program the VM ran (its output checked above) has clusters 1-3 as copies of cluster 0
    compact, _ = stitch.emit_stitched(sub, HW)
    cpc = HW.cores_per_cluster
    # (copies on the same cores, of the patches' layer's runs of tiles, move by 0)
    assert sorted(r.cores for r in compact.kernels[0].replicas if r.cores and r.cores % cpc == 0) == [cpc, 2 * cpc, 3 * cpc]


def test_a_large_weight_is_promoted_in_pieces_and_tiles_wait_for_theirs(monkeypatch, rng):
    """The MLP of 8 x 64 x 256 -> 1024 -> 256: the second weight (1024 x 256 fp16, 512 KiB) is read
    by tiles that split its columns into boxes of one width, so it is promoted in column pieces
    of the fewest such boxes whose rows are whole DDR bursts (each at least PIECE_BYTES), one
    transfer each, in order; the first tile's load of it waits for the first piece, not the last. Functional runs check every dependency
    (hazards), and the model computes what llvm does."""
    mod, seen = _mlp(monkeypatch, 8, 64, 1024)
    _weights_bound_run_as_llvm(mod, rng, 0.1)
    ((sub, sg, prints, name),) = [(m, sg, prints, t) for m in seen for sg, prints in [stitch.read_subgraph(m, HW)]
                                for t, (shape, _) in sg.tensors.items() if tuple(shape) == (1024, 256)]
    (lo, hi), = [prints[L.name].reads[p] for L in sg.layers for p, t in L.args.items() if t == name]
    tile = int((hi - lo)[0, 1])
    assert set((hi - lo)[:, 1]) == {tile} and tile < 256 and not (lo[:, 1] % tile).any()
    width = tile * HW.ddr_burst_bytes // math.gcd(2 * tile, HW.ddr_burst_bytes)  # rows of whole bursts
    assert 256 // width >= 2 and 1024 * width * 2 >= stitch.PIECE_BYTES
    assert stitch.promotion_pieces(sg, prints, name, HW) == (1, width)
    program, _ = stitch.emit_stitched(sub, HW, replicate=False)
    ins = program.kernels[0].instructions
    (base,) = {b.offset for b in stitch.read_allocation(sub) if b.tensor == name and b.cluster == 0}
    pieces = [i for i, y in enumerate(ins) if isinstance(y, isa.Dma) and y.src.mem == "ddr" and y.dst.mem == "gb"
              and y.dst.index == 0 and base <= y.dst.offset < base + 1024 * 256 * 2]
    assert [ins[i].shape for i in pieces] == [(1024, width)] * (256 // width)
    assert [ins[i].dst.offset for i in pieces] == [base + 2 * j for j in range(0, 256, width)]
    first = next(y for y in ins if isinstance(y, isa.Dma) and y.src.mem == "gb" and y.src.index == 0
                 and base <= y.src.offset < base + 1024 * 256 * 2)
    assert pieces[0] in first.deps and pieces[-1] not in first.deps


def test_pieces_of_narrow_tiles_take_several_tiles_columns(monkeypatch, rng):
    """The MLP of 8 x 64 x 256 -> 256 -> 256: the second weight (256 x 256 fp16, 128 KiB) is read in
    column tiles whose boxes of whole DDR bursts hold 32 KiB, under PIECE_BYTES: it is promoted in
    the fewest such widths that hold PIECE_BYTES (two pieces of 64 KiB), not whole (Conformer's
    first feed-forward weight, 512 KiB in 32-column tiles, kept its layer's first tiles waiting for
    all of it). The model computes what llvm does, every dependency checked."""
    mod, seen = _mlp(monkeypatch, 8, 64, 256)
    _weights_bound_run_as_llvm(mod, rng, 0.1)
    weights = [(m, sg, prints, t) for m in seen for sg, prints in [stitch.read_subgraph(m, HW)]
               for t, (shape, _) in sg.tensors.items() if tuple(shape) == (256, 256)]

    def column_tile(sg, prints, name):
        boxes = [prints[L.name].reads[p] for L in sg.layers for p, t in L.args.items() if t == name]
        (tile,) = {int(w) for lo, hi in boxes for w in (hi - lo)[:, 1]}
        return tile

    sub, sg, prints, name = min(weights, key=lambda w: column_tile(*w[1:]))  # the second weight's
    tile = column_tile(sg, prints, name)
    aligned = tile * HW.ddr_burst_bytes // math.gcd(2 * tile, HW.ddr_burst_bytes)  # rows of whole bursts
    assert 256 * aligned * 2 < stitch.PIECE_BYTES <= 256 * 2 * aligned * 2
    assert stitch.promotion_pieces(sg, prints, name, HW) == (1, 2 * aligned)
    program, _ = stitch.emit_stitched(sub, HW, replicate=False)
    ins = program.kernels[0].instructions
    (base,) = {b.offset for b in stitch.read_allocation(sub) if b.tensor == name and b.cluster == 0}
    pieces = [i for i, y in enumerate(ins) if isinstance(y, isa.Dma) and y.src.mem == "ddr" and y.dst.mem == "gb"
              and y.dst.index == 0 and base <= y.dst.offset < base + 256 * 256 * 2]
    assert [ins[i].shape for i in pieces] == [(256, 2 * aligned)] * (256 // (2 * aligned))


def test_a_pieced_weight_goes_after_the_promotions_of_its_step_and_its_tiles_in_piece_order(monkeypatch, rng):
    """The MLP of 8 x 64 x 256 -> 1024 -> 256 with a bias: the second weight comes in column
    pieces, so its layer's tiles are emitted in the order of the piece they read (the cores take
    the first piece together, not one piece each), and the weights promoted at the same step (the
    bias, first used with it) go before the pieces, not after 512 KiB of them. The model computes
    what llvm does, with every dependency checked."""
    import importlib

    op = relax.op
    generator = importlib.import_module("tvm_dsa.kernelgen.stitched")
    seen = []
    monkeypatch.setattr(generator, "emit_stitched", lambda mod, *a, **k: seen.append(mod) or stitch.emit_stitched(mod, *a, **k))
    mod = relax_graph([(8, 64, 256), (256, 1024), (1024, 256), (256,)],
                      lambda x, w1, w2, b2: op.add(op.add(op.matmul(op.nn.relu(op.matmul(x, w1)), w2), b2), x))
    args = [rng.standard_normal([int(s) for s in p.ty.shape]).astype("float32") * 0.1 for p in mod["main"].params]
    ref = _llvm(mod, args)
    mod = relax.transform.BindParams("main", {f"a{i}": tvm.runtime.tensor(a) for i, a in enumerate(args[1:], 1)})(mod)
    vm, _ = _run(mod, "graphturbo")
    out = vm["main"](tvm.runtime.tensor(args[0])).numpy()
    assert np.abs(out - ref).max() / np.abs(ref).max() < 5e-3
    ((sub, sg, prints, name),) = [(m, sg, prints, t) for m in seen for sg, prints in [stitch.read_subgraph(m, HW)]
                                for t, (shape, _) in sg.tensors.items() if tuple(shape) == (1024, 256)]
    dim, width = stitch.promotion_pieces(sg, prints, name, HW)
    assert dim == 1
    program = stitch.emit_stitched(sub, HW, replicate=False)[0].expanded()
    ins = program.kernels[0].instructions
    weights = {b.tensor: b for b in stitch.read_allocation(sub) if b.kind == "w" and b.cluster == 0 and b.level == "gb"}
    w2 = weights[name]

    def promotions(b):
        return [i for i, y in enumerate(ins) if isinstance(y, isa.Dma) and y.src.mem == "ddr" and y.dst.mem == "gb"
                and y.dst.index == 0 and b.offset <= y.dst.offset < b.offset + b.nbytes]

    others = [b for b in weights.values() if b.first == w2.first and b is not w2]
    assert any(b.nbytes == 256 * 2 for b in others), "the bias should be promoted at the second weight's step"
    assert max(i for b in others for i in promotions(b)) < min(promotions(w2))
    # the loads of the weight's tiles into the cores' LBs, in stream order: within each instance
    # of cluster 0 the pieces never go back (tiles dealt by rows, then columns, went 0, 1, 2, 3, 0, ...)
    loads = [((y.src.offset - w2.offset) // 2 % 256) // width for y in ins if isinstance(y, isa.Dma)
             and y.src.mem == "gb" and y.src.index == 0 and w2.offset <= y.src.offset < w2.offset + w2.nbytes]
    (layer,) = [L for L in sg.layers if name in L.args.values()]
    inst, cores = stitch.read_instances(sub, sg, prints, HW), stitch.read_cores(sub)
    runs = sum(1 for i, cs in enumerate(cores) if cs[0] < HW.cores_per_cluster and len(inst.rows[i][layer.name]))
    assert sum(b < a for a, b in zip(loads, loads[1:])) == runs - 1
    assert set(loads) == set(range(256 // width)) and len(set(loads)) >= 2
    # instances here hold a row of tiles; over the layer's whole grid (rows, then columns) the
    # order goes back at every row, and piece_order sorts it stably
    fp = prints[layer.name]
    (param,) = [p for p, t in layer.args.items() if t == name]
    piece = fp.reads[param][0][:, 1] // width
    rows = np.arange(len(fp.tiles))
    assert (np.diff(piece) < 0).any()
    ordered = stitch.piece_order(layer, rows, fp, {name: (1, width)})
    assert sorted(ordered) == list(rows) and (np.diff(piece[ordered]) >= 0).all()
    assert all(list(ordered[piece[ordered] == j]) == list(rows[piece == j]) for j in set(piece))
    assert list(stitch.piece_order(layer, rows, fp, {name: None})) == list(rows)


def test_timed_plans_copied_give_what_emitting_them_gives(monkeypatch, rng):
    """The MLP (``_mlp``) with its layers tiled as they run fastest in place
    (``tiling.lower_timed``, 268 M MACs a matmul): some layer takes another plan than the search's
    first fitting one, the kernels with copies are what emitting every tile gives, and the model
    computes what llvm does."""
    import importlib

    generator = importlib.import_module("tvm_dsa.kernelgen.stitched")
    chosen = []  # (search's lowering, the one kept)
    timed = generator.lower_timed
    monkeypatch.setattr(generator, "lower_timed", lambda *a, **k: chosen.append((a[4], timed(*a, **k))) or chosen[-1][1])
    mod, seen = _mlp(monkeypatch, 8, 256, 512, timed=True)
    args = [rng.standard_normal([int(s) for s in p.ty.shape]).astype("float32") * 0.1 for p in mod["main"].params]
    vm, _ = _run(mod, "graphturbo")
    out = vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()
    ref = _llvm(mod, args)
    assert np.abs(out - ref).max() / np.abs(ref).max() < 5e-3
    assert chosen and any(kept is not first for first, kept in chosen)
    for sub in seen:
        _copies_are_emission(monkeypatch, sub)


@pytest.mark.parametrize("batch", [1, 8])
def test_layers_are_timed_within_a_clusters_share_of_the_rows(monkeypatch, batch):
    """relu(x @ w1) @ w2 with 128 rows a sample, both layers taken as tuned (a tuning record's
    plan is kept where a layer has the whole chip's tiles). At batch 1 the sample's rows are split
    over the clusters: every layer's plans are timed in place all the same (``lower_timed``; the
    record tiles the whole layer), within a cluster's share of the rows (``_row_shares``: 32
    rows, the cap on each layer's second loop), with a cluster's share of the tiles (``spread``,
    the four clusters). At batch 8 (two samples a cluster) nothing caps them, and the records are
    kept."""
    import importlib

    generator = importlib.import_module("tvm_dsa.kernelgen.stitched")
    calls = []
    timed = generator.lower_timed
    monkeypatch.setattr(generator, "lower_timed", lambda *a, **k: calls.append((a[5], k["spread"])) or timed(*a, **k))
    layer = generator.StitchedKernels.layer
    monkeypatch.setattr(generator.StitchedKernels, "layer", lambda self, name, *a, **k: self.ctx.result.tuned.append(
        name) or layer(self, name, *a, **k))
    op = relax.op
    shapes = [(batch, 128, 256), (256, 1024), (1024, 256)]
    mod = relax_graph(shapes, lambda x, w1, w2: op.matmul(op.nn.relu(op.matmul(x, w1)), w2))
    weights = {f"a{i}": tvm.runtime.tensor(np.full(shapes[i], 0.01, "float32")) for i in (1, 2)}
    _run(relax.transform.BindParams("main", weights)(mod), "graphturbo")
    if batch < HW.clusters:
        assert len(calls) >= 2 and set(calls) == {((1, 128 // HW.clusters), HW.clusters)}
    else:
        assert calls == []


def test_plans_for_a_clusters_share_of_the_tiles_are_ranked_for_that_share(monkeypatch):
    """A 3 x 3 convolution of 128 -> 32 channels at 14 x 14, batch 1, its rows dealt over the four
    clusters (``spread``) and at most 2 rows a tile (a cluster's share of an exchange's rows, as
    in DenseNet-121's third dense block). The plans ``_estimate`` ranks first for the whole layer
    are tiles of 2 rows: 4 a cluster, half its cores idle. Ranked for a cluster's share of the
    tiles too (``TIMED_PLANS_SHARE``), ``lower_timed`` takes more tiles a cluster, timed faster
    than the best of the first ranking alone."""
    from tvm_dsa import tiling
    from tvm_dsa.kernel.ir import read_kernel

    mod = fuse(relax_graph([(1, 128, 14, 14), (32, 128, 3, 3)], lambda x, w: relax.op.nn.conv2d(x, w, padding=1)))
    (func,) = [f for _, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    caps, gb = (1, 32, 2), frozenset({0, 1})
    baseline = lower_kernel(func, HW, None, caps=caps)[0]

    def tiles(lowered):
        return math.prod(lp.extent for lp in read_kernel(lowered).tile_loops())

    shared = tiling.lower_timed(func, HW, None, gb, baseline, caps, spread=HW.clusters)
    monkeypatch.setattr(tiling, "TIMED_PLANS_SHARE", 0)
    whole = tiling.lower_timed(func, HW, None, gb, baseline, caps, spread=HW.clusters)
    assert -(-tiles(whole) // HW.clusters) <= HW.cores_per_cluster // 2 < -(-tiles(shared) // HW.clusters)
    cycles = [tiling.timed_cycles(low, HW, None, gb, HW.clusters) for low in (shared, whole)]
    assert cycles[0] < cycles[1]


def test_a_row_at_batch_1_deals_its_columns_over_the_clusters_and_times_plans_for_their_share(monkeypatch, rng):
    """x @ w at batch 1, one row of 1024 columns, taken as tuned: there are no rows to split, the
    kernel's instances take the columns, dealt over the clusters, so the layer's plans are timed
    with a cluster's share of its tiles (``spread``, the four clusters) instead of the tuning
    record's tiles being kept; the kernel computes what llvm does."""
    import importlib

    generator = importlib.import_module("tvm_dsa.kernelgen.stitched")
    calls = []
    timed = generator.lower_timed
    monkeypatch.setattr(generator, "lower_timed", lambda *a, **k: calls.append(k["spread"]) or timed(*a, **k))
    layer = generator.StitchedKernels.layer
    monkeypatch.setattr(generator.StitchedKernels, "layer", lambda self, name, *a, **k: self.ctx.result.tuned.append(
        name) or layer(self, name, *a, **k))
    shapes = [(1, 512), (512, 1024)]
    mod = relax_graph(shapes, lambda x, w: relax.op.matmul(x, w))
    w = (rng.standard_normal(shapes[1]) * 0.05).astype("float32")
    mod = relax.transform.BindParams("main", {"a1": tvm.runtime.tensor(w)})(mod)
    vm, result = _run(mod, "graphturbo")
    x = rng.standard_normal(shapes[0]).astype("float32")
    assert calls and set(calls) == {HW.clusters}
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(), _llvm(mod, [x]), rtol=2e-2, atol=2e-2)


def test_a_classifier_at_batch_1_ranks_its_tiles_with_its_weights_read_from_ddr(rng):
    """x @ w + b at batch 1 (768 -> 1000, ViT-B/16's head), a kernel of its own: each weight is
    read once, so it stays in DDR (``AssignMemoryScopes``), and its tiles are ranked loading it
    from there. Ranked as if it were in the GB, tiles of 25 columns loaded it in 50-byte runs, DDR
    moving 1.28x its bytes (17,991 cycles against 15,028). The kernel computes what llvm does."""
    shapes = [(1, 768), (768, 1000), (1000,)]
    mod = relax_graph(shapes, lambda x, w, b: relax.op.add(relax.op.matmul(x, w), b))
    w, b = (rng.standard_normal(shapes[1]) * 0.05).astype("float32"), rng.standard_normal(shapes[2]).astype("float32")
    mod = relax.transform.BindParams("main", {"a1": tvm.runtime.tensor(w), "a2": tvm.runtime.tensor(b)})(mod)
    vm, _ = _run(mod, "graphturbo")
    x = rng.standard_normal(shapes[0]).astype("float32")
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(), _llvm(mod, [x]), rtol=2e-2, atol=2e-2)
    (run,) = tvm_dsa.last_kernel_runs()
    program = run.program.expanded()
    weight = next(a for a in program.args if a.shape == shapes[1])
    loads = [i for k in program.kernels for i in k.instructions if isinstance(i, isa.Dma) and i.src.mem == "ddr"
             and weight.offset <= i.src.offset < weight.offset + weight.nbytes]
    payload = sum(math.prod(i.shape) * i.src.itemsize for i in loads)
    assert payload >= weight.nbytes  # every weight loaded from DDR, none promoted
    assert sum(ddr_effective_bytes(i.src, i.shape, HW) for i in loads) <= 1.05 * payload


def test_plans_timed_for_a_clusters_tiles_give_way_where_they_halo_into_fewer_instances(monkeypatch, rng):
    """relu(x @ w1) @ w2 at batch 1 (128 rows, 1024 -> 256 -> 256), both layers taken as tuned: its
    layers are lowered both ways, timed with a cluster's share of the tiles, and as before (a
    tuning record kept, here the search's first plan), and the first is kept unless its instances
    are fewer (ResNet-50's first stage at batch 1: tiles of several rows, timed faster, haloed
    into two instances, not four: 99,578 cycles against 71,701). Told that the first way's
    instances are fewer, the kernel keeps the second way's plans where the two differ, and
    computes what llvm does."""
    import importlib

    generator = importlib.import_module("tvm_dsa.kernelgen.stitched")
    plans: dict = {}  # (layer, spread) -> (the plan lower_timed was given, the one it chose)
    timed = generator.lower_timed

    def recorded(*a, **k):
        low = timed(*a, **k)
        plans[tvm_ffi.structural_hash(a[0]), k["spread"]] = (str(plan_of(a[4])), str(plan_of(low)))
        return low

    monkeypatch.setattr(generator, "lower_timed", recorded)
    layer = generator.StitchedKernels.layer
    monkeypatch.setattr(generator.StitchedKernels, "layer", lambda self, name, *a, **k: self.ctx.result.tuned.append(
        name) or layer(self, name, *a, **k))
    counts = itertools.cycle([4, 1])  # the way as before's instances, then the other's (each planning)
    monkeypatch.setattr(generator, "_instances", lambda sub: next(counts))
    seen = []
    real = generator._faster_weights
    monkeypatch.setattr(generator, "_faster_weights", lambda sub, streamed, hw: seen.append(sub) or real(sub, streamed, hw))
    op = relax.op
    shapes = [(1, 128, 1024), (1024, 256), (256, 256)]
    mod = relax_graph(shapes, lambda x, w1, w2: op.matmul(op.nn.relu(op.matmul(x, w1)), w2))
    args = [rng.standard_normal(shape).astype("float32") * 0.05 for shape in shapes]
    mod = relax.transform.BindParams("main", {f"a{i}": tvm.runtime.tensor(args[i]) for i in (1, 2)})(mod)
    vm, result = _run(mod, "graphturbo")
    assert result.stitched and not result.unstitched
    out = vm["main"](tvm.runtime.tensor(args[0])).numpy()
    ref = _llvm(mod, args[:1])
    assert np.abs(out - ref).max() / np.abs(ref).max() < 5e-3
    differ = [(given, chosen) for given, chosen in plans.values() if given != chosen]
    assert differ
    (sub,) = seen
    kept = {str(plan_of(f)) for _, f in sub.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}
    assert all(given in kept and chosen not in kept for given, chosen in differ)


def test_a_stitched_depthwise_conv_on_the_vector_units_computes_and_is_counted_there(rng):
    """A depthwise 3 x 3 conv + ReLU, then a 3 x 3 conv, at batch 8 (timed in place: two samples a
    cluster): the depthwise layer is faster on the vector units (``tiling.lower_timed``), so
    ``StitchInfo.on_vector`` names it; the offload counts its MACs as the vector units', the MME
    executes exactly the other conv's, and the model computes what llvm does. (A 1 x 1 conv after
    it would take the depthwise conv into its own kernel: ``kernelgen.blocks``.)"""
    op = relax.op
    mod = relax_graph([(8, 32, 28, 28), (32, 1, 3, 3), (64, 32, 3, 3)],
                      lambda x, w, p: op.nn.conv2d(op.nn.relu(op.nn.conv2d(x, w, padding=1, groups=32)), p, padding=1))
    result = _weights_bound_run_as_llvm(mod, rng, 0.3)
    (info,) = result.stitched.values()
    depthwise, pointwise = 8 * 32 * 28 * 28 * 9, 8 * 64 * 32 * 28 * 28 * 9
    assert len(info.on_vector) == 1 and result.vector_macs == depthwise
    assert result.dsa_macs == depthwise + pointwise
    report = tvm_dsa.last_report()
    assert report.macs == pointwise and report.vector_lane_ops >= 2 * depthwise


def _weights_bound_run_as_llvm(mod, rng, scale: float):
    """Compile ``mod`` with graphturbo, its inputs but the first (``a1``, ``a2``, ...) bound as
    constants, all drawn from ``rng`` times ``scale``; check one run against llvm's and return the
    pipeline's result."""
    args = [rng.standard_normal([int(s) for s in p.ty.shape]).astype("float32") * scale for p in mod["main"].params]
    ref = _llvm(mod, args)
    mod = relax.transform.BindParams("main", {f"a{i}": tvm.runtime.tensor(a) for i, a in enumerate(args) if i})(mod)
    vm, result = _run(mod, "graphturbo")
    out = vm["main"](tvm.runtime.tensor(args[0])).numpy()
    assert np.abs(out - ref).max() / np.abs(ref).max() < 5e-3
    return result


def test_transfers_that_continue_each_other_on_one_queue_are_one_dma():
    """Core 0 moves the quarters of a DDR tensor into its LB, one after the other: the second box
    continues the first in source and destination, so the emitter extends the first DMA (one
    set-up, ``KernelEmitter._joined``). Core 1 then writes the third quarter in DDR: the third move
    waits for that write, which the first did not, and is a DMA of its own; the fourth extends it.
    A DMA pushed while a run is recorded is never extended (a later copy of the run copies it)."""
    from tvm_dsa.emit.compress import Record
    from tvm_dsa.emit.emitter import KernelEmitter
    from tvm_dsa.emit.placement import Region

    rows, cols = 2, 64
    quarter = rows * cols * 2  # bytes of fp16
    em = KernelEmitter(HW, "k")
    em.claim(Region.whole("ddr", 0, 0, (4 * rows, cols), "float16"), ("ddr", "x"))
    em.claim(Region.whole("lb", 0, 0, (4 * rows, cols), "float16"), ("lb", "x"))
    em.claim(Region.whole("lb", 1, 0, (rows, cols), "float16"), ("lb", "y"))
    ddr, lb = ([Region.whole(mem, 0, k * quarter, (rows, cols), "float16") for k in range(4)] for mem in ("ddr", "lb"))
    em.move(ddr[0], lb[0], 0)
    em.move(ddr[1], lb[1], 0)
    em.push(isa.Dma(1, (rows, cols), isa.Operand("ddr", 0, 2 * quarter, "float16", (cols, 1)),
                    isa.Operand("lb", 1, 0, "float16", (cols, 1))), 1)
    em.move(ddr[2], lb[2], 0)
    em.move(ddr[3], lb[3], 0)
    moves = [i for i in em.instructions if isinstance(i, isa.Dma) and i.core == 0]
    assert [(m.shape, m.src.offset, m.dst.offset, m.deps) for m in moves] == [
        ((2 * rows, cols), 0, 0, ()), ((2 * rows, cols), 2 * quarter, 2 * quarter, (1,))]
    # a DMA of a recorded run (a later call may copy the run) is never extended
    em = KernelEmitter(HW, "k")
    em.claim(Region.whole("ddr", 0, 0, (4 * rows, cols), "float16"), ("ddr", "x"))
    em.claim(Region.whole("lb", 0, 0, (4 * rows, cols), "float16"), ("lb", "x"))
    em.compression.rec = Record(0)
    em.move(ddr[0], lb[0], 0)
    em.compression.rec = None
    em.move(ddr[1], lb[1], 0)
    assert [i.shape for i in em.instructions] == [(rows, cols), (rows, cols)]


def test_copies_within_ddr_that_continue_each_other_are_one_dma_of_the_cluster():
    """Cores 0 and 1 of a cluster copy the halves of a DDR tensor to another DDR tensor one after
    the other (a concatenation's tiles whose input and output stay in DDR): both run on the
    cluster's ``cdma`` queue, so the second extends the first whichever core issued it (one
    set-up); a core's copies into its LB are its own queue's and are not joined with another's."""
    from tvm_dsa.emit.emitter import KernelEmitter
    from tvm_dsa.emit.placement import Region

    rows, cols = 2, 64
    half = rows * cols * 2  # bytes of fp16
    assert HW.cores_per_cluster >= 2
    em = KernelEmitter(HW, "k")
    em.claim(Region.whole("ddr", 0, 0, (2 * rows, cols), "float16"), ("ddr", "x"))
    em.claim(Region.whole("ddr", 0, 2 * half, (2 * rows, cols), "float16"), ("ddr", "y"))
    for core in (0, 1):
        em.push(isa.Dma(core, (rows, cols), isa.Operand("ddr", 0, 2 * half + core * half, "float16", (cols, 1)),
                        isa.Operand("ddr", 0, core * half, "float16", (cols, 1))), core)
    assert [(i.shape, i.src.offset, i.dst.offset) for i in em.instructions] == [((2 * rows, cols), 0, 2 * half)]
    em = KernelEmitter(HW, "k")
    em.claim(Region.whole("ddr", 0, 0, (2 * rows, cols), "float16"), ("ddr", "x"))
    for core in (0, 1):
        em.claim(Region.whole("lb", core, 0, (rows, cols), "float16"), ("lb", core))
        em.push(isa.Dma(core, (rows, cols), isa.Operand("lb", core, 0, "float16", (cols, 1)),
                        isa.Operand("ddr", 0, core * half, "float16", (cols, 1))), core)
    assert [i.core for i in em.instructions] == [0, 1]


def _single_sample_block(rng, hw: str, monkeypatch):
    """relu(conv1x1) -> relu(conv3x3) -> conv1x1 + x at batch 1 under graphturbo on ``hw``, checked
    against llvm: its two kernels' runs, each launched alone (``kernelgen.launch`` would join them),
    and the pipeline's result."""
    monkeypatch.setattr(importlib.import_module("tvm_dsa.kernelgen.offload"), "launch_together",
                        lambda calls, graph, views: (calls, []))
    mod, x = single_sample_block(rng)
    vm, result = _run(mod, "graphturbo", hw=hw)
    out = vm["main"](tvm.runtime.tensor(x)).numpy()
    ref = _llvm(mod, [x])
    np.testing.assert_allclose(out, ref, rtol=2e-2, atol=2e-2 * np.abs(ref).max())
    first, second = tvm_dsa.last_kernel_runs()
    return first, second, result


def _ddr_reads(program, arg) -> list:
    return [i for i in program.kernels[0].instructions if isinstance(i, isa.Dma) and i.src.mem == "ddr"
            and arg.offset <= i.src.offset < arg.offset + arg.nbytes]


def test_an_output_read_in_the_kernel_is_read_on_chip_and_written_out_once(rng):
    """relu(conv1x1) leaves the graph and feeds a wider relu(conv1x1), at batch 1: one kernel,
    whose instances split the rows and keep their rows of the first output in their GB for the
    second convolution. No core loads it from DDR; each cluster's DMA writes its rows out from
    the GB, every byte once. Both outputs are llvm's."""
    op = relax.op
    shapes = [(1, 64, 32, 32), (128, 64, 1, 1), (256, 128, 1, 1)]
    bb = relax.BlockBuilder()
    x, w1, w2 = (relax.Var(f"a{i}", relax.TensorType(s, "float32")) for i, s in enumerate(shapes))
    with bb.function("main", [x, w1, w2]):
        with bb.dataflow():
            a = bb.emit(op.nn.relu(op.nn.conv2d(x, w1)))
            out = bb.emit_output(relax.Tuple([a, bb.emit(op.nn.relu(op.nn.conv2d(a, w2)))]))
        bb.emit_func_output(out)
    args = [rng.standard_normal(s).astype("float32") * 0.2 for s in shapes]
    mod = relax.transform.BindParams("main", {f"a{i}": tvm.runtime.tensor(args[i]) for i in (1, 2)})(bb.get())
    ref = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())["main"](tvm.runtime.tensor(args[0]))
    vm, result = _run(mod, "graphturbo")
    assert _outputs_close(vm, args[:1], [r.numpy() for r in ref])
    (info,) = result.stitched.values()
    assert info.instances >= HW.clusters and not info.spilled
    (run,) = tvm_dsa.last_kernel_runs()
    program = run.program.expanded()
    first = next(a for a in program.args if a.role == "output" and a.shape == (1, 128, 32, 32))
    inside = lambda o: o.mem == "ddr" and first.offset <= o.offset < first.offset + first.nbytes  # noqa: E731
    dmas = [i for i in program.kernels[0].instructions if isinstance(i, isa.Dma)]
    writes = [i for i in dmas if inside(i.dst)]
    assert not any(inside(i.src) for i in dmas)
    assert {(i.src.mem, i.src.index) for i in writes} == {("gb", c) for c in range(HW.clusters)}
    assert sum(math.prod(i.shape) for i in writes) * 2 == first.nbytes
    assert len({i.dst.offset for i in writes}) == len(writes)


def test_a_stitched_kernel_keeps_the_faster_of_multicast_and_plain_loads_from_the_gb(monkeypatch, rng):
    """With fewer samples than clusters, each stitched kernel is emitted with its tiles' GB loads
    as multicasts and as plain DMAs, and the faster program kept. At batch 1 (a sample's rows
    over the clusters) a 1 x 1 -> 3 x 3 -> 1 x 1 block with its residual at 32 x 32 keeps the
    multicasts. Timed with the multicast program's cycles doubled (ResNet-50's last stages at
    batch 1 run 2-5x slower so: a core's load in one tile paired with another core's in a later
    tile waits for it), the kernel keeps the plain loads. Both match llvm."""
    op = relax.op
    seen = []
    real = stitched._faster_loads
    monkeypatch.setattr(stitched, "_faster_loads", lambda sub, hw: seen.append((sub, real(sub, hw))) or seen[-1][1])
    mod = relax_graph([(1, 64, 32, 32), (64, 64, 1, 1), (64, 64, 3, 3), (64, 64, 1, 1)],
                      lambda x, w1, w2, w3: op.add(op.nn.conv2d(op.nn.relu(op.nn.conv2d(
                          op.nn.relu(op.nn.conv2d(x, w1)), w2, padding=1)), w3), x))

    def multicast(program) -> bool:
        return any(type(i) is isa.Dma and i.multicast and i.src.mem == "gb" for i in program.kernels[0].instructions)

    kept = []
    for penalty in (1, 2):
        seen.clear()
        monkeypatch.setattr(stitched, "timing_cycles", lambda p: timing_cycles(p) * (penalty if multicast(p) else 1))
        args = [rng.standard_normal([int(s) for s in p.ty.shape]).astype("float32") * 0.2 for p in mod["main"].params]
        vm, _ = _run(mod, "graphturbo")
        out = vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()
        ref = _llvm(mod, args)
        assert np.abs(out - ref).max() / np.abs(ref).max() < 5e-3
        (sub, (program, _)), = seen
        both = [timing_cycles(emit_stitched(sub, HW, gb_multicasts=m, steady_multicasts=m, unstick=True)[0])
                for m in (True, False)]
        assert timing_cycles(program) == (both[0] if penalty * both[0] <= both[1] else both[1])
        kept.append(multicast(program))
    assert kept == [True, False]


def test_a_clamped_layers_loads_that_do_not_move_with_its_tokens_pair_at_batch_1(monkeypatch, rng):
    """The MLP (``_mlp``) at batch 1 over 197 tokens (prime: the token tiles overlap at the end,
    ``ClampTiles``), its tokens split over the clusters and both layers clamped. Its weights stay
    in DDR (each cluster reads them about once) and every cluster's tiles of the tokens load each
    weight chunk. Emitted with ``steady_multicasts`` (the variant ``_faster_loads`` times beside
    the plain loads), every load of a weight is a multicast and no load of a token row (x, or the
    hidden tensor from the GB: their boxes move with the clamped loop) is; without it no load of
    the clamped layers is. Paired, DDR reads fewer weight bytes, never less than each weight
    once. The model computes what llvm does. (The plans timed are held to tiles of fewer than all
    197 tokens, and timed as though one cluster had all the tiles: the search's fastest plan takes
    the output layer's 197 tokens a tile, in tiles of columns, and timed for a cluster's share, as
    the kernel deals them, the plans promote the weights.)"""
    tiling = importlib.import_module("tvm_dsa.tiling")
    grid = tiling._grid
    monkeypatch.setattr(tiling, "_grid", lambda info, *a: (p for p in grid(info, *a) if p.tiles[1] < info.spatial[1]))
    generator = importlib.import_module("tvm_dsa.kernelgen.stitched")
    layer = generator.StitchedKernels.layer
    monkeypatch.setattr(generator.StitchedKernels, "layer", lambda self, *a: layer(self, *a[:5], False))
    mod, seen = _mlp(monkeypatch, 1, 197, 512, timed=True)
    args = [rng.standard_normal([int(s) for s in p.ty.shape]).astype("float32") * 0.1 for p in mod["main"].params]
    vm, _ = _run(mod, "graphturbo")
    out = vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()
    assert np.abs(out - _llvm(mod, args)).max() / np.abs(out).max() < 5e-3
    sub = seen[0]
    assert all(s is sub for s in seen)  # its program, and the one with plain loads from the GB it is timed against
    sg = stitch.read_subgraph(sub, HW)[0]
    assert all(L.ir.clamped for L in sg.layers)
    regions = place_arguments(sg.inputs, sg.outputs, sg.tensors, sg.stored)[0]
    weights = {t for t in sg.inputs if tuple(sg.tensors[t][0]) in ((256, 512), (512, 256))}
    assert len(weights) == 2

    def loads(steady: bool):
        """(tensor or "gb", multicast) of every load into an LB, and DDR bytes read per weight."""
        program, _ = emit_stitched(sub, HW, steady_multicasts=steady)
        kernel = program.expanded().kernels[0]
        riders = simulate_program(program, HW, False).kernels[0].riders
        kinds, read = set(), dict.fromkeys(weights, 0)
        for i, ins in enumerate(kernel.instructions):
            if type(ins) is not isa.Dma or ins.dst.mem != "lb" or ins.src.mem not in ("ddr", "gb"):
                continue
            tensor = next((t for t, r in regions.items() if ins.src.mem == "ddr"
                           and r.base <= ins.src.offset < r.base + r.nbytes), "gb")
            kinds.add((tensor in weights, ins.multicast))
            if tensor in weights and i not in riders:
                read[tensor] += math.prod(ins.shape) * ins.src.itemsize
        return kinds, read

    paired, paired_read = loads(True)
    plain, plain_read = loads(False)
    assert paired == {(True, True), (False, False)}
    assert plain == {(True, False), (False, False)}
    size = {t: regions[t].nbytes for t in weights}
    assert all(paired_read[t] >= size[t] for t in weights)
    assert sum(paired_read.values()) < sum(plain_read.values())


def test_a_piece_of_a_cut_sub_graph_splits_its_rows_where_that_is_faster(monkeypatch, rng):
    """At batch 1 a chain of four 3 x 3 convolutions is cut before each window (its rows are to
    split over the clusters, ``graphturbo.window_cuts``), yet no piece saves a launch by its
    MACs: each is generated with its rows split and whole (``StitchPlan.rows_if_faster``), and
    the faster program kept. 64 channels at 14 x 14 run faster split. (128 at 7 x 7, each cluster
    loading every weight for two rows, ran faster on one cluster until the split layers' plans
    were timed with a cluster's share of their tiles; now split too, 96 and 144 channels as well.)
    Both match llvm."""
    op = relax.op
    calls = []
    real = stitched._stitched

    def record(spec, *args):
        calls.append((spec.plan, real(spec, *args)))
        return calls[-1][1]

    monkeypatch.setattr(stitched, "_stitched", record)
    split = []
    for c, rows in ((64, 14), (128, 7)):
        ws = [relax.const((rng.standard_normal((c, c, 3, 3)) * 0.05).astype("float32")) for _ in range(4)]

        def chain(x):
            for w in ws:
                x = op.nn.relu(op.nn.conv2d(x, w, padding=1))
            return x

        mod = relax_graph([(1, c, rows, rows)], chain)
        arg = rng.standard_normal((1, c, rows, rows)).astype("float32")
        calls.clear()
        vm, result = _run(mod, "graphturbo")
        out = vm["main"](tvm.runtime.tensor(arg)).numpy()
        ref = _llvm(mod, [arg])
        assert np.abs(out - ref).max() / np.abs(ref).max() < 5e-3
        assert len(result.dsa) == 4  # one kernel a convolution, all of one form: generated once
        # generated whole, then split, then the faster of the two kept
        assert [(p.rows, p.rows_if_faster) for p, _ in calls] == [(False, False), (True, False), (False, True)]
        (_, whole), (_, rows_split), (_, kept) = calls
        assert kept is min((whole, rows_split), key=lambda way: timing_cycles(way[0]))
        split.append({info.instances > 1 for info in result.stitched.values()})
    assert split[0] == {True}


def test_a_first_layers_weight_read_once_is_loaded_from_ddr_not_promoted(monkeypatch, rng):
    """relu(x @ w1) @ w2 at batch 1, one instance on one cluster. Each byte of ``w1`` is read by
    one tile, and its layer is the kernel's first: promoted, its tiles would wait for the whole
    copy DDR -> GB before loading from the GB; instead they load it from DDR, each byte once.
    ``w2``, read later, is promoted behind the first layer. Promoting ``w1`` too
    (``read_once`` finding none) is slower. Both match llvm. (The kernel as promoted: the
    variant streaming every weight read once, ``_faster_weights``, is left out.)"""
    op = relax.op
    shapes = [(1, 512), (512, 2048), (2048, 256)]
    mod = relax_graph(shapes, lambda x, w1, w2: op.matmul(op.nn.relu(op.matmul(x, w1)), w2))
    args = [rng.standard_normal(s).astype("float32") * 0.05 for s in shapes]
    mod = relax.transform.BindParams("main", {f"a{i}": tvm.runtime.tensor(args[i]) for i in (1, 2)})(mod)
    ref = _llvm(mod, args[:1])

    monkeypatch.setattr(stitched, "_faster_weights", lambda sub, streamed, hw: stitched._faster_loads(sub, hw))

    def run():
        vm, _ = _run(mod, "graphturbo")
        out = vm["main"](tvm.runtime.tensor(args[0])).numpy()
        assert np.abs(out - ref).max() / np.abs(ref).max() < 5e-3
        (kernel,) = tvm_dsa.last_kernel_runs()
        program = kernel.program.expanded()
        by_shape = {a.shape: a for a in program.args}
        return kernel.report.cycles, [_ddr_reads(program, by_shape[s]) for s in shapes[1:]]

    cycles, (w1, w2) = run()
    assert {i.dst.mem for i in w1} == {"lb"}
    assert sum(math.prod(i.shape) for i in w1) * 2 == 512 * 2048 * 2  # each byte once
    assert {i.dst.mem for i in w2} == {"gb"}
    monkeypatch.setattr(stitch_passes._Kernel, "read_once", lambda self, tensors, each=False: set())
    promoted, (w1, _) = run()
    assert {i.dst.mem for i in w1} == {"gb"} and promoted > cycles


def test_a_weight_kept_in_ddr_is_multicast_to_the_cores_reading_one_box(monkeypatch, rng):
    """relu(x @ w1) @ w2 at batch 1 with 64 rows, split over the clusters, every cluster's tiles
    reading all of ``w1``, kept in DDR here (``read_once`` patched to find the first layer's
    weights): in a stitched kernel the cores' n-th loads of one box of it into one LB place are
    one multicast transfer (``KernelEmitter(ddr_multicasts=True)``), which reads DDR once, so
    the kernel reads fewer bytes of ``w1`` than its tiles load. A layer's own kernel
    (``build_program``) loads from DDR plainly. Both match llvm."""
    op = relax.op
    shapes = [(1, 64, 512), (512, 512), (512, 256)]
    mod = relax_graph(shapes, lambda x, w1, w2: op.matmul(op.nn.relu(op.matmul(x, w1)), w2))
    args = [rng.standard_normal(s).astype("float32") * 0.05 for s in shapes]
    mod = relax.transform.BindParams("main", {f"a{i}": tvm.runtime.tensor(args[i]) for i in (1, 2)})(mod)
    monkeypatch.setattr(stitch_passes._Kernel, "read_once",
                        lambda self, tensors, each=False: {t for t in tensors if self.sg.tensors[t][0] == (512, 512)})
    ref = _llvm(mod, args[:1])
    vm, result = _run(mod, "graphturbo")
    out = vm["main"](tvm.runtime.tensor(args[0])).numpy()
    assert np.abs(out - ref).max() / np.abs(ref).max() < 5e-3
    (info,) = result.stitched.values()
    assert info.instances > 1
    (kernel,) = tvm_dsa.last_kernel_runs()
    program = kernel.program.expanded()
    instructions = program.kernels[0].instructions
    w1 = next(a for a in program.args if a.shape == (512, 512))
    loads = [n for n, i in enumerate(instructions) if isinstance(i, isa.Dma) and i.src.mem == "ddr"
             and w1.offset <= i.src.offset < w1.offset + w1.nbytes]
    assert {instructions[n].dst.mem for n in loads} == {"lb"} and all(instructions[n].multicast for n in loads)
    groups = isa.multicast_groups(instructions)
    transfers = {groups[n][0] for n in loads}
    loaded = sum(math.prod(instructions[n].shape) for n in loads) * 2
    read = sum(math.prod(instructions[n].shape) for n in transfers) * 2
    assert read < loaded and read >= w1.nbytes  # every byte read, paired loads read once
    fused = fuse(mod)
    layer = lower_kernel(next(f for g, f in fused.functions.items() if "matmul" in g.name_hint), HW)[0]
    alone = build_program(layer, HW, "k").kernels[0].instructions
    assert not any(isinstance(i, isa.Dma) and i.multicast and i.src.mem == "ddr" for i in alone)


def _streamed_product(monkeypatch, rng, rows: int) -> tuple:
    """relu(x @ w1) @ w2 at batch 1 with ``rows`` rows under graphturbo, checked against llvm:
    (weights' program arguments, the weight loads from DDR of the kept program); asserts that
    ``stitched._faster_weights`` was handed streamed variants leaving both weights in DDR, and
    kept the fastest program, a streamed one."""
    op = relax.op
    shapes = [(1, rows, 256), (256, 1024), (1024, 256)]
    mod = relax_graph(shapes, lambda x, w1, w2: op.matmul(op.nn.relu(op.matmul(x, w1)), w2))
    args = [rng.standard_normal(s).astype("float32") * 0.05 for s in shapes]
    mod = relax.transform.BindParams("main", {f"a{i}": tvm.runtime.tensor(args[i]) for i in (1, 2)})(mod)
    seen = []
    real = stitched._faster_weights
    monkeypatch.setattr(stitched, "_faster_weights",
                        lambda sub, streamed, hw: seen.append((sub, streamed, real(sub, streamed, hw))) or seen[-1][2])
    ref = _llvm(mod, args[:1])
    vm, _ = _run(mod, "graphturbo")
    out = vm["main"](tvm.runtime.tensor(args[0])).numpy()
    assert np.abs(out - ref).max() / np.abs(ref).max() < 5e-3
    (sub, streamed, (program, _)), = seen
    promoted = set(sub.attrs["dsa.scopes"]["promote"])
    assert len(streamed) == 2  # its layers tiled for weights in DDR, and as ``sub``'s
    for m in streamed:
        kept = set(m.attrs["dsa.scopes"]["promote"])
        assert kept < promoted and len(promoted - kept) == 2  # the two weights (the shared input stays promoted)
    ways = [timing_cycles(stitched._faster_loads(m, HW)[0]) for m in (sub, *streamed)]
    assert timing_cycles(program) == min(ways) and min(ways[1:]) < ways[0]
    weights = [a for a in program.args if a.shape in shapes[1:]]
    instructions = program.expanded().kernels[0].instructions
    return weights, {w.name: [i for i in instructions if isinstance(i, isa.Dma) and i.src.mem == "ddr"
                              and w.offset <= i.src.offset < w.offset + w.nbytes] for w in weights}


def test_weights_each_cluster_reads_once_are_streamed_where_that_is_faster(monkeypatch, rng):
    """relu(x @ w1) @ w2 at batch 1 with 128 rows, split over the clusters: each cluster's tiles
    read each weight once. The kernel is generated with the weights promoted DDR -> GB and with
    them streamed (``AssignMemoryScopes(..., stream=True)``: left in DDR, loaded by the clusters'
    tiles as multicasts), and the faster program kept (``stitched._faster_weights``). Streamed,
    no promotion is issued and every load of a weight goes DDR -> LB; here that is the faster
    (no layer waits for a copy), as for BERT-128 at batch 1. The streamed variant's layers are
    tiled with their weights ranked as loaded from DDR (the inputs read on chip leave the weight
    out). Both match llvm."""
    calls = []
    layer = stitched.StitchedKernels.layer
    monkeypatch.setattr(stitched.StitchedKernels, "layer", lambda self, name, part, on_chip, *rest: calls.append(
        (name, on_chip)) or layer(self, name, part, on_chip, *rest))
    _, loads = _streamed_product(monkeypatch, rng, 128)
    assert all(loads.values()) and {(i.dst.mem, i.multicast) for w in loads.values() for i in w} == {("lb", True)}
    first, second = sorted({name for name, _ in calls})  # the products, each reading (activation, weight)
    assert {on_chip for name, on_chip in calls if name == first} == {frozenset({1}), frozenset()}
    assert {on_chip for name, on_chip in calls if name == second} == {frozenset({0, 1}), frozenset({0})}


def test_weights_loads_on_the_second_queue_compute_llvms_values_and_are_kept_where_faster(monkeypatch, rng):
    """The single-sample block at batch 1, every stitched kernel emitted with its weights' loads on
    the cores' second DMA queues (``emit_stitched(..., queued_weights=True)``): each load of a
    weight into an LB is on that queue, every other load on the first, and the model computes
    llvm's values. As the pipeline builds it, ``_faster_loads`` keeps, of the faster way it emits
    the kernel's loads and that way with the weights queued, the one that takes fewer cycles."""
    real = stitch.emit_stitched
    monkeypatch.setattr(stitched, "emit_stitched", lambda mod, hw, **k: real(mod, hw, **{**k, "queued_weights": True}))
    first, second, _ = _single_sample_block(rng, "dsa/stcp920", monkeypatch)
    for run in (first, second):
        program = run.program.expanded()
        weights = [a for a in program.args if a.role == "input" and len(a.shape) == 4 and a.shape[0] == 64]
        assert weights
        dmas = [i for k in program.kernels for i in k.instructions if isinstance(i, isa.Dma)]
        in_weights = [(w.offset, w.offset + w.nbytes) for w in weights]
        promoted = [(i.dst.index, *i.dst.extent_bytes(i.shape)) for i in dmas if i.dst.mem == "gb"
                    and i.src.mem == "ddr" and any(lo <= i.src.offset < hi for lo, hi in in_weights)]
        within = {"ddr": [(0, lo, hi) for lo, hi in in_weights], "gb": promoted}  # a weight's bytes in each memory
        loads = [i for i in dmas if i.dst.mem == "lb" and i.src.mem != "lb"]
        of_weights = [i for i in loads if any(g == i.src.index and lo <= a and b <= hi
                                              for g, lo, hi in within[i.src.mem]
                                              for a, b in [i.src.extent_bytes(i.shape)])]
        assert of_weights and all(i.prefetch for i in of_weights)
        assert all(not i.prefetch for i in loads if i not in of_weights)
    monkeypatch.undo()
    subs, kept = [], []
    faster = stitched._faster_loads
    monkeypatch.setattr(stitched, "_faster_loads",
                        lambda sub, hw: subs.append(sub) or kept.append(faster(sub, hw)) or kept[-1])
    _single_sample_block(rng, "dsa/stcp920", monkeypatch)
    assert subs
    for sub, (program, _) in zip(subs, kept):
        ways = [({"steady_multicasts": True}, real(sub, HW, steady_multicasts=True, unstick=True)[0])]
        if any(isinstance(i, isa.Dma) and i.multicast and i.src.mem == "gb" for k in ways[0][1].kernels
               for i in k.instructions):
            ways.append(({"gb_multicasts": False}, real(sub, HW, gb_multicasts=False, unstick=True)[0]))
        options, best = min(ways, key=lambda way: timing_cycles(way[1]))
        queued = real(sub, HW, unstick=True, queued_weights=True, **options)[0]
        assert timing_cycles(program) == min(timing_cycles(best), timing_cycles(queued))


def test_a_weight_a_clusters_cores_load_alike_counts_once_toward_streaming_it(monkeypatch, rng):
    """The product above with 512 rows, its layers on the search's plans (not timed in place: the
    timed ones load each weight about once a cluster): each cluster's 128 rows go to two
    instances of four cores, and every tile loads whole weights, so each cluster's tiles load
    each weight several times.
    The cores load one box as one DDR multicast, so ``read_once(..., each=True)`` counts a box
    once per cluster: the streamed variant leaves both weights in DDR, and it is kept where it is
    the faster, as here. (Counting every tile's load, it promoted them as the other variant does,
    and ResNet-50's last stage at batch 1 kept its 2 MB weights promoted: 1,075,856 -> 1,022,775
    cycles counted once.) Both match llvm."""
    monkeypatch.setattr(stitched, "lower_timed", lambda func, hw, lb, gb, baseline, *a, **k: baseline)
    weights, loads = _streamed_product(monkeypatch, rng, 512)
    for w in weights:
        cluster0 = [i for i in loads[w.name] if i.core < HW.cores_per_cluster]
        moved = sum(math.prod(i.shape) for i in cluster0) * 2
        boxes = sum(math.prod(shape) for _, shape in {(i.src.offset, i.shape) for i in cluster0}) * 2
        assert all(i.multicast for i in loads[w.name]) and moved > stitch_passes.REREAD * w.nbytes
        assert boxes == w.nbytes  # each box once: the cores' loads of it are one multicast


def test_a_shared_input_read_once_stays_in_ddr_where_the_gb_is_short(monkeypatch, rng):
    """The block above on a chip whose GB (256 KiB) cannot hold the second kernel's weights (80 KiB)
    with both its inputs (128 KiB each): only the input the 3x3 convolution's tiles read again
    (their halo rows) is promoted, and nothing spills; ``x``, which the sum reads once in whole
    rows, is loaded by the cores from DDR as their tiles need it, each byte once. (The kernel as
    promoted: the variant streaming the weights from DDR, ``_faster_weights``, leaves the GB room
    for both inputs.)"""
    monkeypatch.setattr(stitched, "_faster_weights", lambda sub, streamed, hw: stitched._faster_loads(sub, hw))
    hardware.register(dataclasses.replace(HW, name="stcp920-gb256k", gb_bytes=256 * KB), override=True)
    first, second, result = _single_sample_block(rng, "dsa/stcp920-gb256k", monkeypatch)
    assert all(not info.spilled for info in result.stitched.values())
    program = second.program.expanded()
    (made,) = [a.name for a in first.program.args if a.role == "output"]
    args = {a.name: a for a in program.args}
    hidden, x = _ddr_reads(program, args[made]), _ddr_reads(program, args["a0"])
    assert {i.dst.mem for i in hidden} == {"gb"} and all(i.multicast for i in hidden)
    assert {i.dst.mem for i in x} == {"lb"}
    assert sum(math.prod(i.shape) for i in x) * 2 == args["a0"].nbytes


def test_ddr_bytes_of_boxes_count_whole_bursts_per_contiguous_run():
    """A (2, 4, 8) fp16 tensor, 64-byte bursts: a whole plane is one run of 32 elements (64 B);
    a 2 x 4 corner of a plane two runs of 4 (8 B each, a burst each); the whole tensor one run of
    128 B; a column of 4 rows four runs of one element."""
    boxes = np.array([(1, 4, 8), (1, 2, 4), (2, 4, 8), (1, 4, 1)])
    assert HW.ddr_burst_bytes == 64
    assert [_ddr_bytes(b[None], (2, 4, 8), "float16", HW) for b in boxes] == [64, 128, 128, 256]
    assert _ddr_bytes(np.concatenate([boxes, boxes[:1]]), (2, 4, 8), "float16", HW) == 2 * 64 + 128 + 128 + 256


def test_a_single_sample_is_cut_before_its_windows_and_its_input_promoted(monkeypatch, rng):
    """At batch 1, relu(conv1x1) -> relu(conv3x3) -> conv1x1 + x: the sub-graph is cut before the
    3x3 window (within one kernel every row instance would compute the 1x1's rows of its halo
    again, and the residual, read once at the end, does not pay for exchanging the halo rows
    instead: ``graphturbo._exchange_pays``), each kernel's rows split over the four clusters, and
    the second kernel's input, which all clusters read rows of, promoted to their GBs: DDR gives
    each of its bytes once (a multicast to the four GBs), and no core loads it from DDR. The
    outputs are llvm's."""
    first, second, result = _single_sample_block(rng, "dsa/stcp920", monkeypatch)
    assert [{m.name for m in run.program.kernels[0].layers} - {PROMOTE} for run in (first, second)] == \
        [{"lv"}, {"lv1", "gv"}]
    assert len(result.stitched) == 2 and all(info.instances >= HW.clusters for info in result.stitched.values())
    program = second.program.expanded()
    (made,) = [a.name for a in first.program.args if a.role == "output"]
    args = {a.name: a for a in program.args}
    for arg in (args[made], args["a0"]):  # the hidden tensor, and x for the sum (a weight may be streamed)
        reads = _ddr_reads(program, arg)
        assert {i.dst.mem for i in reads} == {"gb"} and all(i.multicast for i in reads), arg.name
        assert sum(math.prod(shape) for _, shape in {(i.src.offset, i.shape) for i in reads}) * 2 == arg.nbytes
        assert {i.dst.index for i in reads} == set(range(HW.clusters))
    assert made in {a.name for a in program.args}


def _dense_block(rng, layers: int = 3):
    """(module, input): a dense block at batch 1 over 32 x 32 pixels: a 1 x 1 stem from 16 to 32
    channels, ``layers`` layers, each relu(conv3x3(relu(conv1x1(features)))) of 32 channels
    concatenated to the features, then a 1 x 1 transition: every layer reads all the features
    before it."""
    op = relax.op
    shapes = [(1, 16, 32, 32), (32, 16, 1, 1)]
    for k in range(layers):
        shapes += [(32, 32 * (k + 1), 1, 1), (32, 32, 3, 3)]
    shapes.append((32, 32 * (layers + 1), 1, 1))

    def body(x, stem, *ws):
        features = [op.nn.relu(op.nn.conv2d(x, stem))]
        for k in range(layers):
            y = op.nn.relu(op.nn.conv2d(op.concat(features, axis=1) if k else features[0], ws[2 * k]))
            features.append(op.nn.relu(op.nn.conv2d(y, ws[2 * k + 1], padding=1)))
        return op.nn.conv2d(op.concat(features, axis=1), ws[-1])

    mod = relax_graph(shapes, body)
    args = [rng.standard_normal(s).astype("float32") * 0.2 for s in shapes]
    bound = {f"a{i}": tvm.runtime.tensor(args[i]) for i in range(1, len(shapes))}
    return relax.transform.BindParams("main", bound)(mod), args[0]


@pytest.mark.parametrize("halo_stores", [True, False])
def test_a_single_sample_exchanges_the_halo_rows_of_a_window_in_one_kernel(monkeypatch, rng, halo_stores):
    """The dense block above at batch 1 (each kernel launched alone), each cluster a quarter of the
    32 rows (8). Before the second 3 x 3 window the stem's and the first layer's features cross,
    read again past the next window: there the sub-graph is not cut (before the first and the
    last windows it is), and the 1 x 1's output, which the window reads one row past each side
    of a cluster's share, is exchanged (``StitchPlan.exchange``): each cluster computes its own
    rows only, into its GB; the window reads one row of each neighbour: a row a boundary each
    way, 3 boundaries, 32 channels x 32 columns of fp16 a row. With ``halo_stores`` (the
    default) the tiles that compute those rows store them into the neighbours' GBs too, across
    the bus, on the cores' store queues, and nothing of the tensor goes through DDR; without,
    each cluster copies out to DDR the rows its neighbours' window reads and copies in the rows
    its own window reads of theirs, and on each cluster's DMA queue, which is in order, a copy in
    comes right after the copies, ahead of the weights its step promotes. The functional run
    checks every dependency (a window's load waits for the neighbours' stores, a copy in for the
    other clusters' copies out); the output is llvm's."""
    monkeypatch.setattr(importlib.import_module("tvm_dsa.kernelgen.offload"), "launch_together",
                        lambda calls, graph, views: (calls, []))
    stitched = importlib.import_module("tvm_dsa.kernelgen.stitched")
    monkeypatch.setattr(stitched, "emit_stitched", functools.partial(stitched.emit_stitched, halo_stores=halo_stores))
    mod, x = _dense_block(rng)
    vm, result = _run(mod, "graphturbo")
    out = vm["main"](tvm.runtime.tensor(x)).numpy()
    ref = _llvm(mod, [x])
    np.testing.assert_allclose(out, ref, rtol=2e-2, atol=2e-2 * np.abs(ref).max())
    assert len(result.stitched) == 3 and all(not info.spilled for info in result.stitched.values())
    _, middle, _ = tvm_dsa.last_kernel_runs()
    program = middle.program.expanded()
    args = [(a.offset, a.offset + a.nbytes) for a in program.args]
    inside = lambda o: o.mem == "ddr" and not any(lo <= o.offset < hi for lo, hi in args)  # noqa: E731
    dmas = [i for i in program.kernels[0].instructions if isinstance(i, isa.Dma)]
    out_rows = [i for i in dmas if i.src.mem == "gb" and inside(i.dst)]
    in_rows = [i for i in dmas if i.dst.mem == "gb" and inside(i.src)]
    row = 32 * 32  # elements of a row of the exchanged tensor
    cluster = lambda i: i.core // HW.cores_per_cluster  # noqa: E731
    assert not [i for i in dmas if i.dst.mem == "lb" and inside(i.src)]  # no core loads it from DDR
    if halo_stores:
        assert not out_rows and not in_rows
        stores = [i for i in dmas if i.src.mem == "lb" and i.dst.mem == "gb" and i.dst.index != cluster(i)]
        assert sum(math.prod(i.shape) for i in stores) == 2 * (HW.clusters - 1) * row
        assert {(cluster(i), i.dst.index) for i in stores} == \
            {(c, c + d) for c in range(HW.clusters) for d in (-1, 1) if 0 <= c + d < HW.clusters}
        assert all(i.prefetch for i in stores)
        return
    for moved in (out_rows, in_rows):
        assert sum(math.prod(i.shape) for i in moved) == 2 * (HW.clusters - 1) * row
        assert all(math.prod(i.shape) == row for i in moved)  # one row a copy: one neighbour, one side
    assert {cluster(i) for i in in_rows} == set(range(HW.clusters))
    exchange = {id(i) for i in out_rows + in_rows}
    for c in range(HW.clusters):  # a copy in goes first in its step: after copies, before the step's promotions
        queue = [i for i in dmas if cluster(i) == c and "lb" not in (i.src.mem, i.dst.mem)]
        assert all(id(queue[k - 1]) in exchange for k, i in enumerate(queue) if i in in_rows)


def test_box_minus_and_halos_out_cut_an_instances_box_into_what_others_write():
    """Rows 8-16 of a (1, 4, 32, 8) tensor written by instance 1 of three, whose box holds rows
    7-17: the rows it copies in are 7 and 16 (two boxes of one row); the rows it copies out are
    those the others' boxes hold of its own, row 8 for instance 0 (rows 0-9) and 15 for
    instance 2 (rows 15-32), by the instance they go to."""
    written = ((0, 0, 8, 0), (1, 4, 16, 8))
    box = ((0, 0, 7, 0), (1, 4, 17, 8))
    assert stitch._box_minus(box, written) == [((0, 0, 7, 0), (1, 4, 1, 8)), ((0, 0, 16, 0), (1, 4, 1, 8))]
    assert stitch._box_minus(box, None) == [((0, 0, 7, 0), (1, 4, 10, 8))]
    inst = Instances([{}, {}, {}], [{"t": ((0, 0, 0, 0), (1, 4, 9, 8))}, {"t": box},
                                    {"t": ((0, 0, 15, 0), (1, 4, 32, 8))}], 1.0,
                     [{}, {"t": tuple(np.array(c) for c in written)}, {}])
    assert stitch._halos_out(inst, 1, "t") == {0: ((0, 0, 8, 0), (1, 4, 1, 8)), 2: ((0, 0, 15, 0), (1, 4, 1, 8))}


def test_write_out_slabs_follow_the_dim_the_tiles_finish_in_order():
    """A (1, 256, 16, 64) box (512 kB of fp16) in 16 tiles of 64 channels x 4 rows. Tiles in row
    order (rows outer) finish row slabs one after another: four slabs of 4 rows (128 kB), each
    written once its four tiles have run. In channel order, the channel slabs instead. A box
    of two rows in tiles of a row (8 kB each, under ``SLAB_BYTES``) is one slab, after both."""
    def boxes(rows_outer: bool):
        lo, hi = [], []
        for a in range(4):
            for b in range(4):
                r, c = (a, b) if rows_outer else (b, a)
                lo.append((0, 64 * c, 4 * r, 0))
                hi.append((1, 64 * c + 64, 4 * r + 4, 64))
        return np.array(lo), np.array(hi)

    origin, extents = (0, 0, 0, 0), (1, 256, 16, 64)
    assert write_out_slabs(boxes(True), origin, extents, 2) == [
        (4 * (k + 1), (0, 0, 4 * k, 0), (1, 256, 4, 64)) for k in range(4)]
    assert write_out_slabs(boxes(False), origin, extents, 2) == [
        (4 * (k + 1), (0, 64 * k, 0, 0), (1, 64, 16, 64)) for k in range(4)]
    small = (1, 64, 2, 64)
    assert 64 * 64 * 2 < SLAB_BYTES <= 64 * 2 * 64 * 2
    rows = np.array([(0, 0, 0, 0), (0, 0, 1, 0)]), np.array([(1, 64, 1, 64), (1, 64, 2, 64)])
    assert write_out_slabs(rows, origin, small, 2) == [(2, origin, small)]


def test_a_kept_output_is_written_out_slab_by_slab_as_its_tiles_finish(monkeypatch, rng):
    """y = relu(conv1x1(x)) at batch 1 over 128 channels of 64 x 64, an output of the model that
    the kernel also reads (z = conv1x1(y) + x): it is kept in each cluster's GB (256 kB a
    cluster) and written out to DDR in slabs of rows, each copy waiting only for the stores of
    the tiles that wrote its slab, so the first copies run while later tiles of y still
    compute. The copies tile each cluster's box once; the model computes what llvm does (the
    functional run checks every dependency)."""
    def body(x, w1, w2):
        op = relax.op
        y = op.nn.relu(op.nn.conv2d(x, w1))
        return relax.Tuple([y, op.add(op.nn.conv2d(y, w2), x)])

    emitted = []
    real = stitched.emit_stitched
    monkeypatch.setattr(stitched, "emit_stitched", lambda mod, *a, **k: emitted.append(real(mod, *a, **k)) or emitted[-1])
    mod = relax_graph([(1, 128, 64, 64), (128, 128, 1, 1), (128, 128, 1, 1)], body)
    args = [rng.standard_normal([int(s) for s in p.ty.shape]).astype("float32") * 0.2 for p in mod["main"].params]
    vm, result = _run(mod, "graphturbo")
    assert len(result.stitched) == 1
    y, z = vm["main"](*[tvm.runtime.tensor(a) for a in args])
    ref = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in args])
    for got, want in zip((y, z), ref):
        assert np.abs(got.numpy() - want.numpy()).max() / np.abs(want.numpy()).max() < 5e-3
    program = emitted[0][0]
    kernel = program.expanded().kernels[0]
    timing = simulate_program(program, HW).kernels[0]
    y_bytes = 128 * 64 * 64 * 2
    for cluster in range(HW.clusters):
        copies = [i for i, ins in enumerate(kernel.instructions) if type(ins) is isa.Dma
                  and ins.src.mem == "gb" and ins.src.index == cluster and ins.dst.mem == "ddr"]
        assert len(copies) >= 2
        assert sum(math.prod(kernel.instructions[i].shape) * 2 for i in copies) == y_bytes // HW.clusters
        waits = [kernel.instructions[i].deps for i in copies]
        assert all(type(kernel.instructions[d]) is isa.Dma and kernel.instructions[d].src.mem == "lb"
                   and (kernel.instructions[d].dst.mem, kernel.instructions[d].dst.index) == ("gb", cluster)
                   for deps in waits for d in deps)  # the stores of y's tiles, no other write
        last_store = max(timing.end[d] for deps in waits for d in deps)
        assert max(timing.end[d] for d in waits[0]) < last_store  # the first slab's tiles finish earlier
        assert timing.start[copies[0]] < last_store <= timing.start[copies[-1]]
