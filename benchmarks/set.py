"""SET vs LS vs LP (seed 002 §5): latency, energy and EDP of the best tree each search finds.

    python benchmarks/set.py                                   # ResNet-50, both presets, batch 1/8/64
    python benchmarks/set.py --models resnet50 bert_base --beta 20
    python benchmarks/set.py --presets set-edge16 --batches 1 --objective delay --save trees/
    python benchmarks/set.py --batches 1 8 --lower --plot plots/      # evaluator vs simulator, S-T graphs
    python benchmarks/set.py --models pnasnet --beta 5 --cases pnas.json   # save the cases ...
    python benchmarks/set.py --average resnet.json pnas.json             # ... and average runs together

All three schemes come from one simulated-annealing engine (``schedule.set.search``): SET over all
trees, LS over trees whose depth-one cuts are T-cuts, LP over depth-one S-cuts. The objective is
the preset's (edge E²D, cloud ED²) unless ``--objective`` says otherwise. Prints one row per
(model, preset, batch, scheme), then SET's ratios to LS and LP and their arithmetic and geometric
means over the cases (``--cases FILE`` saves them as JSON; ``--average FILE...`` prints the means
of saved runs together, e.g. runs with a smaller beta for the large graphs).

``--lower`` compiles the model at the batch with each best tree (``tvm_dsa.pipeline(schedule="set")``),
runs the program on the simulator (timing) and prints the evaluator's latency and DRAM bytes next to
the simulator's. SET's row is the program the ``set`` schedule compiles: its search's finalists
(the SET, LS and LP trees) simulated, the one of least simulated cost kept (printed as
``SET(ls)`` where that is the LS tree). ``--plot DIR`` writes each SET tree's S-T graph (evaluator, and simulator with
``--lower``) as SVG.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import tvm_dsa  # noqa: F401  (registers the presets)
from tvm_dsa import hardware
from tvm_dsa.models import MODELS, get_model
from tvm_dsa.schedule.set import Evaluator, LayerGraph, Tree
from tvm_dsa.schedule.set.evaluate import latency_bound
from tvm_dsa.schedule.set.plot import st_graph
from tvm_dsa.schedule.set.ops import LP, LS, SET
from tvm_dsa.schedule.set.search import OBJECTIVES, Anneal, anneal
from tvm_dsa.harness import layer_graph

PRESET_OBJECTIVE = {"set-edge16": "e2d", "set-cloud144": "ed2"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["resnet50"], choices=sorted(MODELS))
    ap.add_argument("--presets", nargs="+", default=["set-edge16", "set-cloud144"])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8, 64])
    ap.add_argument("--objective", default="preset", help="preset (E²D edge, ED² cloud), delay, edp, e2d, ed2")
    ap.add_argument("--beta", type=float, default=100.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save", type=Path, help="directory for each best tree as .txt and .json")
    ap.add_argument("--lower", action="store_true", help="also lower each best tree and simulate it")
    ap.add_argument("--plot", type=Path, help="directory for the SET trees' S-T graphs (SVG)")
    ap.add_argument("--cases", type=Path, help="write every case's SET / LS / LP results to this JSON file")
    ap.add_argument("--average", type=Path, nargs="+", help="only print the means of these --cases files")
    args = ap.parse_args()
    if args.average:
        print_means([case for path in args.average for case in json.loads(path.read_text())])
        return

    print(f"{'model':<10} {'preset':<13} {'batch':>5} {'scheme':<4} {'latency(cyc)':>13} {'energy(mJ)':>11} "
          f"{'EDP(J*s)':>10} {'DRAM(MB)':>9} {'iters':>6} {'search(s)':>9} {'cpu(s)':>7}  tree")
    cases, lowered = [], []
    for model in args.models:
        t = time.perf_counter()
        graph = layer_graph(get_model(model))
        print(f"# {model}: {len(graph)} layers, graph built in {time.perf_counter() - t:.1f} s")
        for preset in args.presets:
            hw = hardware.get(preset)
            objective = PRESET_OBJECTIVE[preset] if args.objective == "preset" else args.objective
            ev = Evaluator(graph, hw)
            for batch in args.batches:
                found = {}
                for space in (SET, LS, LP):
                    r = anneal(graph, hw, batch, Anneal(beta=args.beta, objective=objective, seed=args.seed,
                                                         space=space), evaluator=ev)
                    e = r.evaluation
                    found[space.name] = e
                    text = r.tree.text(graph)
                    if args.save:
                        args.save.mkdir(parents=True, exist_ok=True)
                        path = args.save / f"{model}-{preset}-b{batch}-{space.name}"
                        path.with_suffix(".txt").write_text(text + "\n")
                        path.with_suffix(".json").write_text(json.dumps(r.tree.to_json(graph), indent=1))
                    print(f"{model:<10} {preset:<13} {batch:>5} {space.name.upper():<4} {e.latency:>13.0f} "
                          f"{e.joules * 1e3:>11.3f} {e.edp:>10.3e} {e.dram_bytes / 1e6:>9.2f} {r.iterations:>6} "
                          f"{r.seconds:>9.1f} {r.cpu_seconds:>7.1f}  {text[:70]}{'...' if len(text) > 70 else ''}", flush=True)
                    stem = f"{model}-{preset}-b{batch}-{space.name}"
                    scheme, sim = space.name, None
                    if args.lower and space is SET:
                        scheme, e, sim = compile_searched(model, preset, graph, r, Anneal(
                            beta=args.beta, objective=objective, seed=args.seed))
                    elif args.lower:
                        sim = simulate_tree(model, preset, r.tree, graph)
                    if sim:
                        lowered.append((model, preset, batch, scheme, e, sim[0], sim[1], sim[3], objective))
                    if args.plot and space is SET:
                        args.plot.mkdir(parents=True, exist_ok=True)
                        slots = ev.evaluate(r.tree, timeline=True).timeline
                        st_graph(slots, graph, hw.cores, args.plot / f"{stem}-evaluator.svg", f"{stem} (evaluator)")
                        if sim:
                            st_graph(sim[2], graph, hw.cores, args.plot / f"{stem}-simulator.svg", f"{stem} (simulator)")
                cases.append({"model": model, "preset": preset, "batch": batch, "objective": objective,
                              "beta": args.beta, "bound": latency_bound(graph, hw, batch),
                              **{k: {"latency": e.latency, "joules": e.joules}
                                                    for k, e in found.items()}})
    if lowered:
        print(f"\nthe same trees lowered to DSA programs and simulated (timing):\n{'model':<10} {'preset':<13} "
              f"{'batch':>5} {'scheme':<6} {'evaluator(cyc)':>14} {'simulator(cyc)':>14} {'sim/eval':>8} "
              f"{'eval DRAM(MB)':>13} {'sim DRAM(MB)':>12} {'eval E(mJ)':>10} {'sim E(mJ)':>9}")
        for model, preset, batch, scheme, e, cycles, dram, joules, _ in lowered:
            print(f"{model:<10} {preset:<13} {batch:>5} {_label(scheme):<7} {e.latency:>14.0f} {cycles:>14} "
                  f"{cycles / e.latency:>8.2f} {e.dram_bytes / 1e6:>13.2f} {dram / 1e6:>12.2f} "
                  f"{e.joules * 1e3:>10.3f} {joules * 1e3:>9.3f}")
        ratio = [low[5] / low[4].latency for low in lowered]
        print(f"simulator / evaluator latency: mean {sum(ratio) / len(ratio):.2f}, min {min(ratio):.2f}, "
              f"max {max(ratio):.2f} over {len(ratio)} trees")
        print_orders(lowered)
    if args.cases:
        args.cases.write_text(json.dumps(cases, indent=1))
    print_means(cases)


def print_orders(lowered: list[tuple]) -> None:
    """Per case, the schemes in the simulator's order of latency and of the search's objective
    (energy^a x delay^b, ``search.OBJECTIVES``), the simulator's energy and latency."""
    print("\nsimulated order (fastest / cheapest first):")
    cases: dict = {}
    for model, preset, batch, scheme, _, cycles, _, joules, objective in lowered:
        cases.setdefault((model, preset, batch, objective), []).append((_label(scheme), cycles, joules))
    for (model, preset, batch, objective), runs in cases.items():
        a, b = OBJECTIVES[objective]
        by_latency = " <= ".join(s for s, *_ in sorted(runs, key=lambda r: r[1]))
        by_objective = " <= ".join(s for s, *_ in sorted(runs, key=lambda r: r[2] ** a * r[1] ** b))
        print(f"{model:<10} {preset:<13} {batch:>5}  latency: {by_latency:<20} {objective}: {by_objective}")


