"""What a command is doing, shown on a terminal from its first second: a spinner, the step under
way (``step``), a count where there is one, and the time elapsed, on stderr, erased when the
command ends. Nothing is shown when stderr is not a terminal (a pipe, a file, a test).

    with activity("tvm-dsa run"):
        step("compiling for dsa/stcp920")
        step("measuring candidates", done=8, total=120)

A new user's ``tvm-dsa tune`` showed a blank terminal for about 30 s before its progress bar, and
``--batch 100000`` printed nothing for minutes (issue 41).
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

_shown = None  # (rich Progress, its task) while a command shows its activity


@contextmanager
def activity(what: str):
    """Show ``what`` and the time elapsed while the block runs, if stderr is a terminal. Output to
    stdout goes above the spinner when stdout is that terminal too, and is left alone otherwise
    (``> out.json`` gets only the output)."""
    global _shown
    if not sys.stderr.isatty():
        yield
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                        TextColumn("{task.fields[count]}"), TimeElapsedColumn(), console=Console(stderr=True),
                        transient=True, redirect_stdout=sys.stdout.isatty())
    _shown = progress, progress.add_task(what, total=None, count="")
    try:
        with progress:
            yield
    finally:
        _shown = None


def step(text: str, done: int | None = None, total: int | None = None) -> None:
    """The step the command is at (with ``done`` of ``total`` where it counts), if it is shown."""
    if _shown is not None:
        progress, task = _shown
        progress.update(task, description=text, completed=done or 0, total=total,
                        count=f"{done}/{total}" if total else "")
