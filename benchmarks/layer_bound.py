"""A CNN's bound on a chip when its layers run one after another (issue 39): below the model's
roofline, what no program of one kernel per layer (or per fused group) can beat.

    python benchmarks/layer_bound.py                       # MobileNetV2 at batch 8 on stcp920
    python benchmarks/layer_bound.py --models resnet50 mobilenet_v2 --batch 1
    python benchmarks/layer_bound.py --tiny                # a quick check of the script

Each convolution of the ONNX graph takes at least the longest of

- its MACs on the chip's MMEs, each PE-array pass filled only as far as the reduction (rows) and
  the output channels (columns) reach, for a pointwise or dense convolution;
- its MACs on the VMEs' lanes, for a depthwise convolution (the MME would use one PE column);
- its input, weights and output through the clusters' GB ports (``gb_bytes_per_cycle`` each) in
  the storage type: a layer reads its input from the GB and writes its output there.

Summed over the layers in order, that is the bound of layer-by-layer execution. The two fused
variants sum it per group instead, the group's units overlapped and its intermediates kept in the
LBs: a depthwise convolution with the pointwise one after it (``kernelgen.blocks``), and an
inverted residual block's expansion, depthwise and projection. Printed with the model's roofline
(``report.roofline_cycles``'s bound: MACs at the peak, or the model's bytes through DDR once) and
what that allows of it.
"""

from __future__ import annotations

import argparse
import math

import numpy as np
from onnx import numpy_helper, shape_inference

from graphturbo import WORKLOADS, _table, load_workload
from tvm_dsa import hardware


def layers(model, hw) -> list[dict]:
    """Per convolution in graph order: its kind, compute cycles on the chip, input and output
    bytes, weight bytes."""
    inferred = shape_inference.infer_shapes(model)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output)}
    weights = {i.name: numpy_helper.to_array(i).shape for i in model.graph.initializer}
    cores, item = hw.clusters * hw.cores_per_cluster, np.dtype(hw.storage_dtype).itemsize
    out = []
    for node in model.graph.node:
        if node.op_type != "Conv":
            continue
        x, w, y = shapes[node.input[0]], weights[node.input[1]], shapes[node.output[0]]
        group = next((a.i for a in node.attribute if a.name == "group"), 1)
        macs = math.prod(y) * w[1] * w[2] * w[3]
        if group > 1 and w[1] == 1:
            kind, cycles = "dw", macs / (cores * hw.vme_lanes)
        else:
            k, n, rows, cols = w[1] * w[2] * w[3], y[1], hw.mme.rows, hw.mme.cols
            fill = k / (rows * math.ceil(k / rows)) * n / (cols * math.ceil(n / cols))
            kind, cycles = "conv", macs / (cores * rows * cols * fill)
        out.append(dict(kind=kind, cycles=cycles, macs=macs, x=math.prod(x) * item, y=math.prod(y) * item,
                        w=math.prod(w) * item))
    return out


def bound(convs: list[dict], hw, fuse: int) -> float:
    """Cycles of the layers in order, groups of ``fuse`` (1: none; 2: depthwise + pointwise; 3:
    pointwise + depthwise + pointwise) as one, each at least its busiest unit or port."""
    port = hw.clusters * hw.gb_bytes_per_cycle
    patterns = {2: ("dw", "conv"), 3: ("conv", "dw", "conv")}
    total, i = 0.0, 0
    while i < len(convs):
        n = 1
        for size in (3, 2):
            kinds = tuple(c["kind"] for c in convs[i:i + size])
            if size <= fuse and kinds == patterns[size]:
                n = size
                break
        group = convs[i:i + n]
        mme = sum(c["cycles"] for c in group if c["kind"] == "conv")
        vme = sum(c["cycles"] for c in group if c["kind"] == "dw")
        gb = (group[0]["x"] + group[-1]["y"] + sum(c["w"] for c in group)) / port
        total += max(mme, vme, gb)
        i += n
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", choices=sorted(WORKLOADS), default=["mobilenet_v2"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--target", default="dsa/stcp920")
    ap.add_argument("--tiny", action="store_true")
    args = ap.parse_args()
    hw = hardware.get(args.target)
    rows = []
    for label in args.models:
        model = load_workload(label, args.batch, args.tiny)
        convs = layers(model, hw)
        peak = sum(c["macs"] for c in convs) / (hw.clusters * hw.cores_per_cluster * hw.mme.rows * hw.mme.cols)
        cells = [label, args.batch, f"{peak:,.0f}"]
        for fuse in (1, 2, 3):
            b = bound(convs, hw, fuse)
            cells.append(f"{b:,.0f} ({100 * peak / b:.0f} %)")
        rows.append(cells)
    _table(f"{args.target}: the convolutions' MACs at the peak, and the bound of running them in order "
           "(the share of that peak it allows)",
           ["model", "batch", "MACs at peak", "layer by layer", "dw + pw fused", "pw + dw + pw fused"], rows)


if __name__ == "__main__":
    main()
