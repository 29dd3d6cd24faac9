"""SET's tree operators (seed 002 §4.2.1) as property tests on random trees, and the simulated
annealing engine behind SET, LS and LP (§4.1)."""

import dataclasses
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tvm_dsa  # noqa: F401  (registers the presets)
from tvm_dsa import hardware
from tvm_dsa.schedule.set import Contraction, Cut, Layer, LayerGraph, Leaf, Tree, initial_tree, validate
from tvm_dsa.schedule.set.evaluate import Evaluator, _Dram, _Tiles, latency_bound
from tvm_dsa.schedule.set.tree import invocation_order
from tvm_dsa.schedule.set.ops import (LP, LS, OPERATORS, SET, fewer_sub_batches, group, more_sub_batches, mutate,
                                      random_tree, swap, ungroup)
from tvm_dsa.schedule.set.search import Anneal, anneal

EDGE = hardware.get("set-edge16")


def random_graph(rng: random.Random, n: int) -> LayerGraph:
    """n layers, each reading one to three earlier ones (or the input)."""
    layers, edges = [], []
    for i in range(n):
        preds = rng.sample(range(i), rng.randint(1, min(3, i))) if i and rng.random() < 0.9 else []
        edges += [(p, i) for p in preds]
        m, c = rng.choice([16, 64, 256]), rng.choice([16, 64, 128])
        layers.append(Layer(f"n{i}", m * c * c, m * c, m * c, c * c, m * c, None, dram_in=0 if preds else m * c))
    return LayerGraph.build(layers, edges)


def cut_sbs(tree: Tree) -> list:
    return [(p, n.sb) for p, n, _ in tree.nodes() if isinstance(n, Cut)]


def depth_one_kinds(tree: Tree) -> set:
    return {c.kind for c in tree.root.children if isinstance(c, Cut)}


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 10**9), n=st.integers(2, 9), batch=st.sampled_from([1, 2, 4, 6, 8]),
       tiles=st.sampled_from([4, 16]))
def test_every_operator_keeps_the_tree_valid(seed, n, batch, tiles):
    rng = random.Random(seed)
    graph = random_graph(rng, n)
    tree = random_tree(graph, batch, tiles, rng)
    for op in OPERATORS:
        new = op(tree, graph, rng)
        if new is None:
            continue
        assert sorted(new.root.layers) == list(range(n))
        if new.root.min_tiles <= tiles:  # an operator may need more tiles than the chip has
            validate(new, graph, tiles)
        else:  # mutate() rejects those
            with pytest.raises(Exception, match="tiles"):
                validate(new, graph, tiles)


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 10**9), n=st.integers(3, 9), batch=st.sampled_from([2, 4, 8, 12]))
def test_each_operator_does_what_it_says(seed, n, batch):
    rng = random.Random(seed)
    graph = random_graph(rng, n)
    tree = random_tree(graph, batch, 16, rng)
    cuts_before = len(cut_sbs(tree))
    order = tree.root.layers
    new = swap(tree, graph, rng)
    if new is not None:
        diff = [k for k, (a, b) in enumerate(zip(order, new.root.layers)) if a != b]
        assert len(diff) == 2 and diff[1] == diff[0] + 1 and not graph.depends(order[diff[0]], order[diff[1]])
    new = group(tree, graph, rng)
    if new is not None:
        assert len(cut_sbs(new)) == cuts_before + 1 and new.root.layers == order
    new = ungroup(tree, graph, rng)
    if new is not None:
        assert len(cut_sbs(new)) == cuts_before - 1 and new.root.layers == order
    for op, sign in ((more_sub_batches, 1), (fewer_sub_batches, -1)):
        new = op(tree, graph, rng)
        if new is not None:
            changed = [(a, b) for a, b in zip(cut_sbs(tree), cut_sbs(new)) if a != b]
            assert len(changed) == 1 and (changed[0][1][1] - changed[0][0][1]) * sign > 0


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**9), n=st.integers(2, 9), space=st.sampled_from([SET, LS, LP]))
def test_mutate_stays_in_its_space(seed, n, space):
    rng = random.Random(seed)
    graph = random_graph(rng, n)
    tree = random_tree(graph, 4, 16, rng, space)
    for _ in range(20):
        tree = mutate(tree, graph, 16, rng, space) or tree
        validate(tree, graph, 16)
        assert space.allows(tree)
    if space is LS:
        assert depth_one_kinds(tree) <= {"T"}
    if space is LP:
        assert depth_one_kinds(tree) <= {"S"}


def test_operators_on_the_initial_tree():
    g = random_graph(random.Random(3), 5)
    tree = initial_tree(g, 4)
    assert ungroup(tree, g, random.Random(0)) is None  # the root cannot be deleted
    assert fewer_sub_batches(tree, g, random.Random(0)) is None  # already 1
    new = more_sub_batches(tree, g, random.Random(0))
    assert new.root.sb in (2, 4) and new.root.children == tree.root.children


