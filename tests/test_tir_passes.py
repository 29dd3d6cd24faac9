"""TIR passes on small kernels: each keeps the kernel's meaning (checked by running the TIR on
llvm) and produces the structure the next stage relies on; the codegen + simulator reproduce it."""

import dataclasses
import math

import numpy as np
import pytest
import tvm
import tvm_ffi
from helpers import fuse, random_args, relax_graph, run_llvm
from tvm import relax

from tvm_dsa import hardware, isa, tiling
from tvm_dsa.emit.emitter import build_program, deal
from tvm_dsa.emit.placement import Layer
from tvm_dsa.kernelgen.specialize import timing_cycles
from tvm_dsa.kernel.ir import CodegenError, chunk_loops, plan_lb, read_kernel
from tvm_dsa.emit.footprint import footprints
from tvm_dsa.runtime import simulate
from tvm_dsa.runtime.cost import ddr_effective_bytes
from tvm_dsa.kernel.attrs import LB_SCOPE
from tvm_dsa.tir_passes import AssignScopes, ClampTiles, LowerToDSA, TileForLB
from tvm_dsa.tir_passes.tile import TilePlan, anchor_info, candidate_plans, working_set_floor
from tvm_dsa.tiling import _fitting, _gallop, chunk_cycles, load_cycles, loads, lower_kernel
from tvm_dsa.tir_passes import PLAN_ATTR, lower_with_plan, plan_of
from tvm_dsa.tir_passes.tile import clampable, smaller_tile
from tvm_dsa.tir_passes.inline import inline_products


