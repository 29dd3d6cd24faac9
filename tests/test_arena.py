"""The memory plan applied to the executable (relax_passes.arena.PlanArena, in-place outputs from
relax_passes.inplace, kernels moved into If branches by relax_passes.sink) and the measurement of
what a VM run allocates (vm_memory.measure)."""

import numpy as np
import pytest
import tvm
from helpers import aligned
from tvm import relax, tirx
from tvm.relax.backend import cpu_generic
from tvm.script import relax as R
from tvm.script import tirx as T

import tvm_dsa  # noqa: F401  (registers tvm_dsa.arena_plan)
from tvm_dsa.relax_passes.arena import ALIGN, PlanArena, arena_offsets
from tvm_dsa.relax_passes.inplace import elementwise_inputs, row_inputs
from tvm_dsa.memory_plan import Lifetime, lower_bound
from tvm_dsa.relax_passes.reorder import ApplyExecutionPlan, block_graph
from tvm_dsa.relax_passes.sink import SinkIntoBranches
from tvm_dsa.harness.vm_memory import measure


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
    assert lower_bound([Lifetime(size, a, b) for a, b in spans]) == 3 * size  # a, b and c live together at c
    # in place: c = b * a, d = relu(c) and e = d - x are elementwise and b, c, d die where they are
    # read, so b, c, d, e are one tensor alive from b to the end; with a, two tensors at most
    assert got.count == 1
    assert got.peak == lower_bound([Lifetime(size, *spans[0]), Lifetime(size, spans[1][0], spans[4][1])]) == 2 * size
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


# ---- in-place outputs: an elementwise kernel's output takes the bytes of an input that dies there


def _kernels(mod: tvm.IRModule, inputs=elementwise_inputs) -> dict:
    """name -> (output index, ``inputs``' input indices) of the legalized and fused PrimFuncs."""
    with tvm.target.Target("llvm"):
        lowered = tvm.transform.Sequential([relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
                                            relax.transform.FuseOps(), relax.transform.FuseTIR()])(mod)
    return {gv.name_hint: inputs(f) for gv, f in lowered.functions.items() if isinstance(f, tirx.PrimFunc)}


def test_elementwise_inputs_are_decided_from_the_tir():
    @tvm.script.ir_module
    class Kernels:
        @R.function
        def main(x: R.Tensor(("n", 8), "float32"), y: R.Tensor(("n", 8), "float32"), b: R.Tensor((8,), "float32"),
                 w: R.Tensor((8, 8), "float32"), sq: R.Tensor((8, 8), "float32")):
            with R.dataflow():
                r = R.nn.relu(x)                          # relu: x
                s = R.add(x, b)                           # add: x, not the broadcast b
                t = R.permute_dims(sq)                    # transpose: same shape, swapped indices
                u = R.nn.softmax(x)                       # a reduction over each row
                v = R.add(R.matmul(x, w), y)              # matmul + residual: y, not x (read by rows)
                f = R.nn.relu(R.multiply(x, y))           # multiply -> relu fused: x and y
                R.output(r, s, t, u, v, f)
            return (r, s, t, u, v, f)

    got = {name: (out, sorted(inputs)) for name, (out, inputs) in _kernels(Kernels).items()}
    assert got["relu"] == (1, [0])
    assert got["add"] == (2, [0])
    assert got["transpose"] == (1, [])
    assert got["softmax"] == (1, [])
    assert got["fused_matmul_add1"] == (3, [2])
    assert got["fused_multiply_relu"] == (2, [0, 1])


def test_row_inputs_are_decided_from_the_tir():
    @tvm.script.ir_module
    class Kernels:
        @R.function
        def main(x: R.Tensor(("n", 8), "float32"), y: R.Tensor(("n", 8), "float32"), b: R.Tensor((8,), "float32"),
                 w: R.Tensor((8, 8), "float32"), w5: R.Tensor((8, 5), "float32"), sq: R.Tensor((8, 8), "float32"),
                 b5: R.Tensor((5,), "float32"), v: R.Tensor(("n",), "float32")):
            with R.dataflow():
                u = R.nn.softmax(x)                       # softmax along rows: x
                c = R.nn.softmax(x, axis=0)               # along columns: no
                m = R.add(R.matmul(x, w), y)              # matmul + residual: x by rows, y by elements
                k = R.add(R.matmul(x, w5), b5)            # rows of another length: no
                t = R.permute_dims(sq)                    # row i of the output from column i: no
                g = R.nn.layer_norm(x, b, b, axes=[-1])   # a row's mean and variance: x
                e = R.nn.softmax(v)                       # rank 1 (one row): not decided
                R.output(u, c, m, k, t, g, e)
            return (u, c, m, k, t, g, e)

    got = {name: r and (r[0], sorted(r[1])) for name, r in _kernels(Kernels, row_inputs).items()}
    assert got["softmax"] == (1, [0])
    assert got["softmax1"] == (1, [])
    assert got["fused_matmul_add"] == (3, [0, 2])
    assert got["fused_matmul1_add1"] == (3, [])
    assert got["transpose"] == (1, [])
    assert got["layer_norm"] == (3, [0])
    assert got["softmax2"] is None


