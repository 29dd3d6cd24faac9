"""A depthwise convolution or an elementwise layer and the pointwise convolution reading it as one
kernel (``kernelgen.blocks.FuseSeparableBlocks``): found where the first one's result has no other
reader, lowered with the pointwise convolution as the anchor and the first one computed per chunk
of its channels (a depthwise one on the vector units of a floating-point MME), kept where it times
faster, and computing the model as llvm does, under every schedule that fuses."""

import math

import numpy as np
import pytest
import tvm
import tvm_ffi
from helpers import random_args, run_llvm
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh
from onnx import shape_inference
from tvm import relax

from tvm_dsa import hardware, isa
from tvm_dsa.emit.emitter import build_program
from tvm_dsa.harness import Compiled, import_onnx, max_relative_error
from tvm_dsa.kernel.attrs import VECTOR_CONTRACTION
from tvm_dsa.kernel.ir import Read, read_kernel, stages_of
from tvm_dsa.kernel.macs import kernel_macs
from tvm_dsa.kernelgen.blocks import CALL_TIR, FuseSeparableBlocks, fused_function, pairs
from tvm_dsa.models import example_inputs
from tvm_dsa.models.cnn import mobilenet_v2
from tvm_dsa.relax_passes.fusion import fuse
from tvm_dsa.runtime import simulate
from tvm_dsa.tiling import lower_kernel
from tvm_dsa.tir_passes import lower_with_plan
from tvm_dsa.tir_passes.tile import TilePlan, anchor_info, on_vector_units

TARGET = "dsa/stcp920"
HW = hardware.get(TARGET)
# a stride-1 block (t = 1: depthwise, pointwise), a stride-2 expansion, a residual block
SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2)]


@pytest.fixture(scope="module")
def model():
    return mobilenet_v2(batch=2, image=32, settings=SETTINGS, num_classes=10)


@pytest.fixture(scope="module")
def fused_mod(model):
    with tvm.target.Target("llvm"):
        return fuse(import_onnx(model))


def _depthwise_macs(model) -> int:
    """The depthwise convolutions' MACs, from the graph: one per output element and tap."""
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in
              shape_inference.infer_shapes(model).graph.value_info}
    inits = {i.name: i for i in model.graph.initializer}
    total = 0
    for node in model.graph.node:
        group = [a.i for a in node.attribute if a.name == "group"]
        if node.op_type == "Conv" and group and group[0] > 1:
            w = nh.to_array(inits[node.input[1]])
            total += math.prod(shapes[node.output[0]]) * w.shape[2] * w.shape[3]
    return total


def test_pairs_are_a_depthwise_convolution_and_the_pointwise_one_reading_it(model, fused_mod):
    found = pairs(fused_mod)
    # one per block: three blocks, each a depthwise then a pointwise projection
    assert len(found) == sum(n for _, _, n, _ in SETTINGS)
    for dw, pw in found:
        assert pw.value.args[1].fields[0].same_as(dw.var)
        dwi, pwi = (anchor_info(fused_mod[b.value.args[0]]) for b in (dw, pw))
        assert "N" not in dwi.roles and dwi.reduction[0] == 1
        assert "N" in pwi.roles and pwi.reduction[1:] == (1, 1)


