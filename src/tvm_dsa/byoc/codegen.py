"""The ``relax.ext.dsa`` codegen: each function ``FuseOpsByPattern`` marked for ``dsa`` is compiled
as the ``dsa`` pipeline compiles a model (``relax_passes.fusion.fuse``, then the layerwise
``kernelgen.offload``): one DSA program when its ops make one kernel there, else a host build of
it (llvm), with the reason recorded (``Composite.host``).

RunCodegen calls a function by its global symbol, which ``FuseOpsByPattern`` derives from the ops
(two models can have the same names). So the codegen returns one llvm module per call, imported
by the executable: for each symbol a stub that passes its tensors to
``tvm_dsa.byoc_execute(<composite id>, ...)``; the composite (program, constants, host build)
is kept in this process under that id."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from tvm_dsa import hardware
from tvm_dsa.execution import Registry, program_of, run_kernel
from tvm_dsa.kernelgen.offload import OffloadResult, offload
from tvm_dsa.packed import BYOC_EXECUTE, EXECUTE
from tvm_dsa.relax_passes.fusion import fuse
from tvm_dsa.tuning import tuned_kernels

KEEP = 4096  # composites the process keeps (an executable's calls of a forgotten one fail, naming it)


@dataclass(frozen=True)
class Composite:
    """One offloaded function: its DSA program and the call's info, and where each program input
    comes from (a parameter's index or a constant); or, where it is no single DSA kernel, its host
    build and why."""

    symbol: str
    result: OffloadResult
    program: str | None = None
    info: dict | None = None
    inputs: tuple = ()  # int: the function's parameter; np.ndarray: a constant
    host: str | None = None  # why it runs on the host
    vm: object = None

    def __call__(self, *tensors) -> None:
        args, out = [t.numpy() for t in tensors[:-1]], tensors[-1]
        if self.host is None:
            inputs = [args[i] if isinstance(i, int) else i for i in self.inputs]
            outputs = run_kernel(program_of(self.program, self.info), self.info, inputs)
        else:
            outputs = [self.vm["main"](*(tvm.runtime.tensor(a) for a in args)).numpy()]
        for value in outputs:
            out.copyfrom(np.ascontiguousarray(value, dtype=out.dtype))


COMPOSITES = Registry("dsa-composite", KEEP)  # the compiled functions the stubs name


def composites_of(executable) -> list[Composite]:
    """The composites an executable built by ``RunCodegen`` calls (found by their ids in its
    stub modules), in the order of its stubs: what runs on the DSA, what on the host and why."""
    found, modules = [], [executable.mod]
    while modules:
        module = modules.pop(0)
        modules += list(module.imports)
        if module.kind == "llvm":
            found += COMPOSITES.ids_in(module.inspect_source("ll"))
    return [_composite_of(key) for key in dict.fromkeys(found)]


def execute(key, *tensors) -> None:
    """``tvm_dsa.byoc_execute``: run composite ``key`` on the call's tensors (inputs, then output)."""
    _composite_of(str(key))(*tensors)


def _composite_of(key: str) -> Composite:
    found = COMPOSITES.get(key)
    if found is None:
        raise RuntimeError(f"DSA composite {key} is not in this process (compiled in another one, or one of "
                           f"more than {KEEP} since): compile the model again")
    return found


def codegen(functions, options, constant_names) -> list:
    """``relax.ext.dsa``: a stub module for the functions (see the module's docstring). ``options``
    may name the chip (``RunCodegen({"dsa": {"chip": "stcp920"}})``); by default the current
    target's, else the default preset."""
    chip = _chip(options)
    stubs = {}
    for func in functions:
        symbol = str(func.attrs["global_symbol"])
        key = COMPOSITES.add(compile_composite(symbol, _composite(func), chip))
        stubs[symbol] = _stub(symbol, key, func)
    return [tvm.tirx.build(tvm.IRModule(stubs), target="llvm")] if stubs else []


def compile_composite(symbol: str, func: relax.Function, chip: hardware.Hardware) -> Composite:
    """``func`` compiled by the ``dsa`` pipeline's fusion and layerwise offload, with the tuning
    records the pipeline would use (the database in scope, else the chip's shipped ones)."""
    mod = tvm.IRModule({"main": func})
    with tvm.target.Target("llvm"):
        offloaded, result = offload(fuse(mod), chip, "layerwise", tuned=tuned_kernels(None, chip))
    call, why = _one_dsa_call(offloaded["main"], result)
    if call is None:
        return Composite(symbol, result, host=why,
                         vm=relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu()))
    params = list(offloaded["main"].params)
    inputs = tuple(params.index(a) if isinstance(a, relax.Var) else a.value.numpy() for a in call.args[1].fields[2:])
    return Composite(symbol, result, str(call.args[1].fields[0].value), _info(call), inputs)


def _one_dsa_call(main: relax.Function, result: OffloadResult):
    """The call of ``tvm_dsa.execute`` that is all of ``main`` (whose args are parameters and
    constants), or None and why not."""
    calls = [b.value for block in main.body.blocks for b in block.bindings]
    dsa = [c for c in calls if isinstance(c, relax.Call) and isinstance(c.args[0], relax.ExternFunc)
           and str(c.args[0].global_symbol) == EXECUTE]
    if result.host:
        name, reason = next(iter(result.host.items()))
        return None, f"{name}: {reason}"
    if len(calls) != 1 or len(dsa) != 1:
        return None, f"its ops make {len(dsa)} DSA kernels and {len(calls) - len(dsa)} other bindings, not one kernel"
    if not all(isinstance(a, (relax.Var, tvm.ir.expr.Constant)) for a in dsa[0].args[1].fields[2:]):
        return None, "a kernel input is computed on the host"
    return dsa[0], None


def _info(call: relax.Call) -> dict:
    return json.loads(str(call.args[1].fields[1].value))


def _composite(func: relax.Function) -> relax.Function:
    """The composite function the ``Codegen`` function calls (with its own parameters, in the same
    order), as a plain function."""
    inner = next(b.value for block in func.body.blocks for b in block.bindings if isinstance(b.value, relax.Function))
    return relax.Function(inner.params, inner.body, inner.ret_ty, inner.is_pure).with_attr("global_symbol", "main")


def _chip(options) -> hardware.Hardware:
    if options and "chip" in options:
        return hardware.get(str(options["chip"]))
    target = tvm.target.Target.current(allow_none=True)
    return hardware.from_target(target) if target is not None and "dsa" in list(target.keys) else hardware.get(hardware.DEFAULT)


def _stub(symbol: str, key: str, func: relax.Function) -> tvm.tirx.PrimFunc:
    """A PrimFunc ``symbol(in..., out)`` that calls ``tvm_dsa.byoc_execute(key, in..., out)``."""
    types = [p.ty for p in func.params] + [func.ret_ty]
    if not all(isinstance(t, relax.TensorType) and t.shape is not None for t in types):
        raise ValueError(f"dsa codegen: {symbol} takes or gives a value that is not a tensor of known shape: {types}")
    params = ", ".join(f"arg{i}: T.Buffer({tuple(int(d) for d in t.shape.values)}, \"{t.dtype}\")"
                       for i, t in enumerate(types))
    args = ", ".join(f"arg{i}" for i in range(len(types)))
    return tvm.script.from_source(f"""
@T.prim_func
def stub({params}):
    T.func_attr({{"global_symbol": {symbol!r}}})
    T.call_packed({BYOC_EXECUTE!r}, {key!r}, {args})
""")