def test_temperature_schedule():
    a = Anneal()
    assert (a.t0, a.alpha, a.beta) == (0.07, 8.0, 100.0)  # seed 002 §5.1.4
    assert a.temperature(0, 100) == 0.07 and a.temperature(100, 100) == 0
    assert all(a.temperature(i, 100) > a.temperature(i + 1, 100) for i in range(100))
    with pytest.raises(ValueError, match="unknown objective"):
        Anneal(objective="speed")


def test_annealing_is_deterministic_and_never_worse_than_its_start():
    rng = random.Random(7)
    g = random_graph(rng, 8)
    ev = Evaluator(g, EDGE)
    runs = [anneal(g, EDGE, 4, Anneal(beta=20, seed=5, objective="edp"), evaluator=ev) for _ in range(2)]
    assert runs[0].tree == runs[1].tree and runs[0].cost == runs[1].cost
    start = ev.evaluate(initial_tree(g, 4)).edp
    assert runs[0].cost <= start and runs[0].cost == pytest.approx(runs[0].evaluation.edp)
    # SET's search: the LS and the LP search, then its own, 20 iterations a layer each
    assert runs[0].history == sorted(runs[0].history, reverse=True) and len(runs[0].history) == 3 * 160
    assert runs[0].cost == pytest.approx(ev.evaluate(runs[0].tree).edp)  # the tree scores its cost


def test_ls_and_lp_are_restricted_searches_of_the_same_engine():
    g = random_graph(random.Random(11), 8)
    for space, kind in ((LS, "T"), (LP, "S")):
        r = anneal(g, EDGE, 8, Anneal(beta=20, seed=1, space=space))
        assert space.allows(r.tree) and depth_one_kinds(r.tree) <= {kind}
        assert [(f.scheme, f.tree, f.cost) for f in r.finalists] == [(space.name, r.tree, r.cost)]
    s = anneal(g, EDGE, 8, Anneal(beta=20, seed=1))
    validate(s.tree, g, 16)


def test_set_search_starts_from_the_ls_and_lp_searches_and_keeps_their_trees():
    """SET's finalists: its best tree, then the LS and LP searches' (the same trees as those
    searches alone, seed for seed), so it never ends above either."""
    g = random_graph(random.Random(11), 8)
    ev = Evaluator(g, EDGE)
    alone = [anneal(g, EDGE, 8, Anneal(beta=10, seed=1, space=space), evaluator=ev) for space in (LS, LP)]
    s = anneal(g, EDGE, 8, Anneal(beta=10, seed=1), evaluator=ev)
    assert [f.scheme for f in s.finalists] == ["set", "ls", "lp"]
    assert (s.finalists[0].tree, s.finalists[0].cost) == (s.tree, s.cost)
    assert [(f.tree, f.cost) for f in s.finalists[1:]] == [(r.tree, r.cost) for r in alone]
    assert s.cost <= min(r.cost for r in alone)
    assert s.iterations == 3 * 10 * len(g) and s.accepted >= sum(r.accepted for r in alone)


def test_a_pipeline_beats_layer_sequential_on_a_deep_chain_at_large_batch():
    """Six equal layers, batch 8: an S-cut pipeline keeps every feature map on chip and every tile
    busy; SA must find a tree at least as good as both hand-written LS and LP trees."""
    layers = [Layer(f"c{i}", 256 * 128 * 128, 0, 256 * 128, 128 * 128, 256 * 128,
                    Contraction(1, 256, 128, 128),
                    dram_in=256 * 128 if i == 0 else 0, output=i == 5) for i in range(6)]
    g = LayerGraph.build(layers, [(i, i + 1) for i in range(5)])
    ev = Evaluator(g, EDGE)
    ls = Tree(Cut("T", 1, (Cut("T", 1, tuple(Leaf(i) for i in range(6))),)), 8)
    lp = Tree(Cut("T", 1, (Cut("S", 8, tuple(Leaf(i) for i in range(6))),)), 8)
    best = anneal(g, EDGE, 8, Anneal(beta=60, seed=0, objective="edp"), evaluator=ev)
    assert best.cost <= min(ev.evaluate(ls).edp, ev.evaluate(lp).edp) * 1.001


@settings(max_examples=200, deadline=None)
@given(tiles=st.sampled_from([1, 2, 16, 144]), steps=st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1),
                                                                          st.floats(0, 100)), max_size=40))