def print_means(cases: list[dict]) -> None:
    """SET's latency and energy ratios to LS and LP per case, then their arithmetic and geometric
    means: speed-up (the other's latency / SET's), energy and EDP saving (1 - SET's / the other's).
    ``bound/LS`` is the least SET/LS latency ratio any tree could reach (``latency_bound``)."""
    print(f"\n{'model':<10} {'preset':<13} {'batch':>5} {'objective':<9} {'beta':>5} {'lat SET/LS':>10} "
          f"{'lat SET/LP':>10} {'E SET/LS':>9} {'E SET/LP':>9} {'bound/LS':>9}")
    for c in cases:
        s, ls, lp = c["set"], c["ls"], c["lp"]
        r = (s["latency"] / ls["latency"], s["latency"] / lp["latency"], s["joules"] / ls["joules"],
             s["joules"] / lp["joules"], c["bound"] / ls["latency"] if "bound" in c else math.nan)
        print(f"{c['model']:<10} {c['preset']:<13} {c['batch']:>5} {c['objective']:<9} {c['beta']:>5g} "
              + " ".join(f"{x:>9.3f} " for x in r))
    n = len(cases)
    print(f"\nmeans over {n} cases       speed-up (arith / geo)   energy saving (arith / geo)   EDP saving (arith / geo)")
    for other in ("lp", "ls"):
        speed = [c[other]["latency"] / c["set"]["latency"] for c in cases]
        energy = [c["set"]["joules"] / c[other]["joules"] for c in cases]
        edp = [e / s for e, s in zip(energy, speed)]
        print(f"SET vs {other.upper()}                {sum(speed) / n:>6.2f}x / {_geo(speed):>5.2f}x        "
              f"{100 * (1 - sum(energy) / n):>6.1f} % / {100 * (1 - _geo(energy)):>5.1f} %        "
              f"{100 * (1 - sum(edp) / n):>6.1f} % / {100 * (1 - _geo(edp)):>5.1f} %")


