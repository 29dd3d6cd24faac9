"""The layer graph SET schedules: per layer the work and the bytes one sample needs, and the
producer -> consumer edges (seed 002 §3.1: the DNN's layers ``L`` and its dependencies l -> l').

A layer is one ``call_tir`` of a fused module (``schedule.graph.OpGraph``): a conv or matmul with
its epilogue, a pooling, a softmax... Pure reshapes are views, not layers: their readers read what
the reshape reads. Quantities are per sample (the module is imported at batch 1) and in elements;
the evaluator turns them into bytes with the chip's storage width. Hand-built graphs for tests
use ``LayerGraph.build``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field

import tvm_ffi

from tvm_dsa.kernel.analysis import Unsupported, contraction, int_value
from tvm_dsa.tir_passes.tile import anchor_info
from tvm_dsa.kernel.macs import kernel_macs

CUT_TOKEN = re.compile(r"^[ST]\d+/\d+$")  # a cut's header in the tree text (tree.py)


class LayerGraphError(ValueError):
    """A layer graph that SET cannot schedule (the message names the layer or edge)."""


@dataclass(frozen=True)
class Contraction:
    """The contraction of an MME layer per sample: ``b`` independent ``m x n x k`` products
    (``b``: dims both operands index, e.g. depthwise channels or attention heads)."""

    b: int
    m: int
    n: int
    k: int


@dataclass(frozen=True)
class Layer:
    """One layer, per sample: MACs, vector-unit operations, and elements of activations read
    (``ifmap``), constants (``weights``, shared by all samples) and the output (``ofmap``).
    ``dram_in``: elements read from graph inputs; ``output``: its ofmap leaves the graph."""

    name: str
    macs: int
    vector_ops: int
    ifmap: int
    weights: int
    ofmap: int
    contraction: Contraction | None = None
    dram_in: int = 0
    output: bool = False
    node: int | None = None  # index of the OpGraph node it comes from
    window: tuple[int, int, int, int, int, int, int] | None = None  # a convolution's (C, H, W, OH, OW, kh, kw)

    def window_reads(self, blocks: int, samples: int) -> int:
        """Elements of the convolved input that ``blocks`` equal blocks of ``samples`` samples'
        output pixels (rows of M, sample-major then row-major) read together: each block its
        window, the rows (or, for a block within a row, the columns) its pixels' kernels cover, so
        overlapping windows count once per block: the input's size times the samples where a
        block holds whole samples; 0 where the layer has no window."""
        if self.window is None:
            return 0
        c, h, w, oh, ow, kh, kw = self.window
        pixels = -(-samples * oh * ow // blocks)  # per block
        if pixels >= oh * ow:
            return samples * c * h * w
        sh, sw = max(1, h // oh), max(1, w // ow)
        if pixels >= ow:
            rows = -(-pixels // ow)
            return blocks * c * min(h, (rows - 1) * sh + kh) * w
        return blocks * c * min(h, kh) * min(w, (pixels - 1) * sw + kw)


@dataclass(frozen=True)
class LayerGraph:
    """Layers in a topological order and the edges (producer, consumer) between them."""

    layers: tuple[Layer, ...]
    edges: tuple[tuple[int, int], ...]
    preds: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)
    succs: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)
    ancestors: tuple[int, ...] = field(init=False, repr=False, compare=False)  # bitsets

    def __post_init__(self) -> None:
        n = len(self.layers)
        if n == 0:
            raise LayerGraphError("the layer graph has no layers")
        names = [layer.name for layer in self.layers]
        for name in names:
            if not name or any(c.isspace() or c in "()" for c in name) or CUT_TOKEN.match(name):
                raise LayerGraphError(f"layer name {name!r} cannot be written in a tree's text "
                                      "(no spaces, no parentheses, not of the form T4/2 or S4/2)")
        dup = sorted({x for x in names if names.count(x) > 1})
        if dup:
            raise LayerGraphError(f"duplicate layer names {dup}")
        preds: list[list[int]] = [[] for _ in range(n)]
        succs: list[list[int]] = [[] for _ in range(n)]
        for u, v in self.edges:
            if not (0 <= u < n and 0 <= v < n):
                raise LayerGraphError(f"edge ({u}, {v}) names a layer outside 0..{n - 1}")
            if u >= v:
                raise LayerGraphError(f"edge {names[u]} -> {names[v]} goes backwards: layers must be "
                                      "listed in a topological order")
            preds[v].append(u)
            succs[u].append(v)
        anc = [0] * n
        for v in range(n):
            for u in preds[v]:
                anc[v] |= anc[u] | (1 << u)
        object.__setattr__(self, "preds", tuple(tuple(p) for p in preds))
        object.__setattr__(self, "succs", tuple(tuple(s) for s in succs))
        object.__setattr__(self, "ancestors", tuple(anc))

    def __len__(self) -> int:
        return len(self.layers)

    def index(self, name: str) -> int:
        for i, layer in enumerate(self.layers):
            if layer.name == name:
                return i
        raise LayerGraphError(f"no layer named {name!r}")

    def depends(self, u: int, v: int) -> bool:
        """True when ``v`` needs ``u``'s output, directly or through other layers."""
        return bool(self.ancestors[v] >> u & 1)

    @classmethod
    def build(cls, layers: list[Layer], edges: list[tuple[int, int]]) -> "LayerGraph":
        return cls(tuple(layers), tuple(sorted(set(edges))))

    @classmethod
    def from_relax(cls, mod, batch: int = 1, host: frozenset = frozenset()) -> "LayerGraph":
        """The layer graph of a fused module (after ``FuseOps`` + ``FuseTIR``) whose activations
        carry ``batch`` samples in their leading dimension; quantities are divided by it. Calls
        binding a name in ``host`` are not layers: their outputs come from DRAM like graph inputs."""
        from tvm import relax

        from tvm_dsa.schedule.graph import OpGraph

        graph = OpGraph.from_relax(mod)
        source: dict[str, list[str]] = {}  # tensor -> activation tensors it is a view of
        producer: dict[str, int] = {}  # tensor -> layer index
        layers: list[Layer] = []
        edges: set[tuple[int, int]] = set()

        def sources(t: str) -> list[str]:
            return source.get(t, [t])

        def per_sample(t: str) -> int:
            shape = graph.tensors[t].shape
            if not shape or shape[0] % batch:
                raise LayerGraphError(f"tensor {t} of shape {list(shape)} does not carry the batch "
                                      f"{batch} in its leading dimension")
            return math.prod(shape) // batch

        for node in graph.nodes:
            func = mod[node.func]
            acts = [s for t in node.inputs if not graph.tensors[t].constant for s in sources(t)]
            if node.name not in host and relax.analysis.has_reshape_pattern(func):
                source[node.output] = acts
                continue
            if node.name in host:
                continue
            consts = [t for t in node.inputs if graph.tensors[t].constant]
            index = len(layers)
            from_layers = [t for t in acts if t in producer]
            edges.update((producer[t], index) for t in from_layers)
            layers.append(Layer(
                name=node.name, macs=kernel_macs(func) // batch, vector_ops=_vector_ops(func) // batch,
                ifmap=sum(per_sample(t) for t in acts), weights=sum(math.prod(graph.tensors[t].shape) for t in consts),
                ofmap=per_sample(node.output), contraction=_contraction(func, batch),
                dram_in=sum(per_sample(t) for t in acts if t not in producer), node=node.index,
                window=_window([graph.tensors[t] for t in node.inputs], graph.tensors[node.output]),
            ))
            producer[node.output] = index
        outputs = {p for t in graph.outputs for s in sources(t) if (p := producer.get(s)) is not None}
        outputs |= {producer[s] for node in graph.nodes if node.name in host
                    for t in node.inputs for s in sources(t) if s in producer}
        layers = [lay if i not in outputs else dataclasses.replace(lay, output=True) for i, lay in enumerate(layers)]
        return cls.build(layers, sorted(edges))


