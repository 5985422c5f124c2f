"""Drafting one sequence's tree with the EAGLE drafter (decoder.eagle), sequence by
sequence as the eager decoder (decoder.medusa) runs it.

Drafting a static tree (a Tree of rank paths, as Medusa's): depth by depth, every node of
the depth above is run (with its ancestors and the context window), and each child takes
rank r of its parent's drafted distribution. `dynamic_eagle_tree` expands instead the most
confident nodes (EAGLE-2's rule) up to a token budget and depth.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from decoder.eagle import CONTEXT, EagleDrafter, window_mask
from perfmodel.acceptance.trees import Tree, TreePath


@dataclass
class History:
    """Each sequence's last CONTEXT + 1 accepted (feature, token) pairs: the drafter's
    context window is the inputs (f_p, e(x_(p+1))) of the positions before the root's."""

    features: list[list[torch.Tensor]] = field(default_factory=list)
    tokens: list[list[int]] = field(default_factory=list)

    @classmethod
    def empty(cls, batch: int) -> History:
        return cls([[] for _ in range(batch)], [[] for _ in range(batch)])

    def push(self, row: int, features: torch.Tensor, tokens: list[int]) -> None:
        # a copy: the decoder overwrites its last hidden state in place, and a view of it
        # kept here would become the next position's feature
        self.features[row] = (self.features[row] + list(features.clone()))[-(CONTEXT + 1) :]
        self.tokens[row] = (self.tokens[row] + list(tokens))[-(CONTEXT + 1) :]

    def inputs(self, row: int) -> tuple[list[torch.Tensor], list[int]]:
        """(features, next tokens) of the context positions, oldest first."""
        f, t = self.features[row], self.tokens[row]
        return f[:-1][-CONTEXT:], t[1:][-CONTEXT:]


def draft_tree(
    drafter: EagleDrafter,
    embed: nn.Embedding,
    lm_head: nn.Linear,
    tree: Tree,
    root: int,
    root_feature: torch.Tensor,
    history: tuple[list[torch.Tensor], list[int]],
    position: int,
) -> torch.Tensor:
    """Candidate tokens (T,) of one sequence's static tree, root first. Depth by depth, the
    nodes down to that depth run with the context window before them (each seeing the window
    and its own ancestors), and every child takes rank r of its parent's drafted tokens and,
    as its input feature, the parent's drafted feature. position: the root's."""
    context = context_of(history, root_feature)
    info: dict[TreePath, tuple[int, torch.Tensor]] = {(): (root, root_feature)}
    for depth in range(tree.depth):
        needed = [(), *(p for p in tree.paths if len(p) <= depth)]
        drafted = dict(zip(needed, run_nodes(drafter, embed, context, needed, info, position)))
        children = [p for p in tree.paths if len(p) == depth + 1]
        wanted = max(p[-1] for p in children) + 1
        for parent in dict.fromkeys(p[:-1] for p in children):
            top = lm_head(drafted[parent]).topk(wanted).indices.tolist()
            for child in (p for p in children if p[:-1] == parent):
                info[child] = (top[child[-1]], drafted[parent])
    return torch.tensor([root] + [info[p][0] for p in tree.paths], dtype=torch.long, device=root_feature.device)


def context_of(history: tuple[list[torch.Tensor], list[int]], root_feature: torch.Tensor):
    """The context window's input features (C, h) and next tokens (C,) as tensors."""
    features, tokens = history
    stacked = torch.stack(features) if features else root_feature.new_zeros(0, root_feature.shape[-1])
    return stacked, torch.tensor(tokens, dtype=torch.long, device=root_feature.device)


def run_nodes(drafter, embed, context, paths: list[TreePath], info: dict, position: int) -> torch.Tensor:
    """The drafter's output features for `paths` (a set closed under ancestors, root () first),
    each node seeing the context window and its ancestors. info: path -> (token, input feature)."""
    ctx_f, ctx_t = context
    c = len(ctx_t)
    index = {p: i for i, p in enumerate(paths)}
    n = c + len(paths)
    device = ctx_f.device
    mask = torch.zeros(n, n, dtype=torch.bool, device=device)
    mask[:c, :c] = window_mask(c, c + 1, device)[0, 0]
    mask[c:, :c] = True
    for i, path in enumerate(paths):
        for cut in range(len(path) + 1):
            mask[c + i, c + index[path[:cut]]] = True
    tokens = torch.tensor([info[p][0] for p in paths], dtype=torch.long, device=device)
    feats = torch.stack([info[p][1] for p in paths])
    positions = torch.tensor([position + len(p) for p in paths], device=device)
    positions = torch.cat([torch.arange(position - c, position, device=device), positions])
    out = drafter(
        torch.cat([ctx_f, feats])[None],
        embed(torch.cat([ctx_t, tokens]))[None],
        positions[None],
        mask[None, None],
    )
    return out[0, c:]


@dataclass(frozen=True)
class DynamicDraft:
    """EAGLE-2's dynamic tree: the nodes it keeps, the expansions it drafts, and the top-k of each expansion."""

    nodes: int
    depth: int
    topk: int


def dynamic_eagle_tree(
    drafter: EagleDrafter,
    embed: nn.Embedding,
    lm_head: nn.Linear,
    root: int,
    root_feature: torch.Tensor,
    history: tuple[list[torch.Tensor], list[int]],
    position: int,
    draft: DynamicDraft,
) -> tuple[Tree, torch.Tensor]:
    """EAGLE-2's dynamic tree for one sequence, as `draft` sizes it: `depth` expansions, each
    drafting the children of the `topk` most confident nodes of the depth above (confidence:
    the product of drafted probabilities along the path), keeping each one's top-k children;
    then the `nodes` most confident nodes of all drafted are the tree (a child is never more
    confident than its parent, so they form one). Returns the tree (paths of child ranks) and
    its tokens, root first, in the tree's order."""
    device = root_feature.device
    context = context_of(history, root_feature)
    info: dict[TreePath, tuple[int, torch.Tensor]] = {(): (root, root_feature)}
    score: dict[TreePath, float] = {(): 1.0}
    frontier: list[TreePath] = [()]
    for _ in range(draft.depth):
        needed = sorted({p[:cut] for p in frontier for cut in range(len(p) + 1)}, key=lambda p: (len(p), p))
        out = run_nodes(drafter, embed, context, needed, info, position)
        drafted = dict(zip(needed, out))
        children = []
        for parent in frontier:
            probs = torch.softmax(lm_head(drafted[parent]).float(), dim=-1)
            top = probs.topk(draft.topk)
            for rank, (p, token) in enumerate(zip(top.values.tolist(), top.indices.tolist())):
                child = parent + (rank,)
                info[child] = (token, drafted[parent])
                score[child] = score[parent] * p
                children.append(child)
        frontier = sorted(children, key=lambda p: -score[p])[: draft.topk]
    chosen = sorted((p for p in score if p), key=lambda p: (-score[p], len(p), p))[: draft.nodes]
    tree = Tree(tuple(chosen))
    tokens = torch.tensor([root] + [info[p][0] for p in tree.paths], dtype=torch.long, device=device)
    return tree, tokens
