"""GraphTurbo's tensor lifetimes (seed 000 Fig. 12 style): the buffers of a stitched kernel as bars
over its steps, at their place in the LB / GB, spilled ones marked.

    with capture_allocations() as kernels:      # every stitched kernel a compilation builds
        Compiled.build(mod, "dsa/stcp920", "graphturbo")
    bars = plot_lifetimes(kernels["sg0_lv"], "lifetimes.svg")

The data is ``kernelgen.stitch``'s own: the ``dsa.allocation`` attribute the ``AllocateBuffers``
pass adds to a sub-graph module (``read_allocation``: per buffer its owner, first and last step,
bytes, level, unit and offset). The offload keeps no annotated module, so ``capture_allocations``
records them with a pass instrument while a compilation runs. A buffer whose level is ``ddr`` was
spilled (§4.3: the longest-lived first); a promoted weight spilled with offset -1 is read where it
is and has no place of its own.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import tvm

from tvm_dsa.harness import instrumented
from tvm_dsa.kernelgen.stitch import Buffer, read_allocation
from tvm_dsa.show.plots import check_path

ALLOCATE_PASS = "dsa.AllocateBuffers"
COLOURS = {"t": "tab:green", "w": "tab:blue"}  # intermediates of an instance, promoted weights
LEVELS = ("lb", "gb", "ddr")


@dataclass(frozen=True)
class LifetimeBar:
    """One buffer as drawn: panel (level and unit), steps [first, last], bytes [offset, offset +
    nbytes) (offset -1: a weight read in place, drawn under the axis), spilled or not."""

    label: str  # "layer1.0.conv1 +2 1x64x8x8 @ instance 2" or "w: layer1.0.conv1.weight" (Relax's names without names)
    kind: str  # t | w
    panel: str  # "GB (cluster 0)", "LB (core 3)", "DDR (spilled)"
    first: int
    last: int
    offset: int
    nbytes: int
    spilled: bool


@contextmanager
def capture_allocations():
    """Yield a dict that fills, while the block compiles, with the buffers of every stitched
    kernel (sub-graph name -> ``read_allocation`` list), as ``AllocateBuffers`` decides them."""
    kernels: dict = {}

    @tvm.instrument.pass_instrument
    class _Capture:
        def run_after_pass(self, mod, info):
            if info.name == ALLOCATE_PASS:
                kernels[str(mod.attrs["dsa.subgraph"]["name"])] = read_allocation(mod)

    with instrumented(_Capture()):
        yield kernels


def lifetime_bars(buffers: list[Buffer], cluster: int = 0, names: dict | None = None) -> list[LifetimeBar]:
    """The bars of ``cluster``'s buffers, LB panels first, then the GB, then what was spilled; an
    intermediate labelled by its layer's name in ``names`` (Relax name -> the model's:
    ``Compiled.names``), a weight by its (``w: conv1.weight``), if there."""
    names = names or {}
    bars = []
    for b in buffers:
        if b.cluster != cluster:
            continue
        panel = {"lb": f"LB (core {b.unit})", "gb": f"GB (cluster {b.unit})", "ddr": "DDR (spilled)"}[b.level]
        label = f"{names.get(b.tensor, b.tensor)} @ instance {b.owner}" if b.kind == "t" else f"w: {names.get(b.tensor, b.tensor)}"
        bars.append(LifetimeBar(label, b.kind, panel, b.first, b.last, b.offset, b.nbytes, b.level == "ddr"))
    return sorted(bars, key=lambda x: (_panel_key(x.panel), x.first, x.offset))


def plot_lifetimes(buffers: list[Buffer], path, cluster: int = 0, title: str | None = None,
                   names: dict | None = None) -> list[LifetimeBar]:
    """One panel per memory the cluster's buffers live in (each core's LB, the GB, DDR for the
    spilled): x the kernel's steps (one instance's layer each), y the byte offset; a buffer is a
    rectangle from the step that writes it to its last read, green an intermediate, blue a
    promoted weight, hatched red-edged if spilled (labels: ``lifetime_bars``)."""
    bars = lifetime_bars(buffers, cluster, names)
    if not bars:
        raise ValueError(f"cluster {cluster} of this kernel has no buffers to draw")
    check_path(path)
    from matplotlib.patches import Patch, Rectangle

    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    panels = sorted({b.panel for b in bars}, key=_panel_key)
    fig = Figure(figsize=(10, 2.6 * len(panels)), layout="tight")
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    steps = max(b.last for b in bars) + 1
    for ax, panel in zip(axes, panels):
        mine = [b for b in bars if b.panel == panel]
        top = max((b.offset + b.nbytes for b in mine if b.offset >= 0), default=0)
        for b in mine:
            y = b.offset if b.offset >= 0 else -b.nbytes  # a weight read in place: under the axis
            ax.add_patch(Rectangle((b.first, y), b.last - b.first + 1, b.nbytes, facecolor=COLOURS[b.kind],
                                   edgecolor="red" if b.spilled else "black", linewidth=0.5, alpha=0.8,
                                   hatch="//" if b.spilled else None))
            if b.nbytes >= 0.06 * max(top, 1):
                ax.text(b.first + (b.last - b.first + 1) / 2, y + b.nbytes / 2, b.label, ha="center", va="center",
                        fontsize=5, clip_on=True)
        low = min([0] + [-b.nbytes for b in mine if b.offset < 0])
        ax.set_xlim(0, steps)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(low, max(top, 1))
        ax.set_ylabel(f"{panel}\nbytes")
    axes[-1].set_xlabel("step (an instance's layer)")
    axes[0].set_title(title or f"tensor lifetimes, cluster {cluster}", fontsize=9)
    axes[0].legend(handles=[Patch(facecolor=COLOURS["t"], label="intermediate"),
                            Patch(facecolor=COLOURS["w"], label="promoted weight"),
                            Patch(facecolor="white", edgecolor="red", hatch="//", label="spilled")],
                   fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.savefig(path)
    return bars


def _panel_key(panel: str):
    level, _, unit = panel.partition(" (")
    number = "".join(ch for ch in unit if ch.isdigit())
    return LEVELS.index(level.lower()), int(number) if number else 0
