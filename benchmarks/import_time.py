"""What the plugin adds to ``import tvm`` (issue 38: at most 0.15 s).

    python benchmarks/import_time.py [--runs 15]

Each run is a fresh interpreter timing ``import tvm``: with the plugin as installed (its
``tvm.backends`` entry point runs ``tvm_dsa.plugin.register``), and with that entry point filtered
out of ``importlib.metadata`` (everything else, TVM's own backends included, the same). The runs
alternate, so that the machine's load falls on both alike; the table gives the medians and the
tvm_dsa modules the import loaded.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = """
import importlib.metadata as md, json, sys, time
if {filtered}:
    entry_points = md.entry_points
    def without_plugin(**kw):
        found = entry_points(**kw)
        return md.EntryPoints(e for e in found if e.value.split(":")[0] != "tvm_dsa") if kw.get("group") == "tvm.backends" else found
    md.entry_points = without_plugin
start = time.perf_counter()
import tvm
seconds = time.perf_counter() - start
print(json.dumps([seconds, sorted(m for m in sys.modules if m.startswith("tvm_dsa"))]))
"""


def timed(filtered: bool) -> tuple[float, list[str]]:
    out = subprocess.run([sys.executable, "-c", CHILD.format(filtered=filtered)], capture_output=True, text=True,
                         check=True).stdout
    seconds, modules = json.loads(out.strip().splitlines()[-1])
    return seconds, modules


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    runs = parser.parse_args().runs
    timed(False)  # warm the file cache
    with_plugin, without, modules = [], [], []
    for _ in range(runs):
        seconds, modules = timed(False)
        with_plugin.append(seconds)
        without.append(timed(True)[0])
    a, b = statistics.median(with_plugin), statistics.median(without)
    print(f"{'import tvm':<28}{'median s':>10}{'min s':>10}")
    print(f"{'with the plugin':<28}{a:>10.3f}{min(with_plugin):>10.3f}")
    print(f"{'without it':<28}{b:>10.3f}{min(without):>10.3f}")
    print(f"{'the plugin adds':<28}{a - b:>10.3f}{min(with_plugin) - min(without):>10.3f}")
    print(f"tvm_dsa modules loaded by import tvm: {len(modules)} ({', '.join(modules)})")


if __name__ == "__main__":
    main()