def test_tile_runs_answer_as_a_time_per_tile_would(tiles, steps):
    """The evaluator's ``_Tiles`` (runs of tiles free at the same time) against one time per tile."""
    runs, per_tile = _Tiles(tiles), [0.0] * tiles
    for a, b, end in steps:
        lo = min(int(a * tiles), tiles - 1)
        hi = lo + 1 + min(int(b * (tiles - lo)), tiles - lo - 1)
        assert runs.free_at(lo, hi) == max(per_tile[lo:hi])
        runs.occupy(lo, hi, end)
        per_tile[lo:hi] = [end] * (hi - lo)
        assert [t for k, t in enumerate(runs.times) for _ in range(runs.cuts[k + 1] - runs.cuts[k])] == per_tile


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(0, 60), st.integers(0, 12)), max_size=30))
def test_dram_serves_transfers_in_its_idle_time(steps):
    """``_Dram`` against unit time slots: a transfer of c cycles from s takes the first c idle
    slots at or after s and ends after the last; busy intervals stay disjoint and sorted."""
    dram, busy = _Dram(), [False] * 500
    for start, cycles in steps:
        free = [t for t in range(start, len(busy)) if not busy[t]][:cycles]
        for t in free:
            busy[t] = True
        assert dram.transfer(float(start), float(cycles)) == (free[-1] + 1 if free else start)
        spans = list(zip(dram.starts, dram.ends))
        assert all(a < b <= c for (a, b), (c, _) in zip(spans, spans[1:] + [(math.inf, 0)]))
        assert [t for t in range(len(busy)) if any(a <= t < b for a, b in spans)] == \
            [t for t in range(len(busy)) if busy[t]]


def _order_by_definition(tree: Tree) -> list:
    """Seed 002's order written as it reads: sub-batch k of every child of a cut before sub-batch
    k + 1, a leaf's invocation being its first sample over its samples per invocation."""
    out = []

    def run(node, start, b):
        if isinstance(node, Leaf):
            out.append((node.layer, start // b))
            return
        for k in range(node.sb):
            for child in node.children:
                run(child, start + k * (b // node.sb), b // node.sb)

    run(tree.root, 0, tree.batch)
    return out


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 10**9), n=st.integers(2, 9), batch=st.sampled_from([1, 2, 4, 8, 12, 64]))
def test_invocation_order_and_remembered_evaluations(seed, n, batch):
    """On random trees: the invocation order is the definition's, and an evaluator that has seen
    other trees (remembered evaluations and edges) scores a tree exactly as a fresh one does."""
    rng = random.Random(seed)
    graph = random_graph(rng, n)
    trees = [random_tree(graph, batch, 16, rng) for _ in range(3)]
    used = Evaluator(graph, EDGE)
    for tree in trees + trees:
        assert invocation_order(tree) == _order_by_definition(tree)
        seen = used.evaluate(tree)
        assert seen == Evaluator(graph, EDGE).evaluate(tree)
        assert used.evaluate(tree) is seen
        assert used.evaluate(tree, timeline=True).latency == seen.latency


def test_latency_bound_is_the_roofline():
    """Two layers, derived by hand: 8 samples of 64x64x64 MACs on 16 tiles of 1024 MACs, or
    the weights once plus the input and output of every sample through 16.384 B/cycle."""
    layers = [Layer("a", 64 ** 3, 0, 64 * 64, 64 * 64, 64 * 64, Contraction(1, 64, 64, 64), dram_in=64 * 64),
              Layer("b", 64 ** 3, 0, 64 * 64, 64 * 64, 64 * 64, Contraction(1, 64, 64, 64), output=True)]
    graph = LayerGraph.build(layers, [(0, 1)])
    assert EDGE.peak_macs_per_cycle == 16 * 1024 and EDGE.ddr_bytes_per_cycle == 16.384
    assert latency_bound(graph, EDGE, 8) == max(8 * 2 * 64 ** 3 / 16384, (2 * 4096 + 8 * 2 * 4096) / 16.384)
    heavy = LayerGraph.build([dataclasses.replace(x, weights=4096 * 64) for x in layers], [(0, 1)])
    assert latency_bound(heavy, EDGE, 1) == (2 * 4096 * 64 + 2 * 4096) / 16.384  # DRAM-bound


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 10**9), n=st.integers(2, 10), batch=st.sampled_from([1, 2, 8, 64]),
       preset=st.sampled_from(["set-edge16", "set-cloud144"]))
def test_no_tree_beats_the_roofline(seed, n, batch, preset):
    """The evaluator's latency of any tree is at least ``latency_bound``: its compute, DRAM
    bandwidth shares and pipelines never make up work or bandwidth the chip does not have."""
    rng = random.Random(seed)
    layers, edges = [], []
    for i in range(n):
        preds = rng.sample(range(i), rng.randint(1, min(3, i))) if i and rng.random() < 0.9 else []
        edges += [(p, i) for p in preds]
        m, c = rng.choice([1, 16, 256]), rng.choice([16, 128, 1024])  # from compute- to weight-bound
        layers.append(Layer(f"n{i}", m * c * c, m * c, m * c, c * c, m * c, Contraction(1, m, c, c),
                            dram_in=0 if preds else m * c, output=i == n - 1))
    graph, hw = LayerGraph.build(layers, edges), hardware.get(preset)
    tree = random_tree(graph, batch, hw.cores, rng)
    assert Evaluator(graph, hw).evaluate(tree).latency >= latency_bound(graph, hw, batch)
