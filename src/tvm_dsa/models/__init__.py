"""Benchmark model zoo: ONNX models built in code with seeded random weights.

>>> from tvm_dsa.models import get_model, example_inputs, macs, TINY
>>> m = get_model("resnet18", **TINY["resnet18"])
>>> feeds = example_inputs(m)          # {"input": float32 [1, 3, 32, 32]}

All models are opset 17 / IR version 10, float32, with static shapes (``batch`` is a
builder argument, default 1).
"""

from __future__ import annotations

import json
import math
from typing import Callable

import numpy as np
import onnx

from tvm_dsa.models.builder import META_CONFIG, META_INPUT_RANGES, GraphBuilder, infer_shapes
from tvm_dsa.models.cnn import densenet121, mobilenet_v2, resnet18, resnet50
from tvm_dsa.models.speech import conformer
from tvm_dsa.models.recommendation import dlrm
from tvm_dsa.models.inception import googlenet, inception_resnet_v1, pnasnet
from tvm_dsa.models.transformer import bert_base, vit_b16

MODELS: dict[str, Callable[..., onnx.ModelProto]] = {
    "resnet18": resnet18,
    "resnet50": resnet50,
    "mobilenet_v2": mobilenet_v2,
    "densenet121": densenet121,
    "bert_base": bert_base,
    "vit_b16": vit_b16,
    "dlrm": dlrm,
    "conformer": conformer,
    "googlenet": googlenet,
    "inception_resnet_v1": inception_resnet_v1,
    "pnasnet": pnasnet,
}

#: Small configurations of every model: each imports + compiles in ~1-3 s in TVM llvm
#: and runs in milliseconds.
TINY: dict[str, dict] = {
    "resnet18": dict(image=32, width=0.25, layers=(1, 1, 1, 1), num_classes=10),
    "resnet50": dict(image=32, width=0.25, layers=(1, 1), num_classes=10),
    "mobilenet_v2": dict(image=32, width=0.25, num_classes=10,
                         settings=((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 1, 2))),
    "densenet121": dict(image=32, growth=8, blocks=(2, 2), init_features=16, num_classes=10),
    "bert_base": dict(seq=16, layers=2, hidden=64, heads=4, ffn=256, vocab=100,
                      max_position=32),
    "vit_b16": dict(image=32, patch=8, layers=2, hidden=64, heads=4, mlp=256, num_classes=10),
    "dlrm": dict(batch=8, bottom_mlp=(32, 16), top_mlp=(32, 1), tables=(50, 60, 70, 80)),
    "conformer": dict(seq=32, dim=32, heads=4),
    "googlenet": dict(image=32, width=0.125, modules=(1, 1, 1), num_classes=10),
    "inception_resnet_v1": dict(image=75, width=0.125, blocks=(1, 1, 1), num_classes=10),
    "pnasnet": dict(image=32, filters=16, cells=1, stages=1, num_classes=10),
}


def get_model(name: str, **kwargs) -> onnx.ModelProto:
    """Build model ``name`` (a key of :data:`MODELS`) with builder keyword arguments."""
    try:
        builder = MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(MODELS)}") from None
    return builder(**kwargs)


def model_config(model: onnx.ModelProto) -> dict:
    """The builder arguments recorded in the model's metadata (empty if absent)."""
    props = {p.key: p.value for p in model.metadata_props}
    return json.loads(props.get(META_CONFIG, "{}"))


def _input_ranges(model: onnx.ModelProto) -> dict[str, list]:
    props = {p.key: p.value for p in model.metadata_props}
    ranges = json.loads(props.get(META_INPUT_RANGES, "{}"))
    # Fallback for foreign models: an integer input used directly as Gather indices on an
    # initializer table is in [0, rows).
    inits = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) > 1 and node.input[0] in inits:
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            ranges.setdefault(node.input[1], [0, int(inits[node.input[0]].dims[axis])])
    return ranges


def input_specs(model: onnx.ModelProto) -> dict[str, tuple[list[int], np.dtype]]:
    """The shape and dtype of every graph input (initializers are weights, not inputs); a
    ValueError for a shape that is not static or a dtype ``example_inputs`` cannot fill. Cheap:
    checks a model's inputs before anything is allocated for them."""
    inits = {t.name for t in model.graph.initializer}
    specs = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape = [d.dim_value for d in tt.shape.dim]
        if any(s <= 0 for s in shape):
            raise ValueError(f"input {vi.name!r} has a non-static shape {shape}")
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if not (np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.integer)):
            raise ValueError(f"unsupported input dtype {dtype} for {vi.name!r}")
        specs[vi.name] = (shape, dtype)
    return specs


def example_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs for every graph input (``input_specs``): floats ~ N(0, 1), integers uniform
    in the input's valid range (from metadata or the Gather table it indexes)."""
    rng = np.random.default_rng(seed)
    ranges = _input_ranges(model)
    feeds = {}
    for name, (shape, dtype) in input_specs(model).items():
        if np.issubdtype(dtype, np.floating):
            feeds[name] = rng.standard_normal(shape).astype(dtype)
        else:
            low, high = ranges.get(name, (0, 2))
            high = np.broadcast_to(np.asarray(high), shape)
            feeds[name] = rng.integers(low, high, size=shape).astype(dtype)
    return feeds


def macs(model: onnx.ModelProto) -> int:
    """Multiply-accumulates of all Conv, MatMul and Gemm nodes, computed from the
    (inferred) static shapes. Conv: |output| * Cin/groups * prod(kernel); MatMul:
    |output| * K; Gemm: M * N * K (bias adds are not counted)."""
    inferred = infer_shapes(model)
    shapes: dict[str, list[int]] = {}
    g = inferred.graph
    for vi in [*g.input, *g.value_info, *g.output]:
        shapes[vi.name] = [d.dim_value for d in vi.type.tensor_type.shape.dim]
    for t in [*g.initializer, *model.graph.initializer]:
        shapes[t.name] = list(t.dims)

    def shape(name: str) -> list[int]:
        s = shapes.get(name)
        if s is None or any(d <= 0 for d in s):
            raise ValueError(f"no static shape for tensor {name!r}")
        return s

    total = 0
    for node in g.node:
        if node.op_type == "Conv":
            w = shape(node.input[1])
            total += math.prod(shape(node.output[0])) * math.prod(w[1:])
        elif node.op_type == "MatMul":
            a = shape(node.input[0])
            total += math.prod(shape(node.output[0])) * a[-1]
        elif node.op_type == "Gemm":
            attrs = {a.name: a.i for a in node.attribute}
            a = shape(node.input[0])
            k = a[0] if attrs.get("transA", 0) else a[1]
            total += math.prod(shape(node.output[0])) * k
    return total


__all__ = ["MODELS", "TINY", "GraphBuilder", "example_inputs", "get_model", "infer_shapes",
           "macs", "model_config"]
