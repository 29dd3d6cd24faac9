"""The six tree operators of SET's simulated annealing (seed 002 §4.2.1, Fig. 9).

Each takes a valid tree and a ``random.Random`` and returns a valid tree, or None when it has
nothing to change (no candidate). ``Space`` restricts the trees a search may visit (LS and LP are
SET's search restricted to depth-one T-cuts / S-cuts); ``mutate`` draws operators until one gives a
valid tree of the space.

1. ``swap``: two adjacent leaves (in leaf order) with no direct or transitive dependency trade places.
2. ``move``: a leaf moves into another cut whose parent is its parent or grandparent, at a random
   position that keeps the leaves in a topological order.
3. ``group``: consecutive children of a cut (two or more; all of them only for the root) become a
   new cut of random kind and sub-batch count.
4. ``ungroup``: a non-root cut is deleted, its children take its place in its parent.
5. ``more_sub_batches`` / 6. ``fewer_sub_batches``: a cut's sub-batch count grows / shrinks to
   another divisor of its batch (its children's batches shrink / grow in proportion).

A cut left with one child (after ``move``) is replaced by that child: a one-child cut is not a
valid non-root node, and the child's batch can only grow, which keeps its subtree valid.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

from tvm_dsa.schedule.set.layers import LayerGraph
from tvm_dsa.schedule.set.tree import Cut, Leaf, Node, Path, Tree, TreeError, validate


@dataclass(frozen=True)
class Space:
    """Trees a search may visit: ``depth_one`` forces the kind of the root's child cuts,
    ``max_depth`` bounds the depth of every node (the root is at depth 0)."""

    name: str
    depth_one: str | None = None
    max_depth: int | None = None

    def allows(self, tree: Tree) -> bool:
        for path, node, _ in tree.nodes():
            if self.max_depth is not None and len(path) > self.max_depth:
                return False
            if self.depth_one and len(path) == 1 and isinstance(node, Cut) and node.kind != self.depth_one:
                return False
        return True

    @property
    def kinds(self) -> tuple[str, ...]:
        """Kinds a new cut may take."""
        return (self.depth_one,) if self.depth_one else ("S", "T")


SET = Space("set")
LS = Space("ls", depth_one="T", max_depth=2)
LP = Space("lp", depth_one="S", max_depth=2)
SPACES = {s.name: s for s in (SET, LS, LP)}


# -- helpers on immutable trees ------------------------------------------------------------------
def replace(node: Node, path: Path, new: Node | tuple) -> Node:
    """``node`` with the subtree at ``path`` replaced by ``new`` (a node, or a tuple of nodes
    spliced into the parent in its place)."""
    if not path:
        return new
    i, rest = path[0], path[1:]
    children = node.children
    if rest:
        return Cut(node.kind, node.sb, children[:i] + (replace(children[i], rest, new),) + children[i + 1:])
    inserted = new if isinstance(new, tuple) else (new,)
    return Cut(node.kind, node.sb, children[:i] + inserted + children[i + 1:])


def cuts(tree: Tree) -> list[tuple[Path, Cut, int]]:
    return [(p, n, b) for p, n, b in tree.nodes() if isinstance(n, Cut)]


def leaf_paths(tree: Tree) -> list[Path]:
    """Paths of the leaves in leaf order."""
    return [p for p, n, _ in tree.nodes() if isinstance(n, Leaf)]


def fits(node: Node, b: int) -> bool:
    """True when every cut of ``node``'s subtree divides its batch if ``node`` gets batch ``b``."""
    if isinstance(node, Leaf):
        return True
    return b % node.sb == 0 and all(fits(c, b // node.sb) for c in node.children)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def find(node: Node, target: Node, path: Path = ()) -> Path | None:
    """Path of the object ``target`` (by identity) in ``node``'s subtree."""
    if node is target:
        return path
    if isinstance(node, Cut):
        for i, c in enumerate(node.children):
            hit = find(c, target, path + (i,))
            if hit is not None:
                return hit
    return None


# -- the six operators ---------------------------------------------------------------------------
def swap(tree: Tree, graph: LayerGraph, rng: random.Random, space: Space = SET) -> Tree | None:
    order, paths = tree.root.layers, leaf_paths(tree)
    ks = [k for k in range(len(order) - 1) if not graph.depends(order[k], order[k + 1])]
    if not ks:
        return None
    k = rng.choice(ks)
    root = replace(tree.root, paths[k], Leaf(order[k + 1]))
    return Tree(replace(root, paths[k + 1], Leaf(order[k])), tree.batch)


def move(tree: Tree, graph: LayerGraph, rng: random.Random, space: Space = SET) -> Tree | None:
    """Move a leaf into another cut sharing its parent or grandparent, at a random position that
    keeps the leaves topological. The valid positions come from the leaf order alone (after the
    leaf's removal it must sit after its producers and before its consumers), so no candidate
    tree is built to be rejected."""
    order = tree.root.layers
    pos = {layer: k for k, layer in enumerate(order)}
    first: dict = {}  # path -> index of its first leaf in leaf order
    leaves, targets = [], {}  # targets: cut path -> [(path, cut, leaf index of each child boundary)]
    for path, node, _ in tree.nodes():
        first[path] = len(leaves)
        if isinstance(node, Leaf):
            leaves.append(path)
    for path, node, _ in tree.nodes():
        if isinstance(node, Cut):
            targets[path] = [(path + (j,), c, [first[path + (j, i)] for i in range(len(c.children))] +
                              [first[path + (j,)] + len(c.layers)])
                             for j, c in enumerate(node.children) if isinstance(c, Cut)]
    options = []
    for k, path in enumerate(leaves):
        layer, parent = order[k], path[:-1]
        lo = max((pos[u] - (pos[u] > k) for u in graph.preds[layer]), default=-1) + 1
        hi = min((pos[v] - (pos[v] > k) for v in graph.succs[layer]), default=len(order) - 1)
        for owner in [parent] + ([parent[:-1]] if parent else []):
            for target, c, bounds in targets[owner]:
                if target != parent:
                    valid = [i for i, b in enumerate(bounds) if lo <= b - (b > k) <= hi]
                    if valid:
                        options.append((path, c, valid))
    if not options:
        return None
    path, target, valid = rng.choice(options)
    leaf, parent = tree.node(path), tree.node(path[:-1])
    rest = parent.children[:path[-1]] + parent.children[path[-1] + 1:]
    collapsed = rest[0] if len(rest) == 1 and len(path) > 1 else Cut(parent.kind, parent.sb, rest)
    root = replace(tree.root, path[:-1], collapsed)
    i = rng.choice(valid)
    new = Cut(target.kind, target.sb, target.children[:i] + (leaf,) + target.children[i:])
    return Tree(replace(root, find(root, target), new), tree.batch)


def group(tree: Tree, graph: LayerGraph, rng: random.Random, space: Space = SET) -> Tree | None:
    # the root may group all its children (it may have one child); another cut must keep two
    options = [(p, n, b) for p, n, b in cuts(tree) if len(n.children) >= (3 if p else 2)]
    if not options:
        return None
    path, cut, b = rng.choice(options)
    k = len(cut.children)
    size = rng.randint(2, k if not path else k - 1)
    start = rng.randint(0, k - size)
    members = cut.children[start:start + size]
    child_b = b // cut.sb
    sbs = [d for d in divisors(child_b) if all(fits(m, child_b // d) for m in members)]
    new = Cut(rng.choice(space.kinds), rng.choice(sbs), members)
    children = cut.children[:start] + (new,) + cut.children[start + size:]
    return Tree(replace(tree.root, path, Cut(cut.kind, cut.sb, children)), tree.batch)


def ungroup(tree: Tree, graph: LayerGraph, rng: random.Random, space: Space = SET) -> Tree | None:
    options = [(p, n) for p, n, _ in cuts(tree) if p]
    if not options:
        return None
    path, cut = rng.choice(options)
    return Tree(replace(tree.root, path, cut.children), tree.batch)


def _resize(tree: Tree, rng: random.Random, more: bool) -> Tree | None:
    options = []
    for path, cut, b in cuts(tree):
        sbs = [d for d in divisors(b) if (d > cut.sb if more else d < cut.sb)
               and all(fits(c, b // d) for c in cut.children)]
        if sbs:
            options.append((path, cut, sbs))
    if not options:
        return None
    path, cut, sbs = rng.choice(options)
    return Tree(replace(tree.root, path, Cut(cut.kind, rng.choice(sbs), cut.children)), tree.batch)


def more_sub_batches(tree: Tree, graph: LayerGraph, rng: random.Random, space: Space = SET) -> Tree | None:
    return _resize(tree, rng, more=True)


def fewer_sub_batches(tree: Tree, graph: LayerGraph, rng: random.Random, space: Space = SET) -> Tree | None:
    return _resize(tree, rng, more=False)


OPERATORS: tuple[Callable, ...] = (swap, move, group, ungroup, more_sub_batches, fewer_sub_batches)


def mutate(tree: Tree, graph: LayerGraph, tiles: int, rng: random.Random, space: Space = SET,
           attempts: int = 32) -> Tree | None:
    """A random neighbour of ``tree``: random operators until one yields a valid tree of
    ``space`` (None after ``attempts`` failures)."""
    for _ in range(attempts):
        op = rng.choice(OPERATORS)
        new = op(tree, graph, rng, space)
        if new is None or not space.allows(new):
            continue
        try:
            validate(new, graph, tiles)
        except TreeError:
            continue
        return new
    return None


def random_tree(graph: LayerGraph, batch: int, tiles: int, rng: random.Random, space: Space = SET,
                max_children: int = 4) -> Tree:
    """A random valid tree of ``space``: leaves in a topological order, split recursively into
    consecutive runs under cuts of random kind and sub-batch count."""
    for _ in range(1000):
        order = list(range(len(graph)))
        for _ in range(len(order)):  # random adjacent swaps of independent layers
            k = rng.randrange(len(order) - 1) if len(order) > 1 else 0
            if len(order) > 1 and not graph.depends(order[k], order[k + 1]):
                order[k], order[k + 1] = order[k + 1], order[k]

        def build(items: list[int], b: int, depth: int) -> Node:
            if len(items) == 1:
                return Leaf(items[0])
            limit = space.max_depth is not None and depth + 1 >= space.max_depth
            k = len(items) if limit else rng.randint(2, min(max_children, len(items)))
            if depth == 0:
                kind = "T" if space.depth_one else rng.choice("ST")
            else:
                kind = space.depth_one or rng.choice("ST")
            sb = rng.choice(divisors(b))
            cuts_at = sorted(rng.sample(range(1, len(items)), k - 1))
            runs = [items[a:z] for a, z in zip([0] + cuts_at, cuts_at + [len(items)])]
            return Cut(kind, sb, tuple(build(r, b // sb, depth + 1) for r in runs))

        root = build(order, batch, 0)
        tree = Tree(root if isinstance(root, Cut) else Cut("T", 1, (root,)), batch)
        try:
            if space.allows(tree):
                validate(tree, graph, tiles)
                return tree
        except TreeError:
            continue
    raise TreeError(f"no random tree of {len(graph)} layers fits {tiles} tiles in 1000 draws")
