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
    from tvm_dsa import relax_pipeline, session

    relax_pipeline.register()
    session.register()


_autoload()

from tvm_dsa.session import KernelRun, last_kernel_runs, last_report, last_trace, set_mode  # noqa: E402
from tvm_dsa.relax_pipeline import pipeline, pipeline_result  # noqa: E402


def tune(mod, target: str = "dsa/stcp920", trials: int = 64, work_dir="tune", **options):
    """Tune the DSA kernels of a Relax module with meta-schedule, measured on the simulator;
    returns a ``tvm_dsa.tuning.TuneResult`` (options and details: ``tvm_dsa.tuning.tune``)."""
    from tvm_dsa.tuning import tune as run  # meta-schedule: loaded on first use

    return run(mod, target, trials, work_dir, **options)


__all__ = ["Hardware", "HardwareError", "hardware", "KernelRun", "last_kernel_runs", "last_report", "last_trace", "set_mode", "pipeline", "pipeline_result", "tune"]
