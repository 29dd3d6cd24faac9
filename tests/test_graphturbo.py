"""GraphTurbo's Algorithm 1 (SplitInfo) and Eq. 1 (BestSplit) on hand-built sub-graphs."""

import math

import numpy as np
from helpers import HW, fuse, relax_graph
from tvm import relax

from tvm_dsa.kernel.macs import kernel_macs

from tvm_dsa.schedule.graph import Node, OpGraph, SubGraphs, Tensor
from tvm_dsa.schedule.graphturbo import (
    Split, best_split, bytes_in_flight, cut_before, group, group_two_levels, instance_graph, order_instances,
    pair_product, peak_bytes, split_info, row_window_axis, window_cuts, all_rows_read, paying_cuts,
)

LB = 64 * 1024
FP16 = 2


def chain(shapes: list[tuple[int, ...]]) -> OpGraph:
    """x -> layer 0 -> layer 1 -> ...: ``shapes[0]`` is the input, ``shapes[i + 1]`` layer i's output."""
    tensors = {"x": Tensor("x", shapes[0], "float16", None),
               "w": Tensor("w", (8, 8), "float16", None, constant=True)}
    nodes, prev = [], "x"
    for i, shape in enumerate(shapes[1:]):
        tensors[f"t{i}"] = Tensor(f"t{i}", shape, "float16", i)
        nodes.append(Node(i, f"t{i}", f"f{i}", (prev, "w"), f"t{i}"))
        prev = f"t{i}"
    return OpGraph(tuple(nodes), tensors, (prev,))


def chain_peak(shapes) -> int:
    """Layer i holds its input and its output; earlier tensors are dead."""
    return max(math.prod(a) + math.prod(b) for a, b in zip(shapes, shapes[1:])) * FP16


def test_peak_is_the_live_maximum_of_activations_not_weights():
    shapes = [(2, 16, 32, 32), (2, 32, 32, 32), (2, 32, 16, 16)]
    sgs = SubGraphs(chain(shapes))
    sgs.merge({0, 1})
    assert peak_bytes(sgs, 0, FP16) == chain_peak(shapes) == (32768 + 65536) * FP16


def test_peak_keeps_a_residual_alive():
    # x -> 0 -> 1, and 2 reads 1 and x (a residual add): x stays live through the block
    tensors = {"x": Tensor("x", (1, 8, 8, 8), "float16", None)}
    nodes = []
    for i, inputs in enumerate([("x",), ("t0",), ("t1", "x")]):
        tensors[f"t{i}"] = Tensor(f"t{i}", (1, 8, 8, 8), "float16", i)
        nodes.append(Node(i, f"t{i}", f"f{i}", inputs, f"t{i}"))
    sgs = SubGraphs(OpGraph(tuple(nodes), tensors, ("t2",)))
    sgs.merge({0, 1, 2})
    assert peak_bytes(sgs, 0, FP16) == 3 * 512 * FP16  # x, t0 and t1 at layer 1; x, t1, t2 at layer 2


def test_split_info_of_a_two_layer_chain():
    shapes = [(2, 16, 32, 32), (2, 32, 32, 32), (2, 32, 16, 16)]
    sgs = SubGraphs(chain(shapes))
    sgs.merge({0, 1})
    peak = chain_peak(shapes)

    def smallest_fitting(extent):
        return next((v for v in range(1, extent + 1) if extent % v == 0 and math.ceil(peak / v) <= LB), None)

    info = split_info(sgs, 0, LB, FP16)
    assert smallest_fitting(2) is None and info[0] == Split(0, False, 0, 0)  # the batch of 2 is too coarse
    f = smallest_fitting(32)
    assert info[1] == Split(1, True, 2, f) and f == 4  # both layers have 32 channels; 2 is too coarse
    assert info[2] == Split(2, True, 2, smallest_fitting(16))
    # equal n and f on channels and rows: the outer dimension wins
    assert best_split(info) == info[1]


def test_split_reaches_only_layers_it_divides():
    # the inner layer has 6 rows: a factor of 4 on rows reaches only the output layer
    shapes = [(1, 8, 6, 64), (1, 8, 6, 64), (1, 8, 8, 64)]
    sgs = SubGraphs(chain(shapes))
    sgs.merge({0, 1})
    info = split_info(sgs, 0, 4096, FP16)
    peak = chain_peak(shapes)
    rows = next(v for v in range(1, 9) if 8 % v == 0 and math.ceil(peak / v) <= 4096)
    assert rows == 4 and info[2] == Split(2, True, 1, 4)
    # the channels (8) split both layers with the same factor: more layers reached wins over depth
    assert info[1].n == 2 and best_split(info) == info[1]


