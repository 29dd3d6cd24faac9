"""Our simulator against two independent models of the same core, SCALE-Sim and ZigZag, per layer of
ResNet-18 (docs/references.md).

    python benchmarks/references.py                      # the cached reference results, our layers re-run
    python benchmarks/references.py --refresh            # re-run SCALE-Sim (~11 min) and ZigZag (~1 min)
    python benchmarks/references.py --scalesim-python /path/to/venv/bin/python --zigzag-python ...

The workload: every convolution of the zoo's ResNet-18 (batch 1, 224 x 224) and its FC, each alone on
one core of set-edge16 (a 32 x 32 int8 weight-stationary MME, a 1 MiB LB, DDR at 16.384 B/cycle): the
chip ``set-edge16-core`` derived from the preset, its other fields kept. Ours: each layer as a one-node
ONNX model, compiled with ``target="dsa/set-edge16-core"`` and run timing-only; its cycles (kernel
launch included), the MME's busy cycles and the DDR bytes read and written.

The references run in venvs of their own, through ``reference_sims.py`` (they pin numpy versions that
TVM does not take; nothing under src/ imports them):

- SCALE-Sim 3.0.0 (``pip install scalesim==3.0.0 "numpy<2.3"``): a 32 x 32 array, the LB's 1 MiB as
  448 kB ifmap + 448 kB filter + 128 kB ofmap SRAM; compute cycles weight- and output-stationary
  (CALC mode: no stalls), and weight-stationary in USER mode at 16 words/cycle on each of its three DRAM
  ports for its stall cycles;
- ZigZag 3.9.1 (``pip install zigzag-dse==3.9.1 six``): its ``tpu_like`` core with the 32 x 32 array,
  its 2 MB SRAM cut to 1 MiB, DRAM at 131 bits/cycle, its ``tpu_like`` mapping (conv1, 3 input channels:
  C x FY on the array's columns); latency, ideal compute cycles, DRAM bytes per operand.

Their results are cached as JSON in ``~/.cache/tvm-dsa/references/``, keyed by the layers and the
settings; ``--refresh`` re-runs them. Nothing is downloaded. Printed: per layer the cycles of all three,
the MME time against the references' compute cycles (flagged when ours is more than 10 % below the
nearer reference, or outside +-25 % of it), the DDR bytes against ZigZag's; then the network's sums and
the geo-means of the ratios by kernel size.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from graphturbo import _step, _table
from tvm_dsa import hardware
from tvm_dsa.harness import Compiled, import_onnx
from tvm_dsa.models import get_model
from tvm_dsa.models.builder import GraphBuilder, infer_shapes

CHIP = "set-edge16-core"
SCALESIM_VERSION = "3.0.0"
ZIGZAG_VERSION = "3.9.1"
CACHE = Path.home() / ".cache/tvm-dsa/references"
WORKER = Path(__file__).resolve().with_name("reference_sims.py")


@dataclasses.dataclass(frozen=True)
class Layer:
    """A convolution (an FC: a 1 x 1 one on a 1 x 1 input, ``fc``) of batch 1."""

    name: str
    cin: int
    cout: int
    h: int
    w: int
    k: int
    stride: int
    pad: int
    fc: bool = False

    @property
    def out(self) -> int:
        return (self.h + 2 * self.pad - self.k) // self.stride + 1

    @property
    def macs(self) -> int:
        return self.out * self.out * self.k * self.k * self.cin * self.cout

    @property
    def input_shape(self) -> list[int]:
        return [1, self.cin] if self.fc else [1, self.cin, self.h, self.w]

    @property
    def shape(self) -> str:
        if self.fc:
            return f"fc {self.cin}->{self.cout}"
        return f"{self.k}x{self.k}/{self.stride} {self.cin}->{self.cout} @{self.h}"

    @property
    def group(self) -> str:
        return "fc" if self.fc else f"{self.k}x{self.k}"

    def geometry(self) -> tuple:
        return dataclasses.astuple(self)[1:]

    def job(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "fc"}


def resnet18_layers() -> list[Layer]:
    """The convolutions and the FC of the zoo's ResNet-18, batch 1, 224 x 224, in graph order."""
    model = get_model("resnet18")
    g = infer_shapes(model).graph
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in [*g.input, *g.value_info]}
    weights = {t.name: list(t.dims) for t in model.graph.initializer}
    layers = []
    for node in model.graph.node:
        if node.op_type == "Conv":
            attrs = {a.name: list(a.ints) for a in node.attribute}
            _, cin, h, w = shapes[node.input[0]]
            cout, _, k, _ = weights[node.input[1]]
            layers.append(Layer(node.name.removesuffix(".conv.Conv"), cin, cout, h, w, k, attrs["strides"][0],
                                attrs["pads"][0]))
        elif node.op_type == "Gemm":
            cout, cin = weights[node.input[1]]
            layers.append(Layer(node.name.removesuffix(".Gemm"), cin, cout, 1, 1, 1, 1, 0, fc=True))
    return layers


