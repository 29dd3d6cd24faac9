"""Helpers that several test files share; each file's own helpers stay in it. Test files import
them as ``from helpers import ...`` (pytest puts tests/ on ``sys.path``)."""

from __future__ import annotations

import functools
import math
import tomllib
from collections import defaultdict
from dataclasses import replace
from itertools import product
from pathlib import Path

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper
from tvm import relax
from tvm.relax.frontend import onnx as rx_onnx

from tvm_dsa import hardware
from tvm_dsa.kernelgen.stitch import subgraph_module
from tvm_dsa.dataflow import TensorVolumes
from tvm_dsa.isa import Dma, Kernel, Operand, Program, TensorArg
from tvm_dsa.models import TINY, example_inputs, get_model
from tvm_dsa.relax_passes.arena import ALIGN
from tvm_dsa.runtime import simulate
from tvm_dsa.schedule.graph import OpGraph
from tvm_dsa.tiling import lower_kernel
from tvm_dsa.kernelgen.stitch_passes import (AllocateBuffers, AssignMemoryScopes, BindCores, CrossLayerSchedule,
                                              OrderInstances, StitchBuffers)

PRESETS = Path(__file__).resolve().parents[1] / "src" / "tvm_dsa" / "hardware" / "presets"
HW = hardware.get("stcp920")
KB = 1024


def preset(name: str = "stcp920") -> dict:
    """The preset's TOML file as a dict."""
    return tomllib.loads((PRESETS / f"{name}.toml").read_text())