def test_nothing_fits():
    sgs = SubGraphs(chain([(1, 4, 4, 4), (1, 4, 4, 4)]))
    assert best_split(split_info(sgs, 0, 16, FP16)) is None


def factor(peak: int, extent: int, lb: int = LB) -> int | None:
    return next((v for v in range(1, extent + 1) if extent % v == 0 and math.ceil(peak / v) <= lb), None)


def test_group_merges_a_chain_of_equal_layers():
    shapes = [(1, 64, 32, 32)] * 5  # every layer holds input + output: the same peak when merged
    sgs = group(SubGraphs(chain(shapes)), LB, FP16)
    assert sgs.groups == [frozenset(range(4))]
    assert factor(chain_peak(shapes), 64) == 4  # and the merged SG still splits by 4


def test_group_stops_at_a_downsampling():
    shapes = [(1, 16, 64, 64), (1, 16, 64, 64), (1, 32, 32, 32), (1, 32, 32, 32)]
    f0 = factor(chain_peak(shapes[0:2]), 16)
    f1 = factor(chain_peak(shapes[1:3]), 32)
    f2 = factor(chain_peak(shapes[2:4]), 32)
    assert (f0, f1, f2) == (4, 4, 2)
    # (0, 1): the consumer's factor is not smaller and the merged peak is layer 0's: merge.
    # ({0, 1}, 2): 2's factor (2) is smaller than the producer's (4): rule (i) stops the merge,
    # so the large factor of the big early layers does not spread past the downsampling.
    sgs = group(SubGraphs(chain(shapes)), LB, FP16)
    assert sgs.groups == [frozenset({0, 1}), frozenset({2})]


def test_layers_no_split_fits_into_the_lb_group_at_the_gb_level():
    shapes = [(1, 4, 4, 4)] * 4  # 256 B per layer (input + output): no split fits a 16-byte LB
    assert group(SubGraphs(chain(shapes)), 16, FP16).groups == [frozenset({i}) for i in range(3)]
    # with the GB in Algorithm 1 each splits by 1 and merging keeps it: one sub-graph
    assert group_two_levels(SubGraphs(chain(shapes)), 16, 1024, FP16).groups == [frozenset(range(3))]


def test_the_gb_level_merges_what_rule_i_stopped_where_the_tensors_fit_the_gb():
    # the LB grouping stops at the downsampling (test_group_stops_at_a_downsampling); the whole
    # chain's peak, 256 KiB, fits an 8 MiB GB unsplit (factor 1 each), so the GB level merges it
    shapes = [(1, 16, 64, 64), (1, 16, 64, 64), (1, 32, 32, 32), (1, 32, 32, 32)]
    assert chain_peak(shapes) == 256 * 1024
    assert group_two_levels(SubGraphs(chain(shapes)), LB, 8 << 20, FP16).groups == [frozenset(range(3))]
    # a GB of the LB's size splits {0, 1} by 4 and {2} by 2 again: rule (i) stops the merge there too
    assert group_two_levels(SubGraphs(chain(shapes)), LB, LB, FP16).groups == [frozenset({0, 1}), frozenset({2})]


def test_group_merges_a_small_diamond_then_the_entry():
    # 0 -> 1, 0 -> 2, (1, 2) -> 3, small tensors: every SG fits without a split (factor 1)
    tensors = {"x": Tensor("x", (1, 8, 16, 16), "float16", None)}
    nodes = []
    for i, inputs in enumerate([("x",), ("t0",), ("t0",), ("t1", "t2")]):
        tensors[f"t{i}"] = Tensor(f"t{i}", (1, 8, 16, 16), "float16", i)
        nodes.append(Node(i, f"t{i}", f"f{i}", inputs, f"t{i}"))
    sgs = SubGraphs(OpGraph(tuple(nodes), tensors, ("t3",)))
    assert list(sgs.diamond()) == [{1, 2, 3}] and list(sgs.straight()) == []
    group(sgs, LB, FP16)
    assert sgs.groups == [frozenset(range(4))]


