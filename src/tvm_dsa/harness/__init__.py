"""Load a model, compile it for a target (a DSA preset or llvm), run it once: what ``tvm-dsa run``
and the benchmarks share.

    model = load_model("resnet18", tiny=True)
    mod, inputs = import_onnx(model), tvm_dsa.models.example_inputs(model)
    dsa, ref = Compiled.build(mod, "dsa/stcp920"), Compiled.build(mod, "llvm")
    run = dsa.run(inputs)              # outputs, wall time, the DSA report (and trace if asked)
    max_relative_error(run.outputs, ref.run(inputs).outputs)
    timing_run(dsa, model).report      # the report of a timing run: no inputs made where none are needed
"""

from __future__ import annotations

import functools
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx
import tvm
from tvm import relax

from tvm_dsa import execution, hardware
from tvm_dsa.models import MODELS, TINY, example_inputs, get_model, input_specs
from tvm_dsa.relax_pipeline import pipeline, pipeline_result
from tvm_dsa.kernelgen.offload import OffloadResult
from tvm_dsa.kernelgen.symbolic import OFFLOAD_SYMBOLIC_PASS
from tvm_dsa.relax_passes.fusion import fuse
from tvm_dsa.runtime import Report
from tvm_dsa.schedule.set.layers import LayerGraph, LayerGraphError
from tvm_dsa.frontend import from_onnx
from tvm_dsa.harness.labels import Label, joined, kernel_label, layer_funcs, layer_labels
from tvm_dsa.schedule.graph import OpGraph


class InputError(ValueError):
    """A model, file or target the user named cannot be used (a one-line message)."""


def load_model(spec: str, tiny: bool = False, batch: int | None = None) -> onnx.ModelProto:
    """A built-in model by name (``tiny``: its small configuration) or an ``.onnx`` file."""
    if spec in MODELS:
        kwargs = dict(TINY[spec]) if tiny else {}
        if batch is not None:
            kwargs["batch"] = batch
        return get_model(spec, **kwargs)
    path = Path(spec)
    if not path.is_file():
        if path.suffix == ".onnx" or "/" in spec:
            raise InputError(f"no such file: {spec}")
        raise InputError(f"unknown model {spec!r}: give an .onnx file or one of {', '.join(MODELS)}")
    if tiny or batch is not None:
        raise InputError("--tiny and --batch apply to built-in models only, not to an .onnx file")
    try:
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
    except Exception as err:  # protobuf decode errors, checker errors: all mean "not a valid model"
        raise InputError(f"{spec} is not a valid ONNX model: {one_line(err)}") from None
    return model


def import_onnx(model: onnx.ModelProto) -> tvm.IRModule:
    """The Relax module of an ONNX model, weights embedded as constants (TVM's importer with the
    converters of ``tvm_dsa.frontend``)."""

    try:
        return from_onnx(model, keep_params_in_input=False)
    except Exception as err:  # the frontend reports unsupported operators and attributes this way
        raise InputError(f"cannot import the ONNX model into TVM: {one_line(err)}") from None


def check_target(target: str, model: onnx.ModelProto | None = None, timing_only: bool = False) -> hardware.Hardware:
    """The chip of ``target``; an ``InputError`` for an unknown preset, or for a float (not
    quantized) model on an integer preset unless only timing is asked for."""
    try:
        hw = hardware.get(target)
    except hardware.HardwareError as err:
        raise InputError(str(err)) from None
    if model is not None and not hw.is_float and not timing_only and _is_float(model):
        raise InputError(
            f"{target} stores {hw.storage_dtype}, so a float model's numbers cannot be simulated there: "
            f"pass --quantize to run it quantized to int8, --timing-only for cycles only, or use dsa/{hw.name}-fp16")
    return hw


def _is_float(model: onnx.ModelProto) -> bool:
    """A model of float tensors that is not quantized (a QDQ model's int8 layers compute on an
    integer preset, docs/quantized.md)."""
    g = model.graph
    if is_quantized(model):
        return False
    types = [vi.type.tensor_type.elem_type for vi in [*g.input, *g.output]]
    types += [t.data_type for t in g.initializer]
    return any(np.issubdtype(onnx.helper.tensor_dtype_to_np_dtype(t), np.floating) for t in types if t)


def is_quantized(model: onnx.ModelProto) -> bool:
    """Whether ``model`` holds quantized layers (QDQ or QOperator nodes)."""
    return any(n.op_type in ("QuantizeLinear", "DequantizeLinear") or n.op_type.startswith("QLinear")
               or n.op_type.endswith("Integer") for n in model.graph.node)


def one_line(err: Exception) -> str:
    """The last line of an error's message: TVM puts its traceback first."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    return lines[-1] if lines else type(err).__name__


@dataclass
class Run:
    """One execution: its outputs, wall time and, on a DSA, the simulator's report and trace."""

    outputs: list[np.ndarray]
    seconds: float
    report: Report | None = None
    trace: list = field(default_factory=list)
    kernels: list = field(default_factory=list)  # execution.KernelRun per DSA kernel call


