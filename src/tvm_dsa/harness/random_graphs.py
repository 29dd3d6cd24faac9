"""Random graphs (``models.random_graphs``) checked on the DSA.

``onnxruntime_outputs`` is the reference, ``DsaRun.of(model, feeds,
schedule)`` compiles for the schedule's target (:data:`SCHEDULES`) and runs, ``DsaRun.error`` is
the relative error to compare with :data:`TOLERANCE`, ``fallbacks`` what did not run on the DSA
as scheduled (host kernels not there by design, :data:`ON_PURPOSE`; kernels run layer by layer).
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

import numpy as np
import onnx

from tvm_dsa.harness import Compiled, import_onnx, max_relative_error
from tvm_dsa.kernelgen.offload import OffloadResult


#: schedule -> the target it compiles for (``set`` on the fp16 variant of a tiled chip: its int8
#: presets simulate time only)
SCHEDULES = {"layerwise": "dsa/stcp920", "graphturbo": "dsa/stcp920", "set": "dsa/set-edge16-fp16"}

#: a DSA output is right when ``max |dsa - ref| <= TOLERANCE * max |ref|`` (each output; fp16 storage)
TOLERANCE = 2e-2


#: fallbacks by design: a pattern (``re.match``) of the reason -> why. Every op of a random graph is
#: one the DSA supports, so any other host kernel is one the compiler failed to offload, and any
#: other SET tree or stitched sub-graph run layer by layer one it failed to build.
ON_PURPOSE = {
    r"a pure reshape: a view on the host": "Reshape, Flatten: zero-copy views of their input, no data moves",
    r"layer by layer: layer \w+ keeps a tensor wide": "a tensor that may leave fp16's range (x * x, a mean of "
    "squares) is kept in float32, which stitched kernels and SET trees do not place: their layers run one kernel "
    "each, on the DSA (docs/numerics.md)",
}


def fallbacks(offload: OffloadResult) -> dict[str, str]:
    """What of ``offload`` did not run on the DSA as scheduled, but for :data:`ON_PURPOSE`: host
    kernels (PrimFunc name -> reason) and scheduled kernels (a SET tree, a stitched sub-graph)
    that did not build, their layers run one kernel each (kernel name -> ``"layer by layer: "`` +
    reason)."""
    found = {**offload.host, **{name: f"layer by layer: {why}" for name, why in offload.unstitched.items()}}
    return {name: why for name, why in found.items() if not any(re.match(p, why) for p in ON_PURPOSE)}


def onnxruntime_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """``model``'s outputs on ``feeds`` computed by onnxruntime (a test extra), the reference."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # no warnings about unused initializers (a Clip without min)
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


class DsaRun(NamedTuple):
    """``model`` compiled for the DSA with one schedule and run once: its outputs and what ran where."""

    outputs: list[np.ndarray]
    offload: OffloadResult

    @classmethod
    def of(cls, model: onnx.ModelProto, feeds: dict[str, np.ndarray], schedule: str) -> "DsaRun":
        """Compile ``model`` with ``schedule`` for its target in :data:`SCHEDULES`, run it on
        ``feeds`` (functional simulation)."""
        compiled = Compiled.build(import_onnx(model), SCHEDULES[schedule], schedule)
        return cls(compiled.run(feeds).outputs, compiled.offload)

    def error(self, reference: list[np.ndarray]) -> float:
        """max |out - ref| / max |ref| over the outputs (inf for a non-finite value or a wrong
        shape); right when at most :data:`TOLERANCE`."""
        if any(o.shape != r.shape or not np.isfinite(o).all() for o, r in zip(self.outputs, reference, strict=True)):
            return math.inf
        return max_relative_error(self.outputs, reference)