def _two_convs(c: int, multiplier: int, n: int, readers: int = 1, stride: int = 1, batch: int = 2):
    """x -> a depthwise 3 x 3 convolution of ``multiplier`` outputs per channel (padded, biased)
    -> ``readers`` 1 x 1 convolutions of it (of ``stride``), for ``batch`` samples."""
    rng = np.random.default_rng(0)
    weight = lambda name, *shape: nh.from_array(rng.standard_normal(shape).astype("float32"), name)  # noqa: E731
    m = c * multiplier
    inits = [weight("wd", m, 1, 3, 3), weight("bd", m)] + [weight(f"w{k}", c + k, m, 1, 1) for k in range(readers)]
    nodes = [h.make_node("Conv", ["x", "wd", "bd"], ["d"], group=c, pads=[1, 1, 1, 1])]
    nodes += [h.make_node("Conv", ["d", f"w{k}"], [f"y{k}"], strides=[stride, stride]) for k in range(readers)]
    graph = h.make_graph(nodes, "two_convs", [h.make_tensor_value_info("x", TP.FLOAT, [batch, c, n, n])],
                         [h.make_tensor_value_info(f"y{k}", TP.FLOAT, [batch, c + k, -(-n // stride), -(-n // stride)])
                          for k in range(readers)],
                         inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=10)


def test_a_depthwise_result_read_twice_is_not_fused():
    """Two pointwise convolutions read one depthwise result: fusing one would compute it twice."""
    with tvm.target.Target("llvm"):
        assert pairs(fuse(import_onnx(_two_convs(8, 1, 6, readers=2)))) == []


def test_a_depthwise_convolution_of_two_outputs_per_channel_computes_fused_or_apart():
    """Each input channel feeds two depthwise outputs (a channel multiplier: no N loop, the
    weights indexed by the output channel). Its fused kernel's program computes the pair as llvm
    does; the pass fuses it only if that times faster, and the model computes either way."""
    model = _two_convs(8, 2, 10)
    with tvm.target.Target("llvm"):
        fused_mod = fuse(import_onnx(model))
    (pair,) = pairs(fused_mod)
    func, *_ = fused_function(fused_mod, pair, HW)
    _simulates_like_llvm(func)
    mod, inputs = import_onnx(model), example_inputs(model)
    compiled = Compiled.build(mod, TARGET, schedule="layerwise")
    (block,) = compiled.offload.blocks
    assert (_name_of(block) in compiled.offload.dsa) == (block.fused_cycles < block.parts_cycles)
    assert compiled.offload.host_macs == 0
    reference = Compiled.build(mod, "llvm").run(inputs).outputs
    assert max_relative_error(compiled.run(inputs).outputs, reference) < 2e-3


@pytest.mark.parametrize("schedule", ["layerwise", "graphturbo"])
def test_a_pair_whose_fused_kernel_does_not_lower_stays_apart(schedule):
    """A 1 x 1 convolution of stride 2 reads every other depthwise output. The plans a stitched
    kernel times for the fused kernel make TVM refuse to split its tiles' depthwise sums off
    (``decompose_reduction``), so under graphturbo the pair is not fused; random graph 1635 stopped
    the compile there before. Layer by layer it fuses. Either way the model computes as llvm does.
    (With fewer samples than clusters a stitched kernel keeps the search's tiles, and so does the
    timing: as many as clusters here.)"""
    model = _two_convs(4, 1, 6, stride=2, batch=HW.clusters)
    with tvm.target.Target("llvm"):
        assert len(pairs(fuse(import_onnx(model)))) == 1
    mod, inputs = import_onnx(model), example_inputs(model)
    compiled = Compiled.build(mod, TARGET, schedule=schedule)
    if schedule == "graphturbo":
        assert compiled.offload.blocks == []
    assert compiled.offload.host_macs == 0
    reference = Compiled.build(mod, "llvm").run(inputs).outputs
    assert max_relative_error(compiled.run(inputs).outputs, reference) < 2e-3


def _name_of(block) -> str:
    return f"{block.producer}_{block.consumer.removeprefix('fused_')}"


def _simulates_like_llvm(func):
    """The program of ``func`` as ``lower_kernel`` tiles it, simulated, against ``func`` on llvm."""
    program = build_program(lower_kernel(func, HW)[0], HW, "block")
    isa.validate(program)
    arrays = random_args(func, np.random.default_rng(2))
    (out,) = simulate(program, arrays[:-1]).outputs
    ref = run_llvm(func, arrays)
    np.testing.assert_allclose(out, ref, rtol=1e-2, atol=5e-3 * np.abs(ref).max())  # fp16 storage


def test_the_fused_kernel_lowers_to_tir_that_computes_the_pair(fused_mod):
    """The lowered fused PrimFunc (its stages marked, still TIR) against the pair on llvm, for each
    pair (the depthwise contraction under the pointwise one's chunk loop, on the vector units, its
    sums started afresh in each chunk), and its program simulated."""
    for pair in pairs(fused_mod):
        func, *_ = fused_function(fused_mod, pair, HW)
        info = anchor_info(func)
        assert info.producers == 1 and info.whole == {i for i, r in enumerate(info.roles) if r == "N"}
        n = next(i for i, r in enumerate(info.roles) if r == "N")
        tiles = tuple(info.spatial[i] if i == n else 1 for i in range(len(info.spatial)))
        lowered = lower_with_plan(func, TilePlan(tiles, 16))
        assert not on_vector_units(lowered)  # the anchor runs on the MME
        stages = read_kernel(lowered).stages()
        assert {s.op for s in stages if s.name.startswith("group_conv2d")} == {"reduce"}
        assert kernel_macs(func, VECTOR_CONTRACTION) == kernel_macs(fused_mod[pair[0].value.args[0]])
        arrays = random_args(func, np.random.default_rng(1))
        outs = [run_llvm(f, arrays) for f in (func, lowered)]
        np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-5)
        _simulates_like_llvm(func)


def test_a_pair_is_fused_where_its_kernel_times_faster(fused_mod):
    decided = []
    out = FuseSeparableBlocks(HW, True, decided)(fused_mod)
    assert len(decided) == len(pairs(fused_mod))
    called = {c.args[0].name_hint for c in _calls(out["main"])}
    for b in decided:
        fused = b.fused_cycles < b.parts_cycles
        assert (_name_of(b) in called) == fused
        assert (b.producer in called) != fused
    # a small MobileNetV2's blocks fuse: a kernel launch or a layer change fewer each
    assert all(b.fused_cycles < b.parts_cycles for b in decided)


@pytest.mark.parametrize("schedule", ["layerwise", "graphturbo"])
def test_fused_blocks_compute_the_model_with_their_depthwise_macs_on_the_vector_units(model, fused_mod, schedule):
    mod, inputs = import_onnx(model), example_inputs(model)
    compiled = Compiled.build(mod, TARGET, schedule=schedule)
    result = compiled.offload
    fused = [b for b in result.blocks if b.fused_cycles < b.parts_cycles]
    total = sum(kernel_macs(f) for f in fused_mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc))
    assert result.host_macs == 0 and result.dsa_macs == total
    # a fused block's depthwise MACs on the VME; unfused depthwise layers on the VME too only
    # where a stitched kernel times them faster there
    fused_dw = sum(kernel_macs(fused_mod[b.producer]) for b in fused)
    assert fused_dw > 0
    if schedule == "layerwise":
        assert result.vector_macs == fused_dw
    else:
        assert fused_dw <= result.vector_macs <= _depthwise_macs(model)
    reference = Compiled.build(mod, "llvm").run(inputs).outputs
    assert max_relative_error(compiled.run(inputs).outputs, reference) < 2e-3


def _calls(func):
    found = []
    tvm_ffi.structural_walk(func.body, [(relax.Call, lambda c: found.append(c) if c.op.same_as(CALL_TIR) else None)])
    return found


def _norm_then_conv(c: int, n: int, readers: int = 1, transpose: bool = False, batch: int = HW.clusters):
    """x -> batch norm -> ReLU (DenseNet's pre-activation; ``transpose``: then H and W swapped)
    -> ``readers`` 1 x 1 convolutions of it, for ``batch`` samples."""
    rng = np.random.default_rng(0)
    array = lambda name, a: nh.from_array(a.astype("float32"), name)  # noqa: E731
    inits = [array("g", rng.standard_normal(c)), array("b", rng.standard_normal(c)),
             array("m", rng.standard_normal(c)), array("v", rng.random(c) + 0.5)]
    inits += [array(f"w{k}", rng.standard_normal((16 + k, c, 1, 1))) for k in range(readers)]
    nodes = [h.make_node("BatchNormalization", ["x", "g", "b", "m", "v"], ["bn"]), h.make_node("Relu", ["bn"], ["r"])]
    if transpose:
        nodes.append(h.make_node("Transpose", ["r"], ["t"], perm=[0, 1, 3, 2]))
    nodes += [h.make_node("Conv", ["t" if transpose else "r", f"w{k}"], [f"y{k}"]) for k in range(readers)]
    graph = h.make_graph(nodes, "norm_then_conv", [h.make_tensor_value_info("x", TP.FLOAT, [batch, c, n, n])],
                         [h.make_tensor_value_info(f"y{k}", TP.FLOAT, [batch, 16 + k, n, n]) for k in range(readers)],
                         inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=10)


def test_an_elementwise_layer_before_a_pointwise_convolution_is_a_pair_only_alone_and_untransposed():
    """A batch norm + ReLU read by one 1 x 1 convolution is a pair; read by two, or through a
    transpose (not elementwise: TVM fuses it into the norm's kernel), it is not."""
    with tvm.target.Target("llvm"):
        (pair,) = pairs(fuse(import_onnx(_norm_then_conv(24, 8))))
        assert pairs(fuse(import_onnx(_norm_then_conv(24, 8, readers=2)))) == []
        assert pairs(fuse(import_onnx(_norm_then_conv(24, 8, transpose=True)))) == []


@pytest.mark.parametrize("schedule", ["layerwise", "graphturbo"])
def test_a_norm_fused_into_a_pointwise_convolution_computes_the_model(schedule):
    """The norm's chunk of channels is computed in the LB under the convolution's chunk loop: the
    fused kernel's program computes what llvm does, the pass keeps it where it times faster, and
    the model computes as llvm does. Under graphturbo with fewer samples than clusters (a
    sample's rows split over the clusters) the pair is decided and computes the same way."""
    if schedule == "graphturbo":
        _one_pair_computes(_norm_then_conv(48, 14, batch=HW.clusters - 1), schedule)
    model = _norm_then_conv(48, 14)
    with tvm.target.Target("llvm"):
        fused_mod = fuse(import_onnx(model))
    (pair,) = pairs(fused_mod)
    func, *_ = fused_function(fused_mod, pair, HW)
    program = build_program(lower_kernel(func, HW)[0], HW, "block")
    isa.validate(program)
    arrays = random_args(func, np.random.default_rng(2))
    arrays[2] = np.abs(arrays[2]) + 0.5  # the norm's divisor, a standard deviation
    (out,) = simulate(program, arrays[:-1]).outputs
    ref = run_llvm(func, arrays)
    np.testing.assert_allclose(out, ref, rtol=1e-2, atol=5e-3 * np.abs(ref).max())
    _one_pair_computes(model, schedule)


def _attention(batch: int = 2, seq: int = 16, heads: int = 2, width: int = 32):
    """Self-attention as an exporter writes it: the projections' results split into heads
    (Reshape, Transpose; the keys transposed for their product), softmax, the heads joined back
    (Transpose, Reshape) for the output projection."""
    rng = np.random.default_rng(0)
    dh = width // heads
    inits = [nh.from_array((rng.standard_normal((width, width)) / width ** 0.5).astype("float32"), f"w{p}")
             for p in "qkvo"]
    inits += [nh.from_array(np.array([batch, seq, heads, dh], "int64"), "split"),
              nh.from_array(np.array([batch, seq, width], "int64"), "join")]
    nodes = [h.make_node("MatMul", ["x", f"w{p}"], [p]) for p in "qkv"]
    nodes += [h.make_node("Reshape", [p, "split"], [f"{p}4"]) for p in "qkv"]
    nodes += [h.make_node("Transpose", ["q4"], ["qh"], perm=[0, 2, 1, 3]),
              h.make_node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
              h.make_node("Transpose", ["v4"], ["vh"], perm=[0, 2, 1, 3]),
              h.make_node("MatMul", ["qh", "kt"], ["s"]), h.make_node("Softmax", ["s"], ["p"], axis=-1),
              h.make_node("MatMul", ["p", "vh"], ["a"]), h.make_node("Transpose", ["a"], ["at"], perm=[0, 2, 1, 3]),
              h.make_node("Reshape", ["at", "join"], ["j"]), h.make_node("MatMul", ["j", "wo"], ["y"])]
    graph = h.make_graph(nodes, "attention", [h.make_tensor_value_info("x", TP.FLOAT, [batch, seq, width])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [batch, seq, width])], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=10)


