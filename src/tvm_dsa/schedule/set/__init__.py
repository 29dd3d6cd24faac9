"""SET: inter-layer scheduling on tiled accelerators with resource allocation trees (seed 002).

- ``layers``: the layer graph (work and bytes per sample, dependencies) from a fused module;
- ``tree``: the resource allocation tree (leaves, S-cuts, T-cuts), validity, text and JSON, the
  order its invocations run in;
- ``alloc``: NPT-proportional tile allocation for S-cuts and stripe-based tile ids;
- ``intra``: the intra-layer engine (partition, mapping, loop order per tile group);
- ``analysis``: a tree parsed into a schedule (groups, batches, dataflow, pinned weights) and the
  S-T graph's rectangles (``Slot``);
- ``evaluate``: the fast evaluator (latency, energy by component);
- ``ops`` and ``search``: the six tree operators and simulated annealing (SET, LS, LP).

docs/set.md describes the choices the seed leaves open.
"""

from tvm_dsa.schedule.set.analysis import Schedule, analyse
from tvm_dsa.schedule.set.evaluate import Evaluation, Evaluator
from tvm_dsa.schedule.set.layers import Contraction, Layer, LayerGraph, LayerGraphError
from tvm_dsa.schedule.set.tree import Cut, Leaf, Tree, TreeError, dependencies, initial_tree, validate

__all__ = [
    "Contraction", "Cut", "Evaluation", "Evaluator", "Layer", "LayerGraph", "LayerGraphError", "Leaf",
    "Schedule", "Tree", "TreeError", "analyse", "dependencies", "initial_tree", "validate",
]
