"""DMA flows in the Perfetto/Chrome trace: every dependency of a compute instruction on a DMA is
one arrow (a start event in the load's slice, a finish in the consumer's, one id), and nothing else."""

from collections import defaultdict

from tvm import te

from tvm_dsa import hardware
from tvm_dsa.emit.emitter import build_program
from tvm_dsa.isa.instructions import Dma, Fill
from tvm_dsa.runtime import simulate
from tvm_dsa.tiling import lower_kernel

HW = hardware.get("dsa/stcp920")


def _matmul_relu(n: int):
    a = te.placeholder((n, n), "float32", name="A")
    b = te.placeholder((n, n), "float32", name="B")
    k = te.reduce_axis((0, n), "k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return te.create_prim_func([a, b, te.compute((n, n), lambda i, j: te.max(c[i, j], 0.0), name="D")])


def test_flow_ids_pair_up_against_the_programs_dependencies():
    program = build_program(lower_kernel(_matmul_relu(128), HW)[0], HW, "mm").expanded()
    events = simulate(program, mode="timing", trace=True, start_cycle=500).trace_events
    slices = {}  # (pid, tid, ts) -> (kernel, instruction index) of the slice starting there
    for e in events:
        if e["ph"] == "X":
            assert (e["pid"], e["tid"], e["ts"]) not in slices
            slices[(e["pid"], e["tid"], e["ts"])] = (e["args"]["kernel"], e["args"]["index"])
    ends = defaultdict(dict)  # flow id -> {"s": slice, "f": slice}
    for e in events:
        if e["ph"] in ("s", "f"):
            assert e["ph"] not in ends[e["id"]], f"flow {e['id']} has two {e['ph']} events"
            ends[e["id"]][e["ph"]] = slices[(e["pid"], e["tid"], e["ts"])]
            assert e.get("bp") == ("e" if e["ph"] == "f" else None)
    assert all(set(v) == {"s", "f"} for v in ends.values())
    flows = sorted((v["s"][0], v["s"][1], v["f"][1]) for v in ends.values())
    assert all(v["s"][0] == v["f"][0] for v in ends.values())  # within one kernel
    expected = sorted((k.name, d, n) for k in program.kernels for n, ins in enumerate(k.instructions)
                      if not isinstance(ins, (Dma, Fill)) for d in ins.deps if isinstance(k.instructions[d], Dma))
    assert flows == expected and len(expected) >= 8  # every core's tiles wait for their loads
