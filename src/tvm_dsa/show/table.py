"""Tables for the terminal: rich when it is installed, aligned plain text otherwise."""

from __future__ import annotations

import sys


def render_table(rows: list[tuple], title: str | None = None, file=None) -> None:
    """Print ``rows`` (the first is the header) as a table; numbers right-aligned. Off a terminal
    the table is never wrapped or cut to fit a width."""
    file = file or sys.stdout
    header, body = [str(c) for c in rows[0]], [[str(c) for c in r] for r in rows[1:]]
    right = [any(r[i] for r in body) and all(_numeric(r[i]) or not r[i] for r in body) for i in range(len(header))]
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        _plain(header, body, right, title, file)
        return
    table = Table(title=title, title_justify="left")
    for name, r in zip(header, right):
        table.add_column(name, justify="right" if r else "left", no_wrap=True)
    for r in body:
        table.add_row(*r)
    tty = file.isatty() if hasattr(file, "isatty") else False
    Console(file=file, width=None if tty else 10_000, no_color=not tty, highlight=False).print(table)


def _plain(header, body, right, title, file) -> None:
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    if title:
        print(title, file=file)
    for r in [header, *body]:
        cells = [c.rjust(w) if a else c.ljust(w) for c, w, a in zip(r, widths, right)]
        print("  ".join(cells).rstrip(), file=file)


def _numeric(text: str) -> bool:
    t = text.replace(",", "").replace("%", "").replace("x", "").strip()
    try:
        float(t)
    except ValueError:
        return False
    return True
