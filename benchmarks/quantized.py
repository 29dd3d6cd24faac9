"""Float models quantized for the int8 chips, next to the float models on the chips' fp16 variants.

    python benchmarks/quantized.py                            # ResNet-50, MobileNetV2, BERT-base, batch 1
    python benchmarks/quantized.py --models resnet50 --chips set-edge16
    python benchmarks/quantized.py --tiny                     # the zoo's small configurations: a quick check
    python benchmarks/quantized.py --models resnet50 --schedules layerwise   # the int8 model layerwise only
    python benchmarks/quantized.py --models bert_base --chips set-edge16 --per-layer --layers 0 5 11
    python benchmarks/quantized.py --dynamic                  # quantize_dynamic: MatMulInteger, ConvInteger

Each model is quantized by ``tvm_dsa.quantize`` (onnxruntime's ``quantize_static``: QDQ, int8
activations, per-channel int8 weights, calibrated on four example inputs), compiled for each int8
chip and simulated functionally on an input the calibration did not see; the float model is
compiled for the chip's ``-fp16`` variant and simulated in timing mode. Printed per model and
chip: the int8 run's cycles, energy and fraction of the roofline (the report's
``roofline_fraction``) next to the float model's, the share of the MACs on the DSA, the kernels
left on the host, the output's distance from onnxruntime's sessions of the same QDQ model (its
default one, which fuses QDQ groups into QLinear kernels, and its unfused one, ``ORT_DISABLE_ALL``)
in steps of the output's quantisation (where the output is dequantized from one), and from the
float model on onnxruntime (max |q - float| / max |float|). A second table gives the int8 model's
cycles under each of ``--schedules`` (layerwise, graphturbo's stitched kernels, SET's trees; each
run functionally), whether each output is the first schedule's bit for bit, and its steps off
onnxruntime's default session.

``--per-layer`` measures instead each quantised step of the chosen layers alone: the QDQ model is
cut at its int8 tensors (each QuantizeLinear's output) into segments, each the ops from int8 tensors
to one QuantizeLinear (an integer kernel: a MatMul, Gemm or Add between dequantized int8 tensors;
or a float part: a layer norm, softmax, GELU's erf, left on the host of an int8 chip); each segment
is compiled alone for the chip (layerwise) and given the int8 inputs onnxruntime's unfused session
computed for it in the whole model (intermediate tensors exposed as outputs); its int8 output is
compared, in quantisation steps, with that session's (the segment alone on the unfused session: the
same) and with onnxruntime's default session of the segment alone, on the same inputs. If each
segment is within one step, the whole model's larger distance is the cascade of such steps.

``--dynamic`` quantizes each model with onnxruntime's ``quantize_dynamic`` instead (after its
pre-processing, which folds batch norms; int8 per-channel weights; DynamicQuantizeLinear,
MatMulInteger, ConvInteger), compiles it for each chip (layerwise)
and simulates it functionally: the MACs on the DSA (with the zero points' extra rows,
``tvm_dsa.frontend``), over the float model's, the kernels on the host, the cycles, the output's
distance from onnxruntime's session of the same model and from the float model.
"""

from __future__ import annotations

import argparse
import re
import time

import numpy as np
import onnx
import onnxruntime as ort
from graphturbo import _step, _table
from onnx import numpy_helper

import tvm_dsa
from tvm_dsa.harness import Compiled, dsa_mac_share, import_onnx, max_relative_error, timing_run
from tvm_dsa.models import TINY, example_inputs, get_model

MODELS = ("resnet50", "mobilenet_v2", "bert_base")
CHIPS = ("set-edge16", "set-cloud144")
SCHEDULES = ("layerwise", "graphturbo", "set")


def output_scale(model: onnx.ModelProto) -> float | None:
    """The scale of the per-tensor quantisation the model's (first) output is dequantized from; None
    where the output is not a DequantizeLinear's."""
    producer = {n.output[0]: n for n in model.graph.node}.get(model.graph.output[0].name)
    if producer is None or producer.op_type != "DequantizeLinear":
        return None
    scale = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}.get(producer.input[1])
    return float(scale) if scale is not None and scale.size == 1 else None