def aligned(n: int) -> int:
    """``n`` bytes rounded up to the arena's alignment."""
    return -(-n // ALIGN) * ALIGN


# -- hand-written programs on the simulator -------------------------------------------------------

def lb(off: int, dtype, *strides: int, core: int = 0) -> Operand:
    return Operand("lb", core, off, np.dtype(dtype).name, strides)


def ddr(off: int, dtype, *strides: int) -> Operand:
    return Operand("ddr", 0, off, np.dtype(dtype).name, strides)


def chain(instrs) -> list:
    """Each instruction depends on the one before it: list order, fully serialised."""
    return [replace(ins, deps=(n - 1,) if n else ()) for n, ins in enumerate(instrs)]


def make_program(kernels, args=(), ddr_bytes=1 << 20, hw=None) -> Program:
    """One kernel per list of instructions, on the cores those instructions use."""
    ks = tuple(Kernel(f"k{n}", tuple(sorted({i.core for i in ins})), tuple(ins)) for n, ins in enumerate(kernels))
    return Program(hw or preset(), ddr_bytes, tuple(args), ks, name="test")


def run_lb(body, inputs, outputs, core=0, hw=None, mode="functional"):
    """Stage each (LB offset, array) of ``inputs`` from DDR into the LB of ``core``, run ``body``
    (serialised), and return each (LB offset, shape, dtype) of ``outputs`` read back through DDR."""
    args, staged, saved, off = [], [], [], 0
    for n, (lo, x) in enumerate(inputs):
        args.append(TensorArg(f"in{n}", "input", x.shape, x.dtype.name, x.dtype.name, off))
        staged.append(Dma(core, (x.size,), lb(lo, x.dtype, 1, core=core), ddr(off, x.dtype, 1)))
        off += -(-x.nbytes // 64) * 64
    for n, (lo, shape, dtype) in enumerate(outputs):
        dtype = np.dtype(dtype)
        args.append(TensorArg(f"out{n}", "output", shape, dtype.name, dtype.name, off))
        saved.append(Dma(core, (math.prod(shape),), ddr(off, dtype, 1), lb(lo, dtype, 1, core=core)))
        off += -(-math.prod(shape) * dtype.itemsize // 64) * 64
    program = make_program([chain(staged + list(body) + saved)], args, off, hw)
    return simulate(program, [x for _, x in inputs], mode=mode)


def f16(*shape, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float16)


def mme_tile(m: int, n: int, k: int) -> int:
    """Cycles of one m x n x k product on stcp920's MME (TENET, docs/tenet.md; compute-bound):
    weight-stationary, skewed on the systolic array, tiles overlapped. The K x N operand is cut in
    rows x cols tiles (row-major); tile t starts t*m stamps in, streams the m rows of A through and ends
    m + (r - 1) + (c - 1) stamps later, r x c its extent."""
    assert HW.mme.model == "tenet" and HW.mme.dataflow == "weight-stationary, systolic, pipelined"
    rows, cols = HW.mme.rows, HW.mme.cols
    tiles = [(min(rows, k - a), min(cols, n - b)) for a in range(0, k, rows) for b in range(0, n, cols)]
    return max(t * m + m + r + c - 2 for t, (r, c) in enumerate(tiles))


# -- TENET's metrics by enumeration -----------------------------------------------------------------

def _eval(text, env):
    return eval(text, {"__builtins__": {}, "fl": math.floor, "floor": math.floor}, env)


def brute_force(df, array):
    """(instances, busy stamps, time stamps, {tensor: TensorVolumes}) of ``df`` on ``array`` by
    enumeration: a stamp reuses an element it needs if the same PE had it at the previous time stamp
    (temporal), else if a PE linked to it had it ``delay`` stamps before (spatial)."""
    op = df.op
    held = defaultdict(lambda: defaultdict(set))          # tensor -> (pe, time) -> elements
    instances = 0
    for values in product(*(range(n) for n in op.extents)):
        env = dict(zip(op.loops, values))
        if op.where and not _eval(op.where, env):
            continue
        instances += 1
        stamp = (tuple(_eval(e, env) for e in df.space), tuple(_eval(e, env) for e in df.time))
        for a in (op.output, *op.inputs):
            held[a.tensor][stamp].add(tuple(_eval(i, env) for i in a.indices))
    active = set().union(*(h.keys() for h in held.values()))
    times = sorted({t for _, t in active})
    previous = dict(zip(times[1:], times))
    volumes = {}
    for tensor, at in held.items():
        total = temporal = spatial = 0
        for (pe, t), elements in at.items():
            for f in elements:
                total += 1
                before = previous.get(t)
                if f in at.get((pe, before), ()):
                    temporal += 1
                    continue
                source_t = before if array.interconnect.delay else t
                if any(f in at.get((tuple(p - d for p, d in zip(pe, off)), source_t), ())
                       for off in array.interconnect.offsets):
                    spatial += 1
        volumes[tensor] = TensorVolumes(tensor, tensor == op.output.tensor, total, temporal, spatial)
    return instances, len(active), len(times), volumes


# -- small Relax graphs, fused as the dsa pipeline fuses them; TIR run on llvm ------------------------

def fuse(mod):
    """``mod`` after TVM's legalization and fusion, as the ``dsa`` pipeline runs them."""
    seq = tvm.transform.Sequential([relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
                                    relax.transform.FuseOps(), relax.transform.FuseTIR()])
    with tvm.target.Target("llvm"):
        return seq(mod)


def relax_graph(shapes, body):
    """A Relax ``main`` of float32 inputs of ``shapes`` returning ``body(*inputs)``."""
    bb = relax.BlockBuilder()
    vs = [relax.Var(f"a{i}", relax.TensorType(s, "float32")) for i, s in enumerate(shapes)]
    with bb.function("main", vs):
        with bb.dataflow():
            out = bb.emit_output(body(*vs))
        bb.emit_func_output(out)
    return bb.get()


def run_llvm(func, arrays):
    """Run a PrimFunc on llvm; its last argument is the output."""
    lib = tvm.tirx.build(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target="llvm")
    args = [tvm.runtime.tensor(a.copy()) for a in arrays]
    lib(*args)
    return args[-1].numpy()


def random_args(func, rng):
    return [rng.standard_normal([int(s) for s in p.shape]).astype("float32") for p in func.params]


def conv_chain(batch=4, k=3, hw_=16):
    """relu(conv(relu(conv(x, w1)), w2)), 8 channels, same padding."""
    op = relax.op
    pad = k // 2
    return relax_graph([(batch, 8, hw_, hw_), (8, 8, k, k), (8, 8, k, k)],
                  lambda x, w1, w2: op.nn.relu(op.nn.conv2d(op.nn.relu(op.nn.conv2d(x, w1, padding=pad)), w2,
                                                            padding=pad)))


def residual_block():
    """relu(conv1x1(relu(conv3x3(x))) + b + x), batch 4 of 16 x 8 x 8."""
    op = relax.op
    return relax_graph([(4, 16, 8, 8), (16, 16, 3, 3), (16, 16, 1, 1), (1, 16, 1, 1)],
                  lambda x, w1, w2, b: op.nn.relu(op.add(
                      op.add(op.nn.conv2d(op.nn.relu(op.nn.conv2d(x, w1, padding=1)), w2), b), x)))


def single_sample_block(rng) -> tuple:
    """(module, its input): relu(conv1x1) -> relu(conv3x3) -> conv1x1 + x at batch 1, 64 channels of
    32 x 32, its weights bound (graphturbo cuts it before the 3 x 3 window into two kernels)."""
    op = relax.op
    mod = relax_graph([(1, 64, 32, 32), (64, 64, 1, 1), (64, 64, 3, 3), (64, 64, 1, 1)],
                      lambda x, w1, w2, w3: op.add(op.nn.conv2d(op.nn.relu(op.nn.conv2d(
                          op.nn.relu(op.nn.conv2d(x, w1)), w2, padding=1)), w3), x))
    args = [rng.standard_normal([int(s) for s in p.ty.shape]).astype("float32") * 0.2 for p in mod["main"].params]
    return relax.transform.BindParams("main", {f"a{i}": tvm.runtime.tensor(args[i]) for i in (1, 2, 3)})(mod), args[0]


# -- stitched sub-graph modules (tvm_dsa.kernelgen.stitch_passes) ---------------------------------------

def sub_module(build, split=(0, 1 << 30), budget=None):
    """The sub-graph module of a whole Relax graph: every call one layer, lowered for the first
    ``budget`` bytes of the LB (None: all of it); every input but the first a weight to promote."""
    mod = fuse(build())
    graph = OpGraph.from_relax(mod)
    inputs, outputs = graph.boundary(graph.nodes)
    tensors = {t: (graph.tensors[t].shape, graph.tensors[t].dtype) for n in graph.nodes for t in (*n.inputs, n.output)}
    layers = [(n.name, lower_kernel(mod[n.func], HW, budget)[0], (*n.inputs, n.output), budget) for n in graph.nodes]
    return subgraph_module("sg", layers, inputs, outputs, tensors, inputs[1:], *split)


def through(mod, order="best", prefetch=0, hw=HW):
    """``mod`` through the stitching passes up to buffer allocation."""
    passes = [StitchBuffers(hw), BindCores(hw), AssignMemoryScopes(hw), OrderInstances(hw, order),
              CrossLayerSchedule(hw, prefetch), AllocateBuffers(hw)]
    return tvm.transform.Sequential(passes)(mod)


# -- ONNX ---------------------------------------------------------------------------------------------

@functools.cache
def tiny_llvm_output(name: str) -> np.ndarray:
    """llvm's output (the first, if several) of the tiny zoo model ``name`` on its example inputs:
    compiled once per process for the tests that compare with it (read-only)."""
    model = get_model(name, **TINY[name])
    args = [tvm.runtime.tensor(v) for v in example_inputs(model).values()]
    mod = rx_onnx.from_onnx(model, keep_params_in_input=False)
    out = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())["main"](*args)
    out = (out if hasattr(out, "numpy") else out[0]).numpy()
    out.setflags(write=False)
    return out


def by_tiny_model(names) -> list:
    """``names`` as parameters, each in its model's xdist group: a worker runs all the tests of one
    model, and compiles its ``tiny_llvm_output`` once."""
    return [pytest.param(name, marks=pytest.mark.xdist_group(f"tiny-{name}")) for name in names]


def with_gate_outputs(model):
    """The model with its If conditions as extra outputs, for onnxruntime to report them."""
    conds = [n.input[0] for n in model.graph.node if n.op_type == "If"]
    copy = type(model)()
    copy.CopyFrom(model)
    copy.graph.output.extend(helper.make_tensor_value_info(c, TensorProto.BOOL, []) for c in conds)
    return copy


def scratch_in_ddr(monkeypatch) -> None:
    """Joined launches keep their scratch in DDR (``kernelgen.resident`` off): what joining alone
    changes, one launch fewer, is then exactly what a test sees."""
    import tvm_dsa.kernelgen.launch as launch

    monkeypatch.setattr(launch, "kept_in_gbs", lambda program, places, tensors=(): (program, None))