def distinct(layers: list[Layer]) -> dict[tuple, Layer]:
    """The first layer of each geometry: each is compiled and simulated once."""
    first = {}
    for layer in layers:
        first.setdefault(layer.geometry(), layer)
    return first


def one_core_chip() -> hardware.Hardware:
    """One core of set-edge16, registered as ``dsa/set-edge16-core``: its other fields kept."""
    hw = hardware.get("set-edge16")
    return hardware.register(dataclasses.replace(hw, name=CHIP, clusters=1, cores_per_cluster=1, mesh=(1, 1),
                                                 description="one core of set-edge16"))


def layer_model(layer: Layer):
    """The layer alone as an ONNX model (the FC as the zoo writes it: Gemm with a bias)."""
    b = GraphBuilder(layer.name)
    x = b.input("input", layer.input_shape)
    if layer.fc:
        b.output(b.gemm(x, layer.cin, layer.cout), "out")
    else:
        b.output(b.conv(x, layer.cin, layer.cout, layer.k, layer.stride, layer.pad), "out")
    return b.build()


def measure_ours(layers: list[Layer]) -> dict[str, dict]:
    """Per layer: its cycles, MME and DMA busy cycles and DDR bytes on one core, timing-only."""
    ours = {}
    for layer in layers:
        x = np.zeros(layer.input_shape, np.float32)
        compiled = Compiled.build(import_onnx(layer_model(layer)), f"dsa/{CHIP}", "layerwise")  # the layer's kernel
        report = compiled.run({"input": x}, mode="timing", check_hazards=False).report
        ours[layer.name] = {"cycles": report.cycles, "mme": report.busy["mme"], "dma": report.busy["dma"],
                            "ddr": report.ddr_read + report.ddr_write}
    return ours


def scalesim_settings(hw: hardware.Hardware) -> dict:
    """The chip in SCALE-Sim's terms: its array; its LB as 7/16 ifmap, 7/16 filter and 1/8 ofmap SRAM
    (ifmap and filter are double-buffered read buffers, half of each active; the ofmap buffer only
    collects outputs on their way to DRAM); its DDR bandwidth in whole words per cycle."""
    kb = hw.lb_bytes // 1024
    return {"version": SCALESIM_VERSION, "rows": hw.mme.rows, "cols": hw.mme.cols,
            "ifmap_kb": kb * 7 // 16, "filter_kb": kb * 7 // 16, "ofmap_kb": kb // 8,
            "runs": [{"name": "ws", "dataflow": "ws", "bandwidth": None},
                     {"name": "os", "dataflow": "os", "bandwidth": None},
                     {"name": "ws-dram", "dataflow": "ws", "bandwidth": int(hw.ddr_bytes_per_cycle)}]}


