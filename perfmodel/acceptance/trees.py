"""Medusa candidate trees as lists of paths of top-ranks, the format engines share.

A node (i_1, ..., i_k) is the i_j-th ranked prediction of head j along the path; the root
(the token the model itself just produced) is implicit. The reference implementation,
TensorRT-LLM (`medusa_choices`) and vLLM (`speculative_token_tree`) use this format.
Tokens are ordered root first, then nodes by (depth, path), as the reference does.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from pathlib import Path

import numpy as np

from perfmodel.base.checks import is_count
from perfmodel.base.errors import PerfkitError

TreePath = tuple[int, ...]


def most_tokens_per_step(tree_size: int, heads: int) -> int:
    """The most tokens one verification step of a tree of `tree_size` tokens (the root
    included) can yield: its longest path of candidates, at most tree_size - 1 and at most one
    per Medusa head, all accepted, plus the model's own next token."""
    return min(tree_size - 1, heads) + 1


@dataclass(frozen=True)
class Tree:
    paths: tuple[TreePath, ...]

    def __post_init__(self) -> None:
        paths = tuple(sorted({tuple(p) for p in self.paths}, key=lambda p: (len(p), p)))
        if len(paths) != len(self.paths):
            raise PerfkitError("tree has duplicate paths")
        for path in paths:
            if not path or not all(is_count(r, 0) for r in path):
                raise PerfkitError(f"tree path {path!r} must be a non-empty tuple of ranks >= 0")
        known = set(paths)
        for path in paths:
            if len(path) > 1 and path[:-1] not in known:
                raise PerfkitError(f"tree path {path!r} has no parent {path[:-1]!r} in the tree")
        object.__setattr__(self, "paths", paths)

    @property
    def size(self) -> int:
        """Tokens processed in one tree step: the root plus every node."""
        return len(self.paths) + 1

    @property
    def depth(self) -> int:
        """Heads the tree needs (its longest path)."""
        return max((len(p) for p in self.paths), default=0)

    @property
    def max_rank(self) -> int:
        """Largest top-k rank any node uses (top-k needed = max_rank + 1)."""
        return max((max(p) for p in self.paths), default=-1)

    @cached_property
    def parents(self) -> np.ndarray:
        """Token index of each token's parent (-1 for the root)."""
        index = {p: i + 1 for i, p in enumerate(self.paths)}
        return np.array([-1] + [index.get(p[:-1], 0) for p in self.paths], dtype=np.int64)

    @cached_property
    def depths(self) -> np.ndarray:
        """Depth of each token (root 0): its position id offset from the prefix."""
        return np.array([0] + [len(p) for p in self.paths], dtype=np.int64)

    @cached_property
    def ancestor_mask(self) -> np.ndarray:
        """(size, size) bool: token i may attend to token j iff j is i or an ancestor of i."""
        mask = np.eye(self.size, dtype=bool)
        for i in range(1, self.size):  # parents precede children, so rows build on each other
            mask[i] |= mask[self.parents[i]]
        return mask

    @cached_property
    def draft_passes(self) -> tuple[tuple[int, int], ...]:
        """What drafting this tree depth by depth (EAGLE, decoder.eagle) runs in each pass j =
        0 .. depth - 1: (nodes run, nodes expanded). A pass runs every node down to depth j,
        the root included (a drafter without a KV cache recomputes them), and expands the
        parents of depth j + 1's nodes, each once."""
        depths = self.depths
        expanded = [{p[:-1] for p in self.paths if len(p) == j + 1} for j in range(self.depth)]
        return tuple((int((depths <= j).sum()), len(expanded[j])) for j in range(self.depth))

    def check_fits(self, heads: int, topk: int) -> None:
        """Refuse a tree that needs more heads or ranks than the model has."""
        if self.depth > heads:
            raise PerfkitError(
                f"tree is {self.depth} deep but the model has {heads} Medusa heads; use a tree of depth <= {heads}"
            )
        if self.max_rank >= topk:
            raise PerfkitError(
                f"tree uses rank {self.max_rank} (top-{self.max_rank + 1}) but candidates come from top-{topk}"
            )

    @classmethod
    def breadth_first(cls, nodes: int, branching: int = 8) -> Tree:
        """The first `nodes` nodes of a complete `branching`-ary tree in breadth-first order."""
        paths: list[TreePath] = []
        level: list[TreePath] = [()]
        while len(paths) < nodes:
            level = [parent + (r,) for parent in level for r in range(branching)]
            paths += level[: nodes - len(paths)]
        return cls(tuple(paths))


