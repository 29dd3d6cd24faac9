"""Plots of simulated runs, written as PNG or SVG (by the file's suffix) with matplotlib.

    bars = plot_gantt(tvm_dsa.last_trace(), "run.png")         # one row per unit, one bar per instruction
    plot_roofline([roofline_point("resnet50", report)], hw, "roofline.svg")

Each function returns the data it drew, so what a plot shows can be checked without looking at it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tvm_dsa.hardware import Hardware
from tvm_dsa.runtime import Report

COLOURS = {"dma": "tab:blue", "pdma": "tab:purple", "cdma": "tab:cyan", "mme": "tab:red", "vme": "tab:green", "vec": "tab:olive"}
FORMATS = (".png", ".svg")


@dataclass(frozen=True)
class Bar:
    track: str  # "core 3 / mme"
    unit: str  # dma, cdma, mme, vme, vec
    start_us: float
    duration_us: float


@dataclass(frozen=True)
class RooflinePoint:
    label: str
    intensity: float  # MACs per byte DDR moved (bursts)
    macs_per_cycle: float  # achieved
    bound: float  # the roofline at that intensity: min(peak, intensity x DDR bytes/cycle)


def gantt_bars(events: list[dict]) -> list[Bar]:
    """The complete ("X") events of a trace as bars on tracks named by the trace's metadata."""
    process = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    thread = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
              if e.get("ph") == "M" and e["name"] == "thread_name"}
    return [Bar(f"{process.get(e['pid'], e['pid'])} / {thread.get((e['pid'], e['tid']), e['tid'])}",
                e["cat"], float(e["ts"]), float(e["dur"])) for e in events if e.get("ph") == "X"]


def plot_gantt(events: list[dict], path, title: str = "simulated run") -> list[Bar]:
    """Per-unit Gantt chart of a trace (``tvm_dsa.last_trace()``): a row per unit that ran
    something, a bar per instruction coloured by unit type."""
    bars = gantt_bars(events)
    if not bars:
        raise ValueError("the trace has no instruction events: record it with set_mode(..., trace=True)")
    check_path(path)
    tracks = sorted({b.track for b in bars}, key=_track_key)
    row = {t: i for i, t in enumerate(tracks)}
    fig, ax = figure((12, max(2.0, 0.25 * len(tracks) + 1)))
    for unit in COLOURS:
        mine = [b for b in bars if b.unit == unit]
        for t in {b.track for b in mine}:
            ax.broken_barh([(b.start_us, b.duration_us) for b in mine if b.track == t], (row[t] - 0.4, 0.8),
                           color=COLOURS[unit])
    ax.set_yticks(range(len(tracks)), tracks, fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("time (us)")
    ax.set_title(title)
    from matplotlib.patches import Rectangle

    used = [u for u in COLOURS if any(b.unit == u for b in bars)]
    ax.legend([Rectangle((0, 0), 1, 1, color=COLOURS[u]) for u in used], used, loc="upper right", fontsize=7)
    fig.savefig(path)
    return bars


def roofline_point(label: str, report: Report) -> RooflinePoint:
    """Where a run sits under the roofline of its chip (DDR bytes are the bursts DDR moved)."""
    hw = report.hardware
    if not report.cycles or not report.ddr_burst_bytes:
        raise ValueError(f"{label}: a run without cycles or DDR traffic has no place on a roofline")
    intensity = report.macs / report.ddr_burst_bytes
    return RooflinePoint(label, intensity, report.macs / report.cycles,
                         min(hw.peak_macs_per_cycle, intensity * hw.ddr_bytes_per_cycle))


def plot_roofline(points: list[RooflinePoint], hw: Hardware, path, title: str | None = None) -> list[RooflinePoint]:
    """The chip's roofline (peak MACs/cycle, DDR bandwidth) on log axes and each run as a point."""
    if not points:
        raise ValueError("no runs to place on the roofline")
    check_path(path)
    lo = min(min(p.intensity for p in points) / 4, hw.peak_macs_per_cycle / hw.ddr_bytes_per_cycle / 4)
    hi = max(max(p.intensity for p in points) * 4, hw.peak_macs_per_cycle / hw.ddr_bytes_per_cycle * 4)
    ridge = hw.peak_macs_per_cycle / hw.ddr_bytes_per_cycle
    fig, ax = figure((7, 5))
    ax.plot([lo, ridge, hi], [lo * hw.ddr_bytes_per_cycle, hw.peak_macs_per_cycle, hw.peak_macs_per_cycle],
            color="black", label=f"roofline ({hw.peak_macs_per_cycle:,} MAC/cycle, {hw.ddr_bytes_per_cycle:g} B/cycle)")
    for p in points:
        ax.scatter([p.intensity], [p.macs_per_cycle], zorder=3, label=p.label)
        ax.annotate(p.label, (p.intensity, p.macs_per_cycle), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("MACs per DDR byte")
    ax.set_ylabel("MACs per cycle")
    ax.set_title(title or f"roofline of {hw.name}")
    ax.legend(fontsize=7, loc="lower right")
    fig.savefig(path)
    return points


def _track_key(track: str):
    """Cores before clusters, by number, then the unit in trace order."""
    proc, _, unit = track.partition(" / ")
    kind, _, n = proc.partition(" ")
    return (kind != "core", int(n) if n.isdigit() else 0, unit)


def check_path(path) -> None:
    """A ``ValueError`` naming the problem if a plot cannot be written to ``path``."""
    if Path(path).suffix.lower() not in FORMATS:
        raise ValueError(f"cannot write a plot to {path}: use a .png or .svg file")
    if not Path(path).resolve().parent.is_dir():
        raise ValueError(f"cannot write a plot to {path}: its directory does not exist")


def figure(size, **grid):
    """A figure and its axes (``grid``: ``Figure.subplots``' arguments, e.g. ``ncols``), without
    pyplot's global state (no display backend needed)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, layout="tight")
    return fig, fig.subplots(**grid)