def zigzag_settings(hw: hardware.Hardware, layers: list[Layer]) -> dict:
    """The chip in ZigZag's terms (bits): its array, its LB as the tpu_like core's SRAM, its DDR
    bandwidth. A layer whose C x FY fits on the array's columns unrolls both there (tpu_like's mapping
    unrolls C alone, which leaves 29 of 32 columns idle on conv1's 3 channels; C x FY uses 21)."""
    links = {"O": "O", "W": "I2", "I": "I1"}
    mappings = [{"name": layer.name, "memory_operand_links": links,
                 "spatial_mapping": {"D1": [f"K, {hw.mme.rows}"], "D2": [f"C, {layer.cin}", f"FY, {layer.k}"]}}
                for layer in layers if layer.cin * layer.k <= hw.mme.cols]
    return {"version": ZIGZAG_VERSION, "rows": hw.mme.rows, "cols": hw.mme.cols, "sram_bits": hw.lb_bytes * 8,
            "dram_bits_per_cycle": round(hw.ddr_bytes_per_cycle * 8), "mappings": mappings}


def run_reference(tool: str, python: str, layers: list[Layer], settings: dict, refresh: bool) -> tuple[dict, str]:
    """The reference's results per layer, from the cache unless ``refresh`` or absent there (then run
    in ``python``'s venv, and cached); with where they came from."""
    job = {"layers": [layer.job() for layer in layers], "settings": settings}
    key = hashlib.sha256(json.dumps(job, sort_keys=True).encode()).hexdigest()[:16]
    path = CACHE / f"{tool}-{key}.json"
    if path.is_file() and not refresh:
        cached = json.loads(path.read_text())
        return cached["results"], f"cached {path} (ran {cached['seconds']:.0f} s)"
    if not Path(python).is_file():
        sys.exit(f"no {python} to run {tool} with: make its venv (docs/references.md) or pass --{tool}-python")
    _step(f"running {tool} on {len(layers)} layers in {python}")
    with tempfile.TemporaryDirectory() as tmp:
        job_file, out_file = Path(tmp, "job.json"), Path(tmp, "out.json")
        job_file.write_text(json.dumps(job))
        start = time.perf_counter()
        proc = subprocess.run([python, str(WORKER), tool, str(job_file), str(out_file)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        seconds = time.perf_counter() - start
        if proc.returncode:
            sys.exit(f"{tool} failed (exit code {proc.returncode}):\n{proc.stdout[-4000:]}")
        results = json.loads(out_file.read_text())
    CACHE.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"job": job, "seconds": seconds, "results": results}, indent=1))
    return results, f"ran {seconds:.0f} s, cached {path}"


def geo(xs: list[float]) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs))


def figures(layers: list[Layer], ours: dict, ss: dict, zz: dict, peak: int) -> dict[str, dict]:
    """Per layer (by name), the numbers the tables print, from the results of its distinct geometry."""
    first = distinct(layers)
    out = {}
    for layer in layers:
        key = first[layer.geometry()].name
        o, s, z = ours[key], ss[key], zz[key]
        out[layer.name] = {
            "cycles": o["cycles"], "mme": o["mme"], "dma": o["dma"], "ddr": o["ddr"],
            "ideal": math.ceil(layer.macs / peak),
            "ss_ws": s["ws"]["cycles"], "ss_os": s["os"]["cycles"], "ss_stalls": s["ws-dram"]["stalls"],
            "zz": round(z["latency"]), "zz_ideal": round(z["ideal_temporal"]), "zz_stall": round(z["stall"]),
            "zz_onload": round(z["onloading"]), "zz_offload": round(z["offloading"]),
            "zz_drain": round(z["systolic_drain"]), "zz_ddr": sum(z["dram_bytes"].values()),
            "zz_ddr_iwo": "/".join(f"{z['dram_bytes'][t]:,}" for t in "IWO")}
    return out


def mme_flag(f: dict) -> tuple[str, float, str]:
    """The reference nearer our MME time (by ratio), ours / its compute cycles, and the flags: "<-10%"
    more than 10 % below it, ">25%" outside +-25 % of it."""
    refs = {"ZigZag": f["zz_ideal"], "SCALE-Sim ws": f["ss_ws"]}
    ref = min(refs, key=lambda r: abs(math.log(f["mme"] / refs[r])))
    ratio = f["mme"] / refs[ref]
    return ref, ratio, " ".join(flag for flag, hit in (("<-10%", ratio < 0.9), (">25%", abs(ratio - 1) > 0.25)) if hit)


