"""SoD2 (seed 001) on dynamic models: what RDP resolves beyond Relax's own shape inference.

    python benchmarks/sod2.py                    # the table, every dynamic model
    python benchmarks/sod2.py --show skipnet     # and the per-tensor report of one model

Each model of ``tvm_dsa.models.dynamic`` is imported with TVM's ONNX importer (symbolic dims
stay symbolic) and analysed by RDP. A tensor is *resolved* when its rank and every dim are
known in terms of the function's inputs (integers and the input's symbolic dims): by Relax, from
the struct info the importer and Relax's inference gave it; by RDP, from its fixed point.
"""

from __future__ import annotations

import argparse
import time
import warnings

from tvm.relax.frontend.onnx import from_onnx

from tvm_dsa.models.dynamic import DYNAMIC
from tvm_dsa.relax_passes import rdp


def _table(header: list[str], rows: list[list]) -> None:
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    print("  ".join(str(h).ljust(w) for h, w in zip(header, widths)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(str(c).rjust(w) if k else str(c).ljust(w) for k, (c, w) in enumerate(zip(r, widths))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--show", choices=sorted(DYNAMIC), help="print the per-tensor report of this model")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", module="tvm.relax.frontend.onnx")
    rows, reports = [], {}
    for name, build in DYNAMIC.items():
        mod = from_onnx(build(), keep_params_in_input=False)
        start = time.perf_counter()
        result = rdp.analyze(mod)
        seconds = time.perf_counter() - start
        s = result.summary()
        reports[name] = result
        rows.append([name, s.tensors, s.relax, s.rdp, s.rdp_only, f"{s.relax_dims}/{s.dims}",
                     f"{s.rdp_dims}/{s.dims}", result.visits, f"{seconds * 1e3:.0f}"])
    print("Tensors with rank and dims resolved in terms of the inputs (params and bindings)\n")
    _table(["model", "tensors", "Relax", "RDP", "RDP only", "dims Relax", "dims RDP", "visits", "RDP ms"], rows)
    if args.show:
        print(f"\n{args.show}\n")
        print(reports[args.show])


if __name__ == "__main__":
    main()