def two_sgs(shape=(1, 8, 16, 16)) -> SubGraphs:
    return SubGraphs(chain([shape, shape, shape]))  # SG 0 -> SG 1, one layer each


def test_instances_of_the_same_split_pair_up():
    sgs = two_sgs()
    instances, edges = instance_graph(sgs, {0: Split(1, True, 1, 2), 1: Split(1, True, 1, 2)}, FP16)
    assert [(i.sg, i.index) for i in instances] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert edges == [(0, 2), (1, 3)]  # A0 -> B0, A1 -> B1: the cross edges are redundant
    assert instances[0].nbytes == 8 * 16 * 16 * FP16 // 2


def test_finer_consumer_and_other_dimension():
    sgs = two_sgs()
    _, edges = instance_graph(sgs, {0: Split(1, True, 1, 2), 1: Split(1, True, 1, 4)}, FP16)
    assert edges == [(0, 2), (0, 3), (1, 4), (1, 5)]  # B0, B1 read A0; B2, B3 read A1
    _, edges = instance_graph(sgs, {0: Split(1, True, 1, 2), 1: Split(2, True, 1, 2)}, FP16)
    assert edges == [(0, 2), (0, 3), (1, 2), (1, 3)]  # split along different dims: all needed
    _, edges = instance_graph(sgs, {0: Split(1, True, 1, 2), 1: None}, FP16)
    assert edges == [(0, 2), (1, 2)]  # an unsplit consumer is one instance reading both


def test_depth_first_keeps_fewer_bytes_in_flight():
    sgs = two_sgs()
    instances, edges = instance_graph(sgs, {0: Split(1, True, 1, 2), 1: Split(1, True, 1, 2)}, FP16)
    half = instances[0].nbytes
    # DFS takes the last ready instance: A1, then B1 (now ready), then A0, B0
    order, name = order_instances(instances, edges)
    assert (order, name) == ([1, 3, 0, 2], "dfs")
    assert bytes_in_flight(order, instances, edges) == half  # one A slice waits at a time
    assert bytes_in_flight([0, 1, 2, 3], instances, edges) == 2 * half  # BFS holds both


def test_one_clusters_share_divides_the_batch_and_only_the_batch():
    # x (8, 16) -> t0 (8, 16) -> t1 (128, 16): a batch-major reshape (N * 16) -> t2 (12, 8):
    # a leading dimension that is not a multiple of the batch; the weight (8, 8) is a constant
    g = chain([(8, 16), (8, 16), (128, 16), (12, 8)])
    share, split = g.per_cluster(4)
    assert split == 4
    assert {t: share.tensors[t].shape for t in ("x", "t0", "t1", "t2", "w")} == {
        "x": (2, 16), "t0": (2, 16), "t1": (32, 16), "t2": (12, 8), "w": (8, 8)}
    sgs = SubGraphs(share)
    sgs.merge({0, 1})
    whole = SubGraphs(g)
    whole.merge({0, 1})
    assert peak_bytes(sgs, 0, FP16) * 4 == peak_bytes(whole, 0, FP16)  # layer 1: t0 and t1
    # a batch the clusters do not divide, or one cluster: the whole graph
    assert chain([(6, 16), (6, 16)]).per_cluster(4)[1] == 1
    assert g.per_cluster(1) == (g, 1)


def test_per_cluster_peaks_let_a_batch_four_times_as_large_group_alike():
    # a layer whose peak no one-dimensional split fits into the LB at batch 16 (two (16, 4, 32,
    # 32) tensors, 256 KiB; the largest factor is 32) fits at one cluster's batch of 4
    shapes = [(16, 4, 32, 32)] * 2
    assert best_split(split_info(SubGraphs(chain(shapes)), 0, 4096, FP16)) is None
    share, _ = chain(shapes).per_cluster(4)
    assert best_split(split_info(SubGraphs(share), 0, 4096, FP16)) == \
        best_split(split_info(SubGraphs(chain([(4, 4, 32, 32)] * 2)), 0, 4096, FP16))


def test_cut_before_leaves_runs_of_each_sub_graph():
    sgs = SubGraphs(chain([(1, 8, 16, 16)] * 6), [frozenset({0, 1, 2, 3}), frozenset({4})])
    cut = cut_before(sgs, frozenset({0, 2, 3}))  # the first node of a sub-graph starts it anyway
    assert cut.groups == [frozenset({0, 1}), frozenset({2}), frozenset({3}), frozenset({4})]


