"""SoD2 (seed 001): what RDP resolves beyond Relax's own shape inference, and memory plans.

    python benchmarks/sod2.py                    # all tables
    python benchmarks/sod2.py --tables dynamic   # some (rdp memory planning dynamic fusion evaluation versions executable)
    python benchmarks/sod2.py --show skipnet     # and the per-tensor RDP report of one model

RDP: each model of ``tvm_dsa.models.dynamic`` is imported with TVM's ONNX importer (symbolic dims
stay symbolic) and analysed. A tensor is *resolved* when its rank and every dim are known in
terms of the function's inputs (integers and the input's symbolic dims): by Relax, from the
struct info the importer and Relax's inference gave it; by RDP, from its fixed point.

Memory plans (§4.4.1): the arena each greedy planner needs, over CP-SAT's optimum, on the
intermediate tensors of the tiny zoo models (every legalized op a step, and after FuseOps every
fused kernel a step) and on random lifetimes; next to it, the bytes Relax's own
StaticPlanBlockMemory allocates for the same tensors (storage reuse, no packing into one arena).

Dynamic models on the DSA: one ``dsa`` build of each dynamic model runs several shapes; the same
model imported with that shape fixed and compiled statically is the reference. Simulated cycles
on stcp920 and host wall time of a run (least of warm runs; the first run at a new shape also
builds its programs, reported apart).

Execution planning (§4.3): the peak of live intermediates in the program's order and in the
order the exact search (or the greedy list schedule) finds, on the zoo and on random DAGs.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

from tvm_dsa.kernelgen.specialize import VERSIONS
from tvm_dsa.harness import Compiled, import_onnx, load_model, max_relative_error
from tvm_dsa.relax_passes.fusion import fuse
from tvm_dsa.relax_pipeline import pipeline, pipeline_result
from tvm_dsa.relax_passes.rdp_fusion import count_kernels
from tvm_dsa.models import TINY
from tvm_dsa.models.dynamic import DYNAMIC
from tvm_dsa.relax_passes import rdp
from tvm_dsa.relax_passes.exec_plan import DataflowGraph, greedy_order, lifetimes, optimal_order, peak_of, topological
from tvm_dsa.memory_plan import PLANNERS, Lifetime, graph_lifetimes, lower_bound, optimal, best_greedy
from tvm_dsa.relax_passes.rdp_apply import ApplyRDP
from tvm_dsa.relax_passes.simplify import SimplifyInference
from tvm_dsa.schedule.graph import OpGraph


def _table(header: list[str], rows: list[list]) -> None:
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    print("  ".join(str(h).ljust(w) for h, w in zip(header, widths)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(str(c).rjust(w) if k else str(c).ljust(w) for k, (c, w) in enumerate(zip(r, widths))))


def rdp_table() -> dict:
    rows, reports = [], {}
    for name, build in DYNAMIC.items():
        mod = from_onnx(build(), keep_params_in_input=False)
        start = time.perf_counter()
        result = rdp.analyze(mod)
        seconds = time.perf_counter() - start
        s = result.summary()
        reports[name] = result
        rows.append([name, s.tensors, s.relax, s.rdp, s.rdp_only, f"{s.relax_dims}/{s.dims}",
                     f"{s.rdp_dims}/{s.dims}", result.visits, f"{seconds * 1e3:.0f}",
                     _builds(mod), _builds(ApplyRDP()(mod))])
    print("Tensors with rank and dims resolved in terms of the inputs (params and bindings), and whether\n"
          "tvm.compile(target='llvm') builds the module as imported and with RDP's shapes cast in\n")
    _table(["model", "tensors", "Relax", "RDP", "RDP only", "dims Relax", "dims RDP", "visits", "RDP ms",
            "llvm build", "+ ApplyRDP"], rows)
    return reports


def _builds(mod) -> str:
    try:
        tvm.compile(mod, target="llvm")
    except tvm.error.InternalError as err:
        return "fails" if "CodeGenVM cannot emit" in str(err) else f"fails: {str(err)[:40]}"
    return "ok"


def zoo_module(name: str, fused: bool) -> tvm.IRModule:
    """A tiny zoo model legalized (every op a call_tir), and fused if asked."""
    passes = [SimplifyInference(), relax.transform.LegalizeOps()]
    if fused:
        passes += [relax.transform.AnnotateTIROpPattern(), relax.transform.FuseOps(), relax.transform.FuseTIR()]
    with tvm.target.Target("llvm"):
        return tvm.transform.Sequential(passes)(import_onnx(load_model(name, tiny=True)))


def relax_plan_bytes(mod: tvm.IRModule) -> int:
    """Bytes Relax's own planner (StaticPlanBlockMemory, as tvm.compile runs it) allocates for
    the intermediates: its storages, plus the outputs it leaves to the runtime."""
    planned = tvm.transform.Sequential([relax.transform.ToNonDataflow(), relax.transform.RemovePurityChecking(),
                                        relax.transform.CallTIRRewrite(),
                                        relax.transform.StaticPlanBlockMemory()])(mod)
    total = 0

    def visit(call):
        nonlocal total
        if not isinstance(call.op, tvm.ir.Op):
            return
        if call.op.name == "relax.memory.alloc_storage":
            total += int(call.args[0].values[0])
        elif call.op.name == "relax.builtin.alloc_tensor":
            bits = tvm.runtime.DataType(str(call.args[1].value)).bits
            total += int(np.prod([int(v) for v in call.args[0].values])) * bits // 8

    tvm_ffi.structural_walk(planned["main"].body, [(relax.Call, visit)])
    return total


def random_lifetimes(rng, n: int) -> list[Lifetime]:
    """n tensors over n steps, sizes 16..1024 bytes, each read 1-3 steps after it is written."""
    out = []
    for _ in range(n):
        first = int(rng.integers(0, n))
        out.append(Lifetime(int(rng.integers(1, 65)) * 16, first, min(n - 1, first + int(rng.integers(1, 4)))))
    return out


def zoo_graphs():
    """(label, module, OpGraph or the error that prevented one) of each tiny zoo model, unfused
    and fused; the error is reported in the tables, not hidden."""
    for model in TINY:
        for fused in (False, True):
            mod = zoo_module(model, fused)
            try:
                graph = OpGraph.from_relax(mod)
            except Exception as err:  # noqa: BLE001
                graph = err
            yield f"{model}{' fused' if fused else ''}", mod, graph


def memory_tables(seconds: float) -> None:
    names = list(PLANNERS)
    rows = []
    for label, mod, graph in zoo_graphs():
        if isinstance(graph, Exception):
            rows.append([label, "-", "-", "-", *["n/a"] * (len(names) + 1), f"no graph: {graph}"[:60]])
            continue
        lts = graph_lifetimes(graph)
        best = optimal(lts, seconds)
        rows.append([label, len(lts), lower_bound(lts), best.plan.peak,
                     *[f"{PLANNERS[p](lts).peak / best.plan.peak:.3f}" for p in names],
                     f"{relax_plan_bytes(mod) / best.plan.peak:.3f}", "optimal" if best.proven else "best found"])
    print("\nArena over CP-SAT's optimum: tiny zoo models' intermediates (bytes)\n")
    _table(["model", "tensors", "lower bound", "optimum", *names, "Relax plan", "CP-SAT"], rows)

    rng = np.random.default_rng(0)
    rows = []
    for n in (8, 12, 16, 24):
        ratios = {p: [] for p in names}
        proven = 0
        for _ in range(20):
            lts = random_lifetimes(rng, n)
            best = optimal(lts, seconds)
            proven += best.proven
            for p in names:
                ratios[p].append(PLANNERS[p](lts).peak / best.plan.peak)
        rows.append([n, *[f"{statistics.mean(r):.3f} / {max(r):.3f}" for r in ratios.values()], f"{proven}/20"])
    print("\nArena over CP-SAT's optimum, random lifetimes, 20 instances each: mean / max\n")
    _table(["tensors", *names, "proven optimal"], rows)


def planning_tables() -> None:
    rows = []
    for label, mod, graph in zoo_graphs():
        if isinstance(graph, Exception):
            rows.append([label, "-", *["n/a"] * 6, f"no graph: {graph}"[:60]])
            continue
        g = DataflowGraph.from_opgraph(graph)
        program = tuple(range(len(g.sizes)))
        best = optimal_order(g)
        planned = best or greedy_order(g)
        rows.append([label, len(g.sizes), sum(g.sizes), relax_plan_bytes(mod),
                     best_greedy(lifetimes(g, program)).peak, peak_of(g, program),
                     planned.peak, best_greedy(lifetimes(g, planned.order)).peak,
                     "exact" if best else "greedy"])
    print("\nIntermediate bytes of the tiny zoo: no reuse, Relax's plan, arena (best_greedy) in program order,\n"
          "peak of the program order and of the planned order (§4.3), arena (best_greedy) in the planned order\n")
    _table(["model", "ops", "no reuse", "Relax plan", "arena", "peak", "planned peak", "planned arena", "order"], rows)

    rng = np.random.default_rng(0)
    rows = []
    for n in (8, 12, 16):
        program, greedy = [], []
        for _ in range(20):
            g = random_graph(rng, n)
            best = optimal_order(g).peak
            program.append(peak_of(g, topological(g)) / best)
            greedy.append(greedy_order(g).peak / best)
        rows.append([n, f"{statistics.mean(program):.3f} / {max(program):.3f}",
                     f"{statistics.mean(greedy):.3f} / {max(greedy):.3f}"])
    print("\nPeak over the exact order's, random DAGs (each op reads 1-2 earlier ops), 20 each: mean / max\n")
    _table(["ops", "program order", "greedy order"], rows)


def random_graph(rng, n: int) -> DataflowGraph:
    """Op v reads one or two of the ops before it (op 0 reads the graph input), sizes 16..1024."""
    inputs = [()] + [tuple(sorted(set(int(u) for u in rng.integers(0, v, size=int(rng.integers(1, 3))))))
                     for v in range(1, n)]
    sizes = tuple(int(rng.integers(1, 65)) * 16 for _ in range(n))
    return DataflowGraph(sizes, tuple(inputs), frozenset({n - 1}))


SHAPES = {
    "bert": [(1, 8), (2, 16), (4, 32)],
    "cnn": [(1, 3, 16, 16), (2, 3, 24, 20), (4, 3, 32, 32)],
    "shape_chain": [(1, 8, 64), (2, 16, 64), (4, 32, 64)],
    "skipnet": [(1, 3, 16, 16), (2, 3, 15, 11), (4, 3, 32, 32)],
}


def model_input(name: str, shape: tuple, rng, scale: float = 1.0) -> np.ndarray:
    """Token ids for bert, else normal data times ``scale`` (skipnet's gates skip small inputs)."""
    if name == "bert":
        return rng.integers(0, 100, shape).astype(np.int64)
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def static_module(name: str, shape: tuple) -> tvm.IRModule:
    """The dynamic model imported with its input's shape fixed."""
    model = DYNAMIC[name]()
    feed = model.graph.input[0].name
    return from_onnx(model, shape_dict={feed: list(shape)}, dtype_dict={feed: "int64" if name == "bert" else "float32"},
                     keep_params_in_input=False)


def _timed(compiled: Compiled, x: np.ndarray, repeat: int):
    """(first run, least seconds of ``repeat`` more runs (the machine is shared: the least is
    the steadiest), cycles)."""
    first = compiled.run({"x": x})
    warm = [compiled.run({"x": x}).seconds for _ in range(repeat)]
    return first, min(warm), first.report.cycles if first.report else None


def _interleaved(a: Compiled, b: Compiled, x: np.ndarray, repeat: int) -> tuple[float, float, float, float]:
    """Least wall seconds of ``repeat`` warm runs of ``a`` and of ``b``, their runs alternating,
    and least CPU seconds of this process over the same runs (other processes on a shared
    machine slow the wall clock, not this process's CPU time)."""
    def run(c: Compiled) -> tuple[float, float]:
        start = time.process_time()
        wall = c.run({"x": x}).seconds
        return wall, time.process_time() - start

    run(a), run(b)
    times = [(run(a), run(b)) for _ in range(repeat)]
    return (min(t[0][0] for t in times), min(t[1][0] for t in times),
            min(t[0][1] for t in times), min(t[1][1] for t in times))


def fresh_versions(multi_version: bool = False) -> None:
    """Build symbolic kernels with one lowering (False) or multi-version (True), from scratch."""
    VERSIONS.multi_version = multi_version
    VERSIONS.clear()


def dynamic_table(repeat: int) -> None:
    """Like for like: the dynamic build's programs with one lowering, as the static build's."""
    import onnxruntime as ort

    fresh_versions()
    rng = np.random.default_rng(0)
    rows = []
    for name in DYNAMIC:
        dyn = build_dynamic(name)
        sess = ort.InferenceSession(DYNAMIC[name]().SerializeToString())
        for shape in SHAPES[name]:
            x = model_input(name, shape, rng)
            ref = sess.run(None, {sess.get_inputs()[0].name: x})
            built = VERSIONS.seconds
            first = dyn.run({"x": x})
            build_s = VERSIONS.seconds - built
            cycles = first.report.cycles
            err = max_relative_error(first.outputs, ref)
            try:
                sta = Compiled.build(static_module(name, shape), schedule="layerwise")  # as the dynamic build
                s_cycles = sta.run({"x": x}).report.cycles
                warm, s_warm, cpu, s_cpu = _interleaved(dyn, sta, x, repeat)
                static = [s_cycles, f"{cycles / s_cycles - 1:+.1%}", f"{s_warm * 1e3:.1f}",
                          f"{warm / s_warm - 1:+.1%}", f"{cpu / s_cpu - 1:+.1%}", f"{sta.seconds:.1f}"]
            except Exception as e:  # noqa: BLE001 - the static build's failure is a result
                static = ["fails", "-", "-", "-", "-", str(e).strip().splitlines()[-1][:40]]
            rows.append([name, "x".join(map(str, shape)), f"{err:.1e}", cycles, static[0], static[1],
                         f"{warm * 1e3:.1f}" if static[0] != "fails" else "-", *static[2:5],
                         f"{first.seconds:.2f}", f"{build_s:.2f}", f"{dyn.seconds:.1f}", static[5]])
    print("\nDynamic models on the DSA (stcp920): one build per model, every shape; against the model imported\n"
          "and compiled at that shape. err: max |DSA - onnxruntime| / max |onnxruntime|. Host ms: least of\n"
          f"{repeat} warm runs of each, the two builds' runs interleaved (the machine is shared: noise hits both\n"
          "alike); CPU overhead: the same with this process's CPU time; first run s: the first run at that\n"
          "shape, of which program builds s\n")
    _table(["model", "shape", "err", "cycles dyn", "cycles static", "overhead", "host ms dyn", "host ms static",
            "overhead", "CPU overhead", "first run s", "builds s", "compile s dyn", "compile s static"], rows)
    print(f"\nDispatch on the host, per DSA call with a program already built: {dispatch_us():.1f} us for a kernel with\n"
          f"symbolic dims (shapes -> cached program), {static_dispatch_us():.1f} us for a static one (program text -> parsed);\n"
          f"per run of a dynamic build, the arena plan for its sizes (cached): {arena_plan_us():.1f} us")
    fresh_versions(True)


def dispatch_us(n: int = 2000) -> float:
    """Median cost of looking up a built program by (kernel, shapes), as execute_shaped does."""
    text, shapes, scalars = max(VERSIONS.programs, key=lambda k: len(k[0]))
    times = []
    for _ in range(n):
        start = time.perf_counter()
        VERSIONS.get((text + " ")[:-1], shapes, scalars)  # a new string each call, as from the VM
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def arena_plan_us(n: int = 2000) -> float:
    """Median cost of ``tvm_dsa.arena_plan`` called by the VM for sizes it has planned before
    (bert's 30 tensors), through the FFI as the VM calls it."""
    lifetimes = "[" + ", ".join(f"[{i}, {i + 4}]" for i in range(0, 90, 3)) + "]"
    sizes = tvm_ffi.Shape([256 * (k % 5 + 1) for k in range(30)])
    plan = tvm_ffi.get_global_func("tvm_dsa.arena_plan")
    plan(lifetimes, sizes)
    times = []
    for _ in range(n):
        start = time.perf_counter()
        plan(lifetimes, sizes)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def static_dispatch_us(n: int = 2000) -> float:
    """The same for a static kernel: its program text to the parsed program (``execution.parsed_program``)."""
    from tvm_dsa.execution import parsed_program

    text = max(VERSIONS.programs.values(), key=lambda p: len(p.serialize())).serialize()
    parsed_program(text)
    times = []
    for _ in range(n):
        start = time.perf_counter()
        parsed_program((text + " ")[:-1])
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def input_sizes(name: str, shape: tuple) -> dict[str, int]:
    """The input's symbolic dims by name, at ``shape``."""
    dims = DYNAMIC[name]().graph.input[0].type.tensor_type.shape.dim
    return {d.dim_param: n for d, n in zip(dims, shape) if d.dim_param}


def build_dynamic(name: str, rdp_fusion: bool = True) -> Compiled:
    mod = from_onnx(DYNAMIC[name](), keep_params_in_input=False)
    start = time.perf_counter()
    ex = tvm.compile(mod, target="dsa/stcp920", relax_pipeline=pipeline(rdp_fusion=rdp_fusion))
    return Compiled(ex, "dsa/stcp920", time.perf_counter() - start, pipeline_result())


def fusion_table() -> None:
    """Layers and intermediate bytes (both ways of each If; pure reshapes are views, neither) and
    simulated cycles of one run, with TVM's fusion on the model as imported and with RDP-aware
    fusion (one lowering per kernel: multi-version code off)."""
    fresh_versions()
    rng = np.random.default_rng(0)
    rows = []
    for name in DYNAMIC:
        mod = from_onnx(DYNAMIC[name](), keep_params_in_input=False)
        for shape in SHAPES[name][1:2]:
            sizes = input_sizes(name, shape)
            x = model_input(name, shape, rng)
            row = [name, "x".join(map(str, shape))]
            for rdp_fusion in (False, True):
                with tvm.target.Target("dsa/stcp920"):
                    count = count_kernels(fuse(mod, rdp_fusion), sizes)
                run = build_dynamic(name, rdp_fusion).run({"x": x})
                row += [count.layers, count.intermediate_bytes, len(run.kernels), run.report.cycles]
            rows.append(row + [f"{1 - row[6] / row[2]:.0%}", f"{1 - row[7] / row[3]:.0%}",
                               f"{1 - row[9] / row[5]:.0%}"])
    print("\nRDP-aware fusion (§4.2): kernels (call_tir, both ways of each If; pure reshapes are views) and their\n"
          "output bytes, DSA kernel calls and cycles of one run, with TVM's fusion on the model as imported and\n"
          "with RDP-aware fusion\n")
    _table(["model", "shape", "layers TVM", "bytes TVM", "DSA calls TVM", "cycles TVM",
            "layers RDP", "bytes RDP", "DSA calls RDP", "cycles RDP", "fewer layers", "fewer bytes",
            "fewer cycles"], rows)
    fresh_versions(True)


def gate_decisions(name: str, x: np.ndarray) -> tuple[bool, ...]:
    """The model's If decisions on ``x`` (onnxruntime, the If conditions added as outputs)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    model = DYNAMIC[name]()
    conds = [n.input[0] for n in model.graph.node if n.op_type == "If"]
    if not conds:
        return ()
    model.graph.output.extend(helper.make_tensor_value_info(c, TensorProto.BOOL, []) for c in conds)
    sess = ort.InferenceSession(model.SerializeToString())
    return tuple(bool(g) for g in sess.run(None, {sess.get_inputs()[0].name: x})[1:])


def onnxruntime_memory(name: str, x: np.ndarray) -> tuple[float, float]:
    """(peak RSS in MiB of a process that runs the model once with onnxruntime on CPU, the part
    of it the run added over the loaded session)."""
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        model_path, x_path = f"{tmp}/model.onnx", f"{tmp}/x.npy"
        with open(model_path, "wb") as f:
            f.write(DYNAMIC[name]().SerializeToString())
        np.save(x_path, x)
        code = ("import resource, numpy as np, onnxruntime as ort\n"
                f"s = ort.InferenceSession({model_path!r}, providers=['CPUExecutionProvider'])\n"
                f"x = np.load({x_path!r})\n"
                "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
                "s.run(None, {s.get_inputs()[0].name: x})\n"
                "print(before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n")
        before, after = map(int, subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                                check=True).stdout.split())
    return after / 1024, (after - before) / 1024


def relax_default_bytes(mod: tvm.IRModule, decisions: tuple) -> tuple[int, str]:
    """(bytes of Relax's StaticPlanBlockMemory after TVM's own legalization and fusion, "") on the
    same instance the planners see (the If branches the input takes) — with ApplyRDP first, marked
    "*", where Relax alone does not know every shape (LegalizeOps then refuses or skips ops, and
    the module does not build)."""
    from tvm_dsa.relax_passes.concrete import instantiate
    from tvm_dsa.kernelgen.symbolic import has_unknown_dims

    lost = has_unknown_dims(mod)
    passes = [ApplyRDP()] * lost + [SimplifyInference(), relax.transform.LegalizeOps(),
                                    relax.transform.AnnotateTIROpPattern(), relax.transform.FuseOps(),
                                    relax.transform.FuseTIR()]
    with tvm.target.Target("llvm"):
        fused = tvm.transform.Sequential(passes)(mod)
        return relax_plan_bytes(relax.transform.ConvertToDataflow()(instantiate(fused, {}, decisions))), "*" * lost


def evaluation_table(repeat: int) -> None:
    """Seed 001's evaluation (Figs. 5-6) per dynamic model and input shape: peak intermediate
    memory of the plans, latency of the builds, next to Relax's default and onnxruntime."""
    from tvm_dsa.relax_passes.exec_plan import plan_order
    from tvm_dsa.relax_passes.concrete import instantiate, planning_graph
    from tvm_dsa.memory_plan import in_order

    rng = np.random.default_rng(0)
    memory, latency = [], []
    for name in DYNAMIC:
        mod = from_onnx(DYNAMIC[name](), keep_params_in_input=False)
        with tvm.target.Target("dsa/stcp920"):
            fused = {f: fuse(mod, f) for f in (False, True)}
        builds = {f: build_dynamic(name, f) for f in (False, True)}
        for k, shape in enumerate(SHAPES[name]):
            x = model_input(name, shape, rng, scale=(1.0, 0.1, 1.0)[k])  # the middle one skips
            sizes, decisions = input_sizes(name, shape), gate_decisions(name, x)
            graphs = {f: planning_graph(instantiate(fused[f], sizes, decisions)) for f in (False, True)}
            program = {f: list(range(len(g.sizes))) for f, g in graphs.items()}
            planned = plan_order(graphs[True]).order
            online = lambda f, order: in_order(lifetimes(graphs[f], order)).peak  # noqa: E731
            no_opt, fusion = online(False, program[False]), online(True, program[True])
            sep = online(True, planned)
            dmp = best_greedy(lifetimes(graphs[True], planned)).peak
            relax_bytes, relax_note = relax_default_bytes(static_module(name, shape), decisions)
            ort_peak, ort_run = onnxruntime_memory(name, x)
            label = ["x".join(map(str, shape)) + "".join(" " + "TF"[not d] for d in decisions)]
            memory.append([name, *label, sum(graphs[False].sizes), no_opt, fusion, sep, dmp, f"{relax_bytes}{relax_note}",
                           f"{1 - dmp / relax_bytes:.0%}", f"{ort_peak:.0f}", f"{ort_run:.1f}"])
            runs = {}
            for key, build, multi_version in [("no opt", builds[False], False), ("fusion", builds[True], False),
                                              ("mvc", builds[True], True)]:
                fresh_versions(multi_version)
                runs[key] = _timed(build, x, repeat)
            cyc = {k: r[2] for k, r in runs.items()}
            latency.append([name, *label, cyc["no opt"], cyc["fusion"], cyc["mvc"],
                            f"{1 - cyc['fusion'] / cyc['no opt']:.0%}", f"{1 - cyc['mvc'] / cyc['fusion']:.0%}",
                            *(f"{runs[k][1] * 1e3:.0f}" for k in runs)])
    print("\nPeak intermediate memory (bytes) per dynamic model and input (If decisions T/F): no reuse; the online\n"
          "best-fit allocator in program order with TVM's fusion (no opt.) and RDP-aware fusion (+ fusion); in the\n"
          "planned order (+ SEP); the arena plan (best_greedy) in the planned order (+ DMP); Relax's default pipeline on the\n"
          "model imported at that shape, same branches (StaticPlanBlockMemory; * with ApplyRDP first: Relax alone\n"
          "cannot build it); onnxruntime on CPU: peak process RSS (MiB) and what the run added over the loaded session\n")
    _table(["model", "input", "no reuse", "no opt.", "+ fusion", "+ SEP", "+ DMP", "Relax", "DMP vs Relax",
            "ort MiB", "ort run MiB"], memory)
    print("\nLatency on the DSA (stcp920 cycles) and host wall time (ms, least of warm runs): the dynamic build with\n"
          "TVM's fusion, with RDP-aware fusion, and with multi-version code (+ MVC: each shape class's faster\n"
          "lowering; SEP and DMP are plans, not yet applied to the executable, so they change no cycles)\n")
    _table(["model", "input", "cycles no opt.", "+ fusion", "+ MVC", "fewer: fusion", "fewer: MVC",
            "host ms no opt.", "+ fusion", "+ MVC"], latency)
    fresh_versions(True)


def executable_memory_table() -> None:
    """Peak bytes of storage the VM allocates during one run (``vm_memory.measure``), per dynamic
    model and input: Relax's default pipeline (``tvm.compile(mod, target="llvm")``; ApplyRDP first
    where Relax alone cannot build the model, marked *), the dsa build with Relax's
    StaticPlanBlockMemory, and the dsa build with the plans (``ApplyExecutionPlan``, ``PlanArena``)."""
    import onnxruntime as ort

    from tvm_dsa.harness.vm_memory import measure

    rng = np.random.default_rng(0)
    rows = []
    for name in DYNAMIC:
        mod = from_onnx(DYNAMIC[name](), keep_params_in_input=False)
        try:
            default, lost = tvm.compile(mod, target="llvm"), False
        except tvm.error.InternalError:  # LegalizeOps / CodeGenVM refuse an op of unknown shape
            default, lost = tvm.compile(ApplyRDP()(mod), target="llvm"), True
        vms = {"relax": relax.VirtualMachine(default, tvm.cpu())}
        for plan in (False, True):
            ex = tvm.compile(mod, target="dsa/stcp920", relax_pipeline=pipeline(memory_plan=plan))
            vms[plan] = relax.VirtualMachine(ex, tvm.cpu())
        sess = ort.InferenceSession(DYNAMIC[name]().SerializeToString())
        for k, shape in enumerate(SHAPES[name]):
            x = model_input(name, shape, rng, scale=(1.0, 0.1, 1.0)[k])  # the middle one skips
            ref = sess.run(None, {sess.get_inputs()[0].name: x})
            out = vms[True]["main"](tvm.runtime.tensor(x))
            err = max_relative_error([out.numpy()], ref[:1])
            peak = {key: measure(vm, "main", tvm.runtime.tensor(x)).peak for key, vm in vms.items()}
            label = "x".join(map(str, shape)) + "".join(" " + "TF"[not d] for d in gate_decisions(name, x))
            rows.append([name, label, f"{peak['relax']:,}{'*' * lost}", f"{peak[False]:,}", f"{peak[True]:,}",
                         f"{peak[True] / peak['relax'] - 1:+.0%}", f"{peak[True] / peak[False] - 1:+.0%}", f"{err:.1e}"])
    print("\nPeak storage bytes the VM allocates in one run (measured on the executable: every alloc_storage, alive\n"
          "while referenced): Relax's default pipeline for llvm (* with ApplyRDP first), the dsa build with Relax's\n"
          "StaticPlanBlockMemory, and with the plans (the planned order, the arena (best_greedy)); err: that build\n"
          "vs onnxruntime\n")
    _table(["model", "input", "Relax default", "dsa + Relax plan", "dsa + plans", "vs Relax default",
            "vs dsa + Relax plan", "err"], rows)


def versions_table(plans: int) -> None:
    """Multi-version code (§4.4.2): per contraction and shape, its shape class, the cycles
    (timing simulation) of the two lowerings the versions choose between (every core a tile;
    the largest tile that fits) and of the best of the first ``plans`` candidate tilings that fit
    (and their splits for more cores) — how much a wider search would add."""
    from tvm_dsa import hardware
    from tvm_dsa.emit.emitter import build_program
    from tvm_dsa.kernel.ir import plan_lb, read_kernel
    from tvm_dsa.kernelgen.specialize import timing_cycles, free_symbols, shape_class, specialize
    from tvm_dsa.kernel.analysis import Unsupported
    from tvm_dsa.tir_passes.tile import anchor_info, candidate_plans, parallel_plans
    from tvm_dsa.tiling import lower_kernel
    from tvm_dsa.tir_passes import lower_with_plan

    hw = hardware.get("stcp920")

    def cycles(lowered) -> int:
        return timing_cycles(build_program(lowered, hw, "k"))

    cases = [("bert", "fused_matmul_add", [{"batch": 1, "seq": 4}, {"batch": 2, "seq": 16}, {"batch": 4, "seq": 32},
                                           {"batch": 8, "seq": 64}]),
             ("cnn", "fused_conv2d1_add1_relu1", [{"batch": 1, "height": 4, "width": 4},
                                                  {"batch": 1, "height": 16, "width": 16},
                                                  {"batch": 4, "height": 48, "width": 48}])]
    rows = []
    for name, prefix, shapes in cases:
        with tvm.target.Target("dsa/stcp920"):
            mod = fuse(from_onnx(DYNAMIC[name](), keep_params_in_input=False))
        gv = min((g for g in mod.functions if g.name_hint.startswith(prefix)), key=lambda g: g.name_hint)
        for sizes in shapes:
            func = specialize(mod[gv], {v: sizes[v.name] for v in free_symbols(mod[gv])})
            info = anchor_info(func)
            versions = {v: cycles(lower_kernel(func, hw, parallel=v == "parallel")[0]) for v in ("parallel", "whole")}
            tried = []
            for p in candidate_plans(info, hw.mme.rows, hw.mme.cols):
                try:
                    lowered = lower_with_plan(func, p)
                    plan_lb(read_kernel(lowered), hw, None)
                except Unsupported:
                    continue
                tried.append(cycles(lowered))
                for q in list(parallel_plans(info, p, hw.mme.rows, hw.mme.cols))[:4]:
                    try:
                        tried.append(cycles(lower_with_plan(func, q)))
                    except Unsupported:
                        pass
                if len(tried) >= plans:
                    break
            chosen = min(versions.values())
            rows.append([name, gv.name_hint, "x".join(map(str, info.spatial)), shape_class(func), versions["parallel"],
                         versions["whole"], f"{1 - chosen / versions['parallel']:.1%}", min(tried), len(tried)])
    print("\nMulti-version code (§4.4.2): the two lowerings per shape, what choosing the faster saves over the\n"
          "single (parallel) version, and the best of the candidate tilings\n")
    _table(["model", "kernel", "output", "class", "parallel", "whole", "saved by MVC", "best candidate", "plans tried"],
           rows)


TABLES = ("rdp", "memory", "planning", "dynamic", "fusion", "evaluation", "versions", "executable")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--show", choices=sorted(DYNAMIC), help="print the per-tensor report of this model")
    parser.add_argument("--seconds", type=float, default=10.0, help="CP-SAT time limit per instance")
    parser.add_argument("--tables", nargs="+", choices=TABLES, default=list(TABLES), help="which tables to print")
    parser.add_argument("--repeat", type=int, default=5, help="warm runs per shape in the dynamic table")
    parser.add_argument("--plans", type=int, default=12, help="candidate plans per shape in the versions table")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", module="tvm.relax.frontend.onnx")
    reports = rdp_table() if "rdp" in args.tables or args.show else {}
    if "memory" in args.tables:
        memory_tables(args.seconds)
    if "planning" in args.tables:
        planning_tables()
    if "dynamic" in args.tables:
        dynamic_table(args.repeat)
    if "fusion" in args.tables:
        fusion_table()
    if "evaluation" in args.tables:
        evaluation_table(args.repeat)
    if "versions" in args.tables:
        versions_table(args.plans)
    if "executable" in args.tables:
        executable_memory_table()
    if args.show:
        print(f"\n{args.show}\n")
        print(reports[args.show])


if __name__ == "__main__":
    main()