def _geo(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def lower_tree(model: str, preset: str, tree: Tree, graph: LayerGraph, **model_options):
    """The ``TreeProgram`` of ``tree`` lowered to a DSA program for ``model`` (built with
    ``model_options``) at the tree's batch."""
    import tvm

    from tvm_dsa.harness import import_onnx
    from tvm_dsa.schedule.set.scheduler import SetOptions

    mod = import_onnx(get_model(model, batch=tree.batch, **model_options))
    tvm.compile(mod, target=f"dsa/{preset}",
                relax_pipeline=tvm_dsa.pipeline(schedule="set", options=SetOptions(tree=tree.text(graph))))
    return tvm_dsa.pipeline_result().trees["set0"][1]


def compile_searched(model: str, preset: str, graph: LayerGraph, search, config: Anneal) -> tuple:
    """(scheme, evaluation, ``simulate_tree``'s figures) of the program the ``set`` schedule
    compiles for ``model`` with its own search (``config``): of the search's finalists, the one
    whose program simulated cheapest (``scheme`` "set" or, where a rival's tree won, "set/ls"
    or "set/lp"). Prints the finalists' figures; ``search`` is this script's SET search, which the
    compiler's must repeat."""
    import tvm

    from tvm_dsa.harness import import_onnx
    from tvm_dsa.schedule.set.scheduler import SetOptions

    mod = import_onnx(get_model(model, batch=search.tree.batch))
    pipeline = tvm_dsa.pipeline(schedule="set", options=SetOptions(config))
    tvm.compile(mod, target=f"dsa/{preset}", relax_pipeline=pipeline)
    result = tvm_dsa.pipeline_result()
    plan, program = result.trees["set0"]
    if plan.search.tree.text(graph) != search.tree.text(graph):
        raise SystemExit(f"{model} on {preset}: the compiler's search found another tree than this script's")
    if "set0" not in result.finalists:  # the three searches found one tree: nothing measured
        return "set", search.evaluation, figures(program, preset)
    launch = hardware.get(preset).kernel_launch_cycles
    kept = next(f for f in plan.search.finalists if f.tree == plan.schedule.tree)
    for m in result.finalists["set0"]:
        print(f"  SET's finalist {m.scheme.upper():<3} evaluated {m.evaluated:>10.0f}  simulated "
              f"{m.cycles - launch:>10} cycles {m.joules * 1e3:>7.3f} mJ{'  (kept)' if m.scheme == kept.scheme else ''}")
    measured = next(m for m in result.finalists["set0"] if m.scheme == kept.scheme)
    scheme = "set" if kept.scheme == "set" else f"set/{kept.scheme}"
    return scheme, kept.evaluation, (measured.cycles - launch, measured.ddr_bytes, program.timeline(), measured.joules)


def _label(scheme: str) -> str:
    """SET, LS, LP; SET(LS) for the SET program whose finalist is the LS tree."""
    head, _, tail = scheme.partition("/")
    return head.upper() + (f"({tail.upper()})" if tail else "")


def simulate_tree(model: str, preset: str, tree: Tree, graph: LayerGraph) -> tuple[int, int, tuple, float]:
    """``figures`` of ``tree`` lowered to a DSA program for ``model`` at the tree's batch."""
    return figures(lower_tree(model, preset, tree, graph), preset)


def figures(program, preset: str) -> tuple[int, int, tuple, float]:
    """(simulated cycles of the kernel, without its launch; DRAM payload bytes; S-T rectangles;
    joules, the report's, with the pe_array's) of a lowered tree (``TreeProgram``), timing only
    (the presets store int8)."""
    from tvm_dsa.runtime.simulator import simulate

    report = simulate(program.program, mode="timing", check_hazards=False).report
    launch = hardware.get(preset).kernel_launch_cycles
    return report.cycles - launch, report.ddr_read + report.ddr_write, program.timeline(), report.energy_total


if __name__ == "__main__":
    main()
