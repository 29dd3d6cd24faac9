"""Dynamic models on the DSA: one ``dsa`` compilation runs every shape (programs of symbolic
kernels built per shape at run time), numerics against onnxruntime."""

import warnings

import numpy as np
import onnxruntime as ort
import pytest
import tvm
import tvm_ffi
from onnx import numpy_helper
from helpers import with_gate_outputs
from tvm import relax, tirx
from tvm.relax.frontend.onnx import from_onnx

import tvm_dsa
from tvm_dsa import hardware
from tvm_dsa.emit.emitter import build_program
from tvm_dsa.kernelgen.specialize import VERSIONS, ShapeMismatch, bind, free_symbols, specialize
from tvm_dsa.harness import max_relative_error
from tvm_dsa.models.dynamic import DYNAMIC
from tvm_dsa.kernelgen.symbolic import is_dynamic
from tvm_dsa.packed import EXECUTE_SHAPED
from tvm_dsa.relax_passes.rdp_apply import ApplyRDP
from tvm_dsa.tiling import lower_kernel

warnings.filterwarnings("ignore", module="tvm.relax.frontend.onnx")

SHAPES = {
    "bert": [(1, 5), (2, 9), (3, 4)],
    "cnn": [(1, 3, 16, 16), (2, 3, 13, 21), (1, 3, 9, 12)],
    "shape_chain": [(1, 5, 64), (3, 7, 64), (2, 4, 64)],
    "skipnet": [(1, 3, 16, 16), (2, 3, 15, 11), (1, 3, 9, 12), (3, 3, 7, 7)],
}


def _input(name, shape, rng, k):
    if name == "bert":
        return rng.integers(0, 100, shape).astype(np.int64)
    return (rng.standard_normal(shape) * (0.5, 4.0)[k % 2]).astype(np.float32)  # skipnet: small runs skip


@pytest.mark.parametrize("name", list(SHAPES))
def test_one_dsa_build_runs_every_shape_like_onnxruntime(name, rng):
    model = DYNAMIC[name]()
    mod = from_onnx(model, keep_params_in_input=False)
    assert is_dynamic(mod)
    vm = relax.VirtualMachine(tvm.compile(mod, target="dsa/stcp920", relax_pipeline="dsa"), tvm.cpu())
    offloaded = tvm_dsa.pipeline_result()
    assert offloaded.dsa, "no kernel on the DSA"
    weights = [numpy_helper.to_array(t) for t in model.graph.initializer]  # the float ones, at least
    assert offloaded.model_ddr_bytes is None and offloaded.weight_bytes >= sum(
        w.size for w in weights if w.dtype == np.float32) * hardware.get("stcp920").storage_bytes
    assert offloaded.schedule == "layerwise" and not offloaded.unstitched  # the compiler's choice, no complaint
    sess = ort.InferenceSession(with_gate_outputs(model).SerializeToString())
    feed = sess.get_inputs()[0].name
    taken = set()
    for k, shape in enumerate(SHAPES[name]):
        x = _input(name, shape, rng, k)
        ref, *gates = sess.run(None, {feed: x})
        taken.add(tuple(bool(g) for g in gates))
        built = len(VERSIONS.programs)
        out = vm["main"](tvm.runtime.tensor(x)).numpy()
        report = tvm_dsa.last_report()
        assert out.shape == ref.shape
        assert max_relative_error([out], [ref]) < 1e-2  # fp16 storage on the DSA
        assert report is not None and report.cycles > 0 and tvm_dsa.last_kernel_runs()
        # a dynamic model's bound is this run's: its input and output, its weights, the MACs it ran
        hw = report.hardware
        assert report.model_bound and "the model's bound" in str(report)
        assert report.compulsory_ddr_bytes == (x.size + out.size) * hw.storage_bytes + offloaded.weight_bytes
        assert report.bound_macs == sum(k.report.macs for k in tvm_dsa.last_kernel_runs()) + offloaded.host_macs
        assert len(VERSIONS.programs) > built  # a new shape: new programs
        built = len(VERSIONS.programs)
        again = vm["main"](tvm.runtime.tensor(x)).numpy()
        assert len(VERSIONS.programs) == built  # the same shape again: nothing is rebuilt
        np.testing.assert_array_equal(again, out)
    if name == "skipnet":  # both ways through each gate, on the DSA
        assert {t[0] for t in taken} == {True, False} and {t[1] for t in taken} == {True, False}


def _front(mod):
    """The dsa pipeline up to the fused PrimFuncs (what offload sees)."""
    from tvm_dsa.relax_passes.simplify import SimplifyInference

    with tvm.target.Target("llvm"):
        return tvm.transform.Sequential([
            SimplifyInference(), relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
            relax.transform.FoldConstant(), relax.transform.FuseOps(), relax.transform.FuseTIR()])(mod)


def _calls(mod):
    out = []
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            if isinstance(b.value, relax.Call) and b.value.op.same_as(tvm.ir.Op.get("relax.call_tir")):
                out.append(b.value)
    return out