def on_onnxruntime(model: onnx.ModelProto, feeds: dict, fused: bool = True) -> list[np.ndarray]:
    """``model``'s outputs on onnxruntime: its default session (``fused``: QDQ groups as QLinear
    kernels) or its unoptimised one (``ORT_DISABLE_ALL``: the graph's float ops)."""
    options = ort.SessionOptions()
    if not fused:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)


def measure(name: str, chips: tuple[str, ...], schedule: str, schedules: tuple[str, ...],
            tiny: bool) -> tuple[list[list[str]], list[list[str]]]:
    """The two tables' rows of one model, one per chip: the int8 model under ``schedule`` next to
    the float one; the int8 model under each of ``schedules``."""
    float_model = get_model(name, **(TINY[name] if tiny else {}))
    _step(f"{name}: quantizing")
    qdq = tvm_dsa.quantize(float_model).model
    feeds = example_inputs(float_model, seed=0)  # the calibration's seeds are 1 to 4
    ort_q, ort_float = on_onnxruntime(qdq, feeds), on_onnxruntime(float_model, feeds)
    ort_unfused = on_onnxruntime(qdq, feeds, fused=False)
    scale = output_scale(qdq)
    q_mod, float_mod = import_onnx(qdq), import_onnx(float_model)
    rows, by_schedule = [], []
    for chip in chips:
        int8 = {}  # schedule -> (Compiled, its functional run)
        for s in dict.fromkeys((schedule, *schedules)):
            _step(f"{name}: int8 on {chip}, {s}")
            c = Compiled.build(q_mod, f"dsa/{chip}", s)
            int8[s] = c, c.run(feeds)
        q, run = int8[schedule]
        _step(f"{name}: float on {chip}-fp16 (timing)")
        fp = timing_run(Compiled.build(float_mod, f"dsa/{chip}-fp16", schedule), float_model).report
        rows.append([name, chip, f"{run.report.cycles:,}", f"{fp.cycles:,}", f"{fp.cycles / run.report.cycles:.2f}",
                     f"{run.report.energy_total * 1e6:.4g}", f"{fp.energy_total * 1e6:.4g}",
                     f"{run.report.roofline_fraction:.1%}", f"{fp.roofline_fraction:.1%}",
                     f"{dsa_mac_share(q.offload):.1%}", str(len(q.offload.host)),
                     steps_off(run.outputs, ort_q, scale), steps_off(run.outputs, ort_unfused, scale),
                     f"{max_relative_error(run.outputs, ort_float):.2e}", f"{q.seconds:.0f}", f"{run.seconds:.0f}"])
        first = int8[schedules[0]][1]
        by_schedule.append([name, chip, *(cell for c, r in (int8[s] for s in schedules) for cell in (
            f"{r.report.cycles:,}", f"{first.report.cycles / r.report.cycles:.2f}",
            "yes" if all(np.array_equal(a, b) for a, b in zip(r.outputs, first.outputs)) else "no",
            steps_off(r.outputs, ort_q, scale), str(len(c.offload.unstitched))))])
    return rows, by_schedule


def _segments(model: onnx.ModelProto) -> list[tuple[onnx.NodeProto, list[onnx.NodeProto], list[str]]]:
    """Each QuantizeLinear of ``model`` with the nodes from int8 tensors (other QuantizeLinears'
    outputs) or graph inputs to it, in graph order, and the names of those int8 inputs."""
    producer = {out: n for n in model.graph.node for out in n.output}
    order = {id(n): i for i, n in enumerate(model.graph.node)}
    segments = []
    for q in model.graph.node:
        if q.op_type != "QuantizeLinear" or q.input[0] not in producer:
            continue
        nodes, inputs, todo, seen = {}, [], [q.input[0], *q.input[1:]], set()
        nodes[id(q)] = q
        while todo:
            name = todo.pop()
            if name in seen or not name:
                continue
            seen.add(name)
            node = producer.get(name)
            if node is None:
                continue  # an initializer (or a graph input: none feeds a quantized segment but through a Q)
            if node.op_type == "QuantizeLinear" and node is not q:
                inputs.append(name)
                continue
            if id(node) not in nodes:
                nodes[id(node)] = node
                todo += list(node.input)
        segments.append((q, sorted(nodes.values(), key=lambda n: order[id(n)]), inputs))
    return segments


