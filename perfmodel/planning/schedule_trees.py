"""The Medusa trees a speculation schedule may run: the tree of each size, its tokens per step,
and why other sizes are left out (perfmodel.planning.schedule's module doc says how trees are chosen).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from perfmodel.acceptance.rates import AcceptanceChoice, HeadAccuracyAcceptance
from perfmodel.acceptance.reference_trees import VICUNA_7B_ORDER, vicuna_7b_prefix
from perfmodel.acceptance.trees import Tree, expected_acceptance
from perfmodel.planning.schedule_format import TreeFamily, check_family


@dataclass(frozen=True)
class TreeBook:
    """The tree of each size the schedule may choose, its tokens per step (the acceptance the
    speedups use), and why other sizes were left out. Called with sizes, it is that acceptance."""

    trees: dict[int, Tree] = field(default_factory=dict)  # size > 1 -> tree
    accepted: dict[int, float] = field(default_factory=dict)  # size > 1 -> tokens per step
    notes: tuple[str, ...] = ()

    def __call__(self, n) -> np.ndarray:
        n = np.asarray(n)
        flat = [self.accepted.get(int(x), 1.0) for x in np.ravel(n)]
        return np.asarray(flat, dtype=float).reshape(n.shape)


def tree_book(choice: AcceptanceChoice, sizes, heads: int, family: str = "tree") -> TreeBook:
    """The trees of `sizes` (root included) and their acceptance. family tree: the greedy tree
    of the record's head accuracies, else the reference's Vicuna-7B tree's prefix, at the
    acceptance model's tokens per step; a size without a tree of exactly that many tokens, or
    deeper than the model's `heads`, is left out (with a note). family chain (`sizes` unused):
    the chains of 1 to `heads` nodes, at their expected acceptance from the head accuracies (without them,
    the acceptance model's, which was fitted to trees: an upper bound for a chain)."""
    shaper = choice.trees if isinstance(choice.trees, HeadAccuracyAcceptance) else None
    if check_family(family) == TreeFamily.CHAIN:
        # every chain the heads (and the record's heads) reach: `sizes` is about trees
        depth = heads if shaper is None else min(heads, shaper.accuracy.shape[0])
        trees = {n: Tree(tuple((0,) * d for d in range(1, n))) for n in range(2, depth + 2)}
        if shaper is not None:
            accepted = {n: expected_acceptance(tree, shaper.accuracy) for n, tree in trees.items()}
            notes = ["chains: one token per head (top-1), as vLLM's Medusa drafts; acceptance from the head accuracies"]
        else:
            accepted = {n: float(choice.model(n)) for n in trees}
            notes = [
                "chains: one token per head, as vLLM's Medusa drafts; no head accuracies, so a chain is credited the "
                "acceptance curve's tokens per step at its size, a curve of trees of 16-64 tokens that says little of "
                "2-5 token chains (measure the heads: python -m decoder.measure)"
            ]
        return TreeBook(trees, accepted, tuple(notes))
    trees, missing, deep = {}, [], []
    for n in sorted(int(s) for s in sizes if s > 1):
        if shaper is not None:
            tree = shaper.tree(n)
        elif n - 1 <= len(VICUNA_7B_ORDER):
            tree = vicuna_7b_prefix(n - 1)
        else:
            missing.append(n)
            continue
        if tree.size != n:
            missing.append(n)
        elif tree.depth > heads:
            deep.append(n)
        else:
            trees[n] = tree
    notes = []
    if shaper is None:
        notes.append(
            "no measured head accuracies: each tree is the reference Vicuna-7B tree's first n - 1 nodes "
            "(python -m decoder.measure and --acceptance-rates FILE shape trees from the heads themselves)"
        )
    if missing:
        notes.append(f"tree sizes {', '.join(map(str, missing))} not searched: no tree of exactly that size to run")
    if deep:
        notes.append(f"tree sizes {', '.join(map(str, deep))} not searched: deeper than the model's {heads} heads")
    kept = np.array(list(trees), dtype=np.int64)
    accepted = dict(zip(trees, np.asarray(choice.model(kept), dtype=float).tolist())) if trees else {}
    return TreeBook(trees, accepted, tuple(notes))
