"""What ``import tvm`` registers (the ``tvm.backends`` entry point): the chips' target tags, the
``dsa`` Relax pipeline, TVM's ``default`` pipeline made to choose it under a DSA target, the
packed functions a compiled model calls, and the BYOC patterns and codegen (``tvm_dsa.byoc``). Each is a
thin wrapper that loads the compiler or the simulator on first use, so that ``import tvm`` stays
cheap (``benchmarks/import_time.py``); ``unregister`` undoes what ``register`` did to TVM."""

from __future__ import annotations

import importlib

import tvm
import tvm_ffi
from tvm import relax

from tvm_dsa import packed, tags
from tvm_dsa.byoc import patterns

# Each packed function, and where it is implemented (loaded on its first call).
IMPLEMENTATIONS = {packed.BEGIN_RUN: ("tvm_dsa.execution", "begin_run"),
                   packed.END_RUN: ("tvm_dsa.execution", "end_run"),
                   packed.EXECUTE: ("tvm_dsa.execution", "execute"),
                   packed.EXECUTE_SHAPED: ("tvm_dsa.execution", "execute_shaped"),
                   packed.ARENA_PLAN: ("tvm_dsa.relax_passes.arena", "arena_plan"),
                   packed.BYOC_EXECUTE: ("tvm_dsa.byoc.codegen", "execute"),
                   packed.CODEGEN: ("tvm_dsa.byoc.codegen", "codegen")}


def register() -> None:
    """Register the tags, the pipelines, the packed functions and the BYOC patterns (idempotent)."""
    for name in tags.preset_names():
        tags.register(name)
    patterns.register()
    if "dsa" not in relax.pipeline.PIPELINE_MAP:
        relax.register_pipeline("dsa")(dsa_pipeline)
    default = relax.pipeline.PIPELINE_MAP["default"]
    if not isinstance(default, DefaultForTarget):
        relax.pipeline.PIPELINE_MAP["default"] = DefaultForTarget(default)
    for name in IMPLEMENTATIONS:
        if tvm_ffi.get_global_func(name, allow_missing=True) is None:
            tvm_ffi.register_global_func(name, _loader(name))


def unregister() -> None:
    """Undo ``register`` in TVM's pipeline map: its ``default`` pipeline as it was, no ``dsa``."""
    default = relax.pipeline.PIPELINE_MAP.get("default")
    if isinstance(default, DefaultForTarget):
        relax.pipeline.PIPELINE_MAP["default"] = default.tvm_default
    relax.pipeline.PIPELINE_MAP.pop("dsa", None)


def dsa_pipeline(*args, **kwargs) -> tvm.transform.Pass:
    """The ``dsa`` pipeline (``tvm_dsa.relax_pipeline.pipeline``), the compiler loaded on first use."""
    from tvm_dsa.relax_pipeline import pipeline

    return pipeline(*args, **kwargs)


class DefaultForTarget:
    """TVM's ``default`` pipeline, except under a DSA target (its keys hold ``dsa``), where it is
    the ``dsa`` pipeline. ``tvm.compile`` reads ``PIPELINE_MAP["default"]`` before it enters the
    target's scope, so the choice is made when the pass runs; other targets get TVM's own pass,
    unchanged."""

    def __init__(self, tvm_default):
        self.tvm_default = tvm_default

    def __call__(self, **kwargs) -> tvm.transform.Pass:
        fallback = self.tvm_default(**kwargs)

        @tvm.transform.module_pass(opt_level=0, name="dsa.DefaultForTarget")
        def choose(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
            target = tvm.target.Target.current(allow_none=True)
            chosen = dsa_pipeline() if target is not None and "dsa" in list(target.keys) else fallback
            return chosen(mod)

        return choose


def _loader(name: str):
    """A stand-in for the packed function ``name``: its first call loads the implementation,
    registers it in its place, and makes the call."""

    def call(*args):
        module, function = IMPLEMENTATIONS[name]
        implementation = getattr(importlib.import_module(module), function)
        tvm_ffi.register_global_func(name, implementation, override=True)
        return implementation(*args)

    return call
