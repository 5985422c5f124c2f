"""Medusa candidate trees as lists of paths of top-ranks, the format engines share.

A node (i_1, ..., i_k) is the i_j-th ranked prediction of head j along the path; the root
(the token the model itself just produced) is implicit. The reference implementation,
TensorRT-LLM (`medusa_choices`) and vLLM (`speculative_token_tree`) use this format.
Tokens are ordered root first, then nodes by (depth, path), as the reference does.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from perfmodel.errors import PerfkitError

TreePath = tuple[int, ...]


@dataclass(frozen=True)
class Tree:
    paths: tuple[TreePath, ...]

    def __post_init__(self) -> None:
        paths = tuple(sorted({tuple(p) for p in self.paths}, key=lambda p: (len(p), p)))
        if len(paths) != len(self.paths):
            raise PerfkitError("tree has duplicate paths")
        for path in paths:
            if not path or any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in path):
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

    def check_fits(self, heads: int, topk: int) -> None:
        """Refuse a tree that needs more heads or ranks than the model has."""
        if self.depth > heads:
            raise PerfkitError(f"tree is {self.depth} deep but the model has {heads} Medusa heads; use a tree of depth <= {heads}")
        if self.max_rank >= topk:
            raise PerfkitError(f"tree uses rank {self.max_rank} (top-{self.max_rank + 1}) but candidates come from top-{topk}")

    @classmethod
    def breadth_first(cls, nodes: int, branching: int = 8) -> Tree:
        """The first `nodes` nodes of a complete `branching`-ary tree in breadth-first order."""
        paths: list[TreePath] = []
        level: list[TreePath] = [()]
        while len(paths) < nodes:
            level = [parent + (r,) for parent in level for r in range(branching)]
            paths += level[: nodes - len(paths)]
        return cls(tuple(paths))


def load_tree(text_or_file: str | Path) -> Tree:
    """A tree from a Python/JSON list of paths, or from a file holding one."""
    text = str(text_or_file)
    source = Path(text)
    if source.suffix in (".json", ".txt", ".py") or source.exists():
        try:
            text = source.read_text()
        except OSError as exc:
            raise PerfkitError(f"cannot read tree file {source}: {exc.strerror or exc}") from None
    try:
        paths = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError):
        raise PerfkitError(f"a tree is a list of paths like [(0,), (0, 0), (1,)]; could not read {text[:60]!r}") from None
    if not isinstance(paths, (list, tuple)):
        raise PerfkitError("a tree is a list of paths like [(0,), (0, 0), (1,)]")
    return Tree(tuple(tuple(p) if isinstance(p, (list, tuple)) else (p,) for p in paths))


# The reference implementation's Vicuna-7B tree (63 nodes + root), from DESIGN section 5.
VICUNA_7B_TREE = Tree(
    (
        (0,), (0, 0), (1,), (0, 1), (0, 0, 0), (1, 0), (2,), (0, 2), (0, 0, 1), (0, 3), (3,), (0, 1, 0), (2, 0),
        (4,), (0, 0, 2), (0, 4), (1, 1), (1, 0, 0), (0, 0, 0, 0), (5,), (0, 0, 3), (0, 5), (0, 2, 0), (3, 0),
        (0, 1, 1), (0, 6), (6,), (0, 7), (0, 0, 4), (4, 0), (1, 2), (0, 8), (7,), (0, 3, 0), (0, 0, 0, 1),
        (0, 0, 5), (2, 1), (0, 0, 6), (1, 0, 1), (0, 0, 1, 0), (2, 0, 0), (5, 0), (0, 9), (0, 1, 2), (8,),
        (0, 4, 0), (0, 2, 1), (1, 3), (0, 0, 7), (0, 0, 0, 2), (0, 0, 8), (1, 1, 0), (0, 1, 0, 0), (6, 0),
        (9,), (0, 1, 3), (0, 0, 0, 3), (1, 0, 2), (0, 5, 0), (3, 1), (0, 0, 2, 0), (7, 0), (1, 4),
    )  # fmt: skip
)