def _sub_model(model: onnx.ModelProto, nodes, inputs: dict[str, np.ndarray], output: str,
               out_dtype: int) -> onnx.ModelProto:
    """The model of ``nodes`` from the int8 ``inputs`` (name -> value: their types and shapes) to
    ``output``, with the initializers the nodes read."""
    from onnx import helper
    read = {i for n in nodes for i in n.input}
    inits = [t for t in model.graph.initializer if t.name in read]
    graph = helper.make_graph(
        nodes, "segment", [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                           for k, v in inputs.items()],
        [helper.make_tensor_value_info(output, out_dtype, None)], inits)
    sub = helper.make_model(graph, opset_imports=model.opset_import)
    sub.ir_version = model.ir_version
    return sub


def _layer_of(nodes) -> int | None:
    for n in nodes:
        m = re.search(r"layer\.(\d+)\.", n.name)
        if m and n.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            return int(m.group(1))
    return None


def per_layer(name: str, chip: str, layers: list[int], tiny: bool) -> list[list[str]]:
    """One row per segment of ``layers`` (``--per-layer``): its ops, output values, where it ran
    (kernels on the DSA / host), max and count of the chip's steps off onnxruntime's unfused and
    default sessions given the unfused session's int8 inputs, the llvm build's steps off the
    unfused session (the host's arithmetic, where the whole model computes its float part on an
    int8 chip), and the two sessions' own distance."""
    float_model = get_model(name, **(TINY[name] if tiny else {}))
    _step(f"{name}: quantizing")
    qdq = tvm_dsa.quantize(float_model).model
    feeds = example_inputs(float_model, seed=0)
    segments = [(q, nodes, inputs) for q, nodes, inputs in _segments(qdq) if _layer_of(nodes) in layers]
    _step(f"{name}: onnxruntime unfused, the {len(segments)} segments' int8 tensors exposed")
    exposed = onnx.ModelProto.FromString(qdq.SerializeToString())
    wanted = list(dict.fromkeys(t for q, _, inputs in segments for t in (*inputs, q.output[0])))
    known = {o.name for o in exposed.graph.output}
    exposed.graph.output.extend(onnx.ValueInfoProto(name=t) for t in wanted if t not in known)
    names = [o.name for o in exposed.graph.output]
    values = dict(zip(names, on_onnxruntime(exposed, feeds, fused=False)))
    rows = []
    for q, nodes, inputs in segments:
        label = re.sub(r"^.*layer\.\d+\.", "", next(n.name for n in nodes if n.op_type not in (
            "QuantizeLinear", "DequantizeLinear", "Constant")) if any(n.op_type not in (
                "QuantizeLinear", "DequantizeLinear", "Constant") for n in nodes) else q.name)
        ops = "+".join(dict.fromkeys(n.op_type for n in nodes if n.op_type not in (
            "QuantizeLinear", "DequantizeLinear", "Constant")))
        seg_in = {t: values[t] for t in inputs}
        expected = values[q.output[0]]
        sub = _sub_model(qdq, nodes, seg_in, q.output[0], helper_dtype(expected))
        _step(f"{name}: layer {_layer_of(nodes)} {label} ({ops})")
        compiled = Compiled.build(import_onnx(sub), f"dsa/{chip}", "layerwise")
        dsa = compiled.run(seg_in).outputs[0].astype(np.int64)
        host = Compiled.build(import_onnx(sub), "llvm").run(seg_in).outputs[0].astype(np.int64)
        unfused = on_onnxruntime(sub, seg_in, fused=False)[0].astype(np.int64)
        fused = on_onnxruntime(sub, seg_in)[0].astype(np.int64)
        assert np.array_equal(unfused, expected), f"{label}: the segment alone is not the whole model's"
        off_u, off_f = np.abs(dsa - unfused), np.abs(dsa - fused)
        rows.append([str(_layer_of(nodes)), label, ops, f"{expected.size:,}",
                     f"{len(compiled.offload.dsa)}/{len(compiled.offload.host)}",
                     str(off_u.max()), f"{(off_u > 0).sum():,}", str(off_f.max()), f"{(off_f > 0).sum():,}",
                     str(np.abs(host - unfused).max()), str(np.abs(unfused - fused).max())])
    return rows