RATIOS = {"cycles/SS ws": ("cycles", "ss_ws"), "cycles/SS os": ("cycles", "ss_os"), "cycles/ZZ": ("cycles", "zz"),
          "MME/SS ws": ("mme", "ss_ws"), "MME/ZZ ideal": ("mme", "zz_ideal"), "DDR/ZZ": ("ddr", "zz_ddr")}


def print_layers(layers: list[Layer], f: dict, hw: hardware.Hardware) -> None:
    _table("Cycles per layer: ours (kernel launch and DDR included); SCALE-Sim's compute cycles (no DRAM stalls) "
           "and its ws stalls at 16 words/cycle per DRAM port; ZigZag's latency",
           ["layer", "shape", "MACs", "ours", "SS ws", "SS ws stalls", "SS os", "ZigZag", "ours/SS ws", "ours/ZZ"],
           [[layer.name, layer.shape, f"{layer.macs:,}"]
            + [f"{f[layer.name][k]:,}" for k in ("cycles", "ss_ws", "ss_stalls", "ss_os", "zz")]
            + [f"{f[layer.name]['cycles'] / f[layer.name][k]:.2f}" for k in ("ss_ws", "zz")] for layer in layers])
    rows = []
    for layer in layers:
        g = f[layer.name]
        ref, ratio, flag = mme_flag(g)
        rows.append([layer.name] + [f"{g[k]:,}" for k in ("ideal", "mme", "zz_ideal", "ss_ws")]
                    + [f"{g['mme'] / g[k]:.2f}" for k in ("zz_ideal", "ss_ws")]
                    + [f"{ref} {flag}" if flag and not layer.fc else "", f"{g['ddr']:,}", f"{g['zz_ddr']:,}",
                       g["zz_ddr_iwo"], f"{g['ddr'] / g['zz_ddr']:.2f}"])
    _table("MME time per layer: ours (busy) against ZigZag's ideal compute (its mapping, no stalls) and SCALE-Sim's "
           "ws compute, flagged against the nearer; DDR bytes read + written, ours against ZigZag's",
           ["layer", "MACs/1024", "ours MME", "ZZ ideal", "SS ws", "ours/ZZ", "ours/SS ws", "flag", "ours DDR B",
            "ZZ DDR B", "ZZ I/W/O", "ours/ZZ"], rows)
    rows = []
    for layer in layers:
        g = f[layer.name]
        folds = math.ceil(layer.k * layer.k * layer.cin / hw.mme.rows) * math.ceil(layer.cout / hw.mme.cols)
        rows.append([layer.name] + [f"{g[k]:,}" for k in ("zz_ideal", "zz_stall", "zz_onload", "zz_offload", "zz_drain")]
                    + [f"{folds:,}", f"{g['ss_ws'] - folds * layer.out ** 2:,}", f"{g['mme'] - g['ideal']:,}",
                       f"{g['dma']:,}", f"{g['cycles'] - g['mme']:,}"])
    _table("Where the cycles go: ZigZag's latency = compute + stall + onloading + offloading + systolic drain; "
           "SCALE-Sim ws: its weight folds and its cycles beyond one per output pixel and fold; ours: MME busy "
           "beyond MACs/1024, DMA busy, cycles beyond MME busy",
           ["layer", "ZZ compute", "ZZ stall", "ZZ onload", "ZZ offload", "ZZ drain", "SS ws folds", "SS ws overhead",
            "ours MME overhead", "ours DMA", "ours - MME"], rows)


