"""``tvm-dsa explore``: SET's resource-allocation-tree search (seed 002) from the command line.

    tvm-dsa explore resnet50 --target dsa/set-edge16 --batch 8 --objective e2d --beta 100
    tvm-dsa explore resnet18 --tiny --beta 5 --plot st.svg --save best.json --json
    tvm-dsa explore resnet50 --batch 8 --restarts 8      # 8 seeds per scheme as Ray tasks, the best kept

Runs the simulated annealing three times on the model's layer graph — SET over all trees, LS
(depth-one T-cuts) and LP (depth-one S-cuts) — with the same objective, β and seed (with
``--restarts N``, N times each from seeds seed .. seed + N - 1, as Ray tasks as in ``tvm-dsa sweep``
or in this process, and keeps each scheme's best; SET's search starts from LS's and LP's, so its
iterations are three times theirs); prints the
latency, energy and EDP of each best tree (the evaluator's, ``schedule.set.evaluate``) with SET's
ratios to the others, SET's best tree as text, and optionally its S-T graph and JSON.
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from dataclasses import dataclass

from tvm_dsa.cli.activity import step
from tvm_dsa.cli.args import add_ray_args, check_mesh, check_plot_path, engine, positive_int, say
from tvm_dsa.dse import InProcess, OnRay
from tvm_dsa.harness import InputError, check_target, labelled_layer_graph, load_model
from tvm_dsa.models import MODELS
from tvm_dsa.show.table import render_table
from tvm_dsa.schedule.set import Evaluator, LayerGraphError
from tvm_dsa.schedule.set.ops import LP, LS, SET
from tvm_dsa.schedule.set.search import Anneal, OBJECTIVES, anneal_each, best
from tvm_dsa.schedule.set.plot import st_graph


@dataclass(frozen=True)
class Explored:
    """One scheme's search: its name (set / ls / lp) and ``SearchResult``."""

    scheme: str
    result: object

    def to_dict(self, graph) -> dict:
        e, r = self.result.evaluation, self.result
        return {"scheme": self.scheme, "latency_cycles": e.latency, "seconds": e.seconds, "energy_joules": e.joules,
                "edp": e.edp, "dram_bytes": e.dram_bytes, "cost": r.cost, "iterations": r.iterations,
                "search_seconds": r.seconds, "seed": r.seed, "tree": r.tree.text(graph)}


def explore(model, hw, batch: int, objective: str, beta: float, seed: int, restarts: int = 1, on_ray: bool = False):
    """(layer graph, evaluator, [Explored for SET, LS, LP], the layers' labels by Relax name) of
    ``model`` (ONNX, batch 1) on ``hw``: per scheme the best of ``restarts`` searches from seeds
    ``seed`` on (``anneal_each``; the searches ended are shown as a step)."""

    try:
        graph, labels = labelled_layer_graph(model)
    except LayerGraphError as err:
        raise InputError(f"SET cannot schedule this model: {err}") from None
    evaluator = Evaluator(graph, hw)
    spaces = (SET, LS, LP)
    configs = [Anneal(beta=beta, objective=objective, seed=seed + k, space=space)
               for space in spaces for k in range(restarts)]

    def searched(done: int, total: int) -> None:
        step("searching trees", done, total)

    searched(0, len(configs))
    results = anneal_each(graph, hw, batch, configs, on_ray, evaluator, progress=searched)
    runs = [Explored(space.name, best(results[i * restarts:(i + 1) * restarts])) for i, space in enumerate(spaces)]
    return graph, evaluator, runs, labels


