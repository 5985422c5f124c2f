"""Tree buffers: the tensors one Medusa step needs for a tree of candidate paths.

For a Tree (perfmodel.acceptance.trees) of T tokens (root first, then nodes by depth):
- mask (T, T): token i attends to token j iff j is i or an ancestor of i;
- depths (T,): position id offset of each token from the prefix;
- node_head, node_rank (T,): which head and which of its top-k ranks proposes each node
  (the node -> candidate gather); -1 for the root, whose token the model itself chose;
- retrieve (P, D + 1): token indices of each root-to-leaf path, padded with -1;
- children: each token's children, in rank order (for rejection sampling).
Drafting names the tree a decoding run's steps draft, before any buffers are built for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from perfmodel.acceptance.reference_trees import MC_SIM_7B_63_TREE, VICUNA_7B_TREE
from perfmodel.acceptance.trees import Tree, greedy_tree, load_tree
from perfmodel.base.errors import PerfkitError
from perfmodel.models.operators import HEAD_TOP_K

TREE_NAMES = "default, vicuna-7b, mc-sim-7b-63, greedy-N, chain-N, or a file/list of paths"
# The reference implementation's published trees, by name (vicuna-7b is its vicuna_7b_stage2).
NAMED_TREES = {"vicuna-7b": VICUNA_7B_TREE, "vicuna-7b-stage2": VICUNA_7B_TREE, "mc-sim-7b-63": MC_SIM_7B_63_TREE}


@dataclass(frozen=True)
class Drafting:
    """What each step drafts: a static tree or a dynamic one (neither: plain decoding), its top-k, and who drafts."""

    tree: Tree | None = None
    dynamic_nodes: int = 0  # > 0: a tree of that many nodes besides the root, chosen each step
    topk: int = HEAD_TOP_K
    drafter: str = "medusa"  # decoder.medusa.DRAFTERS: Medusa's heads, or the checkpoint's EAGLE drafter


@dataclass(frozen=True)
class TreeBuffers:
    tree: Tree
    mask: torch.Tensor
    depths: torch.Tensor
    node_head: torch.Tensor
    node_rank: torch.Tensor
    retrieve: torch.Tensor
    children: tuple[tuple[int, ...], ...]

    @property
    def size(self) -> int:
        return self.tree.size


def tree_buffers(tree: Tree, heads: int, topk: int, device="cpu") -> TreeBuffers:
    """Buffers for `tree`, refused with a clear message if it needs more heads or ranks."""
    tree.check_fits(heads, topk)
    parents = tree.parents
    leaves = sorted(set(range(tree.size)) - set(parents[1:].tolist()))
    paths = []
    for leaf in leaves:
        chain = [leaf]
        while chain[-1] != 0:
            chain.append(int(parents[chain[-1]]))
        paths.append(chain[::-1])
    width = max(len(p) for p in paths)
    retrieve = np.full((len(paths), width), -1, dtype=np.int64)
    for row, path in enumerate(paths):
        retrieve[row, : len(path)] = path
    children = [[] for _ in range(tree.size)]
    for child in range(1, tree.size):
        children[parents[child]].append(child)
    as_tensor = lambda a: torch.as_tensor(a, device=device)  # noqa: E731
    return TreeBuffers(
        tree=tree,
        mask=as_tensor(tree.ancestor_mask),
        depths=as_tensor(tree.depths),
        node_head=as_tensor([-1] + [len(p) - 1 for p in tree.paths]),
        node_rank=as_tensor([-1] + [p[-1] for p in tree.paths]),
        retrieve=as_tensor(retrieve),
        children=tuple(tuple(c) for c in children),
    )


def tree_attention_mask(lengths: torch.Tensor, tree_mask: torch.Tensor, kv_len: int) -> torch.Tensor:
    """(B, 1, T, kv_len) bool: each sequence's tree tokens, written right after its own
    prefix of `lengths[b]` tokens, see that prefix and their ancestors in the tree."""
    size = tree_mask.shape[1]
    j = torch.arange(kv_len, device=lengths.device)[None, None, :]
    rel = j - lengths[:, None, None]  # key slot relative to each sequence's tree start
    in_tree = (rel >= 0) & (rel < size)
    tree_part = torch.gather(tree_mask, 2, rel.clamp(0, size - 1).expand(-1, size, -1))
    return ((rel < 0) | (in_tree & tree_part))[:, None]


def resolve_tree(name: str, checkpoint, accuracy=None) -> Tree:
    """A tree by name for a checkpoint: default (its own, else the reference Vicuna-7B tree
    when it has the heads for it, else greedy-32), vicuna-7b (the reference's vicuna_7b_stage2),
    mc-sim-7b-63 (the reference's mc_sim_7b_63), greedy-N (the paper's
    construction from head accuracies: the ones given, else those recorded at training),
    chain-N (top-1 of the first N heads), or a file / literal list of paths."""
    heads = len(checkpoint.heads)
    if name == "default":
        if checkpoint.tree is not None:
            return checkpoint.tree
        name = "vicuna-7b" if heads >= VICUNA_7B_TREE.depth else "greedy-32"
    if name in NAMED_TREES:
        return NAMED_TREES[name]
    if name.startswith("greedy-") and name[7:].isdigit():
        accuracy = accuracy if accuracy is not None else checkpoint.info.get("heldout_head_accuracy")
        if accuracy is None:
            raise PerfkitError(
                f"{name} needs head accuracies; {checkpoint.folder} records none (decoder.measure measures them)"
            )
        return greedy_tree(np.asarray(accuracy), int(name[7:]))
    if name.startswith("chain-") and name[6:].isdigit():
        return Tree(tuple((0,) * d for d in range(1, int(name[6:]) + 1)))
    return load_tree(name)


def path_of_length(buffers: TreeBuffers, length: int) -> list[int]:
    """Token indices of a root-first path of `length` tokens: the first one found going down
    each node's children in rank order. On the host, from the buffers' children lists, so a
    replayed step (decoder.twin) launches no kernel a real step does not."""
    if length < 1:
        raise PerfkitError(f"an accepted path has the root at least: got length {length}")
    path = [0]
    while len(path) < length:
        deeper = next((c for c in buffers.children[path[-1]] if _depth_below(buffers, c) >= length - len(path)), None)
        if deeper is None:
            raise PerfkitError(
                f"the tree of {buffers.size} tokens has no path of {length} tokens: the replayed record was taken "
                "with a deeper tree"
            )
        path.append(deeper)
    return path


def _depth_below(buffers: TreeBuffers, node: int) -> int:
    """Tokens on the longest path from `node` down, itself included."""
    return 1 + max((_depth_below(buffers, c) for c in buffers.children[node]), default=0)
