"""tvm-dsa: a simulated domain-specific accelerator as an Apache TVM compilation target.

    import tvm, tvm_dsa
    ex = tvm.compile(mod, target="dsa/stcp920")                # the dsa pipeline, for a DSA target
    out = tvm.relax.VirtualMachine(ex, tvm.cpu())["main"](x)   # computed by the simulated DSA
    print(tvm_dsa.last_report())                               # what it cost on the DSA

``import tvm`` loads this package through the ``tvm.backends`` entry point, which registers what
TVM needs to know (``tvm_dsa.plugin``); the compiler and the simulator load on first use.
"""

from __future__ import annotations

__version__ = "0.1.0"

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tvm_dsa.execution import KernelRun, Session

_LAZY = {"hardware": "tvm_dsa.hardware", "Hardware": "tvm_dsa.hardware", "HardwareError": "tvm_dsa.hardware",
         "KernelRun": "tvm_dsa.execution", "Session": "tvm_dsa.execution",
         "pipeline": "tvm_dsa.relax_pipeline", "pipeline_result": "tvm_dsa.relax_pipeline",
         "quantize": "tvm_dsa.harness.quantize", "load_calibration": "tvm_dsa.harness.quantize"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module = importlib.import_module(_LAZY[name])
        return module if module.__name__ == f"tvm_dsa.{name}" else getattr(module, name)
    raise AttributeError(f"module 'tvm_dsa' has no attribute {name!r}")


_LOADING = []


def _autoload() -> None:
    """Entry point for ``tvm.backends``: tags, pipelines and packed functions (``tvm_dsa.plugin``).
    Once: ``import tvm_dsa`` before ``import tvm`` comes back here from TVM's autoload while
    ``plugin`` imports TVM."""
    if _LOADING:
        return
    _LOADING.append(True)
    from tvm_dsa import plugin

    plugin.register()


_autoload()


def _current():
    from tvm_dsa.execution import current

    return current()


def session(mode: str = "functional", trace: bool | None = None, check_hazards: bool = True,
            strict: bool = False) -> Session:
    """A new session: ``with tvm_dsa.session(mode="timing") as s: ...; s.report()``. Within the
    block, the DSA kernels of the models run there run as it says (``Session.set_mode``) and report
    to it alone."""
    from tvm_dsa.execution import Session

    return Session(mode, trace, check_hazards, strict)


def set_mode(mode: str = "functional", trace: bool | None = None, check_hazards: bool = True,
             strict: bool = False) -> None:
    """How offloaded kernels run from now on in the current session (``Session.set_mode``)."""
    _current().set_mode(mode, trace, check_hazards, strict)


def last_report():
    """The report of the current session's last model run (all its DSA kernels); None before any
    run and after a run that called no DSA kernel."""
    return _current().report()


def last_kernel_runs() -> list[KernelRun]:
    """Each DSA kernel call of the current session's last model run, in call order."""
    return _current().kernel_runs()


def last_trace() -> list:
    """Trace events of the current session's last run (``set_mode(trace=True)`` records them)."""
    return _current().last_trace()


def tune(mod, target: str = "dsa/stcp920", trials: int = 64, work_dir="tune", **options):
    """Tune the DSA kernels of a Relax module with meta-schedule, measured on the simulator;
    returns a ``tvm_dsa.tuning.TuneResult`` (options and details: ``tvm_dsa.tuning.tune``)."""
    from tvm_dsa.tuning import tune as run  # meta-schedule: loaded on first use

    return run(mod, target, trials, work_dir, **options)


__all__ = ["Hardware", "HardwareError", "hardware", "KernelRun", "Session", "session", "last_kernel_runs", "last_report", "last_trace", "set_mode", "pipeline", "pipeline_result", "tune"]