@tvm.script.ir_module
class Chains:
    @R.function
    def unary(x: R.Tensor(("n", 16), "float32")):
        with R.dataflow():
            a = R.exp(x)
            b = R.nn.relu(a)
            c = R.sigmoid(b)
            d = R.tanh(c)
            R.output(d)
        return d

    @R.function
    def read_later(x: R.Tensor(("n", 16), "float32")):
        with R.dataflow():
            a = R.exp(x)
            b = R.nn.relu(a)
            c = R.add(a, b)   # a is read after relu: b cannot take its bytes; c can take either's
            R.output(c)
        return c

    @R.function
    def transposed(x: R.Tensor(("n", "n"), "float32")):
        with R.dataflow():
            a = R.exp(x)
            b = R.permute_dims(a)   # not elementwise: b cannot take a's bytes, though a dies here
            c = R.nn.relu(b)
            R.output(c)
        return c

    @R.function
    def viewed(x: R.Tensor(("n", 16), "float32")):
        n = T.int64()
        with R.dataflow():
            a = R.exp(x)
            v = R.reshape(a, R.shape([16, n]))   # a view of a's bytes (no kernel), read after relu
            b = R.nn.relu(a)
            c = R.add(R.reshape(b, R.shape([16, n])), v)
            R.output(c)
        return c

    @R.function
    def returned(x: R.Tensor(("n", 16), "float32")):
        with R.dataflow():
            a = R.exp(x)
            b = R.nn.relu(a)   # a is returned: b cannot take its bytes
            R.output(a, b)
        return (a, b)


@pytest.mark.parametrize("n", [4, 9, 32])
def test_a_chain_of_elementwise_kernels_runs_in_one_tensor(n):
    """a = exp(x), b = relu(a), c = sigmoid(b), d = tanh(c): each kernel reads its input and
    writes its output, two tensors live during it; in place all four are one tensor."""
    vm, base = build(Chains, True), build(Chains, False)
    x = np.random.default_rng(n).standard_normal((n, 16)).astype(np.float32)
    ref = np.tanh(1 / (1 + np.exp(-np.maximum(np.exp(x), 0))))
    np.testing.assert_allclose(vm["unary"](tvm.runtime.tensor(x)).numpy(), ref, rtol=1e-5)
    size = aligned(64 * n)
    steps = 3  # alloc, kernel, alias binding per op
    spans = [(k * steps, (k + 1) * steps + 1) for k in range(3)] + [(3 * steps, 4 * steps - 1)]
    assert lower_bound([Lifetime(size, a, b) for a, b in spans]) == 2 * size  # each kernel's input and output
    assert measure(vm, "unary", tvm.runtime.tensor(x)).peak == size
    assert measure(base, "unary", tvm.runtime.tensor(x)).peak == 2 * size  # Relax's planner: two storages


@pytest.mark.parametrize("func,reference", [
    ("read_later", lambda x: [np.exp(x) + np.maximum(np.exp(x), 0)]),
    ("transposed", lambda x: [np.maximum(np.exp(x).T, 0)]),
    ("viewed", lambda x: [np.maximum(np.exp(x), 0).reshape(16, -1) + np.exp(x).reshape(16, -1)]),
    ("returned", lambda x: [np.exp(x), np.maximum(np.exp(x), 0)]),
])
@pytest.mark.parametrize("n", [16, 32])
def test_no_output_takes_the_bytes_of_a_value_still_needed(func, reference, n):
    """Two tensors of n x 16 floats live at the second kernel of each: the input, still needed
    (read later, read transposed, seen through a view, returned), and the output."""
    vm = build(Chains, True)
    x = np.random.default_rng(n).standard_normal((n, n if func == "transposed" else 16)).astype(np.float32)
    got = vm[func](tvm.runtime.tensor(x))
    for g, r in zip(got if func == "returned" else [got], reference(x)):
        np.testing.assert_allclose(g.numpy(), r, rtol=1e-5)
    assert measure(vm, func, tvm.runtime.tensor(x)).peak == 2 * aligned(x.nbytes)


