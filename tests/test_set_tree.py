"""SET (seed 002 §3): layer graph, resource allocation tree, tile allocation, tree analysis and
the fast evaluator, on hand-built graphs whose expected figures the tests derive."""

import dataclasses
import itertools
import random

import numpy as np
import pytest

import tvm_dsa  # noqa: F401  (registers the presets)
from tvm_dsa import hardware
from tvm_dsa.models import TINY, get_model, macs
from tvm_dsa.runtime.cost import mme_cycles, vector_cycles
from tvm_dsa.schedule.set import (Contraction, Cut, Evaluator, Layer, LayerGraph, LayerGraphError, Leaf,
                                  Tree, TreeError, dependencies, initial_tree, validate)
from tvm_dsa.schedule.set.alloc import allocate, imbalance, stripe_order
from tvm_dsa.schedule.set.analysis import allocate_groups, npt
from tvm_dsa.schedule.set.evaluate import layout_share
from tvm_dsa.schedule.set.ops import random_tree
from tvm_dsa.harness import layer_graph

EDGE = hardware.get("set-edge16")


def conv(name, m=256, n=64, k=64, **kw) -> Layer:
    """An MME layer per sample: m x n outputs over k, ifmap m*k/4 (a 1x1-ish conv), weights n*k."""
    return Layer(name, m * n * k, m * n, kw.pop("ifmap", m * k // 4), n * k, m * n, Contraction(1, m, n, k), **kw)


def chain(length: int, **kw) -> LayerGraph:
    layers = [conv(f"l{i}", dram_in=(256 * 16 if i == 0 else 0), output=(i == length - 1), **kw)
              for i in range(length)]
    return LayerGraph.build(layers, [(i, i + 1) for i in range(length - 1)])


def fig3_graph() -> LayerGraph:
    """The patent's Fig. 3 topology: l1 -> l2, l1 -> l4, l3 -> l4 (l3 reads the graph input)."""
    layers = [conv("l1", dram_in=4096), conv("l2"), conv("l3", dram_in=4096), conv("l4", output=True)]
    return LayerGraph.build(layers, [(0, 1), (0, 3), (2, 3)])


def fig3_tree(batch=4) -> Tree:
    # T1( S1( T2( l1 l2 ) l3 ) l4 ), batch 4: S1 splits 4 into 2 sub-batches, T2 into 2 more
    return Tree(Cut("T", 1, (Cut("S", 2, (Cut("T", 2, (Leaf(0), Leaf(1))), Leaf(2))), Leaf(3))), batch)


# -- layer graph --------------------------------------------------------------------------------
def test_layer_graph_rejects_bad_input():
    with pytest.raises(LayerGraphError, match="goes backwards"):
        LayerGraph.build([conv("a"), conv("b")], [(1, 0)])
    with pytest.raises(LayerGraphError, match="duplicate layer names"):
        LayerGraph.build([conv("a"), conv("a")], [])
    with pytest.raises(LayerGraphError, match="cannot be written"):
        LayerGraph.build([conv("T4/2")], [])


def test_layer_graph_from_tiny_resnet50_counts_the_models_macs():
    model = get_model("resnet50", **TINY["resnet50"])
    g = layer_graph(model)
    assert sum(layer.macs for layer in g.layers) == macs(model)
    assert all(g.preds[i] or g.layers[i].dram_in for i in range(len(g)))  # every layer reads something
    assert sum(layer.output for layer in g.layers) == 1
    first = g.layers[0]  # the stem conv: 3x3? contraction k = 3 * kh * kw, n = output channels
    assert first.contraction.m * first.contraction.n * first.contraction.k == first.macs
    assert first.window == (3, 32, 32, 16, 16, 7, 7)  # the 7 x 7 stride-2 stem on the 32 x 32 image
    windows = [lay for lay in g.layers if lay.window]
    assert len(windows) >= 3  # the stem and the 3 x 3 convolutions; 1 x 1 ones read their pixels alone
    for lay in windows:
        c, h, w, oh, ow, kh, kw = lay.window
        assert (c * h * w, oh * ow, c * kh * kw) == (lay.ifmap, lay.contraction.m, lay.contraction.k)


def test_a_convolutions_blocks_read_overlapping_windows():
    """Blocks of a 3 x 3 stride-1 convolution's output rows read the rows their kernels cover:
    whole samples read the input once; 4 blocks of 2 rows read 4 rows each; 16 blocks of half a
    row read 3 rows of the 6 columns their 4 pixels' kernels cover."""
    lay = conv("c", m=64, n=8, k=18, ifmap=128, window=(2, 8, 8, 8, 8, 3, 3))
    assert lay.window_reads(1, 3) == 3 * 128
    assert lay.window_reads(4, 1) == 4 * 2 * 4 * 8
    assert lay.window_reads(16, 1) == 16 * 2 * 3 * 6
    assert conv("d").window_reads(4, 1) == 0  # no window
    stem = conv("s", m=16 * 16, n=8, k=3 * 49, ifmap=3 * 32 * 32, window=(3, 32, 32, 16, 16, 7, 7))
    assert stem.window_reads(8, 1) == 8 * 3 * (1 * 2 + 7) * 32  # 2 output rows of stride 2: 9 rows


def test_a_convolution_split_by_rows_reads_its_windows_from_dram():
    """A convolution reading the graph input, alone on the chip: DRAM moves what its parts' windows
    read (``LayerCost.halo`` times the input), its weights and its output."""
    stem = conv("s", m=64 * 64, n=64, k=3 * 49, ifmap=3 * 128 * 128, window=(3, 128, 128, 64, 64, 7, 7),
                dram_in=3 * 128 * 128, output=True)
    g = LayerGraph.build([stem], [])
    ev = Evaluator(g, EDGE)
    cost = ev.intra.cost(0, 16, 1)
    pb, pm, pn = cost.partition
    assert pm > 1 and cost.halo > 1
    assert cost.halo == pytest.approx(stem.window_reads(pm, 1) / stem.ifmap)
    assert cost.ifmap_in == -(-stem.window_reads(pm, 1) // (pm * pb)) * cost.tiles
    e = ev.evaluate(initial_tree(g, 1))
    assert e.dram_bytes == pytest.approx((stem.window_reads(pm, 1) + stem.weights + stem.ofmap) * EDGE.storage_bytes)


# -- tree: validity, text, JSON, dependencies ----------------------------------------------------
def test_text_and_json_round_trip():
    g = fig3_graph()
    tree = fig3_tree()
    assert tree.text(g) == "T4/1( S4/2( T2/2( l1 l2 ) l3 ) l4 )"
    assert Tree.parse(tree.text(g), g) == tree
    assert Tree.from_json(tree.to_json(g), g) == tree
    rng = random.Random(1)
    for _ in range(20):
        t = random_tree(chain(7), rng.choice([1, 4, 6, 8]), 16, rng)
        assert Tree.parse(t.text(chain(7)), chain(7)) == t
        assert Tree.from_json(t.to_json(chain(7)), chain(7)) == t


@pytest.mark.parametrize("text, message", [
    ("T4/1( S2/2( l1 l2 ) l3 l4 )", "has batch 2 but its parent gives it 4"),
    ("T4/3( l1 l2 l3 l4 )", "not a multiple of its sub-batch count 3"),
    ("T4/1( l1 l2 l3 l9 )", "no layer named 'l9'"),
    ("T4/1( l1 l2 l3 l4", "not closed"),
    ("l1", "the root must be a cut"),
])
def test_parse_errors(text, message):
    with pytest.raises((TreeError, LayerGraphError), match=message):
        Tree.parse(text, fig3_graph())


@pytest.mark.parametrize("tree, message", [
    (Tree(Cut("T", 1, (Leaf(0), Leaf(3), Leaf(1), Leaf(2))), 1), r"l4 \(leaf 1\) needs l3 \(leaf 3\)"),
    (Tree(Cut("T", 1, (Leaf(0), Leaf(1), Leaf(3))), 1), r"missing \['l3'\]"),
    (Tree(Cut("T", 1, (Leaf(0), Leaf(1), Leaf(2), Leaf(2), Leaf(3))), 1), r"repeated \['l3'\]"),
    (Tree(Cut("T", 3, (Leaf(0), Leaf(1), Leaf(2), Leaf(3))), 4), "batch 4 is not a multiple"),
    (Tree(Cut("T", 1, (Cut("S", 1, (Leaf(0),)), Leaf(1), Leaf(2), Leaf(3))), 1), "needs two or more"),
    (Tree(Cut("S", 1, (Leaf(0), Leaf(1), Leaf(2), Leaf(3))), 1), "needs 4 tiles .* the chip has 3"),
])
def test_validate_names_the_broken_rule(tree, message):
    with pytest.raises(TreeError, match=message):
        validate(tree, fig3_graph(), 3)


def test_dependencies_original_and_derived_as_in_fig3():
    g = fig3_graph()
    deps = {(d.src, d.dst): d.original for d in dependencies(fig3_tree(), g)}
    t2, l1, l2, l3, l4 = (0, 0), (0, 0, 0), (0, 0, 1), (0, 1), (1,)
    assert deps[(l1, l2)] is True and deps[(l1, l4)] is True and deps[(l3, l4)] is True
    assert deps[(t2, l4)] is False  # derived from l1 -> l4
    assert (t2, l3) not in deps  # neither l1 nor l2 feeds l3
    assert deps[((0,), l4)] is False  # S1 -> l4


# -- tile allocation and ids ---------------------------------------------------------------------
def test_allocation_is_optimal_against_brute_force():
    rng = random.Random(0)
    for _ in range(300):
        k = rng.randint(1, 4)
        npts = [rng.choice([0, rng.uniform(0.1, 10), rng.randint(1, 5)]) for _ in range(k)]
        mins = [rng.randint(1, 2) for _ in range(k)]
        tiles = rng.randint(sum(mins), 9)
        x = allocate(npts, mins, tiles)
        assert sum(x) == tiles and all(a >= m for a, m in zip(x, mins))
        best = min(imbalance(npts, list(c)) for c in itertools.product(*(range(m, tiles + 1) for m in mins))
                   if sum(c) == tiles)
        assert imbalance(npts, x) == pytest.approx(best)


def test_allocation_is_proportional_when_it_can_be():
    assert allocate([1.0, 3.0], [1, 1], 8) == [2, 6]
    assert allocate([5.0, 5.0, 10.0], [1, 1, 1], 16) == [4, 4, 8]
    with pytest.raises(ValueError, match="need 3 tiles, the group has 2"):
        allocate([1, 1, 1], [1, 1, 1], 2)


def test_stripe_ids_snake_through_the_mesh():
    order = stripe_order(4, 4)
    assert order[:5] == [(0, 0), (1, 0), (2, 0), (3, 0), (3, 1)]  # bottom row left to right, then up
    assert sorted(order) == sorted(itertools.product(range(4), range(4)))
    assert all(abs(a[0] - b[0]) + abs(a[1] - b[1]) == 1 for a, b in zip(order, order[1:]))


def test_s_cut_groups_are_proportional_to_npt_and_t_cut_children_share():
    g = LayerGraph.build([conv("a", n=64), conv("b", n=192), conv("c", n=64)], [])
    tree = Tree(Cut("S", 1, (Leaf(0), Cut("T", 1, (Leaf(1), Leaf(2))))), 1)
    ev = Evaluator(g, EDGE)
    one = [npt(Leaf(i), g, ev.intra) for i in range(3)]
    # one sample on one tile, in one round: the product, then its epilogue (one op per output)
    assert one == [mme_cycles(1, 256, n, 64, EDGE) + vector_cycles(256 * n, "vme", EDGE) for n in (64, 192, 64)]
    t_cut = one[1] + one[2]
    imbalance = lambda x: max(one[0] / x, t_cut / (16 - x))  # noqa: E731
    groups = allocate_groups(tree, g, ev.intra, 16)
    x = groups[(0,)][1]
    assert groups[(0,)] == (0, x) and groups[(1,)] == (x, 16)
    assert imbalance(x) == min(map(imbalance, range(1, 16)))  # brute force (TENET's cycles tie at 3 and 4)
    assert groups[(1, 0)] == groups[(1, 1)] == (4, 16)


# -- dataflow (§3.3.1) and the evaluator ---------------------------------------------------------
def test_dataflow_root_children_use_dram_and_pipelines_use_the_noc():
    g = fig3_graph()
    sched = Evaluator(g, EDGE).schedule(fig3_tree())
    via = {}
    for c in sched.chunks:
        via.setdefault((c.src, c.dst), set()).add(c.noc)
    assert via[(0, 1)] == {1.0}  # l1 -> l2 under T2: consumed at once
    assert via[(0, 3)] == via[(2, 3)] == {0.0}  # into l4: another child of the root T-cut
    plans = sched.leaves
    assert [p.batch for p in plans] == [1, 1, 2, 4] and [p.invocations for p in plans] == [4, 4, 2, 1]


def test_dataflow_chunk_not_consumed_at_once_goes_through_dram():
    # a -> c, b -> c: c takes the whole batch after a and b ran twice; a's first chunk waits
    g = LayerGraph.build([conv("a", dram_in=64), conv("b", dram_in=64), conv("c", output=True)], [(0, 2), (1, 2)])
    tree = Tree(Cut("T", 1, (Cut("T", 1, (Cut("T", 2, (Leaf(0), Leaf(1))), Leaf(2))),)), 2)
    chunks = {(c.src, c.p): c.noc for c in Evaluator(g, EDGE).schedule(tree).chunks}
    assert chunks == {(0, 0): 0.0, (0, 1): 1.0, (1, 0): 0.0, (1, 1): 1.0}


def _xy_links(src, dst) -> set:
    """The directed links of the XY route from ``src`` to ``dst`` ((x, y) routers), one by one."""
    (sx, sy), (dx, dy) = src, dst
    sx_step, sy_step = (1 if dx > sx else -1), (1 if dy > sy else -1)
    return ({((x, sy), (x + sx_step, sy)) for x in range(sx, dx, sx_step)}
            | {((dx, y), (dx, y + sy_step)) for y in range(sy, dy, sy_step)})


@pytest.mark.parametrize("preset", ["set-edge16", "set-cloud144"])
def test_multicast_trees_against_the_union_of_xy_routes(preset):
    """Mesh.multicast / from_dram against trees built link by link: a datum crosses each link of
    the union of its XY routes once; a single destination is the plain XY route."""
    hw = hardware.get(preset)
    mesh = Evaluator(chain(1), hw).mesh
    w, h = hw.mesh
    xy = stripe_order(w, h)
    ports = [p for p in itertools.product(range(w), range(h)) if p[0] in (0, w - 1) or p[1] in (0, h - 1)]
    rng = random.Random(1)
    for _ in range(12):
        a = rng.randrange(hw.cores)
        src = (a, rng.randrange(a + 1, hw.cores + 1))
        lo = rng.randrange(hw.cores)
        room = hw.cores - lo
        sets = tuple(tuple(sorted(rng.sample(range(room), min(room, rng.randrange(1, 6)))))
                     for _ in range(rng.randrange(1, 5)))
        share = np.array([[rng.random() for _ in sets] for _ in range(*src)])
        share /= share.sum()
        load: dict = {}
        links = 0.0
        for i, s in enumerate(range(*src)):
            for j, tiles in enumerate(sets):
                tree = set().union(*(_xy_links(xy[s], xy[lo + t]) for t in tiles))
                links += share[i, j] * len(tree)
                for link in tree:
                    load[link] = load.get(link, 0) + share[i, j]
        assert mesh.multicast(src, lo, sets, share) == pytest.approx((links, max(load.values(), default=0.0)))
        from_dram = [1 + min(len(set().union(*(_xy_links(p, xy[lo + t]) for t in tiles))) for p in ports)
                     for tiles in sets]
        assert mesh.from_dram(lo, sets) == pytest.approx(sum(from_dram) / len(sets))
        # one tile's own data: the hop off the mesh and the way to the nearest border router
        near = [1 + min(x, w - 1 - x, y, h - 1 - y) for x, y in xy[lo:]]
        assert mesh.edge_hops(lo, hw.cores) == pytest.approx(sum(near) / room)
    # a broadcast to the whole mesh: the port's link and a spanning tree, one link per tile
    assert mesh.from_dram(0, (tuple(range(hw.cores)),)) == hw.cores


def test_layout_share_sends_each_block_where_it_is_needed():
    # the same 4 row blocks on both sides: each tile keeps its own block
    assert np.array_equal(layout_share((1, 4, 1), (0, 1, 1), (1, 4, 1), (0, 1, 1)), np.eye(4) / 4)
    # a producer of 2 samples in 2 row blocks x 3 column blocks, a consumer of its second sample in
    # 2 row blocks: the second row block's 3 tiles hold all of it, each a third of each consumer block
    share = layout_share((1, 2, 3), (1, 2, 2), (1, 2, 1), (0, 1, 1))
    assert np.array_equal(share[:3], np.zeros((3, 2))) and share[3:] == pytest.approx(np.full((3, 2), 1 / 6))
    # 3 batch blocks into 2: the middle block splits between both; every share sums to the chunk
    share = layout_share((3, 1, 1), (0, 1, 1), (2, 1, 1), (0, 1, 1))
    assert share == pytest.approx(np.array([[1 / 3, 0], [1 / 6, 1 / 6], [0, 1 / 3]]))


def test_a_chunk_between_layers_on_the_same_blocks_stays_in_place():
    """Two vector layers with the same partition on the same tiles under a T-cut: each tile reads
    the block it wrote, nothing crosses the mesh for that edge."""
    g = LayerGraph.build([Layer("a", 0, 4096, 4096, 0, 4096, dram_in=4096),
                          Layer("b", 0, 4096, 4096, 0, 4096, output=True)], [(0, 1)])
    ev = Evaluator(g, EDGE)
    sched = ev.schedule(Tree(Cut("T", 1, (Cut("T", 1, (Leaf(0), Leaf(1))),)), 1))
    a, b = sched.leaves
    assert a.cost.partition == b.cost.partition and a.cost.tiles > 1
    assert [c.noc for c in sched.chunks] == [1.0]
    # the mesh carries only a's graph input and b's returned output, each to or from its own tile
    e = ev.evaluate_schedule(sched)
    to_dram = 4096 * (ev.mesh.edge_hops(*a.used) + ev.mesh.edge_hops(*b.used))
    assert e.noc_bit_hops == pytest.approx(8 * EDGE.storage_bytes * to_dram)


def test_a_tile_gathers_its_block_in_one_transfer_per_producer_tile_holding_part_of_it():
    """Two layers split alike on the cloud chip's 144 tiles, rows and columns: a consumer tile's
    row block lies on the producer's tiles of that row block, one per column block, each a DMA
    of its own; its one-round invocation loads them (at least a set-up each) before its product."""
    cloud = hardware.get("set-cloud144")
    g = chain(3, m=784, n=512, k=128)
    ev = Evaluator(g, cloud)
    sched = ev.schedule(Tree(Cut("T", 1, (Cut("T", 1, (Leaf(0), Leaf(1), Leaf(2))),)), 1))
    a, b = sched.leaves[:2]
    (_, pm, pn), (_, qm, _) = a.cost.partition, b.cost.partition
    assert pm == qm and pn > 1 and b.cost.rounds == 1
    assert ev._route(a, 0, b, 0)[2] == pn
    slot = ev.evaluate_schedule(sched, timeline=True).timeline[1]
    assert slot.end - slot.start >= b.cost.cycles + (pn + 1) * cloud.dma_latency_cycles


def test_copy_sets_follow_the_partition():
    ev = Evaluator(chain(1), EDGE)
    cost = ev.intra.cost(0, 16, 1)
    ifmap, weight = dataclasses.replace(cost, partition=(2, 2, 3)).copy_sets()
    # part (b, m, n) on tile (b*2 + m)*3 + n: an ifmap block's 3 copies side by side, a weight's 2 copies 3 apart
    assert ifmap == ((0, 1, 2), (3, 4, 5), (6, 7, 8), (9, 10, 11))
    assert weight == ((0, 3), (1, 4), (2, 5), (6, 9), (7, 10), (8, 11))


def test_all_dram_tree_moves_what_the_graph_says():
    """Initial tree: every feature map through DRAM. DRAM bytes = inputs + weights + every read or
    returned output written once + every edge read once (unique data, int8)."""
    g = fig3_graph()
    batch = 4
    e = Evaluator(g, EDGE).evaluate(initial_tree(g, batch))
    expected = sum(layer.dram_in * batch + layer.weights for layer in g.layers)
    expected += sum(layer.ofmap * batch for i, layer in enumerate(g.layers) if g.succs[i] or layer.output)
    expected += sum(g.layers[u].ofmap * batch for u, _ in g.edges)
    assert e.dram_bytes == expected
    assert e.energy["dram"] == pytest.approx(expected * 8 * 7.5)
    assert e.energy["mac"] == pytest.approx(sum(layer.macs for layer in g.layers) * batch * 0.018)


def test_root_s_cut_pins_weights_and_keeps_feature_maps_on_chip():
    g = chain(3)
    batch = 4
    e = Evaluator(g, EDGE).evaluate(Tree(Cut("S", 4, tuple(Leaf(i) for i in range(3))), batch))
    first, last = g.layers[0], g.layers[-1]
    expected = first.dram_in * batch + sum(layer.weights for layer in g.layers) + last.ofmap * batch
    assert e.dram_bytes == expected  # weights loaded once, no feature map through DRAM
    assert e.energy["noc"] > 0


def _rounds_of(layer: Layer, partition: tuple[int, int, int]) -> int:
    """Rounds of a part as the engine sizes them: its ifmap rows, weight columns and outputs
    against half the LB (in elements); two copies of half of that per round where they do not fit."""
    pb, pm, pn = partition
    part = -(-layer.ifmap // (pb * pm)) + -(-layer.weights // (pb * pn)) + -(-layer.ofmap // (pb * pm * pn))
    room = EDGE.lb_bytes // 2 // EDGE.storage_bytes
    return 1 if part <= room else -(-2 * part // room)


@pytest.mark.parametrize("m, k", [(4096, 1152), (256, 64)])
def test_single_layer_latency_overlaps_compute_and_dram_over_its_rounds(m, k):
    """The longer of compute and DRAM time, plus the shorter once for the round nothing hides:
    in many rounds about the longer; a part that fits in one round loads, then computes. Compute
    is the product and its epilogue on the VME overlapped alike: in one round the epilogue
    follows the product."""
    layer = conv("big", m=m, n=256, k=k, dram_in=m * k // 4, output=True)
    ev = Evaluator(LayerGraph.build([layer], []), EDGE)
    e = ev.evaluate(initial_tree(ev.graph, 1))
    cost = ev.intra.cost(0, 16, 1)
    pb, pm, pn = cost.partition
    rounds = _rounds_of(layer, cost.partition)
    assert cost.rounds == rounds and (rounds > 1) == (m == 4096)
    mme = mme_cycles(1, -(-m // pm), -(-256 // pn), k, EDGE)
    vec = vector_cycles(-(-layer.vector_ops // (pb * pm * pn)), "vme", EDGE)
    compute = int(max(mme, vec) + min(mme, vec) / rounds)
    assert cost.cycles == compute and (rounds > 1 or compute == mme + vec)
    dram_time = e.dram_bytes / EDGE.ddr_bytes_per_cycle
    overlapped = max(compute, dram_time) + min(compute, dram_time) / rounds
    assert e.latency == pytest.approx(overlapped + EDGE.dma_latency_cycles)
    if rounds == 1:
        assert e.latency == pytest.approx(compute + dram_time + EDGE.dma_latency_cycles)


def test_noc_energy_of_a_layer_is_its_copies_multicast_from_dram():
    """One layer partitioned over the chip, alone in the tree: its graph input reaches each ifmap
    block's copies and its weights each weight block's copies along multicast trees from DRAM;
    its output goes back to the nearest perimeter router of every tile it is on."""
    g = LayerGraph.build([conv("big", m=4096, n=256, k=1152, dram_in=4096 * 1152 // 4, output=True)], [])
    ev = Evaluator(g, EDGE)
    e = ev.evaluate(initial_tree(g, 1))
    cost = ev.intra.cost(0, 16, 1)
    assert cost.partition[1] > 1 and cost.partition[2] > 1  # both operands have copies
    ifmap_sets, weight_sets = cost.copy_sets()
    layer, mesh, eb = g.layers[0], ev.mesh, EDGE.storage_bytes
    links = (layer.dram_in * mesh.from_dram(0, ifmap_sets) + layer.weights * mesh.from_dram(0, weight_sets)
             + (layer.ofmap + cost.refetch) * mesh.edge_hops(0, cost.tiles)) * eb
    assert e.noc_bit_hops == pytest.approx(8 * links)
    assert e.energy["noc"] == pytest.approx(8 * links * EDGE.energy.noc_hop_pj_per_bit)


def test_feature_maps_beyond_the_buffers_spill():
    """A long chain in one LS segment keeps every feature map on chip; at a batch whose maps
    exceed the retained half of the tiles' buffers the excess goes through DRAM. Beside them the
    weights of layers running more than once a round stay pinned; a layer running once a round
    holds its weights only while it runs (its working set), as the lowered program frees them."""
    g = chain(4, m=65536, n=64, k=64)  # 4 MiB ofmap per sample
    ls = lambda b, sb: Tree(Cut("T", 1, (Cut("T", sb, tuple(Leaf(i) for i in range(4))),)), b)  # noqa: E731
    ev = Evaluator(g, EDGE)
    retained = 16 * EDGE.lb_bytes // 2
    assert ev.schedule(ls(1, 1)).spilled == (0.0,)
    once = ev.schedule(ls(4, 1))  # every layer once, 4 samples: one 16 MiB chunk kept at a time
    assert all(p.pinned and p.invocations == 1 for p in once.leaves)
    assert once.spilled[0] == pytest.approx(1 - retained / (4 * 65536 * 64))
    rounds = ev.schedule(ls(8, 4))  # every layer 4 times, 2 samples each: its weights stay pinned
    assert all(p.pinned and p.invocations == 4 for p in rounds.leaves)
    room = retained - sum(p.cost.weight_tile * p.cost.tiles for p in rounds.leaves)
    assert 0 < rounds.spilled[0] == pytest.approx(1 - room / (2 * 65536 * 64))
