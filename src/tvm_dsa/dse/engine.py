"""Where trials run: in this process, or as Ray tasks on a local Ray or a cluster (docs/dse.md,
"Engine"). Both run ``trial.run_trial`` on the same specs and give the same results.

    with ray_engine(address=None, workers=2) as engine:     # a local Ray of 2 CPUs
        for result in engine.run(specs, on_start):           # in the order they finish
            ...
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from tvm_dsa.dse.trial import TrialResult, TrialSpec, run_trial
from tvm_dsa.harness import one_line


@dataclass(frozen=True)
class InProcess:
    """Trials one after another in this process (``why``: not on Ray)."""

    why: str = "Ray is not installed: pip install 'tvm-dsa[dse]' to run trials in parallel"

    def describe(self) -> str:
        return f"in this process ({self.why})"

    def run(self, specs: list[TrialSpec], running: Callable[[int], None]) -> Iterator[TrialResult]:
        for spec in specs:
            running(1)
            result = run_trial(spec)
            running(0)
            yield result


@dataclass(frozen=True)
class OnRay:
    """Trials as Ray tasks of one CPU each, at most ``slots`` at once (the cluster's CPUs)."""

    slots: int
    where: str

    def describe(self) -> str:
        return f"on Ray ({self.where}, {self.slots} CPUs)"

    def run(self, specs: list[TrialSpec], running: Callable[[int], None]) -> Iterator[TrialResult]:
        import ray

        task = ray.remote(num_cpus=1, max_retries=0)(run_trial)
        pending = {task.remote(s): s for s in specs}
        running(min(len(pending), self.slots))
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)  # a wait without one defers Ctrl-C
            if not ready:
                continue
            spec = pending.pop(ready[0])
            try:
                result = ray.get(ready[0])
            except ray.exceptions.RayError as err:  # the worker died (out of memory, a crash)
                result = TrialResult(spec.key, spec.model, spec.batch, spec.tiny, dict(spec.point),
                                     spec.chip()["name"], "lost", f"{type(err).__name__}: {one_line(err)}")
            running(min(len(pending), self.slots))
            yield result


def ray_available() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


AUTH_HINT = ("a cluster that `ray start --head` started with token authentication needs RAY_AUTH_MODE=token "
             "(and its token: ~/.ray/auth_token, RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH) in this process's environment")


def token_auth_needed(environ) -> bool:
    """Whether a driver connecting to a cluster by its address should turn Ray's token
    authentication on (``RAY_AUTH_MODE=token``): ``environ`` leaves the mode unset and has a token
    where Ray looks for one (``RAY_AUTH_TOKEN``, the file ``RAY_AUTH_TOKEN_PATH``, else
    ``~/.ray/auth_token``). ``ray start --head`` turns it on by itself where a token exists (Ray 2.60;
    ``ray.init()`` of a local Ray writes one), but ``ray.init(address=...)`` does not, and then fails
    to connect after a screen of ``InvalidAuthToken`` lines. A mode set either way is left alone."""
    if environ.get("RAY_AUTH_MODE") is not None:
        return False
    if environ.get("RAY_AUTH_TOKEN"):
        return True
    path = environ.get("RAY_AUTH_TOKEN_PATH")
    home = Path(environ["HOME"]) if environ.get("HOME") else Path.home()
    return Path(path).expanduser().is_file() if path else (home / ".ray" / "auth_token").is_file()


def _enable_token_auth() -> None:
    """``RAY_AUTH_MODE=token`` for this process and Ray's configuration, which Ray reads once at
    import (so the variable alone, set after ``import ray``, does nothing): as ``ray start`` does."""
    os.environ["RAY_AUTH_MODE"] = "token"
    try:
        from ray._raylet import Config
    except ImportError:  # another Ray: the variable is what it reads
        return
    Config.initialize("")


@contextmanager
def ray_engine(address: str | None, workers: int) -> Iterator[OnRay]:
    """An ``OnRay`` on the cluster at ``address`` (or ``RAY_ADDRESS``), else on a local Ray started
    here with ``workers`` CPUs; Ray is shut down (disconnected) on leaving."""
    import ray

    address = address or os.environ.get("RAY_ADDRESS")
    quiet = dict(log_to_driver=False, logging_level=logging.ERROR)  # the workers' TVM warnings stay in Ray's logs
    if address:
        if token_auth_needed(os.environ):
            _enable_token_auth()
        try:
            ray.init(address=address, **quiet)
        except (ConnectionError, ray.exceptions.AuthenticationError) as err:
            raise ConnectionError(f"cannot connect to the Ray cluster at {address} ({one_line(err)}); "
                                  f"{AUTH_HINT}") from None
    else:
        # "local": a Ray of its own, not one `ray start` left running (that one is --address's). Ray runs
        # its workers at niceness 15, below the driver: the trials are the sweep's work, and an
        # in-process sweep runs them at the sweep's priority too
        ray.init(address="local", num_cpus=workers, include_dashboard=False, _system_config={"worker_niceness": 0}, **quiet)
    try:
        yield OnRay(int(ray.cluster_resources().get("CPU", 1)), address or "local")
    finally:
        ray.shutdown()

