"""The spine benchmark: one model through the whole flow, DSA next to llvm.

    python benchmarks/spine.py                      # ResNet-50, batch 1, on dsa/stcp920 (minutes)
    python benchmarks/spine.py --tiny               # a quick check of the script

Prints compile times, the timing-only simulation (cycles, seconds, roofline), the share of MACs on
the DSA, the wall time of one functional simulation next to one llvm run, and the error of the DSA's
output against llvm's and onnxruntime's.
"""

from __future__ import annotations

import argparse
import sys

import onnxruntime as ort

from tvm_dsa.harness import Compiled, check_target, dsa_mac_share, import_onnx, load_model, max_relative_error
from tvm_dsa.models import MODELS, example_inputs


def _step(text: str) -> None:
    print(f"... {text}", file=sys.stderr, flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet50", choices=list(MODELS))
    p.add_argument("--tiny", action="store_true", help="the model's small configuration")
    p.add_argument("--target", default="dsa/stcp920")
    args = p.parse_args()

    model = load_model(args.model, tiny=args.tiny)
    check_target(args.target, model)
    mod, inputs = import_onnx(model), example_inputs(model)
    _step("compiling for llvm")
    llvm = Compiled.build(mod, "llvm")
    _step(f"compiling for {args.target}")
    dsa = Compiled.build(mod, args.target)
    _step("running on llvm and onnxruntime")
    ref = llvm.run(inputs)
    ort_out = ort.InferenceSession(model.SerializeToString()).run(None, inputs)
    _step("timing-only simulation")
    timed = dsa.run(inputs, mode="timing").report
    _step("functional simulation")
    functional = dsa.run(inputs)
    share = dsa_mac_share(dsa.offload)

    rows = [
        ("model", f"{args.model}{' (tiny)' if args.tiny else ''}, batch 1, on {args.target}"),
        ("compile time, dsa / llvm", f"{dsa.seconds:.1f} s / {llvm.seconds:.1f} s"),
        ("kernels on the DSA / host", f"{len(dsa.offload.dsa)} / {len(dsa.offload.host)}"),
        ("MACs on the DSA", f"{share:.1%}" if share is not None else "n/a"),
        ("simulated cycles (timing-only)", f"{timed.cycles:,}"),
        ("simulated time at the clock", f"{timed.seconds * 1e3:.4g} ms @ {timed.hardware.clock_hz / 1e9:g} GHz"),
        ("roofline cycles", f"{timed.roofline_cycles:,.0f}"),
        ("cycles / roofline", f"{timed.roofline_ratio:.2f}"),
        ("wall time of one run, functional sim / llvm", f"{functional.seconds:.2f} s / {ref.seconds:.4f} s"),
        ("max |dsa - llvm| / max |llvm|", f"{max_relative_error(functional.outputs, ref.outputs):.2e}"),
        ("max |dsa - onnxruntime| / max |onnxruntime|",
         f"{max_relative_error(functional.outputs, list(ort_out)):.2e}"),
    ]
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"{k:<{width}}  {v}" for k, v in rows))


if __name__ == "__main__":
    main()