def test_pair_product_is_a_contraction_of_two_activations():
    mod = relax.transform.LegalizeOps()(relax_graph([(1, 8, 16), (1, 16, 8)], lambda a, b: relax.op.matmul(a, b)))
    func = next(f for gv, f in mod.functions.items() if gv.name_hint != "main")
    assert pair_product(func)
    assert not pair_product(func, weights=frozenset({1}))  # the second operand a weight: x @ W


def test_all_rows_read_are_the_operands_a_row_of_the_output_needs_whole():
    """``S = Q K^T`` needs all rows of ``K`` for any of its rows, ``O = P V`` all rows of ``V``,
    ``x W`` none of ``x`` (a row of the output reads its own row) nor of ``W`` beyond its
    reduction (``W``'s rows are the reduced dim: every output row reads all of them)."""
    op = relax.op

    def func(shapes, f):
        mod = relax.transform.LegalizeOps()(relax_graph(shapes, f))
        return next(f for gv, f in mod.functions.items() if "matmul" in gv.name_hint)

    assert all_rows_read(func([(1, 8, 16), (1, 8, 16)], lambda q, k: op.matmul(q, op.permute_dims(k, [0, 2, 1])))) \
        == {1}
    assert all_rows_read(func([(1, 8, 8), (1, 8, 16)], lambda p, v: op.matmul(p, v))) == {1}
    assert all_rows_read(func([(1, 8, 16), (16, 4)], lambda x, w: op.matmul(x, w))) == {1}
    assert all_rows_read(func([(1, 8, 16), (16, 4)], lambda x, w: op.matmul(x, w)), weights=frozenset({1})) == set()


def test_all_rows_read_by_a_global_pooling_but_not_by_a_window_or_a_norm_over_channels():
    """A mean over an image's rows and columns reads all its rows; a 3 x 3 pooling reads a window
    of them, a mean over the channels (the second-to-last dim of ``(C, W)`` rows alone is
    reduced, it is the rows) only its own."""
    op = relax.op

    def func(shape, f):
        mod = relax.transform.LegalizeOps()(relax_graph([shape], f))
        return next(f for gv, f in mod.functions.items() if gv.name_hint != "main")

    assert all_rows_read(func((1, 8, 7, 7), lambda x: op.mean(x, axis=[2, 3], keepdims=True))) == {0}
    assert all_rows_read(func((1, 8, 7, 7), lambda x: op.nn.max_pool2d(x, (3, 3), padding=(1, 1)))) == set()
    assert all_rows_read(func((1, 8, 7, 7), lambda x: op.mean(x, axis=[1], keepdims=True))) == set()


def test_row_window_axis_is_a_window_over_an_activations_rows():
    """A 3x3 convolution and a max pooling read their input's rows through a window of 3, strided
    or not; a 1x1 convolution, a matmul and a global average pooling through none (an index moves
    with an output or a reduction iterator, not both), nor a convolution of a 1 x 3 window."""
    op = relax.op

    def func(shapes, f):
        mod = relax.transform.LegalizeOps()(relax_graph(shapes, f))
        return next(f for gv, f in mod.functions.items() if gv.name_hint != "main")

    assert row_window_axis(func([(1, 8, 16, 16), (8, 8, 3, 3)], lambda x, w: op.nn.conv2d(x, w, padding=1))) == (3, -2)
    assert row_window_axis(func([(1, 8, 16, 16), (8, 8, 3, 3)], lambda x, w: op.nn.conv2d(x, w, strides=2)))[0] == 3
    assert row_window_axis(func([(1, 8, 16, 16)], lambda x: op.nn.max_pool2d(x, pool_size=3, strides=2, padding=1)))[0] == 3
    assert row_window_axis(func([(1, 8, 16, 16), (8, 8, 1, 3)], lambda x, w: op.nn.conv2d(x, w, padding=(0, 1))))[0] == 0
    assert row_window_axis(func([(1, 8, 16, 16), (8, 8, 1, 1)], lambda x, w: op.nn.conv2d(x, w, strides=2)))[0] == 0
    assert row_window_axis(func([(1, 8, 16), (1, 16, 8)], lambda a, b: op.matmul(a, b)))[0] == 0
    assert row_window_axis(func([(1, 8, 16, 16)], lambda x: op.mean(x, axis=[2, 3], keepdims=True)))[0] == 0
    # a 1-D signal's window slides along its last dim, its positions (a sequence's tokens)
    assert row_window_axis(func([(1, 8, 32), (8, 1, 5)], lambda x, w: op.nn.conv1d(x, w, padding=2, groups=8))) \
        == (5, -1)
    assert row_window_axis(func([(1, 8, 32), (4, 8, 1)], lambda x, w: op.nn.conv1d(x, w)))[0] == 0


