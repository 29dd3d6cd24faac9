"""Plots of a design-space sweep (``tvm_dsa.dse``), written as PNG or SVG with matplotlib.

    plot_pareto(results, "energy_joules", "pareto.png", "resnet50, batch 8, around stcp920")
    plot_sensitivity(results, space.axes, "latency", "sensitivity.png", "resnet50, batch 8, around stcp920")

Each returns what it drew: the front's trials, or per axis the best and median objective per value.
"""

from __future__ import annotations

import statistics

from tvm_dsa.dse import Axis, TrialResult
from tvm_dsa.dse.results import pareto
from tvm_dsa.show.plots import check_path, figure

# Metrics a Pareto plot can put against latency: (label of the axis, scale to its unit).
AGAINST = {"energy_joules": ("energy (uJ)", 1e6), "area_mm2": ("area proxy (mm^2)", 1.0)}
# Each objective's name, the unit it is shown in and the scale to it from its own (``dse.OBJECTIVES``).
SHOWN = {"latency": ("latency", "us", 1e6), "energy": ("energy", "uJ", 1e6), "edp": ("EDP", "J s", 1.0),
         "area-latency": ("area proxy x latency", "mm^2 s", 1.0)}


def varied(axes: tuple[Axis, ...]) -> list[Axis]:
    """The axes with more than one value: those that tell trials apart."""
    return [a for a in axes if len(a.values) > 1]


def label(result: TrialResult, axes: tuple[Axis, ...]) -> str:
    """A trial's point in a few words: each varied field's last name and its value (sizes in KiB /
    MiB)."""
    return " ".join(f"{f.rsplit('.', 1)[-1]}={format_value(f, result.params[f])}" for a in varied(axes)
                    for f in a.fields)


def plot_pareto(results: list[TrialResult], against: str, axes: tuple[Axis, ...], path, title: str) -> list[TrialResult]:
    """Latency (us) against ``against`` (a key of ``AGAINST``) of every trial that ran, the Pareto
    front joined and each of its points labelled by its parameters."""
    ok = [r for r in results if r.status == "ok"]
    if not ok:
        raise ValueError("no trial ran: nothing to plot")
    check_path(path)
    name, scale = AGAINST[against]
    front = pareto(ok, "seconds", against)
    fig, ax = figure((9, 6))
    ax.scatter([r.metrics["seconds"] * 1e6 for r in ok], [r.metrics[against] * scale for r in ok], s=14,
               color="tab:gray", alpha=0.6, label=f"trials ({len(ok)})")
    ax.plot([r.metrics["seconds"] * 1e6 for r in front], [r.metrics[against] * scale for r in front], "o-",
            color="tab:red", drawstyle="steps-post", label=f"Pareto front ({len(front)})")
    for r in front:
        ax.annotate(label(r, axes), (r.metrics["seconds"] * 1e6, r.metrics[against] * scale),
                    textcoords="offset points", xytext=(5, 3), fontsize=6)
    ax.set_xlabel("latency (us)")
    ax.set_ylabel(name)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper right")
    fig.savefig(path)
    return front


def plot_sensitivity(results: list[TrialResult], axes: tuple[Axis, ...], objective: str, path, title: str) -> dict:
    """Per varied axis, the objective of every trial that ran against the axis's value, with the best
    and the median per value: how much the objective moves with each parameter. Returns axis name
    -> value label -> (best, median), in the objective's shown unit (``SHOWN``)."""
    ok = [r for r in results if r.status == "ok"]
    if not ok or not varied(axes):
        raise ValueError("no trial ran: nothing to plot" if not ok else "no parameter varies: no sensitivity")
    check_path(path)
    name, unit, scale = SHOWN[objective]
    fig, panels = figure((3.2 * len(varied(axes)), 3.6), ncols=len(varied(axes)), squeeze=False)
    drawn = {}
    for axis, ax in zip(varied(axes), panels[0]):
        ticks = [" ".join(format_value(f, v) for f, v in zip(axis.fields, values)) for values in axis.values]
        groups = [[r.objective(objective) * scale for r in ok
                   if tuple(r.params[f] for f in axis.fields) == tuple(values)] for values in axis.values]
        for i, g in enumerate(groups):
            ax.scatter([i] * len(g), g, s=10, color="tab:gray", alpha=0.5, label="trials" if i == 0 else None)
        shown = [i for i, g in enumerate(groups) if g]
        ax.plot(shown, [min(groups[i]) for i in shown], "o-", color="tab:red", label="best")
        ax.plot(shown, [statistics.median(groups[i]) for i in shown], "s--", color="tab:blue", label="median")
        ax.set_xticks(range(len(ticks)), ticks, rotation=30, fontsize=7)
        ax.set_xlabel(axis.name, fontsize=8)
        drawn[axis.name] = {ticks[i]: (min(groups[i]), statistics.median(groups[i])) for i in shown}
    panels[0][0].set_ylabel(f"{name} ({unit}), lower is better")
    panels[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.savefig(path)
    return drawn


def format_value(field: str, value) -> str:
    """A point's value of ``field`` as tables and labels show it: sizes in KiB or MiB."""
    if field.endswith("_bytes") and isinstance(value, int) and value >= 1024:
        return f"{value / 2**20:g}MiB" if value >= 2**20 else f"{value / 1024:g}KiB"
    return str(value)
