"""The memory plan applied to the executable (relax_passes.arena.PlanArena) and the measurement of
what a VM run allocates (vm_memory.measure)."""

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.backend import cpu_generic
from tvm.script import relax as R
from tvm.script import tirx as T

import tvm_dsa  # noqa: F401  (registers tvm_dsa.arena_plan)
from tvm_dsa.relax_passes.arena import ALIGN, PlanArena, arena_offsets
from tvm_dsa.relax_passes.memory_plan import Lifetime, lower_bound
from tvm_dsa.relax_passes.reorder import ApplyExecutionPlan, block_graph
from tvm_dsa.vm_memory import measure


def build(mod: tvm.IRModule, plan: bool, reorder: bool = False) -> relax.VirtualMachine:
    """TVM's CPU pipeline without fusion (one kernel per op), with PlanArena before
    StaticPlanBlockMemory when ``plan``, and the bindings in the execution plan's order when ``reorder``."""
    host = tvm.target.Target("llvm")
    passes = ([ApplyExecutionPlan] * reorder + [relax.transform.LegalizeOps()]
              + cpu_generic.pipeline.dataflow_lower_passes(host)
              + [PlanArena] * plan + cpu_generic.finalize_passes(host))
    with host:
        lowered = tvm.transform.Sequential(passes)(mod)
    ex = tvm.compile(lowered, target="llvm", relax_pipeline=tvm.transform.Sequential([]))
    return relax.VirtualMachine(ex, tvm.cpu())


def aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@tvm.script.ir_module
class Chain:
    @R.function
    def main(x: R.Tensor(("n", 4), "float32")):
        with R.dataflow():
            a = R.add(x, x)
            b = R.exp(a)
            c = R.multiply(b, a)
            d = R.nn.relu(c)
            e = R.subtract(d, x)
            R.output(e)
        return e


def chain_reference(x):
    a = x + x
    return np.maximum(np.exp(a) * a, 0) - x


@pytest.mark.parametrize("n", [4, 12, 36])  # 16n bytes: multiples of the 64-byte alignment
def test_symbolic_chain_runs_in_one_arena_of_the_planned_size(n):
    vm, base = build(Chain, True), build(Chain, False)
    x = np.random.default_rng(n).standard_normal((n, 4)).astype(np.float32)
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(), chain_reference(x), rtol=1e-5, atol=1e-6)
    got = measure(vm, "main", tvm.runtime.tensor(x))
    # a b c d e: each tensor n*16 bytes; a lives to c, the others to their reader; e is the result
    steps = 3  # the lowered function: alloc, kernel, alias binding per op
    size = aligned(16 * n)
    spans = [(0, 2 * steps + 2), (steps, 2 * steps + 2), (2 * steps, 3 * steps + 2), (3 * steps, 4 * steps + 2),
             (4 * steps, 5 * steps)]
    assert got.count == 1
    assert got.peak == lower_bound([Lifetime(size, a, b) for a, b in spans])
    assert got.peak == 3 * size  # a, b and c are live together at c
    # Relax's planner: one storage per token; a result cannot share with the a..d storages it reads
    assert measure(base, "main", tvm.runtime.tensor(x)).peak >= got.peak


@tvm.script.ir_module
class Gated:
    @R.function
    def main(x: R.Tensor(("n", 8), "float32"), flag: R.Tensor((), "bool")):
        a = R.add(x, x)
        if flag:
            b = R.exp(a)
            c = R.multiply(b, b)
            r1 = R.add(c, a)
            r = r1
        else:
            d = R.nn.relu(a)
            r2 = R.subtract(d, x)
            r = r2
        out = R.multiply(r, x)
        return out


@pytest.mark.parametrize("n,flag", [(3, True), (3, False), (17, True), (6, False)])
def test_if_branches_share_the_functions_arena(n, flag):
    vm = build(Gated, True)
    x = np.random.default_rng(n).standard_normal((n, 8)).astype(np.float32)
    a = x + x
    r = np.exp(a) ** 2 + a if flag else np.maximum(a, 0) - x
    args = [tvm.runtime.tensor(x), tvm.runtime.tensor(np.array(flag))]
    np.testing.assert_allclose(vm["main"](*args).numpy(), r * x, rtol=1e-5)
    got = measure(vm, "main", *args)
    assert got.count == 1  # branch tensors are carved from the one arena
    assert got.peak <= 4 * aligned(32 * n)  # a, b, c, r1 at the widest point, whichever branch runs