def path_value(path: TreePath, accuracy: np.ndarray) -> float:
    """Probability that every node on `path` is accepted, under the independence model:
    the product of a_k^(i_k), the accuracy of rank i_k of head k (paper 2.3.3)."""
    return float(np.prod([accuracy[k, rank] for k, rank in enumerate(path)]))


def expected_acceptance(tree: Tree, accuracy: np.ndarray) -> float:
    """Expected tokens per step of `tree`: the root (always accepted) plus every node's value."""
    return 1.0 + sum(path_value(p, accuracy) for p in tree.paths)


def greedy_tree(accuracy, nodes: int) -> Tree:
    """The paper's sparse-tree construction: repeatedly add the highest-value node whose
    parent is already in the tree, until `nodes` nodes.

    accuracy: (heads, topk) array, a_k^(i) = how often rank i of head k is right; or one
    step's top-k probabilities per head, which makes this the per-step dynamic tree
    (decoder.medusa.dynamic_tree).
    """
    import heapq

    accuracy = np.asarray(accuracy, dtype=float)
    if accuracy.ndim != 2 or (accuracy < 0).any() or (accuracy > 1).any():
        raise PerfkitError("accuracy must be a (heads, topk) array of probabilities in [0, 1]")
    heads, topk = accuracy.shape
    frontier = [(-accuracy[0, r], (r,)) for r in range(topk)]
    heapq.heapify(frontier)
    chosen: list[TreePath] = []
    while frontier and len(chosen) < nodes:
        negative, path = heapq.heappop(frontier)
        chosen.append(path)
        if len(path) < heads:  # its children become reachable
            for r in range(topk):
                heapq.heappush(frontier, (negative * accuracy[len(path), r], path + (r,)))
    return Tree(tuple(chosen))


def optimal_tree(accuracy, nodes: int) -> Tree:
    """The tree of `nodes` nodes with the highest expected acceptance under the same
    independence model as greedy_tree, by dynamic programming (as Sequoia does).

    best[d][m] = the most value m nodes can add below a node whose children come from head
    d, that node's own value being 1: each rank r given c nodes (itself and c - 1 below)
    adds a[d, r] * (1 + best[d + 1][c - 1]); a knapsack over the ranks picks the budgets.
    O(heads x topk x nodes^2).
    """
    accuracy = np.asarray(accuracy, dtype=float)
    if accuracy.ndim != 2 or (accuracy < 0).any() or (accuracy > 1).any():
        raise PerfkitError("accuracy must be a (heads, topk) array of probabilities in [0, 1]")
    if nodes < 0:
        raise PerfkitError(f"nodes must be >= 0, got {nodes}")
    heads, topk = accuracy.shape
    best = np.zeros((heads + 1, nodes + 1))
    # split[d][j][m]: nodes given to rank j (0 = none) in the best use of ranks <= j
    splits = [None] * heads
    for d in range(heads - 1, -1, -1):
        value = np.zeros((topk + 1, nodes + 1))
        split = np.zeros((topk + 1, nodes + 1), dtype=np.int64)
        for j in range(1, topk + 1):
            value[j] = value[j - 1]
            gain = accuracy[d, j - 1] * (1 + best[d + 1][:nodes])  # gain[c - 1] for c nodes
            for m in range(1, nodes + 1):
                options = value[j - 1][m - np.arange(1, m + 1)] + gain[:m]
                c = int(np.argmax(options)) + 1
                if options[c - 1] > value[j][m] + 1e-15:
                    value[j][m], split[j][m] = options[c - 1], c
        best[d] = value[topk]
        splits[d] = split

    def build(d: int, m: int, prefix: TreePath) -> list[TreePath]:
        if d >= heads or m == 0:
            return []
        out = []
        for j in range(topk, 0, -1):
            c = int(splits[d][j][m])
            if c:
                child = prefix + (j - 1,)
                out += [child] + build(d + 1, c - 1, child)
                m -= c
        return out

    return Tree(tuple(build(0, min(nodes, max_nodes(heads, topk)), ())))