def cascade(name: str, chip: str, tiny: bool) -> list[list[str]]:
    """One row per encoder layer (``--per-layer``): the steps between the int8 outputs of the layer
    (its last QuantizeLinear) in onnxruntime's unfused session, its default one and the chip's
    run of the whole model (layerwise), on the same input: how the one-step differences of the
    segments grow through the layers."""
    float_model = get_model(name, **(TINY[name] if tiny else {}))
    qdq = tvm_dsa.quantize(float_model).model
    feeds = example_inputs(float_model, seed=0)
    last = {}
    for q, nodes, _ in _segments(qdq):
        if _layer_of(nodes) is not None:
            last[_layer_of(nodes)] = q.output[0]
    exposed = onnx.ModelProto.FromString(qdq.SerializeToString())
    exposed.graph.output.extend(onnx.ValueInfoProto(name=t) for t in last.values())
    _step(f"{name}: the whole model with each layer's int8 output exposed, on onnxruntime and on {chip}")
    unfused = on_onnxruntime(exposed, feeds, fused=False)
    fused = on_onnxruntime(exposed, feeds)
    chip_run = Compiled.build(import_onnx(exposed), f"dsa/{chip}", "layerwise").run(feeds).outputs
    rows, first = [], len(qdq.graph.output)
    for k, layer in enumerate(last):
        u, f, c = (r[first + k].astype(np.int64) for r in (unfused, fused, chip_run))
        rows.append([str(layer), f"{u.size:,}", str(np.abs(f - u).max()), str(np.abs(c - u).max()),
                     str(np.abs(c - f).max()), f"{(np.abs(c - u) > 1).mean():.1%}"])
    return rows


def dynamic(name: str, chips: tuple[str, ...], tiny: bool) -> list[list[str]]:
    """``--dynamic``: one row per chip of ``name`` quantized by ``quantize_dynamic``."""
    import tempfile

    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    float_model = get_model(name, **(TINY[name] if tiny else {}))
    _step(f"{name}: quantize_dynamic")
    with tempfile.TemporaryDirectory() as tmp:  # pre-processed first, as onnxruntime advises: batch norms folded
        onnx.save(float_model, f"{tmp}/float.onnx")
        quant_pre_process(f"{tmp}/float.onnx", f"{tmp}/pre.onnx")
        quantize_dynamic(f"{tmp}/pre.onnx", f"{tmp}/dynamic.onnx", weight_type=QuantType.QInt8, per_channel=True)
        model = onnx.load(f"{tmp}/dynamic.onnx")
    ops = [n.op_type for n in model.graph.node]
    feeds = example_inputs(float_model, seed=0)
    ref, ref_float = on_onnxruntime(model, feeds), on_onnxruntime(float_model, feeds)
    float_macs = Compiled.build(import_onnx(float_model), "dsa/set-edge16-fp16", "layerwise").offload
    float_macs = float_macs.dsa_macs + float_macs.host_macs
    rows = []
    for chip in chips:
        _step(f"{name}: dynamic int8 on {chip}")
        c = Compiled.build(import_onnx(model), f"dsa/{chip}", "layerwise")
        run = c.run(feeds)
        rows.append([name, chip, f"{ops.count('MatMulInteger')} / {ops.count('ConvInteger')}",
                     f"{dsa_mac_share(c.offload):.1%}", f"{c.offload.dsa_macs / float_macs:.3f}",
                     str(len(c.offload.host)), f"{run.report.cycles:,}",
                     f"{max_relative_error(run.outputs, ref):.1e}", f"{max_relative_error(run.outputs, ref_float):.2e}",
                     f"{c.seconds:.0f}", f"{run.seconds:.0f}"])
    return rows


def helper_dtype(value: np.ndarray) -> int:
    return onnx.helper.np_dtype_to_tensor_dtype(value.dtype)