def print_summary(layers: list[Layer], f: dict) -> None:
    t = {k: sum(g[k] for g in f.values()) for k in ("cycles", "ss_ws", "ss_os", "ss_stalls", "zz", "mme", "zz_ideal",
                                                    "ideal", "ddr", "zz_ddr")}
    print("\nWhole network (sums over the layers; in parentheses ours / reference):")
    print(f"  cycles: ours {t['cycles']:,}; SCALE-Sim ws {t['ss_ws']:,} ({t['cycles'] / t['ss_ws']:.2f}), "
          f"+ {t['ss_stalls']:,} stalls at 16 words/cycle; SCALE-Sim os {t['ss_os']:,} ({t['cycles'] / t['ss_os']:.2f}); "
          f"ZigZag {t['zz']:,} ({t['cycles'] / t['zz']:.2f})")
    print(f"  MME: ours {t['mme']:,}; ZigZag ideal {t['zz_ideal']:,} ({t['mme'] / t['zz_ideal']:.2f}); SCALE-Sim ws "
          f"{t['ss_ws']:,} ({t['mme'] / t['ss_ws']:.2f}); MACs/1024 {t['ideal']:,} ({t['mme'] / t['ideal']:.2f})")
    print(f"  DDR: ours {t['ddr']:,} B; ZigZag {t['zz_ddr']:,} B ({t['ddr'] / t['zz_ddr']:.2f})")
    rows = []
    for group in ("3x3", "1x1", "7x7", "fc"):
        names = [layer.name for layer in layers if layer.group == group]
        rows.append([group, len(names)] + [f"{geo([f[n][a] / f[n][b] for n in names]):.2f}" for a, b in RATIOS.values()])
    _table("Geo-means of the ratios ours / reference, by kernel size", ["layers", "n", *RATIOS], rows)
    flagged = [(layer, *mme_flag(f[layer.name])) for layer in layers if not layer.fc]
    flagged = [x for x in flagged if x[3]]
    print(f"\nConv layers whose MME time is more than 10 % below the nearer reference (<-10%) or outside +-25 % "
          f"of it (>25%): {len(flagged)}")
    for layer, ref, ratio, flag in flagged:
        print(f"  {layer.name} ({layer.shape}): MME {f[layer.name]['mme']:,} = {ratio:.2f} x {ref} [{flag}]")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scalesim-python", default="/work/venv-scalesim/bin/python",
                   help="the Python of a venv with scalesim==3.0.0 (default: %(default)s)")
    p.add_argument("--zigzag-python", default="/work/venv-zigzag/bin/python",
                   help="the Python of a venv with zigzag-dse==3.9.1 (default: %(default)s)")
    p.add_argument("--refresh", action="store_true", help="re-run the references instead of reading the cache")
    args = p.parse_args()

    hw = one_core_chip()
    layers = resnet18_layers()
    unique = list(distinct(layers).values())
    _step(f"compiling and simulating (timing) {len(unique)} distinct layers on dsa/{CHIP}")
    start = time.perf_counter()
    ours = measure_ours(unique)
    ours_seconds = time.perf_counter() - start
    ss, ss_source = run_reference("scalesim", args.scalesim_python, unique, scalesim_settings(hw), args.refresh)
    zz, zz_source = run_reference("zigzag", args.zigzag_python, unique, zigzag_settings(hw, unique), args.refresh)

    print(f"ResNet-18, batch 1, 224 x 224, int8: each layer alone on dsa/{CHIP}, one core of set-edge16 "
          f"({hw.mme.rows}x{hw.mme.cols} MME, {hw.lb_bytes >> 10} KiB LB, DDR {hw.ddr_bytes_per_cycle} B/cycle, "
          f"kernel launch {hw.kernel_launch_cycles:,} cycles)")
    print(f"ours: {len(unique)} distinct layers in {ours_seconds:.0f} s; SCALE-Sim {SCALESIM_VERSION}: {ss_source}; "
          f"ZigZag {ZIGZAG_VERSION}: {zz_source}")
    f = figures(layers, ours, ss, zz, hw.mme.macs_per_cycle)
    print_layers(layers, f, hw)
    print_summary(layers, f)


if __name__ == "__main__":
    main()
