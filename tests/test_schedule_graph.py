"""The scheduler's op graph and GraphTurbo's merge patterns (seed 000 §3.2, Fig. 4)."""

import tvm
from tvm import relax

from tvm_dsa.schedule.graph import Node, OpGraph, SubGraphs, Tensor


def graph(edges: dict[int, list], n: int) -> OpGraph:
    """Nodes 0..n-1; ``edges[i]`` lists what node i reads: other nodes or "x" (the graph input)."""
    tensors = {"x": Tensor("x", (1, 8), "float32", None)}
    nodes = []
    for i in range(n):
        tensors[f"t{i}"] = Tensor(f"t{i}", (1, 8), "float32", i)
        inputs = tuple("x" if e == "x" else f"t{e}" for e in edges.get(i, ["x"]))
        nodes.append(Node(i, f"t{i}", f"f{i}", inputs, f"t{i}"))
    return OpGraph(tuple(nodes), tensors, (f"t{n - 1}",))


def test_straight_chain():
    sgs = SubGraphs(graph({1: [0], 2: [1]}, 3))
    assert list(sgs.straight()) == [{0, 1}, {1, 2}]
    assert list(sgs.diamond()) == [] and list(sgs.branch()) == []


def test_diamond_entry_two_paths_exit():
    # 0 -> 1, 0 -> 2, (1, 2) -> 3: the two middle SGs and the exit fuse
    sgs = SubGraphs(graph({1: [0], 2: [0], 3: [1, 2]}, 4))
    assert list(sgs.diamond()) == [{1, 2, 3}]
    assert list(sgs.straight()) == []  # 0 has two consumers, 3 two producers


def test_diamond_needs_one_entry():
    sgs = SubGraphs(graph({1: [0], 3: [1, 2]}, 4))  # 2 reads the graph input, not 0
    assert list(sgs.diamond()) == []


def test_branch_like_a_resnet_identity_block():
    # 0 produces the block input; 1 is the residual branch; 2 adds 1 to the block input (reads 0)
    sgs = SubGraphs(graph({1: [0], 2: [1, 0]}, 3))
    assert list(sgs.branch()) == [{1, 2}]
    merged = sgs.merge({1, 2})
    assert sgs.groups == [frozenset({0}), frozenset({1, 2})] and merged == 1
    assert list(sgs.straight()) == [{0, 1}]  # after the branch merge, a straight pair remains


def test_branch_like_a_resnet_conv_block():
    # block input 0 feeds the main path 1 -> 2 and the shortcut 3; 4 joins 2 and 3
    sgs = SubGraphs(graph({1: [0], 2: [1], 3: [0], 4: [2, 3]}, 5))
    assert list(sgs.branch()) == [{3, 4}, {2, 4}]  # either producer may play SG2; shortcut first
    assert list(sgs.diamond()) == []  # the paths 0-1-2-4 and 0-3-4 have three SGs, not a diamond


def test_graph_from_relax_conv_block():
    """A ResNet conv block (main path of two convs, a strided shortcut conv) after TVM's fusion."""
    op = relax.op
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 8, 8), "float32"))
    ws = [relax.Var(f"w{i}", relax.TensorType(s, "float32"))
          for i, s in enumerate([(32, 16, 3, 3), (32, 32, 3, 3), (32, 16, 1, 1)])]
    with bb.function("main", [x, *ws]):
        with bb.dataflow():
            a = bb.emit(op.nn.relu(op.nn.conv2d(x, ws[0], strides=2, padding=1)))
            b = bb.emit(op.nn.conv2d(a, ws[1], padding=1))
            s = bb.emit(op.nn.conv2d(x, ws[2], strides=2))
            out = bb.emit_output(op.nn.relu(op.add(b, s)))
        bb.emit_func_output(out)
    seq = tvm.transform.Sequential([relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
                                    relax.transform.FuseOps(), relax.transform.FuseTIR()])
    with tvm.target.Target("llvm"):
        mod = seq(bb.get())
    g = OpGraph.from_relax(mod)
    # TVM's fusion: conv+relu, the shortcut conv, and the second conv with the add+relu fused in
    assert [n.func for n in g.nodes] == ["fused_conv2d_relu", "conv2d2", "fused_conv2d1_add_relu"]
    first = g.nodes[0]
    assert g.tensors[first.output].shape == (1, 32, 4, 4) and g.tensors[first.output].nbytes == 32 * 16 * 4
    assert [g.tensors[t].constant or g.tensors[t].producer is None for t in first.inputs] == [True, True]
    assert g.consumers(0) == g.consumers(1) == {2} and g.producers(2) == {0, 1}
    assert g.outputs == (g.nodes[2].output,)
    # the exit reads two layers that only it consumes: both may play the fused branch (shortcut first)
    assert list(SubGraphs(g).branch()) == [{1, 2}, {0, 2}]
    assert list(SubGraphs(g).straight()) == []
