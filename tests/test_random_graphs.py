"""Random ONNX graphs (``tvm_dsa.models.random_graphs``) on the DSA under every schedule against
onnxruntime, and hand-built graphs for defects they found.

Every graph must (a) give onnxruntime's values within the fp16 tolerance, (b) compile and run
without an exception, (c) run every kernel on the DSA as its schedule planned it: no kernel on the
host, no SET tree or stitched sub-graph run layer by layer instead (``random_graphs.fallbacks``),
but by design (``random_graphs.ON_PURPOSE``: pure reshapes are host views; a float32 tensor's
layers run one kernel each) or for a known defect (``KNOWN_FALLBACKS`` below, each with a
regression test whose placement assertion is a strict xfail: when the compiler is fixed it
passes, fails as XPASS, and its entry here goes). Values and exceptions are never xfailed.
"""

from __future__ import annotations

import functools
import re

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tvm_dsa.models import GraphBuilder
from tvm_dsa.models.random_graphs import KINDS, blocks, op_types, random_graph, random_inputs
from tvm_dsa.harness.random_graphs import SCHEDULES, TOLERANCE, DsaRun, fallbacks, onnxruntime_outputs

#: fallbacks (``random_graphs.fallbacks``) of ops the DSA supports, known and not fixed yet:
#: reason pattern -> the regressions whose ``test_regression_runs_on_dsa`` xfails (strictly) on it
KNOWN_FALLBACKS: dict = {}


def known(reason: str) -> bool:
    """Whether a fallback's ``reason`` is a known defect (``KNOWN_FALLBACKS``)."""
    return any(re.search(pattern, reason) for pattern in KNOWN_FALLBACKS)


def check(model, schedule: str, feeds: dict | None = None) -> dict:
    """Run ``model`` under ``schedule`` and onnxruntime; assert (a) and (b); returns the
    fallbacks (kernel name -> reason) for (c)."""
    feeds = feeds if feeds is not None else random_inputs(model)
    reference = onnxruntime_outputs(model, feeds)
    run = DsaRun.of(model, feeds, schedule)
    error = run.error(reference)
    assert error <= TOLERANCE, f"{schedule}: max |dsa - onnxruntime| / max |onnxruntime| = {error:.3g}"
    return fallbacks(run.offload)


# ------------------------------------------------------------------------ property tests
def test_generator_is_seeded_valid_and_covers_the_blocks():
    """The same seed gives the same model; every graph passes onnx.checker (in random_graph) and
    runs on onnxruntime to finite values; the first graphs use every op type of the blocks."""
    assert random_graph(3, "any").SerializeToString() == random_graph(3, "any").SerializeToString()
    assert random_graph(3, "cnn").SerializeToString() != random_graph(4, "cnn").SerializeToString()
    ops = set()
    for seed in range(40):
        for kind in KINDS:
            model = random_graph(seed, kind)
            ops.update(op_types(model))
            assert blocks(model)
            assert all(np.isfinite(out).all() for out in onnxruntime_outputs(model, random_inputs(model)))
    assert ops >= {"Conv", "BatchNormalization", "Relu", "LeakyRelu", "Clip", "HardSigmoid", "Sigmoid", "Tanh",
                   "MaxPool", "AveragePool", "GlobalAveragePool", "Add", "Concat", "ConvTranspose", "Mul", "Sub",
                   "Div", "MatMul", "Gemm", "LayerNormalization", "Softmax", "Transpose", "Reshape", "Erf",
                   "ReduceMean", "Pow", "Sqrt"}


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@settings(max_examples=10, deadline=None, derandomize=True, database=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), kind=st.sampled_from(KINDS))
def test_random_graph_on_dsa_matches_onnxruntime(schedule, seed, kind):
    """(a), (b) and (c) of the module docstring for random graphs of every kind (the same seeds
    under every schedule: derandomized, no shrinking: a failure names its graph)."""
    host = check(random_graph(seed, kind), schedule)
    assert not {name: why for name, why in host.items() if not known(why)}, \
        f"kernels of supported ops not on the DSA as scheduled (random_graph({seed}, {kind!r}))"