@tvm.script.ir_module
class Cut:
    @R.function
    def main(x: R.Tensor(("n",), "float32"), s: R.Shape(ndim=1)):
        m = T.int64()
        a = R.exp(x)
        b = R.add(a, a)
        _ = R.match_cast(s, R.Shape([m]))
        c = R.zeros(R.shape([m]), "float32")
        d = R.add(c, R.const(1.0))
        e = R.add(d, d)
        f = R.sum(b) + R.sum(e)
        return f


def test_a_symbol_defined_mid_function_starts_a_second_arena():
    vm = build(Cut, True)
    x = np.arange(4, dtype=np.float32)
    f = vm["main"](tvm.runtime.tensor(x), tvm.runtime.ShapeTuple([6]))
    np.testing.assert_allclose(f.numpy(), 2 * np.exp(x).sum() + 12, rtol=1e-5)
    got = measure(vm, "main", tvm.runtime.tensor(x), tvm.runtime.ShapeTuple([6]))
    # (a, b) before the cast, (c, d, e, the sums, the result) after it: m is known only after the cast
    assert got.count == 2


def test_arena_offsets_keep_live_tensors_apart():
    spans = ((0, 3), (1, 2), (2, 5), (4, 6), (0, 6))
    sizes = (100, 64, 1, 200, 7)
    total, *offsets = arena_offsets(spans, sizes)
    for i, (si, (a, b)) in enumerate(zip(sizes, spans)):
        assert offsets[i] % ALIGN == 0 and offsets[i] + aligned(si) <= total
        for j, (sj, (c, d)) in enumerate(zip(sizes, spans)):
            if i < j and a <= d and c <= b:
                assert offsets[i] + aligned(si) <= offsets[j] or offsets[j] + aligned(sj) <= offsets[i]


@tvm.script.ir_module
class TwoReductions:
    @R.function
    def main(x: R.Tensor(("n", 64), "float32")):
        with R.dataflow():
            a = R.exp(x)
            b = R.sin(x)
            ra = R.sum(a, axis=[1])
            rb = R.sum(b, axis=[1])
            out = R.add(ra, rb)
            R.output(out)
        return out


def test_execution_plan_runs_each_reduction_after_its_producer():
    """Program order a, b, ra, rb keeps both n x 64 temporaries live; the plan a, ra, b, rb one."""
    order = [b.var.name for b in ApplyExecutionPlan(TwoReductions)["main"].body.blocks[0].bindings]
    assert order == ["a", "ra", "b", "rb", "out"]
    n = 16
    x = np.random.default_rng(0).standard_normal((n, 64)).astype(np.float32)
    ref = np.exp(x).sum(1) + np.sin(x).sum(1)
    peaks = {}
    for reorder in (False, True):
        vm = build(TwoReductions, True, reorder)
        np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(), ref, rtol=1e-5)
        peaks[reorder] = measure(vm, "main", tvm.runtime.tensor(x)).peak
    big, small = 64 * n * 4, aligned(4 * n)
    assert peaks == {False: 2 * big + small, True: big + 2 * small}


def test_a_binding_follows_the_cast_that_defines_its_symbol():
    @tvm.script.ir_module
    class Casts:
        @R.function
        def main(x: R.Tensor(("n",), "float32"), s: R.Shape(ndim=1)):
            m = T.int64()
            with R.dataflow():
                a = R.exp(x)
                t = R.match_cast(s, R.Shape([m]))
                c = R.zeros(R.shape([m]), "float32")
                R.output(a, c, t)
            return (a, c)

    g = block_graph(Casts["main"].body.blocks[0])
    assert g.inputs[2] == (1,)  # zeros([m]) after the match_cast that defines m