def steps_off(outputs: list, ref: list, scale: float | None) -> str:
    """max |first output - ``ref``'s| in steps of the output's quantisation ``scale`` ("-" without one)."""
    return "-" if scale is None else f"{np.abs(outputs[0].astype(np.float64) - ref[0]).max() / scale:.2f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    p.add_argument("--chips", nargs="+", choices=CHIPS, default=list(CHIPS))
    p.add_argument("--schedule", default="layerwise", choices=("layerwise", "graphturbo", "set", "auto"),
                   help="for both the int8 and the fp16 builds (default layerwise)")
    p.add_argument("--schedules", nargs="+", choices=SCHEDULES, default=list(SCHEDULES),
                   help="the int8 model's schedules, timed and checked against the first")
    p.add_argument("--tiny", action="store_true", help="the zoo's small configurations")
    p.add_argument("--per-layer", action="store_true",
                   help="each quantised segment of --layers alone, on the int8 inputs of onnxruntime's unfused session")
    p.add_argument("--layers", nargs="+", type=int, default=[0], help="the encoder layers --per-layer measures")
    p.add_argument("--dynamic", action="store_true", help="quantized by quantize_dynamic (MatMulInteger, ConvInteger)")
    args = p.parse_args()
    start = time.perf_counter()
    if args.dynamic:
        rows = [row for name in args.models for row in dynamic(name, tuple(args.chips), args.tiny)]
        _table("Quantized by quantize_dynamic (per-channel int8 weights), layerwise, functional: MACs on the DSA, "
               "DSA MACs over the float model's (the zero points' extra rows), host kernels, cycles, max |dsa - ort| / "
               "max |ort| (the same model on onnxruntime), vs float" + (", tiny" if args.tiny else ""),
               ["model", "chip", "MatMulInteger / ConvInteger", "DSA MACs", "MACs / float's", "host kernels",
                "cycles", "vs onnxruntime", "vs float", "compile s", "simulate s"], rows)
        print(f"\n({time.perf_counter() - start:.0f} s)")
        return
    if args.per_layer:
        rows = [row for name in args.models for chip in args.chips for row in per_layer(name, chip, args.layers,
                                                                                        args.tiny)]
        _table("Each quantised segment alone (layerwise), on the int8 inputs onnxruntime's unfused session gave it: "
               "the chip's steps off onnxruntime's unfused and default sessions of the segment (max, values off); "
               "llvm's build of the segment off the unfused session; the two sessions apart"
               + (", tiny" if args.tiny else ""),
               ["layer", "segment", "ops", "values", "DSA/host kernels", "off unfused", "(values)",
                "off default", "(values)", "llvm off unfused", "unfused vs default"], rows)
        rows = [row for name in args.models for chip in args.chips for row in cascade(name, chip, args.tiny)]
        _table("Each encoder layer's int8 output in the whole model (the chip layerwise): steps between onnxruntime's "
               "default and unfused sessions and the chip, and the share of values the chip has more than one step "
               "off the unfused session" + (", tiny" if args.tiny else ""),
               ["layer", "values", "default vs unfused", "chip vs unfused", "chip vs default", "(> 1 step)"], rows)
        print(f"\n({time.perf_counter() - start:.0f} s)")
        return
    rows, by_schedule = [], []
    for name in args.models:
        one, other = measure(name, tuple(args.chips), args.schedule, tuple(args.schedules), args.tiny)
        rows, by_schedule = rows + one, by_schedule + other
    _table(f"Quantized (int8) on the int8 chips vs float on their -fp16 variants, batch 1, {args.schedule}"
           + (", tiny" if args.tiny else ""),
           ["model", "chip", "int8 cycles", "fp16 cycles", "fp16/int8", "int8 uJ", "fp16 uJ", "int8 roofline",
            "fp16 roofline", "DSA MACs", "host kernels", "steps off ort", "(unfused)", "vs float", "compile s",
            "simulate s"], rows)
    _table(f"The int8 models' cycles under each schedule (functional runs): x, the speed-up over {args.schedules[0]}; "
           f"same, its outputs bit for bit; steps off onnxruntime's default session; sub-graphs or trees run layer by "
           f"layer (unstitched)" + (", tiny" if args.tiny else ""),
           ["model", "chip", *(column for s in args.schedules for column in (s, "x", "same", "steps", "unstitched"))],
           by_schedule)
    print(f"\n({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
