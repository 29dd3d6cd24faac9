"""Values an fp16 chip cannot hold: what the compiler keeps wide (``kernel.ranges``,
``relax_passes.wide``) and what the simulator reports where a kernel still overflows."""

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh
from tvm import relax
from tvm.relax.frontend import onnx as rx_onnx

import tvm_dsa
from tvm_dsa.cli import main
from tvm_dsa.relax_passes.fusion import fuse
from tvm_dsa.kernel.ranges import WIDE

# name -> (ONNX nodes from "x" to the output named as the key, numpy of x)
REDUCTIONS = {
    "sum_squares": ([h.make_node("ReduceSumSquare", ["x"], ["sum_squares"], keepdims=1)],
                    lambda x: (x.astype(np.float64) ** 2).sum(keepdims=True)),
    "mean_squares": ([h.make_node("Mul", ["x", "x"], ["sq"]), h.make_node("ReduceMean", ["sq"], ["mean_squares"])],
                     lambda x: (x.astype(np.float64) ** 2).mean(keepdims=True)),
    "variance": ([h.make_node("ReduceMean", ["x"], ["m"]), h.make_node("Sub", ["x", "m"], ["d"]),
                  h.make_node("Pow", ["d", "two"], ["d2"]), h.make_node("ReduceMean", ["d2"], ["variance"])],
                 lambda x: x.astype(np.float64).var(keepdims=True)),
    "l2": ([h.make_node("ReduceL2", ["x"], ["l2"], keepdims=1)],
           lambda x: np.sqrt((x.astype(np.float64) ** 2).sum(keepdims=True))),
    "rms": ([h.make_node("Mul", ["x", "x"], ["q"]), h.make_node("ReduceMean", ["q"], ["ms"]),
             h.make_node("Sqrt", ["ms"], ["rms"])],
            lambda x: np.sqrt((x.astype(np.float64) ** 2).mean(keepdims=True))),
}
NORMALISED = {  # outputs that the storage type holds: not wide
    "ln": ([h.make_node("LayerNormalization", ["x", "g", "b"], ["ln"], axis=-1)], None),
    "softmax": ([h.make_node("Softmax", ["x"], ["softmax"], axis=-1)], None),
    "mean": ([h.make_node("ReduceMean", ["x"], ["mean"])], None),
}


def model(outputs: dict) -> onnx.ModelProto:
    nodes = [n for ns, _ in outputs.values() for n in ns]
    inits = [nh.from_array(np.ones(64, "float32"), "g"), nh.from_array(np.zeros(64, "float32"), "b"),
             nh.from_array(np.array(2.0, "float32"), "two")]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [4, 64])],
                         [h.make_tensor_value_info(n, TP.FLOAT, None) for n in outputs], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 18)], ir_version=10)


def fused(outputs: dict):
    with tvm.target.Target("llvm"):
        return fuse(rx_onnx.from_onnx(model(outputs), keep_params_in_input=False))


def _returned_calls(mod) -> list:
    """The PrimFunc each returned value of ``main`` is computed by, in order."""
    calls = {}
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            if isinstance(b.value, relax.Call) and b.value.op.same_as(tvm.ir.Op.get("relax.call_tir")):
                calls[b.var] = mod[b.value.args[0]]
    body = mod["main"].body.body
    fields = body.fields if isinstance(body, relax.Tuple) else [body]
    bound = {b.var: b.value for block in mod["main"].body.blocks for b in block.bindings}
    out = []
    for f in fields:
        while f not in calls and isinstance(bound.get(f), relax.Tuple):
            f = bound[f].fields[0]
        out.append(calls.get(f))
    return out


@pytest.mark.parametrize("name", [*REDUCTIONS, *NORMALISED])
def test_which_outputs_are_kept_wide(name):
    table = {**REDUCTIONS, **NORMALISED}
    (func,) = _returned_calls(fused({name: table[name]}))
    output = len(func.params) - 1
    attrs = func.attrs if func.attrs is not None and WIDE in func.attrs else {WIDE: ()}
    wide = [int(i) for i in attrs[WIDE]]
    # a sum of squares, a mean of squares and a variance are wide; a root of one reads a wide
    # input and gives a value fp16 holds; normalised values keep the storage type
    expect = {"l2": [0], "rms": [0]}.get(name, [output] if name in REDUCTIONS else [])
    if name == "mean_squares" or name == "variance":
        expect = [0, output]  # the square is a kernel of its own, and wide
    assert wide == expect, (name, wide)


@pytest.mark.parametrize("schedule", ["layerwise", "graphturbo"])
def test_sums_of_squares_beyond_fp16_are_exact_on_the_dsa(schedule, rng):
    x = (rng.standard_normal((4, 64)) * 300).astype("float32")  # squares to ~1e5, sums to ~6e6
    mod = rx_onnx.from_onnx(model(REDUCTIONS), keep_params_in_input=False)
    ex = tvm.compile(mod, target="dsa/stcp920", relax_pipeline=tvm_dsa.pipeline(schedule=schedule))
    outs = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
    for got, (_, ref) in zip(outs, REDUCTIONS.values()):
        want = ref(x)
        assert np.isfinite(got.numpy()).all()
        np.testing.assert_allclose(got.numpy(), want, rtol=5e-3)
    assert tvm_dsa.last_report().numerics == ()
    assert not tvm_dsa.pipeline_result().host