def test_an_inverted_residual_block_is_cut_before_its_expansion_not_its_depthwise_window():
    """Three MobileNetV2 blocks (24 -> 144 -> 24 channels at 56 x 56, the residual added) as one
    sub-graph at batch 1: each depthwise 3 x 3 window recomputes too much of what comes before it
    for its rows to split, so the sub-graph is cut for it. The first block's cut can go only
    before its window (nothing comes before the expansion); the later ones go before their
    block's expansion, where the 24-channel block input crosses instead of the expanded 144
    channels and the residual (``MOVE_SAVES``)."""
    op = relax.op
    rng = np.random.default_rng(0)
    k = lambda *shape: relax.const((rng.standard_normal(shape) * 0.1).astype("float32"))  # noqa: E731
    blocks = [(k(144, 24, 1, 1), k(144, 1, 3, 3), k(24, 144, 1, 1)) for _ in range(3)]

    def body(x):
        for expand, depthwise, project in blocks:
            e = op.nn.relu(op.nn.conv2d(x, expand))
            x = op.add(op.nn.conv2d(op.nn.relu(op.nn.conv2d(e, depthwise, padding=1, groups=144)), project), x)
        return x

    mod = fuse(relax_graph([(1, 24, 56, 56)], body))
    graph = OpGraph.from_relax(mod)
    kinds = [graph.tensors[n.output].shape[1] == 144 and graph.tensors[n.inputs[0]].shape[1] for n in graph.nodes]
    assert kinds == [24, 144, False] * 3  # expansion, depthwise, projection
    macs = {n.index: kernel_macs(mod[n.func]) for n in graph.nodes}
    cuts = window_cuts(SubGraphs(graph, [frozenset(range(len(graph.nodes)))]), mod, HW, frozenset(), macs)
    assert cuts == {1, 3, 6}


def test_a_global_pooling_is_cut_from_the_rows_it_pools_before_a_cheaper_producer():
    """At batch 1 a sample's rows are split over the clusters, and a pooling over all of them
    leaves a row to no cluster: a 3 x 3 convolution, a 1 x 1 expansion to four times the channels
    and a global average pooling, one sub-graph, are cut before the expansion, which reads a
    quarter of the bytes the pooling does and no window. Added to a shortcut as large as its
    output, computed in the sub-graph too, the expansion reads more than the pooling, and the cut
    goes before the pooling."""
    op = relax.op
    rng = np.random.default_rng(0)
    k = lambda *shape: relax.const((rng.standard_normal(shape) * 0.1).astype("float32"))  # noqa: E731
    conv, expand, shortcut = k(128, 128, 3, 3), k(512, 128, 1, 1), k(512, 128, 1, 1)

    def body(residual):
        def f(x):
            y = op.nn.conv2d(op.nn.relu(op.nn.conv2d(x, conv, padding=1)), expand)
            return op.mean(op.add(y, op.nn.conv2d(x, shortcut)) if residual else y, axis=[2, 3], keepdims=True)
        return f

    for residual in (False, True):
        mod = fuse(relax_graph([(1, 128, 14, 14)], body(residual)))
        graph = OpGraph.from_relax(mod)
        macs = {n.index: kernel_macs(mod[n.func]) for n in graph.nodes}
        cuts = paying_cuts(SubGraphs(graph, [frozenset(range(len(graph.nodes)))]), mod, HW, frozenset(), macs,
                           frozenset())
        pooling = next(n.index for n in graph.nodes if graph.tensors[n.output].shape[2:] == (1, 1))
        expansion = graph.tensors[graph.nodes[pooling].inputs[0]].producer
        assert graph.tensors[graph.nodes[expansion].output].shape[1] == 512
        assert cuts == ({pooling} if residual else {expansion})
