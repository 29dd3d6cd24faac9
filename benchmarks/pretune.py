"""Fill the pre-tuned records shipped in the package (seed 004's TopHub): tune the benchmark
models' distinct DSA kernels on a chip preset and keep the best record of each kernel in
``src/tvm_dsa/tuning/records/<preset>/`` (merged with the records already there).

    python benchmarks/pretune.py                                   # tiny ResNet-50 and BERT, stcp920
    python benchmarks/pretune.py --size full --model resnet50 --trials 8 --population 16
    python benchmarks/pretune.py --target dsa/set-edge16 --model resnet18

Per model: its kernels' cycles with the default tiling and with the best record, the tuning wall
time, and how many workloads the shipped database holds afterwards.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import tvm_dsa
from tvm_dsa import hardware
from tvm_dsa.harness import import_onnx, load_model
from tvm_dsa.models import MODELS
from tvm_dsa.tuning import merge_records, records_dir


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", action="append", choices=list(MODELS), help="default: resnet50 and bert_base")
    p.add_argument("--size", action="append", choices=("tiny", "full"), help="model sizes (default: tiny)")
    p.add_argument("--target", default="dsa/stcp920")
    p.add_argument("--trials", type=int, default=16, help="measured candidates per kernel (default 16)")
    p.add_argument("--population", type=int, default=64, help="evolutionary search population (default 64)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work-dir", help="keep the tuning databases here (one folder per model); default: temporary")
    args = p.parse_args()
    chip = hardware.get(args.target).name
    shipped = records_dir(chip)
    rows = [("model", "size", "kernels", "default cycles", "tuned cycles", "speedup", "tune s", "shipped workloads")]
    for size in args.size or ["tiny"]:
        for name in args.model or ["resnet50", "bert_base"]:
            mod = import_onnx(load_model(name, tiny=size == "tiny"))
            with tempfile.TemporaryDirectory(prefix="tvm-dsa-pretune-") as tmp:
                work_dir = Path(args.work_dir, f"{name}-{size}") if args.work_dir else Path(tmp)
                print(f"... tuning {name} ({size}, {args.trials} trials per kernel) on {args.target}", file=sys.stderr, flush=True)
                start = time.perf_counter()
                result = tvm_dsa.tune(mod, args.target, trials=args.trials, work_dir=work_dir, seed=args.seed,
                                      population=args.population)
                seconds = time.perf_counter() - start
                print(f"\n{name} ({size}) on {args.target}:\n{result}\n", flush=True)
                sources = [shipped] if shipped.is_dir() else []
                workloads = merge_records(sources + [work_dir], chip)
            before, after = result.cycles(False), result.cycles(True)
            rows.append((name, size, str(len(result.tasks)), f"{before:,}", f"{after:,}", f"{before / after:.3f}x",
                         f"{seconds:.0f}", str(workloads)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.rjust(w) if i > 1 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))))


if __name__ == "__main__":
    main()