def test_layout_copies_pair_with_the_contraction_reading_them():
    """The heads' splits (a reshape and transpose each) pair with the products reading them, the
    join with the output projection; the projections' pure reshapes alone would be views, and
    a copy two kernels read stays apart."""
    with tvm.target.Target("llvm"):
        fused_mod = fuse(import_onnx(_attention()))
    found = pairs(fused_mod)
    assert len(found) == 4  # queries and keys -> their product, values -> theirs, the join -> the projection
    for copy, consumer in found:
        assert sum(a.same_as(copy.var) for a in consumer.value.args[1].fields) == 1
        assert anchor_info(fused_mod[consumer.value.args[0]]).kind.kind == "mme"
        assert not relax.analysis.has_reshape_pattern(fused_mod[copy.value.args[0]])


@pytest.mark.parametrize("schedule", ["layerwise", "graphturbo"])
def test_layout_copies_folded_into_their_contractions_compute_the_model(schedule):
    """Each pair timed faster is one kernel whose tiles load through the copy's indices; a product
    reading two copies takes one a round (the keys' once the queries' is in), so where all are
    faster no copy kernel is left; the model computes as llvm does."""
    model = _attention()
    with tvm.target.Target("llvm"):
        fused_mod = fuse(import_onnx(model))
    copies = {c.value.args[0].name_hint for c, _ in pairs(fused_mod)}
    decided = []
    with tvm.target.Target("llvm"):
        out = FuseSeparableBlocks(HW, schedule == "graphturbo", decided)(fused_mod)
    assert {b.producer for b in decided} == copies and len(decided) == 4
    called = {c.args[0].name_hint for c in _calls(out["main"])}
    for b in decided:
        assert (b.producer in called) == (b.fused_cycles >= b.parts_cycles)
    mod, inputs = import_onnx(model), example_inputs(model)
    compiled = Compiled.build(mod, TARGET, schedule=schedule)
    assert compiled.offload.host_macs == 0
    reference = Compiled.build(mod, "llvm").run(inputs).outputs
    assert max_relative_error(compiled.run(inputs).outputs, reference) < 2e-3


