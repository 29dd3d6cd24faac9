"""The BYOC flow against the ``dsa`` pipeline's layerwise schedule on the tiny zoo (issue 38).

    python benchmarks/byoc.py [--models resnet18 bert_base]

Per model: ``partition_for_dsa`` (the ``dsa.`` patterns) + ``RunCodegen`` + an llvm build, next to
``tvm.compile(mod, target="dsa/stcp920", relax_pipeline=tvm_dsa.pipeline("layerwise"))`` (a pattern
is one fused op: the layerwise schedule's kernels), each run once on the example inputs. Columns: DSA
kernel calls of each flow; of the BYOC flow's programs, how many the ``dsa`` pipeline also builds
(names aside: ``Program.nameless``); the MACs each ran on the DSA; the simulated cycles; the
largest difference of the two flows' outputs, relative to llvm's largest value; composites the
codegen left on the host. Where the pipeline offloads ops no pattern covers (concatenations, the
importer's own TIR functions such as a Clip's), the flows group differently.
"""

from __future__ import annotations

import argparse
import collections
import json

import numpy as np
import tvm
from tvm import relax

import tvm_dsa
from tvm_dsa.byoc.codegen import composites_of
from tvm_dsa.byoc.partition import partition_for_dsa
from tvm_dsa.harness import import_onnx
from tvm_dsa.models import TINY, example_inputs, get_model


def run(ex, args):
    with tvm_dsa.session() as s:
        out = relax.VirtualMachine(ex, tvm.cpu())["main"](*args)
    while not hasattr(out, "numpy"):
        out = out[0]
    return out.numpy(), s.kernel_runs()


def compare(name: str) -> dict:
    model = get_model(name, **TINY[name])
    mod = import_onnx(model)
    args = [tvm.runtime.tensor(v) for v in example_inputs(model).values()]
    ex = tvm.compile(relax.transform.RunCodegen()(partition_for_dsa(mod)), target="llvm")
    byoc, byoc_runs = run(ex, args)
    dsa, dsa_runs = run(tvm.compile(mod, target="dsa/stcp920", relax_pipeline=tvm_dsa.pipeline("layerwise")), args)
    llvm, _ = run(tvm.compile(mod, target="llvm"), args)
    built = collections.Counter(json.dumps(k.program.nameless()) for k in dsa_runs)
    same = sum((built & collections.Counter(json.dumps(k.program.nameless()) for k in byoc_runs)).values())
    scale = max(np.abs(llvm).max(), 1e-6)
    return {"model": name, "byoc": len(byoc_runs), "dsa": len(dsa_runs), "same": same,
            "byoc_macs": sum(k.report.macs for k in byoc_runs), "dsa_macs": sum(k.report.macs for k in dsa_runs),
            "byoc_cycles": sum(k.report.cycles for k in byoc_runs), "dsa_cycles": sum(k.report.cycles for k in dsa_runs),
            "flows": np.abs(byoc - dsa).max() / scale, "llvm": np.abs(byoc - llvm).max() / scale,
            "host": sum(c.host is not None for c in composites_of(ex))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(TINY), choices=list(TINY))
    rows = [compare(name) for name in parser.parse_args().models]
    head = ("model", "kernels byoc/dsa", "same programs", "DSA MACs byoc/dsa", "cycles byoc/dsa", "|byoc-dsa|",
            "|byoc-llvm|", "host")
    print(" | ".join(head))
    print(" | ".join("---" for _ in head))
    for r in rows:
        print(f"{r['model']} | {r['byoc']} / {r['dsa']} | {r['same']} of {r['byoc']} | {r['byoc_macs']:,} / "
              f"{r['dsa_macs']:,} | {r['byoc_cycles']:,} / {r['dsa_cycles']:,} | {r['flows']:.2e} | {r['llvm']:.2e} | "
              f"{r['host']}")


if __name__ == "__main__":
    main()
