"""The MME dataflow each preset should run: the standard dataflows ranked on the zoo's MME tile shapes.

    python benchmarks/tenet_choose.py                          # the tiny zoo on stcp920 and set-edge16-fp16
    python benchmarks/tenet_choose.py --full resnet18 --targets dsa/stcp920   # a full-size model's shapes

Every model is compiled for the preset (layerwise) and run timing-only; its MME instructions'
products (M x N x K, per shape) are pooled, and each standard dataflow with stored closed forms for
the preset's MME is charged Σ products × ⌈latency⌉ (``tvm_dsa.harness.dataflow_choice``). Printed per preset:
the ranking, the MAC utilisation each gives, and the dataflow the preset runs.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

from tvm_dsa import hardware
from tvm_dsa.harness.dataflow_choice import model_products, rank
from tvm_dsa.models import TINY


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--targets", nargs="*", default=["dsa/stcp920", "dsa/set-edge16-fp16"])
    p.add_argument("--full", nargs="*", help="full-size models instead of the tiny zoo")
    args = p.parse_args()
    models = [(m, False) for m in args.full] if args.full else [(m, True) for m in TINY]
    for target in args.targets:
        hw = hardware.get(target.removeprefix("dsa/"))
        products: Counter = Counter()
        for name, tiny in models:
            print(f"... {name} on {target}", file=sys.stderr, flush=True)
            products += model_products(name, target, tiny)
        ranked = rank(hw, products)
        width = max(len(r.dataflow) for r in ranked)
        print(f"\n{target}: {hw.mme.rows}x{hw.mme.cols} {hw.mme.interconnect} MME; "
              f"{', '.join(m for m, _ in models)}{' (tiny)' if not args.full else ''}: "
              f"{sum(products.values()):,} products of {len(products)} tile shapes\n")
        print(f"{'dataflow':<{width}}  {'MME cycles':>12}  {'MAC util':>8}")
        for r in ranked:
            mark = "  <- the preset's" if r.dataflow == hw.mme.dataflow else ""
            print(f"{r.dataflow:<{width}}  {r.cycles:>12,}  {r.utilisation:>8.1%}{mark}")


if __name__ == "__main__":
    main()