@dataclass
class Compiled:
    """A model compiled for ``target``: the executable, the compile time and (DSA) the offload
    decisions and the DSA calls a run makes where its inputs cannot change them
    (``execution.timing_calls``)."""

    executable: tvm.runtime.Executable
    target: str
    seconds: float
    offload: OffloadResult | None = None
    calls: tuple | None = None
    fused: tvm.IRModule | None = None  # the module the offload scheduled (``labels``)

    @classmethod
    def build(cls, mod: tvm.IRModule, target: str = "dsa/stcp920", schedule: str = "auto",
              options=None, database=None) -> "Compiled":
        """Compile with the ``dsa`` pipeline (``schedule``, stitched-kernel ``options``, tuning
        ``database``) for a DSA target, with TVM's default one for others."""
        is_dsa = target == "dsa" or target.startswith("dsa/")
        passes, calls, fused = "default", [], []
        if is_dsa:
            check_target(target)
            passes = tvm.transform.Sequential([pipeline(schedule, options=options, database=database),
                                               _record_timing_calls(calls)])
        start = time.perf_counter()
        with instrumented(_FirstInput((OFFLOAD_PASS, OFFLOAD_SYMBOLIC_PASS), fused)) if is_dsa else nullcontext():
            ex = tvm.compile(mod, target=target, relax_pipeline=passes)
        seconds = time.perf_counter() - start
        return cls(ex, target, seconds, pipeline_result() if is_dsa else None, calls[0] if calls else None,
                   fused[0] if fused else None)

    def labels(self, model: onnx.ModelProto) -> dict[str, Label]:
        """Each layer of this build (``model`` compiled), by its Relax name, as ``model`` names it
        (``harness.labels``); empty for llvm."""
        return layer_labels(model, self.fused) if self.fused is not None else {}

    def names(self, labels: dict[str, Label]) -> dict[str, str]:
        """``model_names`` of this build's layers, DSA kernels and PrimFuncs, its layers labelled
        ``labels`` (``Compiled.labels``)."""
        if self.fused is None:
            return {}
        return model_names(labels, self.fused, self.offload.layers, self.offload.sources)

    def run(self, inputs: dict[str, np.ndarray] | None, mode: str = "functional", trace: bool = False,
            check_hazards: bool = True) -> Run:
        """Run ``main`` once on ``inputs`` (in graph-input order). ``mode``, ``trace`` and
        ``check_hazards`` set how DSA kernels are simulated for this run, in a session of its own
        (``execution.Session``; ``timing``: outputs of DSA kernels are not computed). ``inputs``
        None: a timing run without the VM, which replays the recorded DSA calls (``calls``):
        no tensor is made, and the run has no outputs."""
        if inputs is not None:
            main = functools.partial(relax.VirtualMachine(self.executable, tvm.cpu())["main"],
                                     *[tvm.runtime.tensor(v) for v in inputs.values()])
        elif mode == "timing" and self.calls is not None:
            main = functools.partial(execution.replay, self.calls)
        else:
            raise ValueError("a run without inputs is a timing run of a model whose DSA calls its inputs "
                             "cannot change (Compiled.calls)")
        with execution.Session(mode, trace=trace, check_hazards=check_hazards) as s:
            start = time.perf_counter()
            value = main()
            seconds = time.perf_counter() - start
        out = [] if inputs is None else _numpy(value)
        if self.offload is None:
            return Run(out, seconds)
        return Run(out, seconds, s.report(), s.last_trace() if trace else [], s.kernel_runs())


def model_names(labels: dict[str, Label], fused: tvm.IRModule, kernels: dict | None = None,
                sources: dict | None = None) -> dict[str, str]:
    """What the model calls each name a run of ``fused`` (the model imported and fused, its
    layers labelled ``labels``: ``layer_labels``) shows: a layer's Relax name -> its label; a
    constant's -> its name (``Label.weights``: an initializer's, ``conv1.weight``); a PrimFunc's,
    or a DSA kernel's in ``kernels`` (name -> the layers it runs: ``OffloadResult.layers``) ->
    ``kernel_label`` of its layers. ``sources`` (``OffloadResult.sources``): the names of the
    graph the kernels were made of that differ in ``fused``, so that a fused depthwise and
    pointwise pair is named by both (``joined``), and a constant numbered again by its name."""
    runs = layer_funcs(fused)
    weights = {const: name for label in labels.values() for const, name in label.weights}
    labels = dict(labels)
    for name, was in (sources or {}).items():
        if all(w in labels for w in was):
            labels[name] = joined(name, [labels[w] for w in was]) if len(was) > 1 else replace(labels[was[0]], name=name)
        elif was[0] in weights:
            weights[name] = weights[was[0]]
    runs |= kernels or {}
    named = {name: kernel_label([labels[n] for n in layers if n in labels]) for name, layers in runs.items()}
    return named | weights | {name: str(label) for name, label in labels.items()}


