"""The resource allocation tree (seed 002 §3.1): leaves are layers, cuts allocate resources.

A ``Leaf`` is one layer. A ``Cut`` is an S-cut (its children get disjoint tile groups and run in
parallel, pipelined by sub-batch) or a T-cut (its children share its tiles and run one after the
other for each sub-batch). A cut splits its batch ``b`` into ``sb`` sub-batches (``b % sb == 0``);
each child processes ``b / sb`` samples at a time. The root's batch is the workload's batch and its
tile group all tiles (Eq. 9-10); a leaf has ``sb = 1`` (Eq. 7), so only cuts carry ``sb``.

Nodes are immutable (operators rebuild the path they change); a node is addressed by its path, the
child indices from the root. Text form (``Tree.text``): ``T4/1( S4/2( conv1 conv2 ) fc )`` — each
cut is ``<kind><batch>/<sub-batches>`` and the batches are checked when parsed.
"""

from __future__ import annotations

from collections import Counter

import json
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Iterator

from tvm_dsa.schedule.set.layers import CUT_TOKEN, LayerGraph


class TreeError(ValueError):
    """An invalid resource allocation tree (the message names the node and the broken rule)."""


@dataclass(frozen=True)
class Leaf:
    layer: int

    @cached_property
    def layers(self) -> tuple[int, ...]:
        return (self.layer,)

    min_tiles = 1


@dataclass(frozen=True)
class Cut:
    kind: str  # "S" or "T"
    sb: int
    children: tuple

    @cached_property
    def layers(self) -> tuple[int, ...]:
        """Layers under the cut, in leaf order (Eq. 8: the union of its children's layers)."""
        return tuple(layer for c in self.children for layer in c.layers)

    @cached_property
    def min_tiles(self) -> int:
        """Fewest tiles that can run the cut: every leaf needs one, S-cut children need their own."""
        mins = [c.min_tiles for c in self.children]
        return sum(mins) if self.kind == "S" else max(mins)


Node = Leaf | Cut
Path = tuple[int, ...]


