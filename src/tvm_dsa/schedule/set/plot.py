"""The space-time (S-T) graph of a SET schedule (seed 002 Fig. 3(b), Fig. 7): tiles on the y axis,
time on the x axis, one rectangle per layer invocation — the layer on the tiles it uses, for its
samples, labelled like the seed's "l1[0,1]" (layer l1 on samples 0 to 1), the layers named in a
legend (by the model's names where the caller has them: ``harness.labels``).

``st_graph`` draws the rectangles of a timeline, the evaluator's (``Evaluator.evaluate(tree,
timeline=True).timeline``) or the simulator's (``TreeProgram.timeline()``), and writes PNG or SVG
by the file's extension. It uses matplotlib's object API (no pyplot, no display needed).
"""

from __future__ import annotations

from pathlib import Path

from tvm_dsa.schedule.set.analysis import Slot
from tvm_dsa.schedule.set.layers import LayerGraph

LEGEND_ROWS = 40  # layers per column of the legend


def st_graph(slots: tuple[Slot, ...], graph: LayerGraph, tiles: int, path: str | Path | None = None,
             title: str = "", clock_hz: float = 1e9, names: dict | None = None):
    """A matplotlib ``Figure`` of the S-T graph (``ax.patches[i]`` is ``slots[i]``'s rectangle:
    x from start to end in microseconds, y over its stripe ids) labelled ``l<layer index>[first,last
    sample]``, and a legend of the layers, each named as in ``names`` (Relax name -> the model's)
    where it has them. Saved to ``path`` when given."""
    try:
        from matplotlib.figure import Figure
        from matplotlib.patches import Rectangle
    except ImportError as err:  # a test extra, not a run-time dependency
        raise ImportError("the S-T graph needs matplotlib (pip install 'tvm-dsa[test]')") from err
    fig = Figure(figsize=(12, max(3.0, 0.35 * tiles)))
    ax = fig.add_subplot()
    colours = _palette(len(graph))
    shown = [f"l{i}  {(names or {}).get(layer.name, layer.name)}" for i, layer in enumerate(graph.layers)]
    scale = 1e6 / clock_hz
    end = max((s.end for s in slots), default=1.0) * scale
    for s in slots:
        x, w = s.start * scale, (s.end - s.start) * scale
        lo, hi = s.tiles
        ax.add_patch(Rectangle((x, lo), w, hi - lo, facecolor=colours[s.layer], edgecolor="black", linewidth=0.4))
        if w > 0.04 * end:
            first = s.invocation * s.batch
            ax.text(x + w / 2, (lo + hi) / 2, f"l{s.layer}\n[{first},{first + s.batch - 1}]",
                    ha="center", va="center", fontsize=6, clip_on=True)
    ax.set_xlim(0, end)
    ax.set_ylim(0, tiles)
    ax.set_xlabel("time (µs)")
    ax.set_ylabel("tile (stripe id)")
    ax.set_title(title)
    drawn = sorted({s.layer for s in slots})
    ax.legend(handles=[Rectangle((0, 0), 1, 1, facecolor=colours[i], edgecolor="black", linewidth=0.4,
                                 label=shown[i]) for i in drawn],
              title="layers", fontsize=5, title_fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              ncols=1 + len(drawn) // LEGEND_ROWS)
    if path is not None:
        fig.savefig(Path(path), dpi=150, bbox_inches="tight")
    return fig


def _palette(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab20"]
    return [cmap(i % 20) for i in range(n)]
