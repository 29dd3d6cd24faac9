"""Run state is per session and per run: reports never mix two runs, two threads, or a compilation
with an older run (``tvm_dsa.execution``)."""

import threading

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import relax as R

import tvm_dsa
from tvm_dsa.execution import KEEP, current

TARGET = "dsa/stcp920"


@tvm.script.ir_module
class Gated:
    """The first DSA kernel (the matmul) sits in the branch ``flag`` takes; the other branch has
    the second (an add)."""

    @R.function
    def main(x: R.Tensor((32, 64), "float32"), w: R.Tensor((64, 32), "float32"), flag: R.Tensor((), "bool")):
        if flag:
            y = R.matmul(x, w)
        else:
            y = R.add(R.strided_slice(x, [1], [0], [32]), R.const(1.0, "float32"))
        return y


@tvm.script.ir_module
class Matmul:
    @R.function
    def main(x: R.Tensor((64, 128), "float32"), w: R.Tensor((128, 64), "float32")):
        with R.dataflow():
            y = R.nn.relu(R.matmul(x, w))
            R.output(y)
        return y


@tvm.script.ir_module
class Add:
    @R.function
    def main(x: R.Tensor((16, 256), "float32")):
        with R.dataflow():
            y = R.add(x, R.const(2.0, "float32"))
            R.output(y)
        return y


@tvm.script.ir_module
class Reshape:
    @R.function
    def main(x: R.Tensor((16, 16), "float32")):
        with R.dataflow():
            y = R.reshape(x, (32, 8))
            R.output(y)
        return y


def _vm(mod):
    return relax.VirtualMachine(tvm.compile(mod, target=TARGET, relax_pipeline="dsa"), tvm.cpu())


def _args(rng, mod):
    return [tvm.runtime.tensor(rng.standard_normal([int(d) for d in p.ty.shape]).astype("float32"))
            for p in mod["main"].params]


def test_each_run_reports_itself_when_the_first_dsa_kernel_sits_in_a_branch_it_skips(rng):
    vm = _vm(Gated)
    x, w = (rng.standard_normal(s).astype("float32") for s in ((32, 64), (64, 32)))
    reports, kernels = [], []
    for flag in (True, False, False, False):
        out = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(w), tvm.runtime.tensor(np.array(flag)))
        expected = x @ w if flag else x[:, :32] + 1
        np.testing.assert_allclose(out.numpy(), expected, rtol=1e-2, atol=1e-2 * np.abs(expected).max())
        reports.append(tvm_dsa.last_report())
        kernels.append([k.name for k in tvm_dsa.last_kernel_runs()])
    assert kernels[0] == ["matmul"] and kernels[1] == kernels[2] == kernels[3] == ["strided_slice", "add"]
    alone = sum(k.report.cycles for k in tvm_dsa.last_kernel_runs())
    assert reports[1].cycles == reports[2].cycles == reports[3].cycles == alone


def test_a_run_without_a_dsa_kernel_has_no_report(rng):
    _vm(Add)["main"](*_args(rng, Add))
    assert tvm_dsa.last_report() is not None
    vm = _vm(Reshape)  # a pure reshape: a view on the host
    assert not tvm_dsa.pipeline_result().dsa
    x = _args(rng, Reshape)
    np.testing.assert_array_equal(vm["main"](*x).numpy(), x[0].numpy().reshape(32, 8))
    assert tvm_dsa.last_report() is None and tvm_dsa.last_kernel_runs() == []


def test_two_threads_running_two_executables_get_their_own_reports(rng):
    models = {"matmul": Matmul, "add": Add}
    vms = {name: _vm(mod) for name, mod in models.items()}
    args = {name: _args(rng, mod) for name, mod in models.items()}
    alone = {}
    for name, vm in vms.items():
        vm["main"](*args[name])
        alone[name] = (tvm_dsa.last_report().cycles, [k.name for k in tvm_dsa.last_kernel_runs()])
    assert alone["matmul"] != alone["add"]
    barrier, seen = threading.Barrier(2), {name: [] for name in models}

    def work(name):
        for _ in range(4):
            barrier.wait()
            vms[name]["main"](*args[name])
            seen[name].append((tvm_dsa.last_report().cycles, [k.name for k in tvm_dsa.last_kernel_runs()]))

    threads = [threading.Thread(target=work, args=(name,)) for name in models]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {name: [alone[name]] * 4 for name in models}


