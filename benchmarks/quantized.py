"""Float models quantized for the int8 chips, next to the float models on the chips' fp16 variants.

    python benchmarks/quantized.py                            # ResNet-50, MobileNetV2, BERT-base, batch 1
    python benchmarks/quantized.py --models resnet50 --chips set-edge16
    python benchmarks/quantized.py --tiny                     # the zoo's small configurations: a quick check
    python benchmarks/quantized.py --models resnet50 --schedules layerwise   # the int8 model layerwise only

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
"""

from __future__ import annotations

import argparse
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
    args = p.parse_args()
    start = time.perf_counter()
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
