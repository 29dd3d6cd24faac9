"""Runs one reference model of a DSA core, SCALE-Sim or ZigZag, on a list of layers; the worker of
benchmarks/references.py, run with the Python of the reference's own venv (it imports only the
standard library and the reference, never TVM or tvm_dsa):

    /work/venv-scalesim/bin/python benchmarks/reference_sims.py scalesim JOB.json OUT.json
    /work/venv-zigzag/bin/python benchmarks/reference_sims.py zigzag JOB.json OUT.json

JOB holds ``layers`` (name, cin, cout, h, w, k, stride, pad; an FC is a 1 x 1 conv on a 1 x 1 input)
and the reference's ``settings`` (written by references.py); OUT gets ``{layer name: record}``.

- SCALE-Sim: one simulation per layer and run (a fresh simulator each, so memory stays that of one
  layer). A run names its dataflow (``ws``/``os``/``is``) and its DRAM bandwidth in words per cycle,
  ``null`` for SCALE-Sim's CALC mode (bandwidth estimated, no stalls). Recorded per run: the compute
  cycles of its report (stalls included in USER mode) and the stall cycles.
- ZigZag: its ``tpu_like`` core (inputs/hardware/tpu_like.yaml) with the array, on-chip SRAM and DRAM
  bandwidth of the settings and its ``tpu_like`` mapping plus the settings' per-layer mappings; one
  run over all layers. Recorded per layer: the latency and its parts, the ideal cycles, the DRAM bytes
  of each operand and the spatial and temporal mappings it chose.
"""

from __future__ import annotations

import json
import logging
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path


def check_version(package: str, wanted: str) -> None:
    have = version(package)
    if have != wanted:
        sys.exit(f"{package} {have} is installed, the settings ask for {wanted}")


def out_size(layer: dict) -> int:
    return (layer["h"] + 2 * layer["pad"] - layer["k"]) // layer["stride"] + 1


# -- SCALE-Sim ---------------------------------------------------------------------------------------

SCALESIM_CONFIG = """[general]
run_name = {name}

[architecture_presets]
ArrayHeight = {rows}
ArrayWidth = {cols}
IfmapSramSzkB = {ifmap_kb}
FilterSramSzkB = {filter_kb}
OfmapSramSzkB = {ofmap_kb}
IfmapOffset = 0
FilterOffset = 10000000
OfmapOffset = 20000000
Bandwidth = {bandwidth}
Dataflow = {dataflow}
ReadRequestBuffer = 32
WriteRequestBuffer = 32

[layout]
IfmapCustomLayout = False
IfmapSRAMBankBandwidth = {bandwidth}
IfmapSRAMBankNum = 1
IfmapSRAMBankPort = 2
FilterCustomLayout = False
FilterSRAMBankBandwidth = {bandwidth}
FilterSRAMBankNum = 1
FilterSRAMBankPort = 2

[sparsity]
SparsitySupport = false
SparseRep = ellpack_block
OptimizedMapping = false
BlockSize = 8
RandomNumberGeneratorSeed = 40

[run_presets]
InterfaceBandwidth = {mode}
UseRamulatorTrace = False
"""


def scalesim_topology(layer: dict) -> str:
    """One layer in SCALE-Sim's conv topology format. SCALE-Sim has no padding and rounds its output
    size up, so the ifmap is the extent the convolution reads: (out - 1) * stride + k."""
    extent = (out_size(layer) - 1) * layer["stride"] + layer["k"]
    row = [layer["name"], extent, extent, layer["k"], layer["k"], layer["cin"], layer["cout"], layer["stride"]]
    return ("Layer name, IFMAP Height, IFMAP Width, Filter Height, Filter Width, Channels, Num Filter, Strides,\n"
            + ", ".join(map(str, row)) + ",\n")


def run_scalesim(job: dict) -> dict:
    from scalesim.scale_sim import scalesim

    s = job["settings"]
    check_version("scalesim", s["version"])
    results = {layer["name"]: {} for layer in job["layers"]}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        layout = tmp / "layout.csv"
        layout.write_text("Layer name,\n")  # read but unused without a custom layout
        for run in s["runs"]:
            config = tmp / f"{run['name']}.cfg"
            bandwidth = run["bandwidth"]
            config.write_text(SCALESIM_CONFIG.format(
                name=run["name"], rows=s["rows"], cols=s["cols"], ifmap_kb=s["ifmap_kb"], filter_kb=s["filter_kb"],
                ofmap_kb=s["ofmap_kb"], dataflow=run["dataflow"], mode="CALC" if bandwidth is None else "USER",
                bandwidth=bandwidth or 10))
            for layer in job["layers"]:
                print(f"scalesim {run['name']}: {layer['name']}", file=sys.stderr, flush=True)
                topology = tmp / "topology.csv"
                topology.write_text(scalesim_topology(layer))
                sim = scalesim(save_disk_space=True, verbose=False, config=str(config), topology=str(topology),
                               layout=str(layout))
                sim.run_scale(top_path=str(tmp / "out"))
                (layer_sim,) = sim.runner.single_layer_sim_object_list
                _, cycles, stalls, *_ = layer_sim.get_compute_report_items()
                results[layer["name"]][run["name"]] = {"cycles": int(cycles), "stalls": int(stalls)}
    return results


