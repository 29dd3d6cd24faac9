"""Conv tiles on the MME: compute-bound or not, and what sliding-window reuse could save (docs/tenet.md).

    python benchmarks/tenet_conv.py                                  # ResNet-18, batch 1, 224 x 224, dsa/stcp920
    python benchmarks/tenet_conv.py --target dsa/set-edge16-fp16

The codegen hands the MME a conv tile as its im2col GEMM (M = output pixels, N = output channels, K =
window x input channels) whose A operand is an overlapping window view of the input in the LB. Printed:

1. per distinct tile shape of the model's MME instructions, TENET's delays under the preset's dataflow
   (compute, read, write; latency is their max): where compute is the max, fewer LB reads change no cycle;
2. over the conv instructions whose window overlaps, A's unique volume under the dataflow (what the LB
   delivers now) against the im2col matrices' elements and the distinct input elements each instruction
   touches (its access relation's range, counted): the most that reusing the input could save, in LB
   reads and energy, against the run's totals;
3. one small 3x3 tile analysed twice with the preset's Θ, on the GEMM and on the convolution itself
   (i = pixel, k = window x channel substituted): the volumes, latency and distinct input elements.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter

from tvm_dsa import hardware
from tvm_dsa.dataflow import Dataflow, PEArray, TensorOp, analyse
from tvm_dsa.dataflow import relations as rel
from tvm_dsa.harness.dataflow_choice import mme_products
from tvm_dsa.dataflow.library import BENCHMARKS, mme_bandwidth, standard_dataflows
from tvm_dsa.dataflow.mme import tile_metrics
from tvm_dsa.dataflow.notation import interconnect
from tvm_dsa.harness import Compiled, check_target, import_onnx, load_model
from tvm_dsa.isa import Mme
from tvm_dsa.models import MODELS, example_inputs
from tvm_dsa.runtime.cost import mme_dims


def distinct_elements(ins: Mme) -> int:
    """How many distinct LB elements operand ``a`` of ``ins`` touches: the range of its access relation."""
    loops = {f"d{n}": e for n, e in enumerate(ins.shape)}
    index = " + ".join(f"{s}*{d}" for d, s in zip(loops, ins.a.strides) if s) or "0"
    op = TensorOp.parse("mme", f"Y[d0] += X[{index}] * W[d0]", loops)
    return rel.count(rel.access(op, "X").range())


def table(rows: list[tuple]) -> None:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(str(c).rjust(w) for c, w in zip(r, widths)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet18", choices=list(MODELS))
    p.add_argument("--target", default="dsa/stcp920")
    args = p.parse_args()
    hw = hardware.get(args.target.removeprefix("dsa/"))
    model = load_model(args.model)
    check_target(args.target, model, timing_only=True)
    print(f"... compiling and simulating (timing) {args.model} for {args.target}", file=sys.stderr, flush=True)
    run = Compiled.build(import_onnx(model), args.target, "layerwise").run(example_inputs(model), mode="timing",
                                                              check_hazards=False)
    mmes: Counter = Counter()  # one instruction of each (shape, reduce, operand strides) -> how many there are
    first: dict = {}
    for k in run.kernels:
        for kernel in k.program.kernels:
            for ins in kernel.instructions:
                if isinstance(ins, Mme):
                    mmes[first.setdefault((ins.shape, ins.reduce, ins.a.strides, ins.b.strides), ins)] += 1
    mme = hw.mme
    print(f"{args.model}, batch 1, on {args.target}: {mme.rows}x{mme.cols} {mme.interconnect} MME, dataflow "
          f"{mme.dataflow!r}, LB {mme_bandwidth(hw):g} elements/cycle\n")

    # 1. compute-bound?
    products = mme_products(k.program for k in run.kernels)
    rows = [("M", "N", "K", "products", "compute", "read", "write", "read/compute")]
    bound = {"compute": 0, "read": 0, "write": 0}
    for (m, n, k), times in sorted(products.items()):
        t = tile_metrics(hw, m, n, k)
        delays = {"compute": t.compute_delay, "read": t.read_delay, "write": t.write_delay}
        bound[max(delays, key=delays.get)] += times
        rows.append((m, n, k, f"{times:,}", f"{t.compute_delay:,.0f}", f"{t.read_delay:,.1f}",
                     f"{t.write_delay:,.1f}", f"{t.read_delay / t.compute_delay:.3f}"))
    table(rows)
    print(f"\nproducts bound by compute / read / write: {bound['compute']:,} / {bound['read']:,} / {bound['write']:,}\n")

    # 2. what sliding-window reuse could save
    now = im2col = distinct = reads = 0  # input elements delivered, im2col elements, distinct elements; all reads
    for ins, times in mmes.items():
        batch, m, n, k = mme_dims(ins)
        volumes = tile_metrics(hw, m, n, k)
        reads += times * batch * (volumes.tensor("A").unique + volumes.tensor("B").unique)
        touched = distinct_elements(ins)
        if touched < m * k:  # the window overlaps
            now += times * batch * volumes.tensor("A").unique
            im2col += times * batch * m * k
            distinct += times * batch * touched
    item, report = hw.storage_bytes, run.report
    saved = (now - distinct) * item
    joules = saved * 8 * hw.energy.lb_pj_per_bit * 1e-12
    print(f"conv instructions whose window overlaps: the LB delivers {now:,} input elements (A's unique volume), "
          f"{now / im2col:.2f}x the im2col matrices' {im2col:,}; they touch {distinct:,} distinct input elements "
          f"({im2col / distinct:.2f}x fewer than im2col)")
    print(f"at best (each distinct element read once) -{saved:,} B: {saved / (reads * item):.1%} of the MME's LB reads "
          f"({reads * item:,} B), {saved / report.lb_read:.1%} of the run's ({report.lb_read:,} B); LB energy "
          f"-{joules * 1e6:.1f} uJ, {joules / report.energy['lb']:.1%} of the LB's, {joules / report.energy_total:.1%} "
          f"of the run's {report.energy_total * 1e6:,.1f} uJ\n")

    # 3. one small 3x3 tile, GEMM form against conv form, the same Θ
    c, o, oh, ow, kh, kw = 4, 8, 4, 4, 3, 3
    gemm = BENCHMARKS["gemm"].op({"i": oh * ow, "j": o, "k": kh * kw * c})
    theta = standard_dataflows(BENCHMARKS["gemm"], gemm, (mme.rows, mme.cols))[mme.dataflow]
    conv = TensorOp.parse("conv", "Y[oy,ox,o] += X[oy + ry, ox + rx, c] * W[ry, rx, c, o]",
                          {"oy": oh, "ox": ow, "o": o, "ry": kh, "rx": kw, "c": c})
    names = {"i": f"(ox + {ow}*oy)", "j": "o", "k": f"(c + {c}*rx + {c * kw}*ry)"}
    conv_theta = Dataflow.parse(conv, re.sub(r"\b[ijk]\b", lambda v: names[v.group(0)], str(theta)))
    array = PEArray((mme.rows, mme.cols), interconnect(mme.interconnect, 2), mme_bandwidth(hw))
    print(f"a {oh}x{ow} output tile of a {kh}x{kw} conv, {c} -> {o} channels (GEMM {oh * ow} x {o} x {kh * kw * c}):")
    rows = [("form", "input total", "spatial", "temporal", "unique", "distinct", "latency", "compute")]
    for form, df, tensor in (("im2col GEMM", theta, "A"), ("convolution", conv_theta, "X")):
        t = analyse(df, array)
        v = t.tensor(tensor)
        rows.append((form, f"{v.total:,}", f"{v.spatial_reuse:,}", f"{v.temporal_reuse:,}", f"{v.unique:,}",
                     f"{rel.count(rel.access(df.op, tensor).range()):,}", f"{t.latency:,.1f}", f"{t.compute_delay:,.0f}"))
    table(rows)
    print(f"\nΘ on the GEMM: {theta}\nΘ on the convolution: {conv_theta}")


if __name__ == "__main__":
    main()
