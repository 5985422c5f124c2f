"""Drafting with the EAGLE drafter (decoder.eagle) over a whole batch at once, as tensor ops
that read nothing back to the host: every sequence's static tree drafted together (what the
static step runs; the same tokens decoder.eagle_tree drafts sequence by sequence), and the
drafter's hits at every position of a decoded text at once (chain_hits).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from decoder.eagle import CONTEXT, EagleDrafter, window_mask
from perfmodel.acceptance.trees import Tree


@dataclass(frozen=True)
class DraftPlan:
    """What drafting a static tree runs at each depth, worked out once per tree: the nodes
    run (those down to that depth, in the tree's order), the attention among them, the nodes
    expanded (the children's parents, each once: the LM head reads only these) and the
    children made from them (each child's parent's place among the nodes run and among those
    expanded, and its rank)."""

    tree: Tree
    runs: tuple[torch.Tensor, ...]
    masks: tuple[torch.Tensor, ...]
    expanded: tuple[torch.Tensor, ...]
    children: tuple[torch.Tensor, ...]
    parents: tuple[torch.Tensor, ...]
    slots: tuple[torch.Tensor, ...]
    ranks: tuple[torch.Tensor, ...]
    depths: torch.Tensor
    tops: tuple[int, ...] = ()  # per depth, the top-k its children need (their highest rank + 1)

    @classmethod
    def of(cls, tree: Tree, device="cpu") -> DraftPlan:
        depths = torch.as_tensor(tree.depths, device=device)
        ancestors = torch.as_tensor(tree.ancestor_mask, device=device)
        parents_of = torch.as_tensor(tree.parents, device=device)
        ranks_of = torch.tensor([-1] + [p[-1] for p in tree.paths], device=device)
        runs, masks, expanded, children, parents, slots, ranks = [], [], [], [], [], [], []
        for depth in range(tree.depth):
            run = torch.nonzero(depths <= depth).ravel()
            child = torch.nonzero(depths == depth + 1).ravel()
            place = torch.searchsorted(run, parents_of[child])  # run is sorted: the parent's column
            unique, slot = torch.unique(place, sorted=True, return_inverse=True)
            runs.append(run)
            masks.append(ancestors[run][:, run])
            expanded.append(unique)
            children.append(child)
            parents.append(place)
            slots.append(slot)
            ranks.append(ranks_of[child])
        tops = tuple(int(r.max()) + 1 for r in ranks)  # read here, once, not inside a step
        return cls(tree, *map(tuple, (runs, masks, expanded, children, parents, slots, ranks)), depths, tops)


def child_tokens(logits: torch.Tensor, slot: torch.Tensor, rank: torch.Tensor, top: int | None = None) -> torch.Tensor:
    """Each child's token (B, children): rank `rank` of its parent's drafted distribution, the
    parent `slot` among the nodes expanded, whose logits are (B, expanded, V). top: the
    top-k to take (rank.max() + 1, read from the device when not given)."""
    return logits.topk(top if top is not None else int(rank.max()) + 1, dim=-1).indices[:, slot, rank]


@dataclass(frozen=True)
class Window:
    """A batch's context windows, left-padded to the longest: input features (B, W, h), next
    tokens (B, W), which slots hold a position (B, W), their positions (B, W), and the causal
    mask among them."""

    features: torch.Tensor
    tokens: torch.Tensor
    valid: torch.Tensor
    positions: torch.Tensor
    causal: torch.Tensor

    @classmethod
    def of(cls, histories, root_features: torch.Tensor, positions: torch.Tensor) -> Window:
        """histories: each sequence's (features, next tokens) before its root, at most CONTEXT;
        positions (B,): the roots'."""
        batch, device = len(histories), root_features.device
        width = max((len(h[1]) for h in histories), default=0)
        ctx_f = root_features.new_zeros(batch, width, root_features.shape[-1])
        ctx_t = torch.zeros(batch, width, dtype=torch.long, device=device)
        valid = torch.zeros(batch, width, dtype=torch.bool, device=device)
        for b, (features, tokens) in enumerate(histories):
            if tokens:
                ctx_f[b, width - len(tokens) :] = torch.stack(features)
                ctx_t[b, width - len(tokens) :] = torch.tensor(tokens, device=device)
                valid[b, width - len(tokens) :] = True
        ctx_pos = positions[:, None] - torch.arange(width, 0, -1, device=device)[None, :]
        return cls(ctx_f, ctx_t, valid, ctx_pos, window_mask(width, width + 1, device)[0, 0])


def run_pass(drafter, embed, window: Window, features, tokens, positions, among) -> torch.Tensor:
    """One draft pass over the batch: nodes with input features (B, r, h), tokens (B, r) and
    positions (B, r), each seeing its sequence's window and the nodes `among` (r, r) allows.
    Returns the nodes' drafted features (B, r, h)."""
    batch, width = window.tokens.shape
    n = width + tokens.shape[1]
    mask = torch.zeros(batch, n, n, dtype=torch.bool, device=tokens.device)
    mask[:, :width, :width] = window.causal & window.valid[:, None, :]
    slots = torch.arange(width, device=tokens.device)  # on the device: capturable in a CUDA graph
    mask[:, slots, slots] = True  # a padded slot sees itself: no empty row
    mask[:, width:, :width] = window.valid[:, None, :]
    mask[:, width:, width:] = among
    out = drafter(
        torch.cat([window.features, features], dim=1),
        embed(torch.cat([window.tokens, tokens], dim=1)),
        torch.cat([window.positions, positions], dim=1),
        mask[:, None],
    )
    return out[:, width:]


def draft_batch(
    drafter: EagleDrafter,
    embed: nn.Embedding,
    lm_head: nn.Linear,
    plan: DraftPlan,
    roots: torch.Tensor,
    root_features: torch.Tensor,
    positions: torch.Tensor,
    window: Window,
) -> torch.Tensor:
    """Candidate tokens (B, T) of every sequence's static tree, drafted together: per depth one
    drafter pass over the batch (context windows left-padded and masked), one LM head over the
    nodes expanded (each parent once) and one gather of the children's ranks. roots (B,),
    root_features (B, h), positions (B,) the roots' positions; `window` the sequences' context
    windows (Window.of a batch's histories; the static step keeps them as tensors). The same
    tokens as decoder.eagle_tree.draft_tree, sequence by sequence."""
    size = plan.tree.size
    tokens = roots[:, None].repeat(1, size)
    feats = root_features[:, None, :].repeat(1, size, 1)
    steps = zip(plan.runs, plan.masks, plan.expanded, plan.children, plan.parents, plan.slots, plan.ranks, plan.tops)
    for run, among, expanded, child, parent, slot, rank, top in steps:
        at = positions[:, None] + plan.depths[run][None, :]
        out = run_pass(drafter, embed, window, feats[:, run], tokens[:, run], at, among)
        tokens[:, child] = child_tokens(lm_head(out[:, expanded]), slot, rank, top)
        feats[:, child] = out[:, parent]
    return tokens


def chain_hits(
    drafter: EagleDrafter,
    embed: nn.Embedding,
    lm_head: nn.Linear,
    features: torch.Tensor,
    tokens: torch.Tensor,
    first: int,
    depth: int,
    topk: int,
) -> torch.Tensor:
    """At every position t = first .. T - 2 of one decoded sequence (the target's features
    (T, h) and tokens (T,); `first` the prompt's last position), where a step whose root is
    x_(t+1) could start: whether the drafter's rank-i token at depth k + 1 is x_(t+k+2), the
    token that came, drafting the chain of the tokens that came (each node's input the
    drafted feature of its parent, as in draft_batch), with the context window the decoder
    has there (the accepted positions since `first`, at most CONTEXT). Returns (positions,
    depth, topk) floats: 1 hit, 0 miss, NaN where that token lies past the end. Greedy
    verification accepts a tree's path exactly where these hits lie along it, so a static
    tree's steps replay through them (perfmodel.acceptance.batching.accepted_lengths)."""
    length, device = len(tokens), features.device
    starts = list(range(first, length - 1))
    histories = []
    for t in starts:
        since = range(max(first, t - CONTEXT), t)
        histories.append(([features[q] for q in since], [int(tokens[q + 1]) for q in since]))
    at = torch.tensor(starts, device=device)
    window = Window.of(histories, features[at], at + 1)
    ahead = (at[:, None] + 1 + torch.arange(depth + 1, device=device)[None, :]).clamp(max=length - 1)
    chain_tokens = tokens[ahead]  # the root and the tokens that came after it
    chain_feats = features[at][:, None, :].repeat(1, depth + 1, 1)
    causal = window_mask(depth, depth + 1, device)[0, 0]
    hits = torch.full((len(starts), depth, topk), float("nan"), device=device)
    for j in range(depth):
        nodes = slice(0, j + 1)
        out = run_pass(
            drafter, embed, window, chain_feats[:, nodes], chain_tokens[:, nodes], ahead[:, nodes], causal[nodes, nodes]
        )
        top = lm_head(out[:, j]).topk(topk, dim=-1).indices
        came = at + j + 2
        inside = came < length
        hits[inside, j] = (top[inside] == tokens[came[inside], None]).float()
        chain_feats[:, j + 1] = out[:, j]
    return hits