def test_specialised_convolutions_are_the_static_kernels():
    """cnn at one shape: each convolution's symbolic PrimFunc, specialised to that shape, builds
    the program the statically imported model builds."""
    hw = hardware.get("stcp920")
    model = DYNAMIC["cnn"]()
    dyn = _front(from_onnx(model, keep_params_in_input=False))
    sta = _front(from_onnx(model, shape_dict={"input": [2, 3, 13, 21]}, keep_params_in_input=False))
    convs = 0
    for cd, cs in zip(_calls(dyn), _calls(sta), strict=True):
        if "conv2d" not in cd.args[0].name_hint:
            continue
        fd, fs = dyn[cd.args[0]], sta[cs.args[0]]
        shapes = [tuple(int(d) for d in p.shape) for p in fs.params]
        scalars = [{"batch": 2, "height": 13, "width": 21}[str(a)] for a in cd.args[1].fields
                   if not isinstance(a.ty, relax.TensorType)]
        assert free_symbols(fd) and not free_symbols(fs)
        ours = build_program(lower_kernel(specialize(fd, bind(fd, shapes, scalars)), hw)[0], hw, "k")
        assert ours.serialize() == build_program(lower_kernel(fs, hw)[0], hw, "k").serialize()
        convs += 1
    assert convs == 6


def test_a_call_whose_shapes_contradict_its_symbols_is_refused():
    dyn = _front(from_onnx(DYNAMIC["cnn"](), keep_params_in_input=False))
    call = next(c for c in _calls(dyn) if c.args[0].name_hint == "max_pool2d")
    func = dyn[call.args[0]]
    bind(func, [(1, 8, 16, 16), (1, 8, 8, 8)], [])
    with pytest.raises(ShapeMismatch, match=r"has shape \(1, 8, 7, 8\), but the kernel's symbols give \(1, 8, 8, 8\)"):
        bind(func, [(1, 8, 16, 16), (1, 8, 7, 8)], [])
    with pytest.raises(ShapeMismatch, match="rank 3, the kernel expects 4"):
        bind(func, [(1, 8, 16), (1, 8, 8, 8)], [])


def test_symbolic_kernels_are_dispatched_by_shape():
    """bert's DSA kernels all have symbolic dims: every DSA call is execute_shaped, each kernel
    the DSA takes is called; what it cannot run (gathers, integer ops) stays on the host."""
    import json

    mod = from_onnx(DYNAMIC["bert"](), keep_params_in_input=False)
    with tvm.target.Target("dsa/stcp920"):
        lowered = tvm_dsa.pipeline()(mod)
    result = tvm_dsa.pipeline_result()
    calls = []  # the packed calls the VM makes
    tvm_ffi.structural_walk(lowered["main"].body, [(relax.Call, lambda c: calls.append(c)
                                                    if isinstance(c.op, relax.ExternFunc) else None)])
    dsa = [c for c in calls if str(c.op.global_symbol).startswith("tvm_dsa.execute")]  # not arena_plan
    assert {str(c.op.global_symbol) for c in dsa} == {EXECUTE_SHAPED}
    infos = [json.loads(c.args[1].value) for c in dsa]
    assert {i["kernel"] for i in infos} == set(result.dsa)
    assert sorted(i["index"] for i in infos) == list(range(len(dsa)))
    assert any("gather" in r for r in result.host.values())
    assert any("writes int64" in r for r in result.host.values())


def test_symbolic_module_runs_layerwise_under_another_schedule():
    mod = from_onnx(DYNAMIC["cnn"](), keep_params_in_input=False)
    tvm.compile(mod, target="dsa/stcp920", relax_pipeline=tvm_dsa.pipeline("graphturbo"))
    result = tvm_dsa.pipeline_result()
    assert result.unstitched == {"graphturbo": "the graphturbo schedule needs static shapes and no control flow: "
                                               "a dynamic model runs layerwise"}
    assert result.dsa and not result.stitched


def test_apply_rdp_substitutes_proven_symbols():
    """shape_chain: the importer names Range's length afresh (a match_cast defines it); RDP proves
    it is seq, so ApplyRDP substitutes seq — which survives CanonicalizeBindings, where a cast
    that only asserts (seq,) would be dropped — and the computation of the length (Shape →
    tensor → arithmetic → shape), now only checked, is proven and removed."""
    mod = ApplyRDP()(from_onnx(DYNAMIC["shape_chain"](), keep_params_in_input=False))
    ops = set()
    tvm_ffi.structural_walk(mod["main"].body, [(relax.Call, lambda c: ops.add(c.op.name)
                                                if isinstance(c.op, tvm.ir.Op) else None)])
    assert "relax.arange" in ops and not ops & {"relax.tensor_to_shape", "relax.floor_divide", "relax.maximum"}
    mod = relax.transform.CanonicalizeBindings()(mod)
    names = set()
    for v in relax.analysis.all_vars(mod["main"]):
        if isinstance(v.ty, relax.TensorType) and isinstance(v.ty.shape, relax.ShapeExpr):
            names |= {x.name for d in v.ty.shape.values for x in tirx.analysis.undefined_vars(d)}
    assert names == {"batch", "seq"}
    assert str(mod["main"].ret_ty) == 'R.Tensor((batch, seq, 64), dtype="float32")'