def dense_tree(top_ks) -> Tree:
    """The dense tree of the paper's Fig. 4: head d's top-s_d under every node of depth
    d - 1, so the Cartesian product of the heads' top-k predictions, s_1 + s_1 s_2 + ... nodes."""
    top_ks = [int(s) for s in top_ks]
    if not top_ks or any(s < 1 for s in top_ks):
        raise PerfkitError(f"a dense tree takes each head's top-k, k >= 1 for at least one head; got {top_ks}")
    level: list[TreePath] = [()]
    paths: list[TreePath] = []
    for s in top_ks:
        level = [parent + (r,) for parent in level for r in range(s)]
        paths += level
    return Tree(tuple(paths))


def random_dense_settings(count: int, heads: int, topk: int, node_limit: int, seed: int = 0) -> list[tuple[int, ...]]:
    """`count` distinct top-k settings (s_1, ..., s_depth) drawn at random, as the paper's
    Fig. 4 samples its dense trees: depth 1 to `heads`, each s_d in 1..topk, at most
    `node_limit` nodes."""
    rng = np.random.default_rng(seed)
    found: dict[tuple[int, ...], None] = {}
    for _ in range(10_000):
        if len(found) == count:
            break
        depth = int(rng.integers(1, heads + 1))
        setting = tuple(int(s) for s in rng.integers(1, topk + 1, size=depth))
        if sum(int(np.prod(setting[:d])) for d in range(1, depth + 1)) <= node_limit:
            found.setdefault(setting, None)
    if len(found) < count:
        raise PerfkitError(f"only {len(found)} dense trees of at most {node_limit} nodes exist here; asked for {count}")
    return list(found)


def max_nodes(heads: int, topk: int) -> int:
    """Nodes of the complete tree: topk + topk^2 + ... + topk^heads."""
    return sum(topk**d for d in range(1, heads + 1))


class TreeFormat(StrEnum):
    """The tree formats export_tree writes, by the engine that reads them."""

    REFERENCE = "reference"
    TENSORRT_LLM = "tensorrt-llm"
    VLLM = "vllm"


def export_tree(tree: Tree, engine: str):
    """The tree in an engine's format: `reference` (Medusa's list of tuples),
    `tensorrt-llm` (medusa_choices, a list of lists) or `vllm` (speculative_token_tree,
    a list of tuples), as Python data; json.dumps() or str() it for a config file."""
    if engine in (TreeFormat.REFERENCE, TreeFormat.VLLM):
        return [tuple(p) for p in tree.paths]
    if engine == TreeFormat.TENSORRT_LLM:
        return [list(p) for p in tree.paths]
    raise PerfkitError(f"unknown engine {engine!r}; choose one of: {', '.join(TreeFormat)}")


def load_tree(text_or_file: str | Path) -> Tree:
    """A tree from a Python/JSON list of paths, or from a file holding one."""
    text = str(text_or_file)
    source = Path(text)
    if not text.lstrip().startswith(("[", "(")):  # not a literal: a file
        if not source.is_file():
            raise PerfkitError(
                f"{text!r} is neither a tree file nor a list of paths; a tree is a list of paths like [(0,), (0, 0), "
                "(1,)]"
            )
        try:
            text = source.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise PerfkitError(f"{source}: tree file is not UTF-8 text (byte {exc.start})") from None
        except OSError as exc:
            raise PerfkitError(f"cannot read tree file {source}: {exc.strerror or exc}") from None
    try:
        paths = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError):
        raise PerfkitError(
            f"a tree is a list of paths like [(0,), (0, 0), (1,)]; could not read {text[:60]!r}"
        ) from None
    if not isinstance(paths, (list, tuple)):
        raise PerfkitError("a tree is a list of paths like [(0,), (0, 0), (1,)]")
    return Tree(tuple(tuple(p) if isinstance(p, (list, tuple)) else (p,) for p in paths))
