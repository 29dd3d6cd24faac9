"""A float model quantized for an int8 chip: onnxruntime's static quantizer, as a user would run it.

    q = quantize(model)                                   # calibrated on the model's example inputs
    q = quantize(model, load_calibration("cal.npz", model))
    q.model                                               # the QDQ model: compile it like any other

What a well-kept library already does, not a quantizer of our own: onnxruntime's pre-processing
(shape inference, its basic graph optimisations: batch norms folded into the convolutions), then
``quantize_static`` in QDQ format with int8 activations, int8 per-channel weights and MinMax
calibration (or onnxruntime's Percentile or Entropy: ``METHODS``), as onnxruntime's documentation
prescribes, whose output the compiler lowers to integer kernels (``relax_passes.quantized``,
docs/quantized.md). Two choices of ours:

- a model below opset 13 is converted to 13 first (onnx's version converter): per-channel
  weights need DequantizeLinear's ``axis`` (PP-OCR's recogniser is opset 10);
- a Softmax and the elementwise ops that compute its input stay float: there the attention mask
  (-10000 where masked) shares the scores' range, which leaves int8 no resolution for the scores
  (quantized, MiniLM's sentence embeddings come out at cosine 0.27 to the float model's; left
  float, 0.85). They run on the host of an int8 chip, as the activation x activation matmuls
  around them do anyway.

onnxruntime is an optional dependency (``tvm-dsa[quantize]``): without it, ``quantize`` is one
clear error.
"""

from __future__ import annotations

import logging
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnx.version_converter

from tvm_dsa.harness import InputError, is_quantized
from tvm_dsa.models import example_inputs, input_specs

#: onnxruntime's calibration methods: each activation's range is its min and max over the samples
#: (MinMax), the 0.001 and 99.999 percentiles of its values (Percentile: outliers clipped), or the
#: one that keeps the most of its histogram's information (Entropy)
METHODS = ("MinMax", "Percentile", "Entropy")
#: the opset per-channel quantisation needs (DequantizeLinear's axis)
PER_CHANNEL_OPSET = 13
#: ops a Softmax's input passes through that stay float with it
SOFTMAX_PRODUCERS = ("Add", "Sub", "Mul", "Div", "Where", "Cast")

#: example inputs calibrated on where the user gives none: seeds 1 to 4 (``tvm-dsa run`` runs seed 0,
#: an input the calibration did not see)
EXAMPLE_SEEDS = range(1, 5)


@dataclass(frozen=True)
class QuantizedModel:
    """A float model's QDQ quantization and what it was calibrated on."""

    model: onnx.ModelProto
    samples: int
    calibration: str  # "the example inputs" or the file's path
    method: str  # one of METHODS


def load_calibration(path: str | Path, model: onnx.ModelProto) -> list[dict[str, np.ndarray]]:
    """The calibration samples of an ``.npz`` file for ``model``: one array per graph input, named
    as the input, shaped as the input (one sample) or as ``[N, *shape]`` (N samples, N the same
    for every input). An ``InputError`` names what does not fit."""
    specs = input_specs(model)
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
    except (OSError, ValueError, zipfile.BadZipFile) as err:
        raise InputError(f"cannot read the calibration file {path}: {err}") from None
    if missing := [n for n in specs if n not in arrays]:
        raise InputError(f"calibration file {path} has no array for input {missing[0]!r} "
                            f"(it has {', '.join(map(repr, arrays)) or 'none'})")
    if extra := [n for n in arrays if n not in specs]:
        raise InputError(f"calibration file {path} has an array {extra[0]!r} that is no input of the model "
                            f"(inputs: {', '.join(map(repr, specs))})")
    counts = {}
    for name, (shape, dtype) in specs.items():
        a = arrays[name]
        if list(a.shape) == shape:
            a = arrays[name] = a[None]
        elif list(a.shape[1:]) != shape:
            raise InputError(f"calibration array {name!r} has shape {list(a.shape)}: the input is {shape} "
                                f"(or [N, {', '.join(map(str, shape))}] for N samples)")
        if not np.can_cast(a.dtype, dtype, "same_kind"):
            raise InputError(f"calibration array {name!r} is {a.dtype}: the input is {np.dtype(dtype)}")
        arrays[name] = a.astype(dtype)
        counts[name] = len(a)
    if len(set(counts.values())) > 1:
        raise InputError(f"calibration file {path} holds different numbers of samples per input: {counts}")
    return [{name: a[i] for name, a in arrays.items()} for i in range(next(iter(counts.values()), 0))]