def _explore(args) -> int:

    if args.objective not in OBJECTIVES:
        raise InputError(f"unknown objective {args.objective!r}; one of {', '.join(OBJECTIVES)}")
    if args.beta <= 0:
        raise InputError(f"--beta must be positive, not {args.beta:g}")
    if args.plot:

        check_plot_path(args.plot)
    model = load_model(args.model, tiny=args.tiny)
    hw = check_target(args.target, model, timing_only=True)
    check_mesh(args.target, hw, "SET's search")
    # one restart is three short searches: in this process unless a cluster is named
    on_engine = args.restarts > 1 or args.address or args.in_process
    with engine(args, "explore") if on_engine else nullcontext(InProcess("one search per scheme")) as where:
        say(f"explore: {3 * args.restarts} searches (SET, LS, LP) of {args.model} run {where.describe()}")
        step("building the layer graph")
        graph, evaluator, runs, labels = explore(model, hw, args.batch, args.objective, args.beta, args.seed,
                                                 args.restarts, isinstance(where, OnRay))
    chosen = runs[0].result
    names = {name: str(label) for name, label in labels.items()}
    if args.plot:
        st_graph(evaluator.evaluate(chosen.tree, timeline=True).timeline, graph, hw.cores, args.plot,
                 f"{args.model}{' (tiny)' if args.tiny else ''} on {args.target}, batch {args.batch}: SET's best tree",
                 clock_hz=hw.clock_hz, names=names)
    if args.save:
        with open(args.save, "w") as f:
            json.dump(chosen.tree.to_json(graph), f, indent=1)
    if args.json:
        print(json.dumps({"model": args.model, "tiny": args.tiny, "target": args.target, "batch": args.batch,
                          "objective": args.objective, "beta": args.beta, "seed": args.seed,
                          "restarts": args.restarts, "layers": len(graph),
                          "tree": chosen.tree.text(graph), "tree_json": chosen.tree.to_json(graph), "plot": args.plot,
                          "layer_labels": [labels[layer.name].to_dict() for layer in graph.layers],
                          "saved": args.save, "schemes": [r.to_dict(graph) for r in runs]}, indent=2))
        return 0
    e0 = chosen.evaluation
    rows = [("scheme", "latency (cycles)", "energy (uJ)", "EDP (J*s)", "DRAM (MB)", "latency / SET", "energy / SET",
             "iterations", "search s", "seed")]
    for run in runs:
        e, r = run.result.evaluation, run.result
        rows.append((run.scheme.upper(), f"{e.latency:,.0f}", f"{e.joules * 1e6:.4g}", f"{e.edp:.3e}",
                     f"{e.dram_bytes / 1e6:.3f}", f"{e.latency / e0.latency:.2f}x", f"{e.joules / e0.joules:.2f}x",
                     str(r.iterations), f"{r.seconds:.1f}", str(r.seed)))
    render_table(rows, title=f"{args.model}{' (tiny)' if args.tiny else ''} on {args.target}, batch {args.batch}: "
                             f"SET vs LS / LP ({args.objective}, beta {args.beta:g}, "
                             + (f"seeds {args.seed}..{args.seed + args.restarts - 1})" if args.restarts > 1
                                else f"seed {args.seed})"))
    print(f"\nbest tree (SET, {len(graph)} layers; T/S: a temporal / spatial cut, batch/sub-batch):\n"
          f"{chosen.tree.listing(graph, names)}")
    if args.plot:
        print(f"S-T graph: {args.plot}")
    if args.save:
        print(f"tree JSON: {args.save}")
    return 0


def add_parser(sub) -> None:

    p = sub.add_parser("explore", help="search SET resource allocation trees for a model (vs LS / LP)",
                       description="Simulated annealing over resource allocation trees (seed 002, docs/set.md) for "
                                   "SET, LS and LP with one objective, beta and seed: a table of their latency, "
                                   "energy and EDP, SET's best tree, and optionally its S-T graph and JSON. With "
                                   "--restarts N each scheme's search runs from N seeds (as Ray tasks where Ray is "
                                   "installed) and the best tree is kept.")
    p.add_argument("model", help=f"an .onnx file (batch 1) or a built-in model: {', '.join(MODELS)}")
    p.add_argument("--tiny", action="store_true", help="the built-in model's small configuration")
    p.add_argument("--target", default="dsa/set-edge16",
                   help="a DSA preset (default dsa/set-edge16) or a hardware file")
    p.add_argument("--batch", type=positive_int, default=1, help="samples the schedule processes (default 1)")
    p.add_argument("--objective", default="edp", help="e2d, ed2, edp, delay or energy (default edp)")
    p.add_argument("--beta", type=float, default=100.0, help="search effort: iterations per layer (default 100)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--restarts", type=positive_int, default=1,
                   help="searches per scheme from seeds --seed, --seed + 1, ...; the best is kept (default 1)")
    add_ray_args(p, "searches")
    p.add_argument("--plot", metavar="PNG_OR_SVG", help="write SET's S-T graph")
    p.add_argument("--save", metavar="JSON", help="write SET's best tree as JSON")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=_explore)


__all__ = ["Explored", "add_parser", "explore"]
