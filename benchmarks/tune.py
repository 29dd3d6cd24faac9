"""Cycles before and after meta-schedule tuning of a model's DSA kernels, on the simulator.

    python benchmarks/tune.py                       # tiny ResNet-50 and BERT on dsa/stcp920
    python benchmarks/tune.py --model resnet50 --trials 32 --batch 4
    python benchmarks/tune.py --model mobilenet_v2 --size full --trials 8   # the full-size model
    python benchmarks/tune.py --conv 64,28 --trials 32  # one 64-channel 3x3 conv + ReLU on 28x28
    python benchmarks/tune.py --shipped --size tiny --size full   # the shipped records, no tuning

Per kernel: the default tiling's cycles (``lower_kernel``), the best record's after tuning with
``--trials`` measured candidates per kernel (in all: that times the model's distinct kernels),
the trials it got. Per model: the same summed over the kernel calls, and a
timing-only run of the whole model compiled without and with the database (every DSA kernel,
launches included), with the tuning wall time.

``--shipped`` tunes nothing: per model and size it compiles without records and with the records
shipped in the package (``tuning/records/<chip>``, filled by ``benchmarks/pretune.py``) and prints
the timing-only cycles of both and how many kernels had a record.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import tvm_dsa
from tvm_dsa.harness import Compiled, import_onnx, load_model
from tvm_dsa.models import MODELS, example_inputs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", action="append", choices=list(MODELS), help="default: resnet50 and bert_base")
    p.add_argument("--target", default="dsa/stcp920")
    p.add_argument("--trials", type=int, default=16, help="measured candidates per kernel (default 16)")
    p.add_argument("--batch", type=int, help="batch size of the models")
    p.add_argument("--conv", metavar="CHANNELS,SIZE", help="tune one 3x3 conv + ReLU instead of the models")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work-dir", help="keep the databases here (one folder per model); default: temporary")
    p.add_argument("--shipped", action="store_true", help="measure the shipped records instead of tuning")
    p.add_argument("--size", action="append", choices=("tiny", "full"), help="model sizes (default: tiny)")
    args = p.parse_args()
    if args.shipped:
        shipped(args.model or ["resnet50", "bert_base"], args.size or ["tiny"], args.target)
        return
    if args.conv:
        channels, size = (int(v) for v in args.conv.split(","))
        models = {f"conv{channels}x{size}": _conv(channels, size)}
    else:
        models = {name + ("" if size == "tiny" else f" ({size})"): load_model(name, tiny=size == "tiny", batch=args.batch)
                  for size in args.size or ["tiny"] for name in args.model or ["resnet50", "bert_base"]}

    rows = [("model", "DSA kernels", "default cycles", "tuned cycles", "speedup", "model default", "model tuned",
             "model speedup", "tune s")]
    for name, model in models.items():
        mod, inputs = import_onnx(model), example_inputs(model)
        keep = Path(args.work_dir, name.replace(" ", "_")) if args.work_dir else None
        with (nullcontext(str(keep)) if keep else tempfile.TemporaryDirectory(prefix="tvm-dsa-tune-bench-")) as work_dir:
            print(f"... tuning {name} ({args.trials} trials per kernel)", file=sys.stderr, flush=True)
            start = time.perf_counter()
            result = tvm_dsa.tune(mod, args.target, trials=args.trials, work_dir=work_dir, seed=args.seed)
            seconds = time.perf_counter() - start
            print(f"\n{name} on {args.target}:\n{result}\n")
            before = Compiled.build(mod, args.target, "layerwise", database=False).run(inputs, mode="timing").report.cycles
            after = Compiled.build(mod, args.target, "layerwise", database=work_dir).run(inputs, mode="timing").report.cycles
        rows.append((name, str(len(result.tasks)), f"{result.cycles(False):,}", f"{result.cycles(True):,}",
                     f"{result.cycles(False) / result.cycles(True):.3f}x", f"{before:,}", f"{after:,}",
                     f"{before / after:.3f}x", f"{seconds:.0f}"))
    _print(rows)


def shipped(models: list[str], sizes: list[str], target: str) -> None:
    """Cycles of each model compiled without records and with the shipped ones (timing only)."""
    rows = [("model", "size", "DSA kernels", "with a record", "no records", "shipped records", "speedup")]
    for size in sizes:
        for name in models:
            model = load_model(name, tiny=size == "tiny")
            mod, inputs = import_onnx(model), example_inputs(model)
            before = Compiled.build(mod, target, "layerwise", database=False)
            after = Compiled.build(mod, target, "layerwise")
            b, a = (c.run(inputs, mode="timing", check_hazards=False).report.cycles for c in (before, after))
            rows.append((name, size, str(len(after.offload.dsa)), str(len(after.offload.tuned)), f"{b:,}", f"{a:,}",
                         f"{b / a:.3f}x"))
            print(f"... {name} ({size}) done", file=sys.stderr, flush=True)
    _print(rows)


def _print(rows) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))))


def _conv(channels: int, size: int):
    """A 3x3 same-padded conv + ReLU with seeded weights, as one ONNX model."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).standard_normal((channels, channels, 3, 3)).astype("float32") * 0.1
    shape = [1, channels, size, size]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])],
        "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


if __name__ == "__main__":
    main()
