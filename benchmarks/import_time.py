"""What the plugin adds to ``import tvm`` (issue 38: at most 0.15 s).

    python benchmarks/import_time.py [--runs 15]

Each run is a fresh interpreter timing ``import tvm``: with the plugin as installed (its
``tvm.backends`` entry point runs ``tvm_dsa.plugin.register``), and with that entry point filtered
out of ``importlib.metadata`` (everything else, TVM's own backends included, the same). The runs
alternate, so that the machine's load falls on both alike. The difference of the two is noisy on a
shared machine; the time spent in the plugin's entry point (importing ``tvm_dsa`` and running
``_autoload``, timed inside the first kind of run) is what the plugin adds, measured directly. The
table gives medians and minima, and the tvm_dsa modules the import loaded.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = """
import importlib.metadata as md, json, sys, time
entry_points, spent = md.entry_points, [0.0]

class Timed:  # the plugin's entry point, its import and call timed
    def __init__(self, ep):
        self.name, self.ep = ep.name, ep
    def load(self):
        def call():
            start = time.perf_counter()
            self.ep.load()()
            spent[0] += time.perf_counter() - start
        return call

def plugin(**kw):
    found = entry_points(**kw)
    if kw.get("group") != "tvm.backends":
        return found
    ours = [e for e in found if e.value.split(":")[0] == "tvm_dsa"]
    return [e for e in found if e not in ours] + ([] if {filtered} else [Timed(e) for e in ours])
md.entry_points = plugin
start = time.perf_counter()
import tvm
seconds = time.perf_counter() - start
print(json.dumps([seconds, spent[0], sorted(m for m in sys.modules if m.startswith("tvm_dsa"))]))
"""


def timed(filtered: bool) -> tuple[float, float, list[str]]:
    """``import tvm``'s seconds, those of the plugin's entry point within them, the tvm_dsa modules
    loaded."""
    out = subprocess.run([sys.executable, "-c", CHILD.format(filtered=filtered)], capture_output=True, text=True,
                         check=True).stdout
    seconds, plugin, modules = json.loads(out.strip().splitlines()[-1])
    return seconds, plugin, modules


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    runs = parser.parse_args().runs
    timed(False)  # warm the file cache
    with_plugin, without, entry, modules = [], [], [], []
    for _ in range(runs):
        seconds, plugin, modules = timed(False)
        with_plugin.append(seconds)
        entry.append(plugin)
        without.append(timed(True)[0])
    a, b = statistics.median(with_plugin), statistics.median(without)
    print(f"{'import tvm':<34}{'median s':>10}{'min s':>10}")
    print(f"{'with the plugin':<34}{a:>10.3f}{min(with_plugin):>10.3f}")
    print(f"{'without it':<34}{b:>10.3f}{min(without):>10.3f}")
    print(f"{'difference':<34}{a - b:>10.3f}{min(with_plugin) - min(without):>10.3f}")
    print(f"{'the entry point (the plugin adds)':<34}{statistics.median(entry):>10.3f}{min(entry):>10.3f}")
    print(f"tvm_dsa modules loaded by import tvm: {len(modules)} ({', '.join(modules)})")


if __name__ == "__main__":
    main()
