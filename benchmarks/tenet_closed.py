"""Closed forms against counting: the time to get one MME tile shape's metrics, per stored dataflow.

    python benchmarks/tenet_closed.py            # every stored (dataflow, array, interconnect), three shapes

For each dataflow with stored closed forms (``tvm_dsa.dataflow.closed``) and each tile shape: the
milliseconds ``analyse`` takes to count the metrics on the relations (barvinok), the microseconds the
closed forms take (best of 200 evaluations), and whether the two agree on every count.
"""

from __future__ import annotations

import timeit
from time import perf_counter

from tvm_dsa.dataflow import closed
from tvm_dsa.dataflow.library import BENCHMARKS, standard_dataflows
from tvm_dsa.dataflow.metrics import analyse
from tvm_dsa.dataflow.notation import PEArray, interconnect

SHAPES = [(64, 64, 64), (196, 128, 576), (49, 512, 1152)]  # (M, N, K): ResNet-like conv tiles as GEMMs
BANDWIDTH = 128.0


def main() -> None:
    rows = [("dataflow", "array", "interconnect", "M x N x K", "counted ms", "closed-form us", "equal")]
    for key in closed.stored():
        name, r, c, links = key
        for m, n, k in SHAPES:
            gemm = BENCHMARKS["gemm"]
            df = standard_dataflows(gemm, gemm.op({"i": m, "j": n, "k": k}), (r, c))[name]
            start = perf_counter()
            exact = analyse(df, PEArray((r, c), interconnect(links, 2), BANDWIDTH))
            counted = perf_counter() - start
            fast = min(timeit.repeat(lambda: closed.metrics(key, BANDWIDTH, m, n, k), number=200, repeat=3)) / 200
            got = closed.metrics(key, BANDWIDTH, m, n, k)
            same = (got.instances, got.time_stamps, got.tensors) == (exact.instances, exact.time_stamps, exact.tensors)
            rows.append((name, f"{r}x{c}", links, f"{m}x{n}x{k}", f"{counted * 1e3:,.1f}", f"{fast * 1e6:,.0f}",
                         "yes" if same else "NO"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(v.ljust(w) if i < 4 else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths))).rstrip())


if __name__ == "__main__":
    main()
