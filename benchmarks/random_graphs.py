"""Random ONNX graphs on the DSA against onnxruntime, under every schedule.

    python benchmarks/random_graphs.py                         # 300 graphs (any kind), all schedules
    python benchmarks/random_graphs.py --count 50 --kind cnn --schedules layerwise set
    python benchmarks/random_graphs.py --seed 1000 --jobs 2 --json results.jsonl

Graph ``i`` is ``random_graph(seed + i, kind)`` (``tvm_dsa.models.random_graphs``), run on its
``random_inputs`` by onnxruntime and, compiled with each schedule for its target
(``random_graphs.SCHEDULES``), by the simulated DSA. Graphs run in worker processes (``--jobs``),
one graph at a time; an exception is recorded as an error of that graph and schedule, a worker that
dies or spends more than ``--timeout`` seconds on a graph is restarted after recording the graph as
an error under the schedules it had not finished.

Prints, per schedule: the graphs, those with a wrong value (``max |dsa - ref| > 2e-2 max |ref|``),
the errors grouped by cause (the message's last line with names, numbers and TIR expressions
elided), the graphs with every kernel on the DSA as scheduled and the fallbacks grouped by reason
(``random_graphs.fallbacks``: host kernels, and SET trees or stitched sub-graphs that did not build
and ran layer by layer, but those ``ON_PURPOSE`` allows); each group with its count and the seed of
its smallest graph (a reproducer: ``random_graph(SEED, KIND)``). Then the summary line.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import selectors
import subprocess
import sys
import time
import traceback
from collections import defaultdict

WIDTH = 140  # characters of a cause printed


def check(seed: int, kind: str, schedules: list[str]):
    """One graph under each schedule: yields one record (a dict) per schedule."""
    from tvm_dsa.harness.random_graphs import TOLERANCE, DsaRun, fallbacks, onnxruntime_outputs
    from tvm_dsa.models.random_graphs import blocks, random_graph, random_inputs

    model = random_graph(seed, kind)
    feeds = random_inputs(model)
    reference = onnxruntime_outputs(model, feeds)
    base = {"seed": seed, "nodes": len(model.graph.node), "blocks": blocks(model)}
    for schedule in schedules:
        try:
            run = DsaRun.of(model, feeds, schedule)
        except Exception as err:  # noqa: BLE001 - every failure is a finding, recorded and grouped
            yield {**base, "schedule": schedule, "error": describe(err)}
            continue
        error = run.error(reference)
        yield {**base, "schedule": schedule, "rel_error": error, "wrong": not error <= TOLERANCE,
               "fallbacks": fallbacks(run.offload)}


def describe(err: Exception) -> str:
    """The error's type, the last line of its message (TVM puts its traceback first) and the
    innermost tvm_dsa function it came from."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    where = [f for f in traceback.extract_tb(err.__traceback__) if "/tvm_dsa/" in f.filename]
    at = f" (in {where[-1].filename.rsplit('/tvm_dsa/', 1)[1]} {where[-1].name})" if where else ""
    return f"{type(err).__name__}: {lines[-1] if lines else ''}{at}"


def cause(reason: str) -> str:
    """A reason with what varies between graphs elided: kernel names (``K``), buffer and stage
    names (``B``), TIR expressions and buffer accesses (``…``; not the ``(last: ...)`` a message
    quotes), numbers (``#``); cut to ``WIDTH`` characters."""
    text = re.sub(r"\bfused_\w+", "K", re.sub(r"\bkernel \w+( at shapes \[[^\]]*\])?", "kernel K", reason))
    text = re.sub(r"\b(stage|access to|layer(?! by)) [\w.]+|[\w.]+(?= is walked)|'[\w.]+'",
                  lambda m: f"{m[1]} B" if m[1] else "B", text)
    while True:  # innermost calls, buffer accesses and parenthesised expressions first
        new = re.sub(r"[\w.]+\([^()]*\)|[\w.]+\[[^\[\]]*\]|\((?![^()]*: )(?=[^()]*(?:…| [-+*/%<>] ))[^()]*\)",
                     "…", text)
        if new == text:
            break
        text = new
    text = re.sub(r"(?:[\w.]+ [-+*/%<>]=? )*…(?: [-+*/%<>]=? (?:[\w.]+|…))*", "…", text)
    text = re.sub(r"(?<![\w.])\d+(\.\d+)?(e[-+]?\d+)?", "#", text)
    return text if len(text) <= WIDTH else text[:WIDTH - 1] + "…"


def worker(kind: str, schedules: list[str], seeds: list[int]) -> None:
    """Check ``seeds`` one by one, one JSON line per (graph, schedule) on stdout."""
    for seed in seeds:
        try:
            for record in check(seed, kind, schedules):
                print(json.dumps(record), flush=True)
        except Exception as err:  # noqa: BLE001 - the generator or onnxruntime failed on this graph
            for schedule in schedules:
                print(json.dumps({"seed": seed, "schedule": schedule, "nodes": None, "blocks": [],
                                  "error": f"graph or reference: {describe(err)}"}),
                      flush=True)