@dataclass(frozen=True)
class Tree:
    root: Cut
    batch: int

    def nodes(self) -> Iterator[tuple[Path, Node, int]]:
        """Every node in pre-order with its path and batch (samples per invocation)."""
        stack = [((), self.root, self.batch)]
        while stack:
            path, node, b = stack.pop()
            yield path, node, b
            if isinstance(node, Cut):
                for i in reversed(range(len(node.children))):
                    stack.append((path + (i,), node.children[i], b // node.sb))

    def node(self, path: Path) -> Node:
        node = self.root
        for i in path:
            node = node.children[i]
        return node

    def batch_of(self, path: Path) -> int:
        b, node = self.batch, self.root
        for i in path:
            b //= node.sb
            node = node.children[i]
        return b

    # -- text and JSON --------------------------------------------------------------------------
    def text(self, graph: LayerGraph) -> str:
        def fmt(node: Node, b: int) -> str:
            if isinstance(node, Leaf):
                return graph.layers[node.layer].name
            inner = " ".join(fmt(c, b // node.sb) for c in node.children)
            return f"{node.kind}{b}/{node.sb}( {inner} )"

        return fmt(self.root, self.batch)

    def listing(self, graph: LayerGraph, names: dict | None = None) -> str:
        """The tree one node a line, children indented under their cut (``T4/1``: a T-cut of batch 4
        in sub-batches of 1), each leaf ``l<index>`` (as the S-T graph labels it) and its layer's
        name in ``names`` (Relax name -> the model's) if there, else its Relax name."""
        names = names or {}
        lines = []

        def walk(node: Node, b: int, depth: int) -> None:
            if isinstance(node, Leaf):
                name = graph.layers[node.layer].name
                lines.append("  " * depth + f"l{node.layer}  {names.get(name, name)}")
                return
            lines.append("  " * depth + f"{node.kind}{b}/{node.sb}")
            for c in node.children:
                walk(c, b // node.sb, depth + 1)

        walk(self.root, self.batch, 0)
        return "\n".join(lines)

    @classmethod
    def parse(cls, text: str, graph: LayerGraph) -> "Tree":
        """Read ``Tree.text``'s form; the batches written on the cuts must agree with the root's."""
        tokens = re.findall(r"[()]|[^\s()]+", text)
        pos = 0

        def take() -> str:
            nonlocal pos
            if pos == len(tokens):
                raise TreeError("tree text ends early: a '(' is not closed")
            pos += 1
            return tokens[pos - 1]

        def node(expect_b: int | None) -> tuple[Node, int]:
            tok = take()
            if tok in "()":
                raise TreeError(f"tree text: unexpected {tok!r} at token {pos}")
            if not CUT_TOKEN.match(tok):
                return Leaf(graph.index(tok)), expect_b
            b, sb = (int(x) for x in tok[1:].split("/"))
            if expect_b is not None and b != expect_b:
                raise TreeError(f"tree text: cut {tok} has batch {b} but its parent gives it {expect_b}")
            if sb <= 0 or b % sb:
                raise TreeError(f"tree text: cut {tok}: batch {b} is not a multiple of its sub-batch count {sb}")
            if take() != "(":
                raise TreeError(f"tree text: cut {tok} must be followed by '('")
            children = []
            while pos < len(tokens) and tokens[pos] != ")":
                children.append(node(b // sb)[0])
            take()
            return Cut(tok[0], sb, tuple(children)), b

        root, batch = node(None)
        if pos != len(tokens):
            raise TreeError(f"tree text: unexpected {tokens[pos]!r} after the root")
        if not isinstance(root, Cut):
            raise TreeError("tree text: the root must be a cut")
        return cls(root, batch)

    def to_json(self, graph: LayerGraph) -> dict:
        def enc(node: Node) -> dict:
            if isinstance(node, Leaf):
                return {"layer": graph.layers[node.layer].name}
            return {"cut": node.kind, "sb": node.sb, "children": [enc(c) for c in node.children]}

        return {"format": "set-tree/1", "batch": self.batch, "root": enc(self.root)}

    @classmethod
    def from_json(cls, data: dict | str, graph: LayerGraph) -> "Tree":
        if isinstance(data, str):
            data = json.loads(data)
        if data.get("format") != "set-tree/1":
            raise TreeError(f"not a SET tree: format is {data.get('format')!r}, expected 'set-tree/1'")

        def dec(d: dict) -> Node:
            if "layer" in d:
                return Leaf(graph.index(d["layer"]))
            if d.get("cut") not in ("S", "T"):
                raise TreeError(f"tree JSON: node {d} is neither a leaf nor an S/T cut")
            return Cut(d["cut"], int(d["sb"]), tuple(dec(c) for c in d["children"]))

        root = dec(data["root"])
        if not isinstance(root, Cut):
            raise TreeError("tree JSON: the root must be a cut")
        return cls(root, int(data["batch"]))


def invocation_order(tree: Tree) -> list[tuple[int, int]]:
    """(layer, invocation) in the tree's order: every cut runs sub-batch k of all its children
    before sub-batch k+1 (a T-cut one child after the other on shared tiles, an S-cut's children
    on their own tiles, pipelined). Each tile's invocations appear in the order it runs them and
    every producer invocation before the consumer invocations that read it; the lowered program
    (``kernelgen.tree``) is emitted in this order too."""

    def order(node: Node, b: int) -> list[tuple[int, int, int]]:
        """(layer, invocation, samples per invocation) of ``node`` run over ``b`` samples: its
        first sub-batch's order, repeated with the invocations moved on by a sub-batch."""
        if isinstance(node, Leaf):
            return [(node.layer, 0, b)]
        bc = b // node.sb
        first = [x for c in node.children for x in order(c, bc)]
        return [(v, i + k * bc // lb, lb) for k in range(node.sb) for v, i, lb in first]

    return [(v, i) for v, i, _ in order(tree.root, tree.batch)]


def initial_tree(graph: LayerGraph, batch: int) -> Tree:
    """SA's starting point (§4.1): every leaf, in topological order, under a root T-cut."""
    return Tree(Cut("T", 1, tuple(Leaf(i) for i in range(len(graph)))), batch)


def validate(tree: Tree, graph: LayerGraph, tiles: int) -> None:
    """Raise ``TreeError`` unless ``tree`` is a valid resource allocation tree of ``graph`` on
    ``tiles`` tiles: each layer is one leaf; leaves are in a topological order (every dependency,
    original or derived, points left to right); every cut has a kind S/T and ``b % sb == 0``;
    non-root cuts have two children or more; every S-cut child can get a tile of its own."""
    if not isinstance(tree.batch, int) or tree.batch < 1:
        raise TreeError(f"batch must be a positive integer, got {tree.batch!r}")
    names = graph.layers
    for path, node, b in tree.nodes():
        if isinstance(node, Leaf):
            if not 0 <= node.layer < len(graph):
                raise TreeError(f"leaf at {list(path)} names layer {node.layer}, not in the graph")
            continue
        where = f"{node.kind}-cut at {list(path)}"
        if node.kind not in ("S", "T"):
            raise TreeError(f"cut at {list(path)} has kind {node.kind!r}; expected 'S' or 'T'")
        if not isinstance(node.sb, int) or node.sb < 1 or b % node.sb:
            raise TreeError(f"{where}: its batch {b} is not a multiple of its sub-batch count {node.sb}")
        if len(node.children) < (2 if path else 1):
            raise TreeError(f"{where} has {len(node.children)} child; a cut needs two or more")
    order = tree.root.layers
    seen = set(order)
    missing = [names[i].name for i in range(len(graph)) if i not in seen]
    dup = sorted({names[i].name for i, n in Counter(order).items() if n > 1}) if len(seen) < len(order) else []
    if missing or dup:
        raise TreeError(f"every layer must be exactly one leaf: missing {missing}, repeated {dup}")
    position = {layer: k for k, layer in enumerate(order)}
    for u, v in graph.edges:
        if position[u] > position[v]:
            raise TreeError(f"leaves are not in a topological order: {names[v].name} (leaf {position[v]}) "
                            f"needs {names[u].name} (leaf {position[u]}), which comes later")
    if tree.root.min_tiles > tiles:
        raise TreeError(f"the tree needs {tree.root.min_tiles} tiles (one per leaf side by side under "
                        f"S-cuts) but the chip has {tiles}")


@dataclass(frozen=True)
class Dependency:
    """``src`` -> ``dst``: some layer under ``dst`` needs a layer under ``src`` (Eq. 5-6).
    ``original`` for two leaves (a DNN edge), derived for nodes with a cut among them."""

    src: Path
    dst: Path
    original: bool


def dependencies(tree: Tree, graph: LayerGraph) -> list[Dependency]:
    """All dependencies between nodes with disjoint layers (neither contains the other)."""
    nodes = [(path, set(node.layers), isinstance(node, Leaf)) for path, node, _ in tree.nodes()]
    edges = set(graph.edges)
    out = []
    for p, lp, leaf_p in nodes:
        for q, lq, leaf_q in nodes:
            if p[:len(q)] == q or q[:len(p)] == p:
                continue
            if any((u, v) in edges for u in lp for v in lq):
                out.append(Dependency(p, q, leaf_p and leaf_q))
    return out


def sibling_dependencies(cut: Cut, graph: LayerGraph) -> list[tuple[int, int]]:
    """(i, j) for children i < j of ``cut`` where child j needs child i."""
    owner = {layer: i for i, c in enumerate(cut.children) for layer in c.layers}
    return sorted({(owner[u], owner[v]) for v in cut.layers for u in graph.preds[v]
                   if u in owner and owner[u] != owner[v]})
