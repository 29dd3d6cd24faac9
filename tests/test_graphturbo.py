"""GraphTurbo's Algorithm 1 (SplitInfo) and Eq. 1 (BestSplit) on hand-built sub-graphs."""

import math

from tvm_dsa.schedule.graph import Node, OpGraph, SubGraphs, Tensor
from tvm_dsa.schedule.graphturbo import Split, best_split, peak_bytes, split_info

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


def test_peak_counts_activations_not_weights():
    shapes = [(2, 16, 32, 32), (2, 32, 32, 32), (2, 32, 16, 16)]
    sgs = SubGraphs(chain(shapes))
    sgs.merge({0, 1})
    assert peak_bytes(sgs, 0, FP16) == sum(math.prod(s) for s in shapes) * FP16  # input, inner, output


def test_split_info_of_a_two_layer_chain():
    shapes = [(2, 16, 32, 32), (2, 32, 32, 32), (2, 32, 16, 16)]
    sgs = SubGraphs(chain(shapes))
    sgs.merge({0, 1})
    peak = sum(math.prod(s) for s in shapes) * FP16

    def smallest_fitting(extent):
        return next((v for v in range(1, extent + 1) if extent % v == 0 and math.ceil(peak / v) <= LB), None)

    info = split_info(sgs, 0, LB, FP16)
    assert smallest_fitting(2) is None and info[0] == Split(0, False, 0, 0)  # the batch of 2 is too coarse
    f = smallest_fitting(32)
    assert info[1] == Split(1, True, 2, f) and f == 4  # both layers have 32 channels, 4 divides them
    assert info[2] == Split(2, True, 2, smallest_fitting(16))
    # equal n and f on channels and rows: the outer dimension wins
    assert best_split(info) == info[1]


def test_split_reaches_only_layers_it_divides():
    # the inner layer has 6 rows: a factor of 4 on rows reaches only the output layer
    shapes = [(1, 8, 6, 64), (1, 8, 6, 64), (1, 8, 8, 64)]
    sgs = SubGraphs(chain(shapes))
    sgs.merge({0, 1})
    info = split_info(sgs, 0, 8 * 1024, FP16)
    peak = sum(math.prod(s) for s in shapes) * FP16
    rows = next(v for v in range(1, 9) if 8 % v == 0 and math.ceil(peak / v) <= 8 * 1024)
    assert rows == 4 and info[2] == Split(2, True, 1, 4)
    # the channels (8) split both layers with the same factor: more layers reached wins over depth
    assert info[1].n == 2 and best_split(info) == info[1]


def test_nothing_fits():
    sgs = SubGraphs(chain([(1, 4, 4, 4), (1, 4, 4, 4)]))
    assert best_split(split_info(sgs, 0, 16, FP16)) is None