def fused_kernel(build):
    """The single fused PrimFunc of a Relax graph built by ``build(bb)``."""
    mod = fuse(build())
    funcs = [f for _, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert len(funcs) == 1
    return funcs[0]


def conv_bias_relu():
    op = relax.op
    return fused_kernel(lambda: relax_graph(
        [(1, 16, 12, 12), (32, 16, 3, 3), (1, 32, 1, 1)],
        lambda x, w, b: op.nn.relu(op.add(op.nn.conv2d(x, w, padding=1), b))))


def test_anchor_is_the_contraction_with_mme_roles():
    info = anchor_info(conv_bias_relu())
    assert info.kind.kind == "mme"
    assert info.spatial == (1, 32, 12, 12) and info.reduction == (16, 3, 3)
    assert info.roles == ("M", "N", "M", "M")  # output channels feed the PE array's columns


def test_each_pass_preserves_numerics(rng):
    func = conv_bias_relu()
    args = random_args(func, rng)
    ref = run_llvm(func, args)
    mod = tvm.IRModule({"main": func})
    for p in (TileForLB(TilePlan((1, 16, 4, 12), 8)), AssignScopes(), LowerToDSA()):
        mod = p(mod)
        np.testing.assert_allclose(run_llvm(mod["main"], args), ref, rtol=1e-5, atol=1e-5)
    text = mod["main"].script()
    assert text.count('"dsa.loop": "tile"') == 4 and text.count('"dsa.loop": "chunk"') == 1
    for op in ('"dsa.op": "mme"', '"dsa.op": "dma"', '"dsa.op": "vector"'):
        assert op in text
    assert LB_SCOPE in text


def test_lb_plan_sizes_follow_the_tile():
    func = conv_bias_relu()
    lowered = (LowerToDSA()(AssignScopes()(TileForLB(TilePlan((1, 16, 4, 12), 8))(
        tvm.IRModule({"main": func})))))["main"]
    plan = plan_lb(read_kernel(lowered), hardware.get("stcp920"))
    sizes = {b.extents: b.dtype for b in plan.buffers.values()}
    assert sizes[(1, 16, 4, 12)] in ("float32", "float16")  # accumulator / epilogue tiles
    assert sizes[(1, 8, 6, 14)] == "float16"  # input tile with its 1-pixel halo, 8 channels
    assert sizes[(16, 8, 3, 3)] == "float16"  # weight chunk
    assert plan.total_bytes <= 64 * 1024


def test_chosen_tiling_fits_and_simulates_exactly(rng):
    hw = hardware.get("stcp920")
    func = conv_bias_relu()
    lowered, plan = lower_kernel(func, hw)
    assert plan_lb(read_kernel(lowered), hw).total_bytes <= hw.lb_bytes
    program = build_program(lowered, hw, "k")
    isa.validate(program)
    args = random_args(func, rng)
    ref = run_llvm(func, args)
    out = simulate(program, args[:-1]).outputs[0]
    np.testing.assert_allclose(out, ref, rtol=2e-2, atol=2e-2 * np.abs(ref).max())
    macs = sum(isa.macs(i) for i in program.kernels[0].instructions)
    assert macs == 32 * 12 * 12 * 16 * 9


def test_zero_init_folds_into_the_first_chunk_of_the_contraction(rng):
    """The accumulator's zero fill is dropped: the MME overwrites on the first reduction chunk of
    each tile and adds on the others, and the result is unchanged."""
    hw = hardware.get("stcp920")
    func = conv_bias_relu()
    plan = TilePlan((1, 16, 4, 12), 8)
    lowered = lower_with_plan(func, plan)
    ir = read_kernel(lowered)
    (mme,) = [st for st in ir.stages() if st.op == "mme"]
    chunk_slots = [n.slot for n in ir.tile_loops()[-1].body if hasattr(n, "kind") and n.kind == "chunk"]
    assert mme.overwrite == tuple(chunk_slots) and len(chunk_slots) == 1
    assert not any(st.dst.buffer == mme.dst.buffer for st in ir.stages() if st is not mme and st.op == "dma")
    program = build_program(lowered, hw, "k")
    tiles = (32 // 16) * (12 // 4)
    chunks = 16 // 8
    mmes = [i for i in program.kernels[0].instructions if isinstance(i, isa.Mme)]
    assert sum(not i.accumulate for i in mmes) == tiles
    assert sum(i.accumulate for i in mmes) == tiles * (chunks - 1)
    args = random_args(func, rng)
    ref = run_llvm(func, args)
    out = simulate(program, args[:-1]).outputs[0]
    np.testing.assert_allclose(out, ref, rtol=2e-2, atol=2e-2 * np.abs(ref).max())


def test_row_longer_than_the_lb_has_no_tiling():
    """A softmax row cannot be split (its reductions need the whole row), so on the smallest
    valid LB a 4096-wide row does not fit and the kernel stays on the host."""
    d = hardware.get("stcp920").to_dict()
    d.update(name="tinylb", lb_bytes=hardware.min_lb_bytes(hardware.get("stcp920").mme, 2, 4))
    hw = hardware.Hardware.from_dict(d)
    func = fused_kernel(lambda: relax_graph([(4, 4096)], lambda x: relax.op.nn.softmax(x)))
    from tvm_dsa.kernel.analysis import Unsupported
    with pytest.raises(Unsupported, match="fits the .*LB"):
        lower_kernel(func, hw)


@pytest.mark.parametrize("name,shapes,body", [
    # row reductions with a compound update and broadcast temporaries (mean, variance, rsqrt)
    ("layer_norm", [(1, 64, 96), (96,), (96,)],
     lambda x, g, b: relax.op.nn.layer_norm(x, g, b, axes=[-1])),
    ("softmax", [(2, 16, 40)], lambda x: relax.op.nn.softmax(x)),
    ("gelu", [(32, 48)], lambda x: relax.op.nn.gelu(x)),
    # a windowed max reduction and a divide by a window size folded from index arithmetic
    ("max_pool", [(1, 8, 12, 12)], lambda x: relax.op.nn.max_pool2d(x, pool_size=3, strides=2, padding=1)),
    ("avg_pool", [(1, 8, 12, 12)], lambda x: relax.op.nn.avg_pool2d(x, pool_size=2, strides=2)),
    ("depthwise_conv", [(1, 16, 10, 10), (16, 1, 3, 3)],
     lambda x, w: relax.op.nn.conv2d(x, w, padding=1, groups=16)),
    ("batch_matmul", [(3, 24, 40), (3, 40, 56)], lambda a, b: relax.op.matmul(a, b)),
    # a reshape whose floordiv/floormod indices are affine once the iterators' ranges are known
    ("reshape_transpose", [(2, 16, 64)],
     lambda x: relax.op.permute_dims(relax.op.reshape(x, (2, 16, 4, 16)), [0, 2, 1, 3])),
])
def test_kernel_on_the_simulator_matches_llvm(rng, name, shapes, body):
    hw = hardware.get("stcp920")
    func = fused_kernel(lambda: relax_graph(shapes, body))
    lowered, _ = lower_kernel(func, hw)
    program = build_program(lowered, hw, name)
    isa.validate(program)
    args = random_args(func, rng)
    ref = run_llvm(func, args)
    out = simulate(program, args[:-1]).outputs[0]
    # fp16 storage of inputs and outputs, fp32 inside: a few fp16 ulps of the output range
    np.testing.assert_allclose(out, ref, rtol=1e-2, atol=5e-3 * max(np.abs(ref).max(), 1))


def test_head_merge_transpose_runs_on_the_dsa(rng):
    """out[b, s, h*64 + d] = in[b, h, s, d]: the tile along the merged dim must divide 64, and the
    tile's head index (tile // k) is a non-linear function of the tile loop only."""
    hw = hardware.get("stcp920")
    func = fused_kernel(lambda: relax_graph(
        [(1, 12, 32, 64)], lambda x: relax.op.reshape(relax.op.permute_dims(x, [0, 2, 1, 3]), (1, 32, 768))))
    lowered, plan = lower_kernel(func, hw)
    assert 64 % plan.tiles[-1] == 0 or plan.tiles[-1] % 64 == 0
    program = build_program(lowered, hw, "merge")
    args = random_args(func, rng)
    out = simulate(program, args[:-1]).outputs[0]
    np.testing.assert_array_equal(out, args[0].astype(np.float16).transpose(0, 2, 1, 3).reshape(1, 32, 768))


def test_merge_heads_alignment_from_simplified_indices_where_it_is_faster(rng):
    """The legalized reshape of (2, 16, 4, 16) -> (2, 16, 64) reads its input through
    floordiv/floormod chains whose divisors (2, 16, ...) vanish under the iterators' ranges: the
    simplified indices allow tiles of 16 along the merged dim where the raw ones allowed 2, and
    lower_kernel keeps whichever alignment simulates faster — here the simplified one."""
    from tvm_dsa.kernelgen.specialize import timing_cycles

    hw = hardware.get("stcp920")
    func = fused_kernel(lambda: relax_graph(
        [(2, 4, 16, 16)], lambda x: relax.op.reshape(relax.op.permute_dims(x, [0, 2, 1, 3]), (2, 16, 64))))
    raw, simple = anchor_info(func, simplify=False), anchor_info(func)
    assert raw.align[-1] == 2 and simple.align[-1] == 16
    programs = {s: build_program(lower_kernel(func, hw, simplify=s)[0], hw, "merge") for s in (False, True)}
    cycles = {s: timing_cycles(p) for s, p in programs.items()}
    assert cycles[True] < 0.5 * cycles[False]  # 2x2x2-element tiles no more
    args = random_args(func, rng)
    out = simulate(programs[True], args[:-1]).outputs[0]
    np.testing.assert_array_equal(out, args[0].astype(np.float16).transpose(0, 2, 1, 3).reshape(2, 16, 64))


@pytest.mark.parametrize("shape", [(8, 4, 32, 16), (2, 4, 128, 16)])
def test_alignments_are_timed_only_when_their_tile_counts_are_close(shape, monkeypatch):
    """Merge heads (b, 4, s, 16) -> (b, s, 64): both alignments are lowered; the timing simulation
    decides only when neither has TIMED_TILES_RATIO times the other's tiles (else the one with
    fewer tiles is kept unsimulated: ViT-B/16's 1.2M one-element tiles took minutes to time)."""
    from tvm_dsa.tiling import TIMED_TILES_RATIO, _lower_aligned

    b, h, s, d = shape
    func = fused_kernel(lambda: relax_graph(
        [shape], lambda x: relax.op.reshape(relax.op.permute_dims(x, [0, 2, 1, 3]), (b, s, h * d))))
    info = anchor_info(func)
    counts = {a: math.prod(e // t for e, t in zip(info.spatial, _lower_aligned(func, HW, None, True, True, a)[1].tiles))
              for a in (False, True)}
    timed = []
    real = tiling.timing_cycles
    monkeypatch.setattr(tiling, "timing_cycles", lambda p: timed.append(p) or real(p))
    _, plan = lower_kernel(func, HW)
    close = max(counts.values()) < TIMED_TILES_RATIO * min(counts.values())
    assert close == (shape == (8, 4, 32, 16))  # 128 against 32 tiles; 4096 against 16
    assert len(timed) == (2 if close else 0)
    if not close:
        assert math.prod(e // t for e, t in zip(info.spatial, plan.tiles)) == min(counts.values())


def test_patch_embedding_merge_tiles_rows_and_skips_guarded_stages(rng):
    """ViT's patch merge: conv output (2, 64, 4, 4) -> reshape (2, 64, 16) -> transpose -> concat
    after a class token -> add positions (17 rows, prime). Whole tiles need the reshape's
    ``p // 4, p % 4`` over a loop (not affine), so rows are tiled one at a time; the row-0 tile
    takes the class token and compute_at guards the reshape and transpose stages off there
    (``T.where(1 <= row)``). With the simplified indices a row tile is a whole row of 64 channels;
    the raw ones (``((p - 1) // 16 + c) // 64 ...``, not affine for row 0's p = -1) need one element
    per tile. The guarded stages are skipped in that tile (their reads would leave the input), and
    the result matches numpy."""
    from tvm_dsa.kernel.ir import Bound
    from tvm_dsa.tiling import _lower_aligned

    hw = HW
    op = relax.op

    def merge(x, cls, pos):
        return op.add(op.concat([cls, op.permute_dims(op.reshape(x, (2, 64, 16)), [0, 2, 1])], axis=1), pos)

    func = fused_kernel(lambda: relax_graph([(2, 64, 4, 4), (2, 1, 64), (1, 17, 64)], merge))
    plans = {s: _lower_aligned(func, hw, None, True, s)[1] for s in (False, True)}
    assert plans[False].tiles == (1, 1, 1) and plans[True].tiles == (1, 1, 64)
    lowered, plan = lower_kernel(func, hw)
    assert plan.tiles == (1, 1, 64)
    ir = read_kernel(lowered)
    guarded = {s.name: s.guard for s in ir.stages() if s.guard}
    assert set(guarded) == {"T_reshape", "T_transpose"}
    row_slot = ir.tile_loops()[1].slot
    assert all(g == (Bound("le", 1, ((row_slot, -1),), ()),) for g in guarded.values())  # 1 - row <= 0
    x, cls, pos = [rng.standard_normal([int(s) for s in p.shape]).astype("float32") for p in func.params[:3]]
    out = simulate(build_program(lowered, hw, "merge"), [x, cls, pos]).outputs[0]
    h = lambda a: a.astype(np.float16).astype(np.float32)  # noqa: E731 - the DSA stores fp16
    want = np.concatenate([h(cls), h(x).reshape(2, 64, 16).transpose(0, 2, 1)], axis=1) + h(pos)
    np.testing.assert_allclose(out, want, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("batch,clusters", [(1, 1), (2, 2), (4, 4), (8, 4)])
def test_batch_splits_across_clusters(batch, clusters):
    """Layerwise: the batch goes to min(batch, clusters) clusters, a tile per core within each."""
    hw = hardware.get("stcp920")
    func = fused_kernel(lambda: relax_graph(
        [(batch, 16, 16, 16), (32, 16, 3, 3)], lambda x, w: relax.op.nn.conv2d(x, w, padding=1)))
    lowered, _ = lower_kernel(func, hw)
    cores = build_program(lowered, hw, "k").kernels[0].cores
    assert {c // hw.cores_per_cluster for c in cores} == set(range(clusters))
    assert len(cores) == clusters * hw.cores_per_cluster  # every core of a used cluster has a tile


def test_a_tile_holding_more_samples_than_a_cluster_takes_is_split_for_every_cluster(rng):
    """BERT's head merge at batch 8, (8, 12, 128, 64) -> (8, 128, 768): the largest tiles that fit
    the LB hold 4 samples, and their 24 tiles already give 2 clusters' 16 cores one each; but the
    first tile loop picks the cluster, so only 2 of the 4 would run (and a stitched sub-graph could
    not be split into more instances than that loop has values). The sample tile is split until
    every cluster has samples."""
    hw = HW
    func = fused_kernel(lambda: relax_graph(
        [(8, 12, 128, 64)], lambda x: relax.op.reshape(relax.op.permute_dims(x, [0, 2, 1, 3]), (8, 128, 768))))
    _, largest = lower_kernel(func, hw, parallel=False)
    used = 8 // largest.tiles[0]  # clusters the first tile loop reaches
    assert used < hw.clusters and math.prod(e // t for e, t in zip((8, 128, 768), largest.tiles)) >= used * 8
    lowered, plan = lower_kernel(func, hw)
    assert 8 // plan.tiles[0] >= hw.clusters
    program = build_program(lowered, hw, "merge")
    assert len(program.kernels[0].cores) == hw.clusters * hw.cores_per_cluster
    args = random_args(func, rng)
    out = simulate(program, args[:-1]).outputs[0]
    np.testing.assert_array_equal(out, args[0].astype(np.float16).transpose(0, 2, 1, 3).reshape(8, 128, 768))


HW = hardware.get("stcp920")


def test_loads_count_each_tiles_bursts_and_a_weight_tile_kept_in_the_lb():
    """A 1x1 conv of 64 samples (16 -> 32 channels, 4x4), a sample per tile: 64 tiles on 32 cores.
    Each tile reads its sample (16x4x4) and all the weights (32x16); without a chunk loop the
    tile 32 tiles later on the same core finds the same weights still in its LB. Both boxes are
    contiguous in DDR, so their bytes are whole bursts."""
    op = relax.op
    func = fused_kernel(lambda: relax_graph([(64, 16, 4, 4), (32, 16, 1, 1)], lambda x, w: op.nn.conv2d(x, w)))
    sample, weights, fp16 = 16 * 4 * 4, 32 * 16, 2
    assert sample * fp16 % HW.ddr_burst_bytes == 0 and weights * fp16 % HW.ddr_burst_bytes == 0
    whole = lower_with_plan(func, TilePlan((1, 32, 4, 4), 16))
    assert loads(whole, HW) == ((64 * sample + 32 * weights) * fp16, 64 + 32, 0)
    # two chunks of 8 channels: the LB ends with the second, so every tile loads its weights;
    # a chunk's weights are 32 runs of 8 channels (16 bytes), each a whole burst
    chunked = lower_with_plan(func, TilePlan((1, 32, 4, 4), 8))
    per_chunk = sample // 2 * fp16 + 32 * HW.ddr_burst_bytes
    assert loads(chunked, HW) == (64 * 2 * per_chunk, 64 * 2 * 2, 0)
    nbytes, transfers, _ = loads(chunked, HW)
    cores = HW.clusters * HW.cores_per_cluster
    assert load_cycles(chunked, HW) == nbytes / HW.ddr_bytes_per_cycle + transfers * HW.dma_latency_cycles / cores


def test_loads_are_the_ddr_loads_of_the_program_its_tiles_dealt_as_build_program_deals_them():
    """Tiles go to clusters by their first tile loop (the batch split) and round-robin over a
    cluster's cores (``deal``); a weight tile stays in the LB only where the tile before it on
    the same core read it. A matmul (8, 128, 256) x (256, 1024) in tiles of 16 x 64 over the whole
    reduction: on a cluster's 8 cores consecutive tiles alternate their row block and never share
    a weight column, so every tile loads its 32 KB of weights (counted as kept for every other
    tile when tiles were taken as round-robin over all 32 cores). ``loads`` counts exactly the
    program's DDR -> LB transfers, and with the weights counted the lowering takes 64 x 64 tiles
    in chunks of 32, which also run faster."""
    func = fused_kernel(lambda: relax_graph([(8, 128, 256), (256, 1024)], relax.op.matmul))
    assert deal([8, 8, 16], HW)[:18] == [0, 1, 2, 3, 4, 5, 6, 7] * 2 + [0, 1]
    assert deal([8, 8, 16], HW)[128:130] == [8, 9]  # the second sample: the second cluster
    cycles, ddr = {}, {}
    for plan in (TilePlan((1, 16, 64), 256), TilePlan((1, 64, 64), 32)):
        lowered = lower_with_plan(func, plan)
        program = build_program(lowered, HW, "mm")
        ddr[plan] = [i for i in program.expanded().kernels[0].instructions
                     if isinstance(i, isa.Dma) and i.src.mem == "ddr" and i.dst.mem == "lb"]
        ddr_bytes = sum(ddr_effective_bytes(i.src, i.shape, HW) for i in ddr[plan])
        assert loads(lowered, HW) == (ddr_bytes, len(ddr[plan]), 0)
        cycles[plan] = timing_cycles(program)
    whole, chunked = cycles
    assert sum(i.shape == (256, 64) for i in ddr[whole]) == 8 * 8 * 16  # every tile's weights
    assert cycles[chunked] < cycles[whole] and lower_kernel(func, HW)[1] == chunked


def test_a_contraction_keeps_the_order_of_plans_that_loads_faster():
    """Both orders of candidate plans are tried; the lowered plan is the one ``load_cycles`` ranks
    first (a 1x1 conv with a long reduction: the reuse order's smaller chunk leaves room for
    tiles of more rows, so each weight tile serves more pixels)."""
    op = relax.op
    func = fused_kernel(lambda: relax_graph([(2, 1024, 14, 14), (256, 1024, 1, 1)],
                                            lambda x, w: op.nn.relu(op.nn.conv2d(x, w))))
    lowered, plan = lower_kernel(func, HW)
    info = anchor_info(func)
    cycles = {}
    for reuse in (False, True):
        f, p = _fitting(func, info, list(candidate_plans(info, HW.mme.rows, HW.mme.cols, reuse)), HW, None, True)
        cycles[p] = load_cycles(f, HW)
    assert len(cycles) == 2 and plan == min(cycles, key=cycles.get)


def test_weights_on_chip_keep_the_output_channels_whole_and_the_input_read_once(rng):
    """A 1 x 1 convolution 512 -> 128 at 28 x 28, as the first layer of a stitched kernel: its
    input from DDR, its weights from the GB (``on_chip``). The two default orders tile 32 output
    channels, so every input element is loaded four times; ``keep_n`` keeps the 128 channels
    whole, and ranked with the weights' bytes at the GBs' bandwidth it loads fewer cycles: it is
    lowered, each input element loaded once. Without ``on_chip`` the plan is the default one.
    The lowered kernel computes what llvm does."""
    op = relax.op
    func = fused_kernel(lambda: relax_graph([(2, 512, 28, 28), (128, 512, 1, 1)],
                                            lambda x, w: op.nn.relu(op.nn.conv2d(x, w))))
    info = anchor_info(func)
    n = info.roles.index("N")
    default, plan = lower_kernel(func, HW)
    lowered, kept = lower_kernel(func, HW, on_chip=frozenset({1}))
    assert plan.tiles[n] < 128 and kept.tiles[n] == 128
    cycles = {}
    for reuse, keep_n in ((False, False), (True, False), (True, True)):
        plans = list(candidate_plans(info, HW.mme.rows, HW.mme.cols, reuse, keep_n))
        f, p = _fitting(func, info, plans, HW, None, True)
        cycles[p] = load_cycles(f, HW, None, frozenset({1}))
    assert kept == min(cycles, key=cycles.get)

    def input_reads(low):  # elements of the input the tiles' boxes cover, over all tiles
        fp = footprints(Layer.of(low, HW, "k"))
        lo, hi = fp.reads[read_kernel(low).params[0][0]]
        return int(np.prod(hi - lo, axis=1).sum())
    elements = 2 * 512 * 28 * 28
    assert input_reads(lowered) == elements and input_reads(default) == 128 // plan.tiles[n] * elements
    args = random_args(func, rng)
    ref = run_llvm(func, args)
    out = simulate(build_program(lowered, HW, "k"), args[:-1]).outputs[0]
    np.testing.assert_allclose(out, ref, rtol=2e-2, atol=2e-2 * np.abs(ref).max())


def test_an_elementwise_layer_tiles_through_every_divisor_of_its_channels(rng):
    """DenseNet's batch norm + ReLU before a convolution, over 416 = 32 x 13 channels: halving
    its tile of channels goes 416, 208, 104, 52, 26, 13, and 13's own divisors leave one channel
    a tile, each with a load of every parameter. The tiles step through 416's divisors instead:
    the plan is the largest divisor whose tile fits the LB, and it computes what llvm does."""
    op = relax.op
    func = fused_kernel(lambda: relax_graph(
        [(2, 416, 28, 28)] + [(1, 416, 1, 1)] * 4,
        lambda x, m, s, g, b: op.nn.relu(op.add(op.multiply(op.divide(op.subtract(x, m), s), g), b))))
    lowered, plan = lower_kernel(func, HW)

    def fits(c):
        try:
            return plan_lb(read_kernel(lower_with_plan(func, TilePlan((1, c, 28, 28), None))), HW) is not None
        except CodegenError:
            return False
    largest = next(c for c in sorted((c for c in range(1, 417) if 416 % c == 0), reverse=True) if fits(c))
    assert largest > 1 and plan.tiles == (1, largest, 28, 28)
    args = random_args(func, rng)
    args[2] = np.abs(args[2]) + 0.5  # the divisor: a standard deviation
    ref = run_llvm(func, args)
    out = simulate(build_program(lowered, HW, "k"), args[:-1]).outputs[0]
    np.testing.assert_allclose(out, ref, rtol=2e-2, atol=2e-2 * np.abs(ref).max())


def test_a_prime_reduction_takes_rows_of_one_not_chunks_of_one(rng):
    """probs x V of an attention over 197 tokens (prime): a tile holds 197 rows or one, a chunk
    the whole reduction or one step. With one-deep chunks each step's column of probs is 197
    bursts and a transfer of its own; rows of one beside the whole reduction load contiguous
    rows. ``load_cycles`` ranks the two as the simulator does. (In tiles that divide, as a
    stitched kernel's layer is lowered: ``clamp=False``.)"""
    op = relax.op
    func = fused_kernel(lambda: relax_graph([(1, 2, 197, 197), (1, 2, 197, 64)], lambda p, v: op.matmul(p, v)))
    info = anchor_info(func)
    plans = {}
    for reuse in (False, True):
        candidates = list(candidate_plans(info, HW.mme.rows, HW.mme.cols, reuse, clamp=False))
        f, p = _fitting(func, info, candidates, HW, None, True)
        plans[p] = (load_cycles(f, HW), timing_cycles(build_program(f, HW, "k")))
    assert {p.chunk for p in plans} == {1, 197}
    rows, steps = sorted(plans, key=lambda p: -p.chunk)
    assert rows.tiles[2] == 1 and steps.tiles[2] == 197
    assert plans[rows][0] < plans[steps][0] and plans[rows][1] < plans[steps][1]
    lowered, plan = lower_kernel(func, HW, clamp=False)
    assert plan == rows
    args = random_args(func, rng)
    ref = run_llvm(func, args)
    out = simulate(build_program(lowered, HW, "k"), args[:-1]).outputs[0]
    np.testing.assert_allclose(out, ref, rtol=2e-2, atol=2e-2 * np.abs(ref).max())


def test_plans_ruled_out_by_the_working_set_floor_do_not_fit():
    """``working_set_floor`` never exceeds the bytes a lowered tile's buffers take, so skipping the
    plans above the LB by it (and galloping from the first below) picks the plan a scan picks:
    the first that fits."""
    op = relax.op
    func = fused_kernel(lambda: relax_graph([(2, 256, 14, 14), (128, 256, 3, 3)],
                                            lambda x, w: op.nn.relu(op.nn.conv2d(x, w, padding=1))))
    info = anchor_info(func)
    for reuse in (False, True):
        plans = list(candidate_plans(info, HW.mme.rows, HW.mme.cols, reuse))
        fits = []
        for p in plans:
            ir = read_kernel(lower_with_plan(func, p))
            single = sum(b.nbytes for b in plan_lb(ir, HW, 1 << 40).buffers.values())
            assert working_set_floor(info, p, HW.storage_bytes, HW.accum_bytes) <= single
            try:
                fits.append(plan_lb(ir, HW) is not None)
            except CodegenError:
                fits.append(False)
        assert any(fits) and not all(fits)
        _, chosen = _fitting(func, info, plans, HW, None, False)
        assert chosen == plans[fits.index(True)]


@pytest.mark.parametrize("kind", ["layer_norm", "softmax", "matmul"])
def test_a_too_big_tile_predicts_the_first_that_fits(kind, monkeypatch):
    """Over 197 rows (prime: clamped tiles of 20-40 ms each to lower), the search lowers three
    plans: the first within ``working_set_floor`` (too big), the one its bytes predict, shrunk
    with the boxes (the first that fits), and the one before that (too big: the answer is
    exact). It chooses what a scan of every plan chooses, with fewer lowerings than galloping."""
    op = relax.op
    shapes, body = {
        "layer_norm": ([(2, 197, 768), (768,), (768,)], lambda x, g, b: op.nn.layer_norm(x, g, b, axes=[-1])),
        "softmax": ([(2, 4, 197, 197)], lambda x: op.nn.softmax(x)),
        "matmul": ([(2, 197, 768), (768, 3072), (3072,)], lambda x, w, b: op.nn.gelu(op.add(op.matmul(x, w), b))),
    }[kind]
    func = fused_kernel(lambda: relax_graph(shapes, body))
    info = anchor_info(func)
    plans = list(candidate_plans(info, HW.mme.rows, HW.mme.cols, reuse=True))
    fits = []
    for p in plans:
        try:
            fits.append(plan_lb(read_kernel(lower_with_plan(func, p)), HW) is not None)
        except CodegenError:
            fits.append(False)
    first = fits.index(True)
    floor = next(i for i, p in enumerate(plans)
                 if working_set_floor(info, p, HW.storage_bytes, HW.accum_bytes) <= HW.lb_bytes)
    assert floor < first - 1
    galloped = set()
    assert _gallop(floor, len(plans), lambda i: galloped.add(i) or fits[i]) == first
    lowered = []
    monkeypatch.setattr(tiling, "lower_with_plan", lambda f, p: lowered.append(plans.index(p)) or lower_with_plan(f, p))
    _, chosen = _fitting(func, info, plans, HW, None, False)
    assert chosen == plans[first]
    assert sorted(lowered) == [floor, first - 1, first] and len(lowered) < len(galloped)


def test_an_epilogues_temporaries_share_lb_places_and_compute_exactly(rng):
    """matmul + bias + GELU: the seven buffers the tile computes take three places (``plan_lb``'s
    rule: in place where a vector stage computes one from another element for element, else the
    place of one whose use has ended); the three it loads keep their own. The bytes follow, and
    the shared places compute what llvm computes. (FuseTIR names two of the GELU's temporaries
    ``T_multiply``: they are two buffers, ``T_multiply#1`` the second, ``kernel.ir``.)"""
    op = relax.op
    func = fused_kernel(lambda: relax_graph([(64, 96), (96, 48), (48,)],
                                            lambda x, w, b: op.nn.gelu(op.add(op.matmul(x, w), b))))
    ir = read_kernel(lower_with_plan(func, TilePlan((64, 16), 32)))
    plan = plan_lb(ir, HW)
    writer = {st.dst.buffer: st for st in ir.stages() if st.dst.lb}
    loaded = {b for b, st in writer.items() if st.op == "dma"}
    computed = [b for b in plan.buffers if b not in loaded]
    place = {b: plan.buffers[b].slots for b in plan.buffers}
    assert len(loaded) == 3 and len(computed) == 7
    assert len({place[b] for b in loaded}) == 3 and not {place[b] for b in loaded} & {place[b] for b in computed}
    acc = next(b for b, st in writer.items() if st.op == "mme")
    bias_add = next(b for b, st in writer.items() if acc in [r.buffer for r in st.reads()])
    assert place[bias_add] == place[acc]  # in place: the accumulator plus the bias, element for element
    assert len({place[b] for b in computed}) == 3
    tile = 64 * 16 * 4  # a (64, 16) float32 tile: the accumulator's place and the GELU's
    # operand chunks, the bias (aligned), the two float32 places and the fp16 output staging
    single = 64 * 32 * 2 + 32 * 16 * 2 + 64 + 2 * tile + tile // 2
    assert plan.total_bytes == 2 * single  # double-buffered: it fits twice
    program = build_program(lower_with_plan(func, TilePlan((64, 16), 32)), HW, "gelu_epilogue")
    isa.validate(program)
    args = random_args(func, rng)
    ref = run_llvm(func, args)
    out = simulate(program, args[:-1]).outputs[0]
    np.testing.assert_allclose(out, ref, rtol=1e-2, atol=5e-3 * np.abs(ref).max())


@pytest.mark.parametrize("rows", [8, 64])
def test_whole_rows_keep_each_tile_to_whole_rows_of_the_output(rng, rows):
    """matmul + bias, (rows, 64) x (64, 64): for more tiles the default splits the output's 64
    columns by the PE array's 32; with ``whole_rows`` (for an output that overwrites its input row
    by row) every tile holds whole rows, and computes the same."""
    op = relax.op
    func = fused_kernel(lambda: relax_graph([(rows, 64), (64, 64), (64,)], lambda x, w, b: op.add(op.matmul(x, w), b)))
    args = random_args(func, rng)
    ref = run_llvm(func, args)
    for whole, columns in ((False, HW.mme.cols), (True, 64)):
        lowered, plan = lower_kernel(func, HW, whole_rows=whole)
        assert plan.tiles[-1] == columns
        out = simulate(build_program(lowered, HW, "linear"), args[:-1]).outputs[0]
        np.testing.assert_allclose(out, ref, rtol=1e-2, atol=5e-3 * np.abs(ref).max())


def test_overlap_takes_the_largest_divisor_of_the_chunk_whose_loads_fit_twice(rng):
    """ViT's fc2 on one sample: 197 rows (prime: tiled whole), bias and residual. The first plan
    that fits the LB has room for one copy of its chunk loads only, so every chunk's loads wait
    for the MME. ``overlap`` keeps its tiles and takes the largest divisor of the chunk (at least
    the PE array's rows) whose loads fit twice, as ``chunk_cycles`` finds it faster: the loads of
    a chunk at the core's share of the GB's bandwidth beside the product instead of before it. The
    result computes what llvm computes. (In tiles that divide, as a stitched kernel's layer is
    lowered: ``clamp=False``.)"""
    op = relax.op
    func = fused_kernel(lambda: relax_graph([(1, 197, 768), (768, 768), (768,), (1, 197, 768)],
                                            lambda x, w, b, r: op.add(op.add(op.matmul(x, w), b), r)))
    low, plan = lower_kernel(func, HW, clamp=False)
    assert plan.chunk is not None and not plan_lb(read_kernel(low), HW).double_buffered
    over, chosen = lower_kernel(func, HW, overlap=True, clamp=False)
    assert chosen.tiles == plan.tiles
    lb = plan_lb(read_kernel(over), HW)
    assert lb.double_buffered and lb.total_bytes <= HW.lb_bytes

    def fits_twice(chunk):
        return plan_lb(read_kernel(lower_with_plan(func, TilePlan(plan.tiles, chunk))), HW).double_buffered

    assert HW.mme.rows <= chosen.chunk < plan.chunk and plan.chunk % chosen.chunk == 0
    assert not any(fits_twice(c) for c in range(chosen.chunk + 1, plan.chunk) if plan.chunk % c == 0)
    # per chunk: an MME pass and two loads (rows of x, the weight tile), each with its set-up
    single, double = chunk_cycles(read_kernel(low), HW, False), chunk_cycles(read_kernel(over), HW, True)
    per_core = HW.gb_bytes_per_cycle / HW.cores_per_cluster
    loads = 2 * HW.dma_latency_cycles + (197 + 24) * chosen.chunk * 2 / per_core
    assert double >= 768 // chosen.chunk * loads and double < single
    args = random_args(func, rng)
    ref = run_llvm(func, args)
    out = simulate(build_program(over, HW, "fc2"), args[:-1]).outputs[0]
    np.testing.assert_allclose(out, ref, rtol=1e-2, atol=5e-3 * np.abs(ref).max())


def test_a_bare_contraction_writes_its_tile_back_once_after_the_chunk_loop(rng):
    """A matmul with nothing after it (DenseNet's 1x1 convolutions): its output's write-back sits
    after the chunk loop, not in it, so every output element goes to DDR once (not once per
    chunk, the partial sums of all but the last chunk overwritten), and the result is llvm's."""
    from tvm_dsa.kernel.ir import Loop

    op = relax.op
    func = fused_kernel(lambda: relax_graph([(64, 256), (256, 96)], lambda x, w: op.matmul(x, w)))
    plan = TilePlan((32, 32), 64)  # 6 tiles, 4 chunks each
    low = lower_with_plan(func, plan)
    body = read_kernel(low).tile_loops()[-1].body
    (chunk,) = [n for n in body if isinstance(n, Loop)]
    stores = [n for n in body if not isinstance(n, Loop) and n.op == "dma" and not n.dst.lb]
    assert chunk.extent == 4 and len(stores) == 1 and body.index(stores[0]) > body.index(chunk)
    assert not [st for st in chunk.body if st.op == "dma" and not st.dst.lb]
    program = build_program(low, HW, "bare_matmul")
    args = random_args(func, rng)
    ref = run_llvm(func, args)
    run = simulate(program, args[:-1])
    np.testing.assert_allclose(run.outputs[0], ref, rtol=1e-2, atol=5e-3 * np.abs(ref).max())
    assert run.report.ddr_write == 64 * 96 * 2  # the output once, in fp16


def test_caps_bound_every_plan_and_the_lowered_tiles():
    """``caps`` (a micro-batch's samples for the first loop, a SET partition's tiles) bound the
    leading loops' tiles in every candidate plan and the parallel plans after them: an add over
    (8, 64, 512) takes plans of the whole batch without them, none over 2 samples and 16 rows
    with ``caps=(2, 16)``, and lowers so."""
    hw = hardware.get("stcp920")
    op = relax.op
    func = fused_kernel(lambda: relax_graph([(8, 64, 512), (8, 64, 512)], lambda x, y: op.add(x, y)))
    info = anchor_info(func)
    assert max(p.tiles[0] for p in candidate_plans(info, hw.mme.rows, hw.mme.cols)) == 8
    assert max(p.tiles[1] for p in candidate_plans(info, hw.mme.rows, hw.mme.cols)) == 64
    capped = list(candidate_plans(info, hw.mme.rows, hw.mme.cols, caps=(2, 16)))
    assert capped and max(p.tiles[0] for p in capped) == 2 and max(p.tiles[1] for p in capped) == 16
    tiles = lower_kernel(func, hw, caps=(2, 16))[1].tiles
    assert tiles[0] <= 2 and tiles[1] <= 16

def _matmul_197():
    """(2, 197, 64) x (64, 96) + bias, ReLU: ViT's 197 tokens (prime) as M."""
    op = relax.op
    return fused_kernel(lambda: relax_graph([(2, 197, 64), (64, 96), (96,)],
                                            lambda x, w, b: op.nn.relu(op.add(op.matmul(x, w), b))))


def test_a_prime_extent_is_tiled_in_parts_that_overlap_at_the_end():
    """197 rows have no divisor but 1: the candidate tiles of the M loop are ⌈197 / k⌉ (99, 66,
    50, ...), and ``ClampTiles`` moves the last tile back to end at row 197 (origins 0, 66, 131
    for 66), so every tile has the one shape and no predicate is left. Tiles moved along N
    translate (their rounds can be copies), along the clamped M only where every tile moved
    moves as far (``moves``' ``at``: none reaches the clamped last tile)."""
    hw = hardware.get("stcp920")
    func = _matmul_197()
    info = anchor_info(func)
    assert smaller_tile(197, 197) == 99 and smaller_tile(197, 99) == 66
    assert smaller_tile(197, 99, halve=True) == 50 and smaller_tile(197, 50, halve=True) == 25
    # another anchor than a contraction (an add over 197 rows) halves its rows' tiles
    op = relax.op
    add = anchor_info(fused_kernel(lambda: relax_graph([(2, 197, 512), (2, 197, 512)], lambda x, y: op.add(x, y))))
    assert clampable(add, hw.mme.rows) == {1}
    assert {p.tiles[1] for p in candidate_plans(add, hw.mme.rows, hw.mme.cols)} == {197, 99, 50, 25, 13, 7, 4, 2, 1}
    assert clampable(info, hw.mme.rows) == {1}  # not the batch loop, not N
    tiles_m = {p.tiles[1] for p in candidate_plans(info, hw.mme.rows, hw.mme.cols)}
    assert {99, 66, 50} <= tiles_m and all(t == 197 or math.ceil(197 / math.ceil(197 / t)) == t for t in tiles_m)
    lowered = lower_with_plan(func, TilePlan((1, 66, 32), 32))
    passes = [TileForLB(TilePlan((1, 66, 32), 32)), AssignScopes(), LowerToDSA(), ClampTiles()]
    mod = tvm.IRModule({"main": func})
    for p in passes:
        mod = p(mod)
    assert plan_of(lowered) == TilePlan((1, 66, 32), 32)  # which the chain records, the passes do not
    tvm.ir.assert_structural_equal(mod["main"], lowered.without_attr(PLAN_ATTR))  # the passes, one at a time, give the same
    predicates = []
    tvm_ffi.structural_walk(lowered.body, [(tvm.s_tir.stmt.SBlockRealize, lambda r: predicates.append(r.predicate))])
    assert all(isinstance(p, tvm.tirx.IntImm) and p.value for p in predicates)
    ir = read_kernel(lowered)
    m_slot = ir.tile_loops()[1].slot
    assert ir.clamped == {m_slot} and [lp.extent for lp in ir.tile_loops()] == [2, 3, 3]
    lo, hi = footprints(Layer.of(lowered, hw, "m")).write
    rows = sorted({(int(a[1]), int(b[1])) for a, b in zip(lo, hi)})
    assert rows == [(0, 66), (66, 132), (131, 197)]  # [low, high) of each tile's rows
    assert ir.moves({ir.tile_loops()[2].slot: 1}) is not None and ir.moves({m_slot: 1}) is None
    # tiles that all have one M value move along M by the difference of their origins: 66 from
    # tile 0 to 1, 65 from 1 to the clamped 2 (origin 197 - 66)
    out, x = ir.params[-1][0], ir.params[0][0]
    assert ir.bent == {m_slot}
    for start, rows in ((0, 66), (1, 197 - 66 - 66)):
        moved = ir.moves({m_slot: 1}, (((m_slot, start),),))
        assert moved[out] == moved[x] == (0, rows, 0)
    assert ir.moves({m_slot: 1}, (((m_slot, 0),), ((m_slot, 1),))) is None  # tiles 0, 1 would move 66, 65
    # tiles of 25 rows (origins 0, 25, ..., 150, then 172): two tiles on, the first four move
    # by 50 rows alike; with the fifth and sixth, the sixth moves into the last by 47
    ir25 = read_kernel(lower_with_plan(func, TilePlan((1, 25, 32), 32)))
    m25 = ir25.tile_loops()[1].slot
    assert ir25.tile_loops()[1].extent == math.ceil(197 / 25)
    assert ir25.moves({m25: 2}, tuple(((m25, m),) for m in range(4)))[out] == (0, 50, 0)
    assert ir25.moves({m25: 2}, tuple(((m25, m),) for m in range(6))) is None


def test_chunks_move_along_the_reduction_past_the_pass_that_folds_the_zero_init():
    """A matmul's chunk loop (x: 2 x 64 x 128, w: 128 x 96, chunks of 32): its first pass
    overwrites the accumulator (the zero fill folded in), so chunks moved along the loop are not
    the same chunks moved — unless none of them is the first (``moves``' ``nonzero``, what
    ``Compressor.chunks`` copies): then x's boxes move by the chunk along its last dim,
    w's along its first, and the output not at all."""
    op = relax.op
    func = fused_kernel(lambda: relax_graph([(2, 64, 128), (128, 96)], lambda x, w: op.matmul(x, w)))
    ir = read_kernel(lower_with_plan(func, TilePlan((1, 32, 32), 32)))
    (chunks,) = chunk_loops(ir)
    assert chunks.extent == 128 // 32
    assert [s.overwrite for s in ir.stages() if s.op == "mme"] == [(chunks.slot,)]
    assert ir.moves({chunks.slot: 1}) is None
    x, w, out = (name for name, *_ in ir.params)
    for d in (1, 2):
        moved = ir.moves({chunks.slot: d}, (), frozenset({chunks.slot}))
        assert (moved[x], moved[w], moved[out]) == ((0, 0, 32 * d), (32 * d, 0), (0, 0, 0))


def test_overlapping_tiles_compute_what_numpy_does(rng):
    """The rows two tiles share are written twice with the same values, the second write
    ordered after the first (every dependency checked), for the default plan and a hand-picked
    one."""
    hw = hardware.get("stcp920")
    func = _matmul_197()
    x = rng.standard_normal((2, 197, 64)).astype("float32")
    w = (rng.standard_normal((64, 96)) / 8).astype("float32")
    b = rng.standard_normal(96).astype("float32")
    ref = np.maximum(x @ w + b, 0)
    lowered, plan = lower_kernel(func, hw)
    assert 197 % plan.tiles[1]
    for low in (lowered, lower_with_plan(func, TilePlan((1, 66, 32), 32))):
        out = simulate(build_program(low, hw, "m"), [x, w, b], mode="functional").outputs[0]
        assert np.abs(out - ref).max() / np.abs(ref).max() < 2e-3


def test_a_vit_sized_matmul_is_faster_in_overlapping_tiles():
    """ViT's projection (197 x 768 x 768, batch 2): its M tile was 197 whole, which left room for
    24 output columns (the input loaded again for every 24); in overlapping tiles of fewer rows
    the default plan takes fewer cycles."""
    hw = hardware.get("stcp920")
    op = relax.op
    func = fused_kernel(lambda: relax_graph([(2, 197, 768), (768, 768), (768,)],
                                            lambda x, w, b: op.nn.relu(op.add(op.matmul(x, w), b))))
    lowered, plan = lower_kernel(func, hw)
    whole = lower_with_plan(func, TilePlan((1, 197, 24), 32))
    assert 197 % plan.tiles[1] and plan.tiles[2] > 24
    assert timing_cycles(build_program(lowered, hw, "m")) < timing_cycles(build_program(whole, hw, "m"))


def test_a_partition_gives_each_core_one_tile_of_its_parts():
    """A 256 x 256 product over 64 in 4 x 2 parts on 8 cores (set-edge16-fp16, a 32 x 32 array,
    16 elements per cycle over a link): of the tilings into at most twice each role's parts,
    64-row by 128-column tiles, one per core, take max(MME 64*64*128/1024 = 512, loads
    (64 + 128) * 64 / 16 = 768) cycles, as do 128 x 64 tiles (the inner loop split less wins);
    32 x 256 tiles load 1,152; 16 tiles of 64 x 64 take two rounds of 512."""
    hw = hardware.get("set-edge16-fp16")
    func = fused_kernel(lambda: relax_graph([(256, 64), (64, 256)], relax.op.matmul))
    info = anchor_info(func)
    assert info.roles == ("M", "N") and info.reduction == (64,)
    assert tiling._part_tiles(info, {"M": 4, "N": 2}, 8, hw) == (64, 128)
    lowered, plan = tiling.lower_in_parts(func, hw, None, {"M": 4, "N": 2}, 8)
    assert plan.tiles == (64, 128) and plan.chunk == 64
    assert len(footprints(Layer.of(lowered, hw, "k")).tiles) == 8


def test_a_partition_keeps_tiles_that_divide_a_reshape():
    """A loop whose index sits inside a reshape's division by 16 takes tiles dividing 16 even
    when the partition asks for it whole (ViT's head split, on one core of a SET group)."""
    from tvm_dsa.tir_passes.tile import AnchorInfo
    from tvm_dsa.kernel.analysis import StageKind
    info = AnchorInfo("T_reshape", StageKind("copy", ""), (2, 17, 64), (), ("", "", ""), (1, 1, 16))
    assert tiling._part_tiles(info, {"": 1}, 1, hardware.get("set-edge16-fp16")) == (2, 17, 16)


def test_timed_plans_load_during_the_product_and_compute_exactly(rng):
    """A 1 x 1 convolution 256 -> 512 at 28 x 28 (batch 2, ReLU over a bias) from the GB: the
    search's first fitting plan takes the whole reduction in one chunk, which leaves no room for
    a second copy of its loads, so each tile loads, then multiplies. ``lower_timed`` keeps a plan
    whose loads are double-buffered because it runs faster in place (``timed_cycles``), no
    coarser along the batch than the search's, and the program computes what llvm does."""
    hw = hardware.get("stcp920")
    op = relax.op
    func = fused_kernel(lambda: relax_graph([(2, 256, 28, 28), (512, 256, 1, 1), (1, 512, 1, 1)],
                                            lambda x, w, b: op.nn.relu(op.add(op.nn.conv2d(x, w), b))))
    gb = frozenset({0, 1, 2})
    base = lower_kernel(func, hw)[0]
    timed = tiling.lower_timed(func, hw, None, gb, base)
    first, chosen = read_kernel(base), read_kernel(timed)
    assert not plan_lb(first, hw).double_buffered and plan_lb(chosen, hw).double_buffered
    assert tiling.timed_cycles(timed, hw, None, gb) < tiling.timed_cycles(base, hw, None, gb)
    assert chosen.tile_loops()[0].extent >= first.tile_loops()[0].extent
    args = random_args(func, rng)
    ref = run_llvm(func, args)
    run = simulate(build_program(timed, hw, "timed_conv"), args[:-1])
    np.testing.assert_allclose(run.outputs[0], ref, rtol=1e-2, atol=5e-3 * np.abs(ref).max())


def test_plans_of_a_layer_whose_rows_are_split_over_the_clusters_are_timed_with_a_clusters_tiles():
    """Conformer's second feed-forward matmul at batch 1 (128 tokens x 1024 -> 256, the weight in
    the GB), capped at a cluster's 32 tokens: timed as if one cluster ran all its tiles, tiles of
    32 x 128 (eight, one a core) win; but the four clusters share them out, two a cluster, and six
    of its cores idle. Timed with a cluster's share (``spread``), a plan of more tiles wins, and
    it runs in fewer cycles on a cluster's share than the other (each timed so)."""
    hw = hardware.get("stcp920")
    op = relax.op
    func = fused_kernel(lambda: relax_graph([(1, 128, 1024), (1024, 256)], lambda x, w: op.matmul(x, w)))
    gb, caps = frozenset({1}), (1, 32)
    base = lower_kernel(func, hw, caps=caps)[0]
    alone, shared = (tiling.lower_timed(func, hw, None, gb, base, caps, spread=s) for s in (1, hw.clusters))

    def tiles(low):
        return math.prod(lp.extent for lp in read_kernel(low).tile_loops())

    assert tiles(alone) // hw.clusters < hw.cores_per_cluster <= tiles(alone)
    assert tiles(shared) > tiles(alone)
    assert tiling.timed_cycles(shared, hw, None, gb, hw.clusters) < tiling.timed_cycles(alone, hw, None, gb, hw.clusters)


def test_a_pooling_from_the_gb_takes_tiles_whose_loads_fit_twice(rng):
    """ResNet-50's max pooling (3 x 3, stride 2) at batch 2 from the GB: the search's largest tile
    (a channel's whole map) leaves no room for the next tile's loads beside it, so each tile
    loads, then pools. ``lower_timed`` keeps the largest tiles that fit half the LB (two copies of
    every buffer) because they run faster in place (``timed_cycles``), and the program computes
    what llvm does."""
    hw = hardware.get("stcp920")
    op = relax.op
    func = fused_kernel(lambda: relax_graph([(2, 64, 112, 112)],
                                            lambda x: op.nn.max_pool2d(x, (3, 3), (2, 2), padding=(1, 1, 1, 1))))
    gb = frozenset({0})
    base = lower_kernel(func, hw)[0]
    timed = tiling.lower_timed(func, hw, None, gb, base)
    first, chosen = plan_lb(read_kernel(base), hw), plan_lb(read_kernel(timed), hw)
    assert not first.double_buffered and {len(b.slots) for b in chosen.buffers.values()} == {2}
    assert chosen.total_bytes <= hw.lb_bytes < 2 * first.total_bytes
    assert tiling.timed_cycles(timed, hw, None, gb) < tiling.timed_cycles(base, hw, None, gb)
    args = random_args(func, rng)
    run = simulate(build_program(timed, hw, "timed_pool"), args[:-1])
    np.testing.assert_allclose(run.outputs[0], run_llvm(func, args), rtol=1e-2, atol=1e-2)


def test_a_square_computes_its_operand_once(rng):
    """A layer norm's variance sums ``(x - mean) * (x - mean)``: the product reads one temporary
    twice, so a tile runs one ``sub`` for it, not two. Per tile, the vector instructions are the
    ops of its stages' value trees with an op's identical operands counted once; the kernel
    computes what llvm does."""
    from tvm_dsa.kernel.ir import Op

    hw = hardware.get("stcp920")
    op = relax.op
    func = fused_kernel(lambda: relax_graph([(2, 64, 256), (256,), (256,)],
                                            lambda x, g, b: op.nn.layer_norm(x, g, b, axes=[-1])))
    low = lower_kernel(func, hw)[0]
    kernel = read_kernel(low)

    def ops(v, name):  # the ``name`` ops an emission of ``v`` runs, a repeated operand once
        if not isinstance(v, Op):
            return 0
        return (v.name == name) + sum(ops(k, name) for k in dict.fromkeys(v.kids))

    subs = sum(ops(st.value, "sub") for st in kernel.stages() if st.op in ("vector", "reduce"))
    assert subs == 2  # the variance's (one, read twice) and the output's
    program = build_program(low, hw, "layer_norm")
    ins = program.expanded().kernels[0].instructions
    tiles = math.prod(lp.extent for lp in kernel.tile_loops())
    assert sum(isinstance(y, isa.Vector) and y.op == "sub" for y in ins) == subs * tiles
    assert any(isinstance(y, isa.Vector) and y.op == "mul" and y.srcs[0] == y.srcs[1] for y in ins)
    args = random_args(func, rng)
    np.testing.assert_allclose(simulate(program, args[:-1]).outputs[0], run_llvm(func, args), rtol=1e-2, atol=1e-2)


def test_timed_cycles_scale_the_first_tiles_to_all():
    """``timed_cycles`` runs the first ``TIMED_TILES`` tiles on one cluster's cores with the
    inputs named and the output in the GB: a layer with no more tiles is timed whole, exactly
    the program of all its tiles so placed, less the kernel's launch (a stitched kernel pays it
    once, not per layer or tile)."""
    hw = hardware.get("stcp920")
    func = conv_bias_relu()
    low = lower_kernel(func, hw)[0]
    tiles = math.prod(lp.extent for lp in read_kernel(low).tile_loops())
    assert tiles <= tiling.TIMED_TILES
    whole = build_program(low, hw, "whole", cores=tuple(range(hw.cores_per_cluster)), gb=frozenset({0, 1, 2, 3}))
    assert not whole.args  # every tensor in the GB, none passed in through DDR
    assert tiling.timed_cycles(low, hw, None, frozenset({0, 1, 2})) == timing_cycles(whole) - hw.kernel_launch_cycles


def test_loads_from_the_gb_are_multicast_but_in_layers_whose_tiles_overlap():
    """On stcp920 (``multicast_dma``) a layer's loads from the GB are multicast DMAs, the cores'
    n-th loads of one box one transfer; a layer whose tiles overlap (ViT's 197 rows, clamped)
    loads them plainly, and so does a chip without the field."""
    hw = hardware.get("stcp920")

    def flags(func, chip):
        low = lower_kernel(func, chip)[0]
        program = build_program(low, chip, "k", cores=tuple(range(chip.cores_per_cluster)), gb=frozenset({0, 1, 2}))
        return {ins.multicast for ins in program.kernels[0].instructions if isinstance(ins, isa.Dma)
                and ins.src.mem == "gb"}

    plain = conv_bias_relu()
    assert flags(plain, hw) == {True}
    assert flags(plain, dataclasses.replace(hw, multicast_dma=False)) == {False}
    clamped = _matmul_197()
    assert read_kernel(lower_kernel(clamped, hw)[0]).clamped and flags(clamped, hw) == {False}


def test_a_tile_spread_over_many_cores_steps_through_the_whole_tiles_divisors():
    """A concatenation of 256 + 320 + 128 + 128 channels at 7 x 7 (GoogLeNet's inception output)
    on set-cloud144 (144 cores): the largest channel tile that gives every core a tile divides 832
    and leaves at least 144 tiles, 4 channels. Stepping through the divisors of the current tile
    instead (... 26, 13, 1) gave one-channel tiles, 832 DMAs."""
    mod = relax.transform.LegalizeOps()(relax_graph([(1, c, 7, 7) for c in (256, 320, 128, 128)],
                                                    lambda *x: relax.op.concat(x, axis=1)))
    (func,) = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    hw = hardware.get("set-cloud144")
    channels = max(t for t in range(1, 833) if 832 % t == 0 and 832 // t >= hw.cores)
    assert channels == 4 and lower_kernel(func, hw)[1].tiles == (1, channels, 7, 7)


def test_a_product_only_a_sum_reads_is_inlined_into_it_and_one_a_reduction_reads_is_not(rng):
    """x * s + t fuses into two blocks; ``inline_products`` leaves one, whose stage is one ``mac``
    (values as llvm's). A sum of squares (a reduction reading x * x) keeps its product block: the
    tiling places stages under a reduction's tile loop only as separate blocks."""
    op = relax.op
    affine = fused_kernel(lambda: relax_graph([(8, 64), (64,), (64,)], lambda x, s, t: op.add(op.multiply(x, s), t)))
    inlined = inline_products(affine)
    assert len(_block_names(affine)) == 2 and len(_block_names(inlined)) == 1
    hw = hardware.get("stcp920")
    lowered, _ = lower_kernel(inlined, hw)
    program = build_program(lowered, hw, "affine")
    ops = {i.op for k in program.kernels for i in k.instructions if type(i) is isa.Vector}
    assert ops == {"mac"}
    args = random_args(inlined, rng)
    np.testing.assert_allclose(simulate(program, args[:-1]).outputs[0], run_llvm(affine, args), rtol=1e-2, atol=1e-2)
    squares = fused_kernel(lambda: relax_graph([(8, 64)], lambda x: op.sum(op.multiply(x, x), axis=1)))
    assert _block_names(inline_products(squares)) == _block_names(squares)


def _block_names(func) -> list[str]:
    names = []
    tvm_ffi.structural_walk(func.body, [(tvm.s_tir.SBlock, lambda b: names.append(b.name_hint))])
    return [n for n in names if n != "root"]