# -- ZigZag ----------------------------------------------------------------------------------------

def zigzag_layer(n: int, layer: dict) -> dict:
    """A layer in ZigZag's workload format (as its ONNX parser writes a Conv), int8 operands, 16-bit
    partial sums (its default), its own input: no layer feeds another."""
    k, s, p = layer["k"], layer["stride"], layer["pad"]
    return {"id": n, "name": layer["name"], "operator_type": "Conv",
            "equation": "O[b][k][oy][ox]+=W[k][c][fy][fx]*I[b][c][iy][ix]",
            "dimension_relations": [f"ix={s}*ox+1*fx", f"iy={s}*oy+1*fy"],
            "loop_dims": ["B", "K", "C", "OY", "OX", "FY", "FX"],
            "loop_sizes": [1, layer["cout"], layer["cin"], out_size(layer), out_size(layer), k, k],
            "operand_precision": {"W": 8, "I": 8, "O": 16, "O_final": 8}, "operand_source": {"I": n},
            "pr_loop_dims": ["IX", "IY"], "pr_loop_sizes": [layer["w"], layer["h"]], "padding": [[p, p], [p, p]]}


def zigzag_core(tpu_like: dict, s: dict) -> dict:
    """ZigZag's tpu_like core with the settings' array, on-chip SRAM (bits) and DRAM bandwidth (bits per
    cycle); everything else as shipped."""
    memories = tpu_like["memories"]
    sram = memories.pop("sram_2MB")
    sram["size"] = s["sram_bits"]
    memories = {**{k: v for k, v in memories.items() if k != "dram"}, "sram": sram, "dram": memories["dram"]}
    for port in memories["dram"]["ports"]:
        port["bandwidth_min"] = port["bandwidth_max"] = s["dram_bits_per_cycle"]
    return {**tpu_like, "name": "tpu_like_core", "memories": memories,
            "operational_array": {**tpu_like["operational_array"], "sizes": [s["rows"], s["cols"]]}}


def dram_bytes(cme, operand) -> int:
    """Bytes the layer's ``operand`` moves to and from DRAM, its top memory level."""
    top = cme.mapping_int.unit_mem_data_movement[operand][-1]
    counts, bits = (top.get_attribute(a) for a in ("data_elem_move_count", "data_precision"))
    return sum(counts.get(d) * bits.get(d) for d in counts.data) // 8


def run_zigzag(job: dict) -> dict:
    import yaml
    import zigzag
    from zigzag.api import get_hardware_performance_zigzag

    s = job["settings"]
    check_version("zigzag-dse", s["version"])
    logging.basicConfig(level=logging.ERROR)  # before ZigZag's own INFO configuration, which then does nothing
    inputs = Path(zigzag.__file__).parent / "inputs"
    core = zigzag_core(yaml.safe_load((inputs / "hardware/tpu_like.yaml").read_text()), s)
    mapping = s["mappings"] + yaml.safe_load((inputs / "mapping/tpu_like.yaml").read_text())
    workload = [zigzag_layer(n, layer) for n, layer in enumerate(job["layers"])]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "core.yaml").write_text(yaml.safe_dump(core, sort_keys=False))
        (Path(tmp) / "mapping.yaml").write_text(yaml.safe_dump(mapping, sort_keys=False))
        _, _, cmes = get_hardware_performance_zigzag(workload, f"{tmp}/core.yaml", f"{tmp}/mapping.yaml",
                                                     opt="latency", dump_folder=f"{tmp}/out",
                                                     loma_show_progress_bar=False)
    results = {}
    for cme, _ in cmes[0][1]:
        results[cme.layer.name] = {
            "latency": cme.latency_total2, "ideal": cme.ideal_cycle, "ideal_temporal": cme.ideal_temporal_cycle,
            "stall": cme.stall_slack_comb, "onloading": cme.data_onloading_cycle,
            "offloading": cme.data_offloading_cycle, "systolic_drain": cme.systolic_drain_cycle,
            "dram_bytes": {str(op): dram_bytes(cme, op) for op in cme.layer.layer_operands},
            "spatial_mapping": str(cme.spatial_mapping_int), "temporal_mapping": str(cme.temporal_mapping)}
    return results


def main() -> None:
    tool, job, out = sys.argv[1:]
    run = {"scalesim": run_scalesim, "zigzag": run_zigzag}[tool]
    Path(out).write_text(json.dumps(run(json.loads(Path(job).read_text())), indent=1))


if __name__ == "__main__":
    main()