def _contraction(func, batch: int = 1) -> Contraction | None:
    """(b, m, n, k) of one sample of the kernel's contraction from its anchor's loop roles (the
    first spatial loop runs over the ``batch`` samples); None without one."""

    try:
        info = anchor_info(func)
    except Unsupported:
        return None
    if info.kind.kind != "mme":
        return None
    dims = {"B": 1, "M": 1, "N": 1}
    spatial = list(info.spatial)
    if spatial[0] % batch:
        raise LayerGraphError(f"the contraction's first loop ({spatial[0]}) does not run over the batch {batch}")
    spatial[0] //= batch
    for extent, role in zip(spatial, info.roles):
        dims[role] *= extent
    return Contraction(dims["B"], dims["M"], dims["N"], math.prod(info.reduction))


def _window(inputs: list, output) -> tuple[int, int, int, int, int, int, int] | None:
    """(C, H, W, OH, OW, kh, kw) of a 2-D convolution's per-sample input and output (NCHW, one
    4-D activation and a 4-D constant kernel of ``kh x kw``, its output channels first); None for
    other layers."""
    if len(output.shape) != 4:
        return None
    acts = [t for t in inputs if not t.constant and len(t.shape) == 4]
    kernels = [t for t in inputs if t.constant and len(t.shape) == 4 and t.shape[0] == output.shape[1]]
    if len(acts) != 1 or len(kernels) != 1:
        return None
    _, c, h, w = acts[0].shape
    oh, ow = output.shape[2:]
    kh, kw = kernels[0].shape[2:]
    if not (0 < oh <= h and 0 < ow <= w) or (kh, kw) == (1, 1) and (oh, ow) == (h, w):
        return None
    return (c, h, w, oh, ow, kh, kw)


def _vector_ops(func) -> int:
    """Iterations of the kernel's blocks that are not a contraction (elementwise, reductions,
    copies): what the vector units do."""
    from tvm.s_tir import SBlockRealize


    total = 0

    def visit(realize):
        nonlocal total
        block = realize.block
        if not block.iter_vars or contraction(block) is not None:
            return
        total += math.prod(int_value(it.dom.extent) or 1 for it in block.iter_vars)

    tvm_ffi.structural_walk(func.body, [(SBlockRealize, visit)])
    return total
