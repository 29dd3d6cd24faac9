"""What the cores' DMAs load into their LBs, and how much of it is loaded more than once (issue 39).

    python benchmarks/core_loads.py --models resnet50 --batch 8
    python benchmarks/core_loads.py --tiny                    # a quick check of the script

Each workload is compiled as ``relax_pipeline="dsa"`` compiles it and run once in timing mode.
Over the programs of its kernels (written out: ``Program.expanded``), every transfer into an LB
from the GB or DDR is a load. Per layer, a load of a box (its source, shape and strides) counts
as

- ``again, same core``: the core already loaded that box in the layer (a tile's operand reloaded
  for the next tile: the tiling's reuse);
- ``again, other core``: another core of the cluster loaded it in the layer, not this one (what a
  multicast from the GB to several LBs would save).

Printed per model: the loads' bytes and count, their mean size, the two shares, and the loads'
set-ups (``dma_latency_cycles`` each) per core.
"""

from __future__ import annotations

from collections import defaultdict

from graphturbo import _step, _table, timed_run, workload_parser
from time_budget import SEVEN
from tvm_dsa.isa.instructions import Dma
from tvm_dsa.runtime.cost import elements


def core_loads(label: str, batch: int, tiny: bool, target: str) -> list[str]:
    """One row of the table for ``label`` at ``batch``."""
    run = timed_run(label, batch, tiny, target)
    hw = run.report.hardware
    total = count = same = other = 0
    for k in run.kernels:
        for kernel in k.program.expanded().kernels:
            loaders: dict = defaultdict(set)  # (layer, cluster, box) -> the cores that loaded it
            for ins, mark in zip(kernel.instructions, kernel.layer_of_each()):
                if not isinstance(ins, Dma) or ins.dst.mem != "lb" or ins.src.mem == "lb":
                    continue
                nbytes = elements(ins.shape) * ins.dst.itemsize
                total, count = total + nbytes, count + 1
                box = (mark.name if mark else None, ins.core // hw.cores_per_cluster, ins.src.mem, ins.src.index,
                       ins.src.offset, ins.src.strides, ins.shape)
                cores = loaders[box]
                if ins.core in cores:
                    same += nbytes
                elif cores:
                    other += nbytes
                cores.add(ins.core)
    return [label, str(batch), f"{total / 1e6:,.1f}", f"{count:,}", f"{total / max(count, 1):,.0f}",
            f"{same / max(total, 1):.1%}", f"{other / max(total, 1):.1%}",
            f"{count * hw.dma_latency_cycles / hw.cores:,.0f}"]


def main() -> None:
    args = workload_parser(__doc__, SEVEN).parse_args()
    rows = []
    for label in args.models:
        _step(f"{label} batch {args.batch}")
        rows.append(core_loads(label, args.batch, args.tiny, args.target))
    _table(f"Loads into the LBs under the pipeline's schedule on {args.target}, batch {args.batch}"
           f"{' (tiny)' if args.tiny else ''}", ["model", "batch", "MB loaded", "loads", "bytes / load", "again, same core", "again, other core",
            "set-up cycles / core"], rows)


if __name__ == "__main__":
    main()
