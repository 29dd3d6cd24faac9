"""A dynamic model at one input (relax_passes.concrete): branches taken, views contracted."""

import itertools
import warnings

import pytest
import tvm
from tvm.relax.frontend.onnx import from_onnx

from tvm_dsa.models.dynamic import DYNAMIC
from tvm_dsa.relax_passes.fusion import fuse
from tvm_dsa.relax_passes.exec_plan import DataflowGraph, peak_of
from tvm_dsa.relax_passes.concrete import instantiate, planning_graph, without_views
from tvm_dsa.kernelgen.symbolic import is_dynamic
from tvm_dsa.relax_passes.rdp_fusion import count_kernels

warnings.filterwarnings("ignore", module="tvm.relax.frontend.onnx")


def _fused(name):
    with tvm.target.Target("dsa/stcp920"):
        return fuse(from_onnx(DYNAMIC[name](), keep_params_in_input=False))


def test_contracted_view_keeps_what_it_views_alive():
    """0 -> view 1 -> 2, and 0 -> 3: the view allocates nothing, and 0 stays live until 2 ran."""
    g = DataflowGraph((100, 100, 10, 10), ((), (0,), (1,), (0,)), frozenset({2, 3}))
    h = without_views(g, {1})
    assert h.sizes == (100, 10, 10) and h.inputs == ((), (0,), (0,)) and h.outputs == frozenset({1, 2})
    # peak by brute force over the contracted graph's orders equals the direct count: 0 live with both outputs
    assert min(peak_of(h, order) for order in [(0, 1, 2), (0, 2, 1)]) == 120


def test_a_view_of_a_graph_input_reads_nothing():
    g = DataflowGraph((8, 16), ((), (0,)))
    assert without_views(g, {0}).inputs == ((),)


def test_skipnet_instances_per_decision():
    """skipnet's two gates: the first runs a residual block (two convolutions) or nothing, the
    second a strided convolution or an average pool. Each instance is static and plans; running a
    block costs kernels and bytes that skipping it does not."""
    fused = _fused("skipnet")
    sizes = {"batch": 2, "height": 15, "width": 11}
    graphs = {d: planning_graph(instantiate(fused, sizes, d)) for d in itertools.product((True, False), repeat=2)}
    for d, g in graphs.items():
        assert not is_dynamic(instantiate(fused, sizes, d))
    assert len(graphs[True, True].sizes) > len(graphs[False, True].sizes)
    assert sum(graphs[True, True].sizes) > sum(graphs[False, True].sizes)
    # the second gate's two ways differ in the spatial size: conv (h-1)//2+1 = 8, pool h//2 = 7
    last_conv, last_pool = graphs[True, True], graphs[True, False]
    assert 2 * 8 * 8 * 6 * 4 in last_conv.sizes and 2 * 8 * 7 * 5 * 4 in last_pool.sizes


def test_decisions_must_match_the_ifs():
    fused = _fused("skipnet")
    with pytest.raises(ValueError, match="more If nodes than decisions"):
        instantiate(fused, {"batch": 1, "height": 8, "width": 8}, (True,))
    with pytest.raises(ValueError, match="1 decisions left over"):
        instantiate(fused, {"batch": 1, "height": 8, "width": 8}, (True, True, False))


def test_bert_instance_counts_like_the_symbolic_module():
    """bert: the graph has one op per kernel and their bytes, as count_kernels counts them on the
    symbolic module at the same sizes."""
    fused, sizes = _fused("bert"), {"batch": 2, "seq": 16}
    g = planning_graph(instantiate(fused, sizes))
    count = count_kernels(fused, sizes)
    assert (len(g.sizes), sum(g.sizes)) == (count.layers, count.intermediate_bytes)