def test_a_session_block_sets_the_mode_and_keeps_its_runs_to_itself(rng):
    vm = _vm(Matmul)
    x = _args(rng, Matmul)
    out = vm["main"](*x).numpy()
    np.testing.assert_allclose(out, np.maximum(x[0].numpy() @ x[1].numpy(), 0), rtol=1e-2, atol=2e-2)
    functional = tvm_dsa.last_report().cycles
    with tvm_dsa.session(mode="timing") as s:
        vm["main"](*x)
        assert current() is s and tvm_dsa.last_report() == s.report()
    assert s.report().cycles == functional  # timing alone: the same cycles
    assert current() is not s and current().last_run() is not s.last_run()
    assert tvm_dsa.last_report().cycles == functional
    for _ in range(KEEP + 3):
        with s:
            vm["main"](*x)
    assert len(s.runs) == KEEP


def test_an_executable_finds_what_its_compilation_decided():
    ex_matmul = tvm.compile(Matmul, target=TARGET, relax_pipeline="dsa")
    ex_add = tvm.compile(Add, target=TARGET, relax_pipeline="dsa")
    assert tvm_dsa.pipeline_result() is tvm_dsa.pipeline_result(ex_add)
    matmul, add = tvm_dsa.pipeline_result(ex_matmul), tvm_dsa.pipeline_result(ex_add)
    assert matmul.dsa_macs == 64 * 128 * 64 and add.dsa_macs == 0 and add.dsa


def test_a_dsa_target_alone_compiles_for_the_dsa_and_other_targets_as_before(rng):
    x = _args(rng, Matmul)
    expected = np.maximum(x[0].numpy() @ x[1].numpy(), 0)
    ex = tvm.compile(Matmul, target=TARGET)  # no relax_pipeline: TVM's "default" under a DSA target
    assert tvm_dsa.pipeline_result(ex).dsa_macs == 64 * 128 * 64
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](*x).numpy()
    np.testing.assert_allclose(out, expected, rtol=1e-2, atol=2e-2)
    assert tvm_dsa.last_report().macs == 64 * 128 * 64
    llvm = tvm.compile(Matmul, target="llvm")
    assert tvm_dsa.pipeline_result(llvm) is None
    np.testing.assert_allclose(relax.VirtualMachine(llvm, tvm.cpu())["main"](*x).numpy(), expected, rtol=1e-4, atol=1e-4)
    assert tvm_dsa.last_report().macs == 64 * 128 * 64  # the llvm run called no DSA kernel: no run


def test_unregister_gives_tvm_its_default_pipeline_back(rng):
    from tvm_dsa import plugin

    x = _args(rng, Matmul)
    plugin.unregister()
    try:
        assert "dsa" not in relax.pipeline.PIPELINE_MAP
        assert not isinstance(relax.pipeline.PIPELINE_MAP["default"], plugin.DefaultForTarget)
        assert tvm_dsa.pipeline_result(tvm.compile(Matmul, target=TARGET)) is None  # built for the CPU alone
    finally:
        plugin.register()
    ex = tvm.compile(Matmul, target=TARGET)
    assert tvm_dsa.pipeline_result(ex).dsa_macs == 64 * 128 * 64
    relax.VirtualMachine(ex, tvm.cpu())["main"](*x)
    assert tvm_dsa.last_report().macs == 64 * 128 * 64


@pytest.mark.parametrize("first", ["tvm", "tvm_dsa"])
def test_import_tvm_registers_the_plugin_and_loads_neither_compiler_nor_simulator(first):
    """The entry point registers tags, pipelines and packed functions, whichever of the two is
    imported first; what they call loads on first use (``benchmarks/import_time.py`` times it)."""
    import json
    import subprocess
    import sys

    code = (f"import {first}\n"
            "import json, sys, tvm, tvm_ffi\n"
            "from tvm import relax\n"
            "print(json.dumps([sorted(m for m in sys.modules if m.startswith('tvm_dsa')),\n"
            "    'dsa' in relax.pipeline.PIPELINE_MAP, tvm.target.Target('dsa/stcp920').attrs['model'],\n"
            "    [tvm_ffi.get_global_func(n, allow_missing=True) is not None for n in\n"
            "     ('tvm_dsa.begin_run', 'tvm_dsa.execute', 'tvm_dsa.execute_shaped', 'tvm_dsa.arena_plan')]]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "Failed to autoload" not in done.stderr, done.stderr
    modules, has_pipeline, model, funcs = json.loads(done.stdout.strip().splitlines()[-1])
    assert has_pipeline and model == "stcp920" and all(funcs)
    assert set(modules) == {"tvm_dsa", "tvm_dsa.plugin", "tvm_dsa.packed", "tvm_dsa.tags", "tvm_dsa.byoc",
                            "tvm_dsa.byoc.patterns"}