def quantize(model: onnx.ModelProto, samples: list[dict[str, np.ndarray]] | None = None,
             calibration: str = "the example inputs", method: str = "MinMax") -> QuantizedModel:
    """``model`` pre-processed and quantized by onnxruntime's ``quantize_static`` (QDQ, int8
    activations, per-channel int8 weights, the calibration ``method``) on ``samples`` (``load_calibration``; default:
    the model's example inputs of ``EXAMPLE_SEEDS``); ``calibration`` names where they came
    from. An ``InputError`` without onnxruntime, or for a model already quantized."""
    try:
        from onnxruntime.quantization import (
            CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static
        )
        from onnxruntime.quantization.shape_inference import quant_pre_process
    except ImportError:
        raise InputError("quantizing a float model needs onnxruntime: pip install onnxruntime "
                         "(or tvm-dsa[quantize])") from None
    if is_quantized(model):
        raise InputError("the model is already quantized (it has QuantizeLinear, QLinear or Integer nodes): "
                         "run it as it is")
    if method not in METHODS:
        raise InputError(f"unknown calibration method {method!r}: one of {', '.join(METHODS)}")
    if samples is None:
        samples = [example_inputs(model, seed) for seed in EXAMPLE_SEEDS]
    if not samples:
        raise InputError(f"no calibration sample in {calibration}")

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter(samples)

        def get_next(self):
            return next(self.feeds, None)

    logging.disable(logging.WARNING)  # the quantizer's advice, one line per tensor, on the root logger
    try:
        with tempfile.TemporaryDirectory() as tmp:
            src, pre, dst = (str(Path(tmp) / f"{n}.onnx") for n in ("float", "pre", "qdq"))
            onnx.save(_at_least_opset(model, PER_CHANNEL_OPSET), src)
            quant_pre_process(src, pre)
            pre_model = _named(onnx.load(pre))
            onnx.save(pre_model, pre)  # a path: quantize_static moves a ModelProto's weights to a file it deletes
            quantize_static(pre, dst, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                            activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                            nodes_to_exclude=softmax_inputs(pre_model),
                            calibrate_method=getattr(CalibrationMethod, method))
            return QuantizedModel(onnx.load(dst), len(samples), calibration, method)
    finally:
        logging.disable(logging.NOTSET)


def _at_least_opset(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """``model``, converted to ``opset`` by onnx's version converter where its default domain's is lower."""
    current = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    if current >= opset:
        return model
    try:
        return onnx.version_converter.convert_version(model, opset)
    except Exception as err:  # the converter's errors name the node it cannot convert
        raise InputError(f"cannot convert the model from opset {current} to {opset} for per-channel "
                         f"quantisation: {str(err).strip().splitlines()[-1]}") from None


def _named(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with a name for each unnamed node (the quantizer excludes nodes by name)."""
    names = {n.name for n in model.graph.node}
    for i, node in enumerate(model.graph.node):
        if not node.name:
            node.name = next(f"{node.op_type}_{i}_{k}" for k in range(len(names) + 1)
                             if f"{node.op_type}_{i}_{k}" not in names)
            names.add(node.name)
    return model


def softmax_inputs(model: onnx.ModelProto) -> list[str]:
    """The names of each Softmax and of the ``SOFTMAX_PRODUCERS`` nodes its input comes through."""
    producer = {out: n for n in model.graph.node for out in n.output}
    found, todo = [], [n for n in model.graph.node if n.op_type == "Softmax"]
    while todo:
        node = todo.pop()
        if node.name not in found:
            found.append(node.name)
            todo += [producer[i] for i in node.input if i in producer and producer[i].op_type in SOFTMAX_PRODUCERS]
    return found