@tvm.script.ir_module
class RowWise:
    @R.function
    def main(x: R.Tensor(("n", 64), "float32"), w: R.Tensor((64, 64), "float32"), b: R.Tensor((64,), "float32")):
        with R.dataflow():
            a = R.nn.relu(x)
            s = R.nn.softmax(a)
            y = R.add(R.matmul(s, w), b)
            R.output(y)
        return y


@pytest.mark.parametrize("n", [3, 16, 40])
def test_dsa_kernels_overwrite_the_inputs_they_read_by_rows(n):
    """relu -> softmax -> linear, rows of 64 floats. On the DSA the softmax and the linear layer
    each read a row whole before writing it (their programs keep rows whole: no tile splits one),
    so each writes over its input and the run needs one tensor. On the host they do not (TVM's
    loops get there only through a whole-tensor temporary): two."""
    rng = np.random.default_rng(n)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((n, 64), (64, 64), (64,)))
    e = np.exp(np.maximum(x, 0) - np.maximum(x, 0).max(axis=1, keepdims=True))
    ref = (e / e.sum(axis=1, keepdims=True)) @ w + b
    args = [tvm.runtime.tensor(a) for a in (x, w, b)]
    dsa = relax.VirtualMachine(tvm.compile(RowWise, target="dsa/stcp920", relax_pipeline="dsa"), tvm.cpu())
    np.testing.assert_allclose(dsa["main"](*args).numpy(), ref, rtol=1e-2, atol=1e-2 * np.abs(ref).max())
    assert measure(dsa, "main", *args).peak == aligned(x.nbytes)
    assert measure(build(RowWise, True), "main", *args).peak == 2 * aligned(x.nbytes)


@tvm.script.ir_module
class Branch:
    @R.function
    def main(x: R.Tensor(("n", 16), "float32"), flag: R.Tensor((), "bool")):
        a = R.exp(x)
        if flag:
            b = R.nn.relu(a)   # a dies here on this path; the other path returns it
            r = b
        else:
            r = a
        out = R.multiply(r, x)
        return out


@pytest.mark.parametrize("flag", [True, False])
@pytest.mark.parametrize("n", [4, 20])
def test_a_branch_overwrites_what_the_other_branch_returns(n, flag):
    """relu's output takes a's bytes on its path (a is read after the If only on the other one),
    and out takes r's: a, b and out are one tensor, whichever way the If goes."""
    vm = build(Branch, True)
    x = np.random.default_rng(n).standard_normal((n, 16)).astype(np.float32)
    a = np.exp(x)
    args = [tvm.runtime.tensor(x), tvm.runtime.tensor(np.array(flag))]
    np.testing.assert_allclose(vm["main"](*args).numpy(), (np.maximum(a, 0) if flag else a) * x, rtol=1e-5)
    assert measure(vm, "main", *args).peak == aligned(64 * n)


def test_kernels_only_one_branch_uses_move_into_it():
    @tvm.script.ir_module
    class Hoisted:  # as TVM's ONNX importer writes an If: the branch's work before it
        @R.function
        def main(x: R.Tensor(("n", 16), "float32"), flag: R.Tensor((), "bool")):
            with R.dataflow():
                a = R.exp(x)                  # used by b only: moves with it
                b = R.nn.relu(a)              # used in the then branch only: moves
                c = R.sigmoid(x)              # used in both branches: stays
                d = R.tanh(x)                 # used after the If: stays
                R.output(b, c, d)
            if flag:
                r = R.add(b, c)
            else:
                r = R.multiply(c, c)
            out = R.add(r, d)
            return out

    def names(seq):
        return [b.var.name for block in seq.blocks for b in block.bindings]

    with tvm.target.Target("llvm"):
        mod = relax.transform.LegalizeOps()(Hoisted)
    sunk = SinkIntoBranches(mod)
    relax.analysis.well_formed(sunk)  # raises if not
    body = sunk["main"].body
    if_binding = next(b for block in body.blocks for b in block.bindings if isinstance(b.value, relax.If))
    assert names(body) == ["c", "d", "r", "out"]
    assert names(if_binding.value.true_branch) == ["a", "b", "r_then"]
    assert names(if_binding.value.false_branch) == ["r_else"]
    x = np.random.default_rng(0).standard_normal((5, 16)).astype(np.float32)
    for flag in (True, False):
        args = [tvm.runtime.tensor(x), tvm.runtime.tensor(np.array(flag))]
        outs = [relax.VirtualMachine(tvm.compile(m, target="llvm"), tvm.cpu())["main"](*args).numpy() for m in (mod, sunk)]
        np.testing.assert_allclose(outs[1], outs[0], rtol=1e-6)
