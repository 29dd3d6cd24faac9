"""tvm-dsa: a simulated domain-specific accelerator as an Apache TVM compilation target.

    import tvm, tvm_dsa
    ex = tvm.compile(mod, target="dsa/stcp920", relax_pipeline="dsa")
    out = tvm.relax.VirtualMachine(ex, tvm.cpu())["main"](x)   # computed by the simulated DSA
    print(tvm_dsa.last_report())                               # what it cost on the DSA

``import tvm`` loads this package through the ``tvm.backends`` entry point.
"""

from __future__ import annotations

__version__ = "0.1.0"

from tvm_dsa import hardware
from tvm_dsa.hardware import Hardware, HardwareError

_INITIALISED = False


def _autoload() -> None:
    """Entry point for ``tvm.backends``: register presets, target tags, pipeline and runtime."""
    global _INITIALISED
    if _INITIALISED:
        return
    _INITIALISED = True
    hardware.init()
    from tvm_dsa import execution, relax_pipeline

    relax_pipeline.register()
    execution.register()


_autoload()

from tvm_dsa.execution import KernelRun, Session, current  # noqa: E402
from tvm_dsa.relax_pipeline import pipeline, pipeline_result  # noqa: E402


def session(mode: str = "functional", trace: bool | None = None, check_hazards: bool = True,
            strict: bool = False) -> Session:
    """A new session: ``with tvm_dsa.session(mode="timing") as s: ...; s.report()``. Within the
    block, the DSA kernels of the models run there run as it says (``Session.set_mode``) and report
    to it alone."""
    return Session(mode, trace, check_hazards, strict)


def set_mode(mode: str = "functional", trace: bool | None = None, check_hazards: bool = True,
             strict: bool = False) -> None:
    """How offloaded kernels run from now on in the current session (``Session.set_mode``)."""
    current().set_mode(mode, trace, check_hazards, strict)


def last_report():
    """The report of the current session's last model run (all its DSA kernels); None before any
    run and after a run that called no DSA kernel."""
    return current().report()


def last_kernel_runs() -> list[KernelRun]:
    """Each DSA kernel call of the current session's last model run, in call order."""
    return current().kernel_runs()


def last_trace() -> list:
    """Trace events of the current session's last run (``set_mode(trace=True)`` records them)."""
    return current().last_trace()


def tune(mod, target: str = "dsa/stcp920", trials: int = 64, work_dir="tune", **options):
    """Tune the DSA kernels of a Relax module with meta-schedule, measured on the simulator;
    returns a ``tvm_dsa.tuning.TuneResult`` (options and details: ``tvm_dsa.tuning.tune``)."""
    from tvm_dsa.tuning import tune as run  # meta-schedule: loaded on first use

    return run(mod, target, trials, work_dir, **options)


__all__ = ["Hardware", "HardwareError", "hardware", "KernelRun", "Session", "session", "last_kernel_runs", "last_report", "last_trace", "set_mode", "pipeline", "pipeline_result", "tune"]