# -------------------------------------------------------------------- regression graphs
def _model(build) -> onnx.ModelProto:
    """The model whose outputs ``build(GraphBuilder)`` returns."""
    b = GraphBuilder("regression", seed=0)
    for out in build(b):
        b.output(out)
    return b.build()


def _conv(b: GraphBuilder, x: str, cin: int, cout: int, kernel: int = 3, **kw) -> str:
    """A Conv padded to keep the spatial shape (``GraphBuilder.conv``'s other arguments in ``kw``)."""
    return b.conv(x, cin, cout, kernel, padding=kw.pop("padding", kernel // 2), **kw)


def same_input_twice(op: str):
    """``op(x, x)`` and ``op(a, b)`` of one shape as two outputs: TVM gives both one PrimFunc,
    whose two parameters share a name (the DSA computed ``b op b`` for the second)."""
    shape = [8, 8] if op == "MatMul" else [2, 3, 4, 5]
    return _model(lambda b: [b.op(op, [b.input("x", shape)] * 2), b.op(op, [b.input("a", shape), b.input("b", shape)])])


def residual_one_conv(b):
    """``Relu(x + Conv(x))``, a 3x3 Conv with bias: the residual Add fused into the conv."""
    x = b.input("x", [1, 8, 8, 8])
    return [b.relu(b.add(x, _conv(b, x, 8, 8, bias=True)))]


def residual_grouped_conv(b):
    """``x + Conv(x)``, a 1x1 Conv in 2 groups (random graphs: seeds 10, 295)."""
    x = b.input("x", [1, 4, 6, 6])
    return [b.add(x, _conv(b, x, 4, 4, kernel=1, groups=2))]


def avgpool_exclude_pad(b):
    """AveragePool 3x3 / 2, pads 1, ``count_include_pad=0``: border windows divide by fewer elements."""
    x = b.input("x", [1, 4, 8, 8])
    return [b.op("AveragePool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=0)]


def conv_then(activation: str):
    """A 3x3 Conv followed by ``activation`` (fused into the conv's kernel)."""
    def build(b):
        y = _conv(b, b.input("x", [1, 4, 8, 8]), 4, 8)
        if activation == "LeakyRelu":
            return [b.op("LeakyRelu", [y], alpha=0.1)]
        if activation == "HardSigmoid":
            return [b.op("HardSigmoid", [y], alpha=0.2, beta=0.5)]
        return [b.op("Clip", [y, b.const(np.float32(-0.5), "min"), b.const(np.float32(1.0), "max")])]
    return build


def grouped_conv_relu(b):
    """A 3x3 Conv in 2 groups + Relu."""
    return [b.relu(_conv(b, b.input("x", [1, 8, 8, 8]), 8, 8, groups=2))]


def conv_transpose(stride: int):
    """ConvTranspose 2x2 / 1 (8x8 -> 9x9), or 3x3 / 2 with pads 1, output_padding 1 and a bias
    (8x8 -> 16x16)."""
    def build(b):
        x, k = b.input("x", [1, 4, 8, 8]), 1 + stride
        inputs = [x, b.param("w", [4, 8, k, k], 1 / (2 * k))] + ([b.param("bias", [8], 0.1)] if stride == 2 else [])
        return [b.op("ConvTranspose", inputs, kernel_shape=[k, k], strides=[stride] * 2, pads=[stride - 1] * 4,
                     output_padding=[stride - 1] * 2)]
    return build


def conv_transpose_asymmetric(b):
    """ConvTranspose 2x2 / 2 with one pad, at the end of the width (6x6 -> 12x11; random graphs:
    seed 176)."""
    x = b.input("x", [1, 4, 6, 6])
    return [b.op("ConvTranspose", [x, b.param("w", [4, 8, 2, 2], 0.25)], kernel_shape=[2, 2], strides=[2, 2],
                 pads=[0, 0, 0, 1])]


def conv_transpose_grouped_sliced(b):
    """ConvTranspose 2x2 / 2 in 2 groups with pads 1 and an output padding along the width (8x8 ->
    14x15): a grouped convolution of 15x15 whose rows are sliced to 14. Dealt to the cores in row
    tiles of 5, the slice had a partial last tile, and the kernel ran on the host (random graphs:
    seed 575)."""
    x = b.input("x", [1, 8, 8, 8])
    return [b.op("ConvTranspose", [x, b.param("w", [8, 2, 2, 2], 0.25)], kernel_shape=[2, 2], strides=[2, 2],
                 pads=[1, 1, 1, 1], output_padding=[0, 1], group=2)]


def concat_after_elementwise(b):
    """Concat (channels) of Relu(x), Sigmoid(x) and x * 2."""
    x = b.input("x", [1, 4, 8, 8])
    return [b.concat([b.relu(x), b.sigmoid(x), b.scale(x, 2.0)], axis=1)]


def concat_of_normalised(b):
    """Concat (channels) of HardSigmoid(y) and Tanh(y), y = BatchNormalization(x), all in one
    kernel (random graphs: seed 49)."""
    y = b.batchnorm(b.input("x", [1, 4, 8, 8]), 4)
    return [b.concat([b.op("HardSigmoid", [y]), b.op("Tanh", [y])], axis=1)]


def concat_same_tensor_twice(b):
    """``Concat(r, r)``, ``r = Relu(x)`` computed in the same kernel (random graphs: seed 185)."""
    r = b.relu(b.input("x", [1, 4, 8, 8]))
    return [b.concat([r, r], axis=1)]


def concat_thrice_then_pool(b):
    """MaxPool, ConvTranspose 2x2 / 2, Concat of its output three times, AveragePool, the classifier
    (GlobalAveragePool, Flatten, Gemm), stitched: a layer replayed from an earlier one reads one
    region as three parameters, and the replica listed its move three times, which the program
    format rejects (random graphs: seed 515)."""
    x = b.maxpool(b.input("x", [2, 8, 6, 6]), 2, 2)
    t = b.op("ConvTranspose", [x, b.param("w", [8, 8, 2, 2], 0.25)], kernel_shape=[2, 2], strides=[2, 2],
             pads=[1, 1, 0, 0])
    c = b.concat([t, t, t], axis=1)
    p = b.op("AveragePool", [c], kernel_shape=[2, 2], pads=[0, 1, 1, 1], strides=[1, 1])
    return [b.gemm(b.gap_flatten(p), 24, 10)]


def concat_of_square_and_fp16(b):
    """Concat (channels) of ``a * a`` (kept in float32), ``a`` and a grouped 1x1 Conv of ``a``, then
    the classifier: the concatenation is a kernel of its own whose output is kept wide too, and
    its fp16 inputs are converted on the way from DDR to DDR (a vector instruction wrote DDR, and
    the kernel ran on the host; random graphs: seeds 585, 33)."""
    x = b.input("x", [1, 3, 8, 8])
    a = b.add(b.relu(_conv(b, x, 3, 3, kernel=1)), x)
    c = b.concat([b.mul(a, a), a, _conv(b, a, 3, 3, kernel=1, groups=3)], axis=1)
    return [x, b.gemm(b.gap_flatten(c), 9, 10)]


def square_then(op: str):
    """``x * x``, kept in float32 (docs/numerics.md), into a MatMul or a 3x3 Conv (random graphs:
    seeds 297, 146)."""
    def build(b):
        if op == "MatMul":
            x = b.input("x", [2, 7, 8])
            return [b.op("MatMul", [b.mul(x, x), b.param("w", [8, 8], 0.35)])]
        x = b.input("x", [1, 8, 8, 8])
        return [_conv(b, b.mul(x, x), 8, 8, gain=1.0)]
    return build


REGRESSIONS = {
    **{f"same_input_twice_{op}": functools.partial(same_input_twice, op) for op in ("Mul", "Add", "Sub", "Div",
                                                                                     "MatMul")},
    **{f.__name__: functools.partial(_model, f) for f in (residual_one_conv, residual_grouped_conv,
                                                         avgpool_exclude_pad)},
    **{f"conv_then_{act}": functools.partial(_model, conv_then(act)) for act in ("LeakyRelu", "Clip", "HardSigmoid")},
    "grouped_conv_relu": functools.partial(_model, grouped_conv_relu),
    **{f"conv_transpose_s{s}": functools.partial(_model, conv_transpose(s)) for s in (1, 2)},
    **{f.__name__: functools.partial(_model, f) for f in (conv_transpose_asymmetric, conv_transpose_grouped_sliced,
                                                         concat_after_elementwise,
                                                         concat_of_normalised, concat_same_tensor_twice,
                                                         concat_thrice_then_pool, concat_of_square_and_fp16)},
    "square_then_matmul": functools.partial(_model, square_then("MatMul")),
    "square_then_conv": functools.partial(_model, square_then("Conv")),
    # Concat(x + Relu(x), x, x), BatchNorm, ConvTranspose, pools, Gemm: under set, a layer's tiles
    # from its intra-layer partition left their region, and the whole tree ran layer by layer
    "random_graph_77": functools.partial(random_graph, 77, "any"),
    # a kernel (multiply, concatenate, sigmoid, subtract) whose producer is computed on its
    # consumer's padded window: the load of a parameter past its edge was refused ("access to x
    # leaves its region") and the kernel ran on the host under layerwise and graphturbo; the part
    # outside is now zero-filled (``kernel.ir._Reader.guard``)
    "random_graph_1154": functools.partial(random_graph, 1154, "any"),
    # Add, Sub, ConvTranspose, MaxPool, ConvTranspose, Relu: under set, a transposed convolution's
    # tile past the output's rows writes nothing, and its invocation was looked up at sample -1
    # (a KeyError): the tree ran layer by layer; such a tile is now in no invocation
    "random_graph_2074": functools.partial(random_graph, 2074, "any"),
}

#: regression -> (the schedules under which it falls back now, why)
ALL = tuple(SCHEDULES)
LAYER_BY_LAYER = ("graphturbo", "set")  # a stitched sub-graph or SET tree that does not build
FALLING_BACK_NOW: dict = {}


def pair(name: str, schedule: str, *marks):
    """The parameters of a regression's two tests, which share ``regression_fallbacks``: in one
    xdist group, so that one worker runs both and checks the regression once."""
    return pytest.param(name, schedule, marks=(pytest.mark.xdist_group(f"regression-{name}-{schedule}"), *marks))


@functools.cache
def regression_fallbacks(name: str, schedule: str) -> dict:
    """Check regression ``name`` under ``schedule`` once for both tests: (a) and (b) asserted, the
    fallbacks returned."""
    model = REGRESSIONS[name]()
    feeds = None
    if name.startswith("same_input_twice"):  # away from zero: the Div
        rng = np.random.default_rng(0)
        feeds = {i.name: rng.uniform(0.5, 1.5, [d.dim_value for d in i.type.tensor_type.shape.dim]).astype("float32")
                 for i in model.graph.input}
    return check(model, schedule, feeds)


@pytest.mark.parametrize("name, schedule", [pair(name, schedule) for name in REGRESSIONS for schedule in SCHEDULES])
def test_regression_values(name, schedule):
    """(a) and (b): never xfailed."""
    regression_fallbacks(name, schedule)


@pytest.mark.parametrize("name, schedule", [
    pair(name, schedule, *([pytest.mark.xfail(strict=True, reason=FALLING_BACK_NOW[name][1])]
                           if schedule in FALLING_BACK_NOW.get(name, ((),))[0] else []))
    for name in REGRESSIONS for schedule in SCHEDULES])
def test_regression_runs_on_dsa(name, schedule):
    """(c): a strict xfail where ``FALLING_BACK_NOW`` says the regression falls back now."""
    assert regression_fallbacks(name, schedule) == {}