def product(weight: float) -> onnx.ModelProto:
    """``x * W`` with every weight ``weight``."""
    graph = h.make_graph([h.make_node("Mul", ["x", "W"], ["y"])], "big",
                         [h.make_tensor_value_info("x", TP.FLOAT, [2, 16])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [2, 16])],
                         [nh.from_array(np.full((2, 16), weight, "float32"), "W")])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=10)


def run(model: onnx.ModelProto, *inputs):
    ex = tvm.compile(rx_onnx.from_onnx(model, keep_params_in_input=False), target="dsa/stcp920", relax_pipeline="dsa")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm, vm["main"](*(tvm.runtime.tensor(x) for x in inputs)).numpy()


def test_weights_beyond_fp16_stay_wide():
    x = np.linspace(-2, 2, 32, dtype="float32").reshape(2, 16)
    _, out = run(product(1e5), x)  # W and x * W beyond 65,504: both wide
    np.testing.assert_allclose(out, x * 1e5, rtol=1e-3)
    assert tvm_dsa.last_report().numerics == ()


def test_an_overflow_is_reported_and_raises_when_strict():
    graph = h.make_graph([h.make_node("Mul", ["x", "y"], ["z"])], "xy",
                         [h.make_tensor_value_info(n, TP.FLOAT, [2, 16]) for n in "xy"],
                         [h.make_tensor_value_info("z", TP.FLOAT, [2, 16])])
    xy = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=10)
    x = np.full((2, 16), 300, "float32")  # x * y = 90,000: no square the compiler could see
    vm, out = run(xy, x, x)
    assert np.isinf(out).all()  # what the chip computes: nothing is hidden
    (line,) = tvm_dsa.last_report().numerics
    (ran,) = tvm_dsa.last_kernel_runs()
    (mark,) = ran.program.kernels[0].layers  # the Mul: a kernel of its own layer, named unless alike
    where = f"kernel {ran.name}" + (f", layer {mark.name}" if mark.name != ran.name else "")
    assert line == f"{where}: 9e+04 overflowed the chip's float16 (max 65504) and became inf"
    assert "NUMERICS" in str(tvm_dsa.last_report())
    tvm_dsa.set_mode(strict=True)
    try:
        with pytest.raises(Exception, match="overflowed the chip's float16"):
            vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(x))
    finally:
        tvm_dsa.set_mode()


def test_cli_warns_of_an_overflow_and_fails_when_strict(tmp_path, capsys):
    path = tmp_path / "big.onnx"
    onnx.save(product(6e4), str(path))  # W fits fp16; x * W of the random inputs ~ N(0, 1) does not
    assert main(["run", str(path), "--no-check"]) == 0
    assert "tvm-dsa: warning: kernel" in capsys.readouterr().err
    assert main(["run", str(path), "--no-check", "--strict"]) == 1
    err = capsys.readouterr().err
    assert "tvm-dsa: error: kernel" in err and "overflowed the chip's float16" in err


@pytest.mark.parametrize("target, schedule", [("dsa/stcp920", "layerwise"), ("dsa/stcp920", "graphturbo"),
                                              ("dsa/set-edge16-fp16", "set")])
def test_a_wide_layer_inside_a_scheduled_sub_graph(target, schedule, rng):
    """A conv whose square is summed beside its Relu: the sum is wide; a stitched kernel or a SET
    tree takes no float layer that keeps a tensor wide, so its layers run one kernel each."""
    w = (rng.standard_normal((8, 4, 3, 3)) * 0.3).astype("float32")
    nodes = [h.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]), h.make_node("Mul", ["c", "c"], ["s"]),
             h.make_node("ReduceSum", ["s", "axes"], ["r"], keepdims=1), h.make_node("Relu", ["c"], ["y"])]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [2, 4, 8, 8])],
                         [h.make_tensor_value_info(n, TP.FLOAT, None) for n in "ry"],
                         [nh.from_array(w, "W"), nh.from_array(np.array([1, 2, 3], "int64"), "axes")])
    mod = rx_onnx.from_onnx(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=10),
                            keep_params_in_input=False)
    x = (rng.standard_normal((2, 4, 8, 8)) * 40).astype("float32")
    ex = tvm.compile(mod, target=target, relax_pipeline=tvm_dsa.pipeline(schedule=schedule))
    r, y = (o.numpy() for o in relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)))
    ref = tvm.compile(mod, target="llvm")
    want_r, want_y = (o.numpy() for o in relax.VirtualMachine(ref, tvm.cpu())["main"](tvm.runtime.tensor(x)))
    assert want_r.max() > 65504  # beyond fp16: computed wide, or this test tests nothing
    np.testing.assert_allclose(r, want_r, rtol=2e-3)
    np.testing.assert_allclose(y, want_y, atol=2e-2 * np.abs(want_y).max())
    assert tvm_dsa.last_report().numerics == ()
    assert not tvm_dsa.pipeline_result().host