def _conv1d_block(batch: int = HW.clusters, c: int = 16, n: int = 32, taps: int = 7):
    """x -> a depthwise 1-D convolution of ``taps`` (padded, biased; Conformer's convolution
    module) -> a pointwise 1-D convolution to ``c + 8`` channels."""
    rng = np.random.default_rng(0)
    weight = lambda name, *shape: nh.from_array(rng.standard_normal(shape).astype("float32"), name)  # noqa: E731
    inits = [weight("wd", c, 1, taps), weight("bd", c), weight("wp", c + 8, c, 1)]
    nodes = [h.make_node("Conv", ["x", "wd", "bd"], ["d"], group=c, pads=[taps // 2, taps // 2]),
             h.make_node("Conv", ["d", "wp"], ["y"])]
    graph = h.make_graph(nodes, "conv1d_block", [h.make_tensor_value_info("x", TP.FLOAT, [batch, c, n])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [batch, c + 8, n])], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=10)


@pytest.mark.parametrize("schedule", ["layerwise", "graphturbo"])
def test_a_1d_depthwise_convolution_and_the_pointwise_one_after_it_are_a_pair(schedule):
    """A 1-D convolution reduces its channels and one window dim: a depthwise one (one channel, a
    window of taps) and a pointwise one (all channels, a window of 1) pair as 2-D ones do, and
    the model computes as llvm does whichever way the timing decides."""
    model = _conv1d_block()
    with tvm.target.Target("llvm"):
        fused_mod = fuse(import_onnx(model))
    (pair,) = pairs(fused_mod)
    assert [anchor_info(fused_mod[b.value.args[0]]).reduction for b in pair] == [(1, 7), (16, 1)]
    _one_pair_computes(model, schedule)


def _one_pair_computes(model, schedule: str) -> None:
    """``model``, of one pair, compiled for ``schedule``: one layer where the pair timed faster
    fused, else two (kernels, or a stitched kernel's layers), all on the DSA, computing as llvm."""
    mod, inputs = import_onnx(model), example_inputs(model)
    compiled = Compiled.build(mod, TARGET, schedule=schedule)
    (block,) = compiled.offload.blocks
    run = compiled.run(inputs)
    layers = {L.name for k in run.kernels for pk in k.program.kernels for L in pk.layers if L.shape}
    assert len(layers) == (1 if block.fused_cycles < block.parts_cycles else 2)
    assert compiled.offload.host_macs == 0
    reference = Compiled.build(mod, "llvm").run(inputs).outputs
    assert max_relative_error(run.outputs, reference) < 2e-3


def test_weights_every_tile_reads_alike_are_loaded_once_a_core(fused_mod):
    """The stride-2 block's pair (a depthwise convolution of 96 channels, the pointwise one to 24)
    in tiles of two output rows and chunks of 16 channels, every tile on one core: each chunk of
    each tile loads its share of the depthwise weights, their bias and the pointwise weights.
    With ``TilePlan.resident`` those copies move out of the chunk loop and hold the whole
    weights, which the core loads once (its later tiles find them in its LB), while the input
    is still loaded per chunk of each tile; both programs compute the pair as llvm does, the
    resident one in fewer cycles from the GB (the loads it saves are DMA set-ups)."""
    pair = next(p for p in pairs(fused_mod) if int(p[0].var.ty.shape[1]) == 96)
    func, *_ = fused_function(fused_mod, pair, HW)
    info = anchor_info(func)
    assert info.spatial[1:] == (24, 8, 8)
    tiles, chunks = info.spatial[0] * 8 // 2, 96 // 16
    arrays = random_args(func, np.random.default_rng(3))
    ref = run_llvm(func, arrays)
    loads, cycles = {}, {}
    for resident in (False, True):
        lowered = lower_with_plan(func, TilePlan((1, 24, 2, 8), 16, resident=resident))
        kernel = read_kernel(lowered)
        body = kernel.tile_loops()[-1].body
        (chunk,) = [n for n in body if getattr(n, "kind", None) == "chunk"]
        inside = {st.value.access.buffer for st in stages_of(chunk.body) if st.op == "dma" and isinstance(st.value, Read)}
        program = build_program(lowered, HW, "block", cores=(0,))
        (out,) = simulate(program, arrays[:-1]).outputs
        np.testing.assert_allclose(out, ref, rtol=1e-2, atol=5e-3 * np.abs(ref).max())  # fp16 storage
        dmas = [y for y in program.expanded().kernels[0].instructions
                if isinstance(y, isa.Dma) and y.dst.mem == "lb" and y.src.mem == "ddr"]
        loads[resident] = ({a.name: sum(a.offset <= y.src.offset < a.offset + a.nbytes for y in dmas)
                            for a in program.args}, inside)
        gb = frozenset(range(len(func.params) - 1))
        cycles[resident] = simulate(build_program(lowered, HW, "block", cores=(0,), gb=gb),
                                    mode="timing").report.cycles
    (per_chunk, inside), (held, inside_resident) = loads[False], loads[True]
    assert inside_resident == set()  # the input's copy (a padded window) is loaded per chunk still
    shapes = {p.name: tuple(int(d) for d in p.shape) for p in func.params}
    # the depthwise weights, their bias, the pointwise weights: a box per chunk; the clip's bounds
    # (scalars) are one box, which every chunk finds in the LB either way
    chunked = {w for w in inside if shapes[w]}
    assert len(chunked) == 3 and all(per_chunk[w] == tiles * chunks for w in chunked)
    assert all(per_chunk[w] == 1 for w in inside - chunked)
    assert all(held[w] == 1 for w in inside)
    data = func.params[0].name
    assert per_chunk[data] == held[data] == tiles * chunks
    assert cycles[True] < cycles[False]
