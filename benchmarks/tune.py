"""Cycles before and after meta-schedule tuning of a model's DSA kernels, on the simulator.

    python benchmarks/tune.py                       # tiny ResNet-50 and BERT on dsa/stcp920
    python benchmarks/tune.py --model resnet50 --trials 32 --batch 4

Per kernel: the default tiling's cycles (``lower_kernel``), the best record's after tuning with
``--trials`` measured candidates per kernel (in all: that times the model's distinct kernels),
the trials it got. Per model: the same summed over the kernel calls, and a
timing-only run of the whole model compiled without and with the database (every DSA kernel,
launches included), with the tuning wall time.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

import tvm_dsa
from tvm_dsa.driver import Compiled, import_onnx, load_model
from tvm_dsa.models import MODELS, example_inputs
from tvm_dsa.tuning import extract_tasks


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", action="append", choices=list(MODELS), help="default: resnet50 and bert_base")
    p.add_argument("--target", default="dsa/stcp920")
    p.add_argument("--trials", type=int, default=16, help="measured candidates per kernel (default 16)")
    p.add_argument("--batch", type=int, help="batch size of the tiny models")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    rows = [("model", "DSA kernels", "default cycles", "tuned cycles", "speedup", "model default", "model tuned",
             "model speedup", "tune s")]
    for name in args.model or ["resnet50", "bert_base"]:
        model = load_model(name, tiny=True, batch=args.batch)
        mod, inputs = import_onnx(model), example_inputs(model)
        trials = args.trials * len(extract_tasks(mod, args.target))
        with tempfile.TemporaryDirectory(prefix="tvm-dsa-tune-bench-") as work_dir:
            print(f"... tuning {name} ({trials} trials)", file=sys.stderr, flush=True)
            start = time.perf_counter()
            result = tvm_dsa.tune(mod, args.target, trials=trials, work_dir=work_dir, seed=args.seed)
            seconds = time.perf_counter() - start
            print(f"\n{name} (tiny{f', batch {args.batch}' if args.batch else ''}) on {args.target}:\n{result}\n")
            before = Compiled.build(mod, args.target).run(inputs, mode="timing").report.cycles
            after = Compiled.build(mod, args.target, database=work_dir).run(inputs, mode="timing").report.cycles
        rows.append((name, str(len(result.tasks)), f"{result.cycles(False):,}", f"{result.cycles(True):,}",
                     f"{result.cycles(False) / result.cycles(True):.3f}x", f"{before:,}", f"{after:,}",
                     f"{before / after:.3f}x", f"{seconds:.0f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))))


if __name__ == "__main__":
    main()