OFFLOAD_PASS = "dsa.OffloadToDSA"


@tvm.instrument.pass_instrument
class _FirstInput:
    """A pass instrument keeping in ``found`` the module the first run of a pass of ``names`` receives."""

    def __init__(self, names: tuple[str, ...], found: list):
        self.names, self.found = names, found

    def run_before_pass(self, mod, info):
        if info.name in self.names and not self.found:
            self.found.append(mod)


@contextmanager
def instrumented(instrument):
    """A copy of the current ``PassContext`` with ``instrument`` added, for a block: what passes
    do inside a compilation, seen from outside."""
    current = tvm.transform.PassContext.current()
    with tvm.transform.PassContext(opt_level=current.opt_level, required_pass=current.required_pass,
                                   disabled_pass=current.disabled_pass, config=dict(current.config),
                                   instruments=[*current.instruments, instrument]):
        yield


def _record_timing_calls(found: list) -> tvm.transform.Pass:
    """A pass that changes nothing and appends the module's ``execution.timing_calls`` to ``found``:
    the last of the ``dsa`` pipeline, whose module is lowered for the VM."""

    @tvm.transform.module_pass(opt_level=0, name="dsa.RecordTimingCalls")
    def record(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        found.append(execution.timing_calls(mod))
        return mod

    return record


def label_trace(events: list[dict], names: dict[str, str]) -> list[dict]:
    """``events`` (a run's trace) with the model's name of each instruction's layer, else of its
    kernel, as the argument ``node`` (``Compiled.names``); ``layer`` and ``kernel`` stay Relax's."""
    out = []
    for e in events:
        args = e.get("args", {})
        node = names.get(args.get("layer")) or names.get(args.get("kernel"))
        out.append(e | {"args": args | {"node": node}} if node else e)
    return out


def check_inputs(model: onnx.ModelProto) -> None:
    """An ``InputError`` for a model whose inputs cannot be made (``models.input_specs``): before
    anything is compiled or allocated."""
    try:
        input_specs(model)
    except ValueError as err:
        raise InputError(str(err)) from None


def timing_run(compiled: Compiled, model: onnx.ModelProto, trace: bool = False, check_hazards: bool = True) -> Run:
    """A timing run of ``compiled`` (``model`` compiled) that allocates no data it does not need:
    the recorded DSA calls replayed where the inputs cannot change them (``Compiled.calls``; a
    static model), else ``main`` on the VM with ``model``'s example inputs."""
    inputs = None if compiled.calls is not None else example_inputs(model)
    return compiled.run(inputs, mode="timing", trace=trace, check_hazards=check_hazards)


def _numpy(value) -> list[np.ndarray]:
    if hasattr(value, "numpy"):
        return [value.numpy()]
    return [a for v in value for a in _numpy(v)]


def max_relative_error(outputs: list[np.ndarray], reference: list[np.ndarray]) -> float:
    """max |out - ref| / max |ref| over the outputs (each output scaled by its own reference)."""
    err = 0.0
    for out, ref in zip(outputs, reference, strict=True):
        ref = ref.astype(np.float64)
        scale = max(float(np.abs(ref).max(initial=0.0)), 1e-12)
        err = max(err, float(np.abs(out.astype(np.float64) - ref).max(initial=0.0)) / scale)
    return err


def dsa_mac_share(offload: OffloadResult) -> float | None:
    """Fraction of the model's MACs in DSA kernels (None for a model without MACs)."""
    total = offload.dsa_macs + offload.host_macs
    return offload.dsa_macs / total if total else None


def layer_graph(model: onnx.ModelProto) -> LayerGraph:
    """SET's layer graph of a batch-1 ONNX ``model``: imported and fused as the ``dsa`` pipeline
    fuses it before scheduling (``relax_passes.fusion.fuse``), quantities per sample."""
    return labelled_layer_graph(model)[0]


def labelled_layer_graph(model: onnx.ModelProto) -> tuple[LayerGraph, dict[str, Label]]:
    """``layer_graph(model)`` and its layers' labels, by name, as ``model`` names them
    (``harness.labels``)."""
    for vi in model.graph.input:
        dims = vi.type.tensor_type.shape.dim
        if dims and dims[0].dim_value not in (0, 1):
            raise LayerGraphError(f"input {vi.name!r} has batch {dims[0].dim_value}: build the model at "
                                  "batch 1 (SET's trees carry the batch)")
    fused = fused_module(import_onnx(model))
    with tvm.target.Target("llvm"):
        return LayerGraph.from_relax(fused), layer_labels(model, fused)


def fused_module(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` fused as the ``dsa`` pipeline fuses it before scheduling
    (``relax_passes.fusion.fuse``), for the llvm host unless a target is current."""
    with tvm.target.Target.current(allow_none=True) or tvm.target.Target("llvm"):
        return fuse(mod)