def test_multi_version_picks_the_faster_lowering_per_shape_class():
    """bert's q/k/v matmul (rows batch*seq, 64 columns): thin at 1x4 (4 rows), regular at 2x16,
    fat at 8x64 (512 rows). The first shape of a class builds both versions and keeps the one the
    simulator finds faster; a later shape of that class is built with it directly."""
    from tvm_dsa.kernelgen.specialize import SymbolicKernel, Versions, timing_cycles, shape_class

    hw = hardware.get("stcp920")
    fused = _front(from_onnx(DYNAMIC["bert"](), keep_params_in_input=False))
    func = fused[next(gv for gv in fused.functions if gv.name_hint == "fused_matmul_add5")]
    kernel = SymbolicKernel("qkv", func, hw)
    text = kernel.serialize()

    def shapes(b, s):
        return ((b, s, 64), (64, 64), (64,), (b, s, 64))

    for (b, s), cls in [((1, 4), "thin"), ((2, 16), "regular"), ((8, 64), "fat")]:
        env = bind(func, list(shapes(b, s)), [])
        assert shape_class(specialize(func, env)) == cls
    versions = Versions()
    env = bind(func, list(shapes(8, 64)), [])
    fat = versions.get(text, shapes(8, 64), ())
    cycles = {v: timing_cycles(kernel.program(env, parallel=v == "parallel")) for v in ("parallel", "whole")}
    assert versions.chosen == {(text, "fat"): min(cycles, key=cycles.get)}
    assert timing_cycles(fat) == min(cycles.values())
    later = versions.get(text, shapes(8, 48), ())  # 384 rows: fat again, no new comparison
    assert list(versions.chosen) == [(text, "fat")]
    parallel = versions.chosen[text, "fat"] == "parallel"
    want = kernel.program(bind(func, list(shapes(8, 48)), []), parallel=parallel)
    assert later.serialize() == want.serialize()


def test_versions_are_bounded_and_built_once_across_threads():
    """The per-shape programs keep the last ``keep``; two threads asking for one new shape get
    one program, built once."""
    import threading

    from tvm_dsa.kernelgen.specialize import SymbolicKernel, Versions

    fused = _front(from_onnx(DYNAMIC["bert"](), keep_params_in_input=False))
    func = fused[next(gv for gv in fused.functions if gv.name_hint == "fused_matmul_add5")]
    text = SymbolicKernel("qkv", func, hardware.get("stcp920")).serialize()

    def shapes(s):
        return ((1, s, 64), (64, 64), (64,), (1, s, 64))

    versions = Versions(multi_version=False, keep=2)
    first = versions.get(text, shapes(4), ())
    versions.get(text, shapes(8), ())
    versions.get(text, shapes(12), ())
    assert [k[1] for k in versions.programs] == [shapes(8), shapes(12)]  # the oldest is dropped
    again = versions.get(text, shapes(4), ())
    assert again is not first and again.serialize() == first.serialize()  # built again, the same

    got = []
    threads = [threading.Thread(target=lambda: got.append(versions.get(text, shapes(16), ()))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 2 and got[0] is got[1]


def test_a_dynamic_run_counts_each_output_of_a_tuple_in_its_bound(rng):
    """A dynamic ``main`` returning a tuple: the run's roofline counts the input and both outputs
    at the storage type's bytes (no weights), and the MACs its DSA kernels ran."""
    n = tirx.Var("n", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([n, 64], "float32"))
    w = relax.const(rng.standard_normal((64, 32)).astype("float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, w))
            z = bb.emit(relax.op.nn.relu(x))
            out = bb.emit_output(relax.Tuple([y, z]))
        bb.emit_func_output(out)
    vm = relax.VirtualMachine(tvm.compile(bb.get(), target="dsa/stcp920", relax_pipeline="dsa"), tvm.cpu())
    offloaded = tvm_dsa.pipeline_result()
    hw = hardware.get("stcp920")
    assert offloaded.model_ddr_bytes is None and offloaded.weight_bytes == 64 * 32 * hw.storage_bytes
    a = rng.standard_normal((5, 64)).astype("float32")
    y, z = vm["main"](tvm.runtime.tensor(a))
    np.testing.assert_allclose(z.numpy(), np.maximum(a, 0), rtol=1e-2, atol=1e-2)
    report = tvm_dsa.last_report()
    assert report.model_bound
    assert report.compulsory_ddr_bytes == (5 * 64 + 5 * 32 + 5 * 64) * hw.storage_bytes + offloaded.weight_bytes
    assert report.bound_macs == 5 * 64 * 32 + offloaded.host_macs
