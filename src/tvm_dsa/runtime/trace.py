"""Chrome / Perfetto trace-event JSON of a timed program: open it in ui.perfetto.dev or chrome://tracing.

One process per core (and one per cluster for its ``cdma``), one track per unit that ran something,
one complete ("X") event per instruction with its kernel, index, layer (name and output shape,
from the kernel's layer marks) and bytes or MACs. Every dependency of a compute instruction on a
DMA (a load it waits for) is a flow: a start ("s") event inside the DMA's slice and a finish
("f", bound to the enclosing slice) inside the compute's, with the same id, so ui.perfetto.dev
draws an arrow from the load to its consumer.
"""

from __future__ import annotations

import itertools
import json

from tvm_dsa.hardware.model import Hardware
from tvm_dsa.isa.instructions import OPCODE_OF, Dma, Fill, Mme, macs
from tvm_dsa.isa.program import Program
from tvm_dsa.runtime.cost import elements
from tvm_dsa.runtime.timing import ProgramTiming

TRACKS = ("dma", "mme", "vme", "vec", "cdma", "pdma")
_FLOW_IDS = itertools.count()  # unique in the process: traces of several runs concatenate


def _pid(unit: tuple[str, int], hw: Hardware) -> int:
    kind, index = unit
    return hw.cores + index if kind == "cdma" else index


def trace_events(program: Program, hw: Hardware, timing: ProgramTiming, offset: int = 0) -> list[dict]:
    """Trace events of ``timing`` shifted by ``offset`` cycles (so several runs concatenate)."""
    us = 1e6 / hw.clock_hz
    events, tracks = [], set()
    for k, kt in zip(program.kernels, timing.kernels):
        base = offset + kt.start_cycle
        marks = k.layer_of_each()
        shown = kt.shown()
        where = [(_pid(unit, hw), TRACKS.index(unit[0]), (base + s) * us) for unit, s in zip(kt.units, shown)]
        for n, (ins, unit, s, e) in enumerate(zip(k.instructions, kt.units, shown, kt.end)):
            pid, tid = where[n][:2]
            tracks.add((pid, tid, unit))
            name = OPCODE_OF[type(ins)] + (f".{ins.op}" if hasattr(ins, "op") else "")
            args = {"kernel": k.name, "index": n}
            if marks[n] is not None:
                args["layer"], args["output"] = marks[n].name, list(marks[n].shape)
            if isinstance(ins, (Dma, Fill)):
                args["bytes"] = elements(ins.shape) * ins.dst.itemsize
            elif isinstance(ins, Mme):
                args["macs"] = macs(ins)
            else:
                args["elements"] = elements(ins.shape)
            events.append({"name": name, "cat": unit[0], "ph": "X", "pid": pid, "tid": tid,
                           "ts": (base + s) * us, "dur": (e - s) * us, "args": args})
            if not isinstance(ins, (Dma, Fill)):
                for d in ins.deps:
                    if isinstance(k.instructions[d], Dma):
                        events += _flow(next(_FLOW_IDS), where[d], where[n])
    meta, named = [], set()
    for pid, tid, (kind, index) in sorted(tracks):
        if pid not in named:
            named.add(pid)
            process = f"cluster {index}" if kind == "cdma" else f"core {index}"
            meta.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": process}})
        meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": kind}})
    return meta + events


def _flow(flow_id: int, producer: tuple, consumer: tuple) -> list[dict]:
    """A flow arrow from the slice starting at ``producer`` to the one starting at ``consumer``
    (each ``(pid, tid, ts)``): a start event and a finish bound to its enclosing slice."""
    return [{"name": "load", "cat": "dma-flow", "ph": ph, "id": flow_id, "pid": pid, "tid": tid, "ts": ts,
             **({"bp": "e"} if ph == "f" else {})}
            for ph, (pid, tid, ts) in (("s", producer), ("f", consumer))]


def write_trace(events: list[dict], path) -> None:
    with open(path, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ns"}, f)