def run_workers(args) -> list[dict]:
    """Run every graph in ``args.jobs`` worker processes; a worker that dies or times out on a
    graph is restarted after the graph's unfinished schedules are recorded as errors."""
    seeds = list(range(args.seed, args.seed + args.count))
    queues = [seeds[i::args.jobs] for i in range(args.jobs)]
    records: list[dict] = []
    done: dict = defaultdict(set)  # seed -> schedules recorded
    selector = selectors.DefaultSelector()
    deadline: dict = {}  # worker -> time it must have finished its current graph by

    def start(queue):
        if not queue:
            return
        cmd = [sys.executable, __file__, "--worker", "--kind", args.kind, "--schedules", *args.schedules,
               "--seeds", *map(str, queue)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        selector.register(proc.stdout, selectors.EVENT_READ, (proc, queue))
        deadline[proc] = time.monotonic() + args.timeout

    def stop(proc, queue, why: str):
        """Record the worker's current graph as failed (``why``) and go on with the rest."""
        selector.unregister(proc.stdout)
        proc.kill()
        proc.wait()
        del deadline[proc]
        seed = queue.pop(0)
        for schedule in args.schedules:
            if schedule not in done[seed]:
                records.append({"seed": seed, "schedule": schedule, "nodes": None, "blocks": [], "error": why})
        start(queue)

    for queue in queues:
        start(queue)
    while selector.get_map():
        for key, _ in selector.select(timeout=1.0):
            proc, queue = key.data
            line = proc.stdout.readline()
            if not line:  # the worker ended: done, or died on its current graph
                if queue:
                    stop(proc, queue, f"worker died (exit code {proc.wait()})")
                else:
                    selector.unregister(proc.stdout)
                    del deadline[proc]
                    proc.wait()
                continue
            record = json.loads(line)
            records.append(record)
            done[record["seed"]].add(record["schedule"])
            if done[record["seed"]] >= set(args.schedules):
                queue.pop(0)
                deadline[proc] = time.monotonic() + args.timeout
                if sys.stderr.isatty():
                    print(f"\r{len(records) // len(args.schedules)}/{args.count} graphs", end="", file=sys.stderr)
        for key in list(selector.get_map().values()):
            proc, queue = key.data
            if time.monotonic() > deadline[proc]:
                stop(proc, queue, f"timeout: more than {args.timeout:g} s on one graph")
    return records


def group(records: list[dict], reasons) -> list[tuple[str, int, dict]]:
    """(cause, graphs, the smallest graph's record) per cause of ``reasons(record)``, most first."""
    seeds: dict = defaultdict(set)
    smallest: dict = {}
    for record in records:
        for reason in reasons(record):
            key = cause(reason)
            seeds[key].add(record["seed"])
            if key not in smallest or (record["nodes"] or math.inf) < (smallest[key]["nodes"] or math.inf):
                smallest[key] = record
    return sorted(((key, len(s), smallest[key]) for key, s in seeds.items()), key=lambda g: (-g[1], g[0]))


def report(records: list[dict], args) -> None:
    wrong = errors = all_on_dsa = 0
    for schedule in args.schedules:
        rows = [r for r in records if r["schedule"] == schedule]
        failed = [r for r in rows if "error" in r]
        bad = [r for r in rows if r.get("wrong")]
        clean = [r for r in rows if "error" not in r and not r["fallbacks"]]
        wrong, errors, all_on_dsa = wrong + len(bad), errors + len(failed), all_on_dsa + len(clean)
        print(f"\n== {schedule} ({args.kind} graphs, seeds {args.seed}..{args.seed + args.count - 1})")
        print(f"graphs {len(rows)}   wrong values {len(bad)}   errors {len(failed)}   "
              f"every kernel on the DSA {len(clean)} ({100 * len(clean) / max(len(rows), 1):.1f} %)")
        for title, grouped in (
                ("wrong values (by the blocks of the graph)", group(bad, lambda r: [" ".join(sorted(set(
                    b.split(":")[0] for b in r["blocks"])))])),
                ("errors", group(failed, lambda r: [r["error"]])),
                ("fallbacks: on the host, or layer by layer (graphs)",
                 group(rows, lambda r: list(r.get("fallbacks", {}).values())))):
            if grouped:
                print(f"  {title}:")
                for key, count, example in grouped:
                    size = f", {example['nodes']} nodes" if example["nodes"] else ""
                    print(f"    {count:5d}  {key}   [seed {example['seed']}{size}]")
    total = len(records)
    print(f"\nrandom graphs: {args.count} graphs x {len(args.schedules)} schedules, {wrong} wrong, {errors} errors, "
          f"{100 * all_on_dsa / max(total, 1):.1f} % with every kernel on the DSA")


def main() -> None:
    from tvm_dsa.models.random_graphs import KINDS
    from tvm_dsa.harness.random_graphs import SCHEDULES

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0, help="seed of the first graph")
    ap.add_argument("--count", type=int, default=300, help="graphs")
    ap.add_argument("--kind", choices=KINDS, default="any")
    ap.add_argument("--schedules", nargs="+", choices=list(SCHEDULES), default=list(SCHEDULES))
    ap.add_argument("--jobs", type=int, default=2, help="worker processes")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds a graph may take (all schedules)")
    ap.add_argument("--json", help="also write every record to this file (JSON lines)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--seeds", type=int, nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.kind, args.schedules, args.seeds)
        return
    start = time.perf_counter()
    records = sorted(run_workers(args), key=lambda r: (r["seed"], args.schedules.index(r["schedule"])))
    if args.json:
        with open(args.json, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    report(records, args)
    print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
