"""The acceptance schemes of decoder.acceptance over a whole batch at once, as tensor ops.

Each scheme takes the candidate tokens (B, T), the model's logits at every tree token
(B, T, V) and a StaticTree, and returns a Verdict: every sequence's accepted path (node
indices, root first, padded to the tree's depth + 1), its length and the next root. Nothing
is read back to the host and no Python loop runs over sequences, so a step built from them
can be captured in a CUDA graph. The per-sequence schemes stay the reference: greedy and
typical pick the same path as them (ties to the first path, the most likely path under
typical), rejection sampling draws from the same distribution (each child in rank order is
accepted with its probability under the residual, which drops it when rejected), with its
random numbers from a generator on the model's device instead of one CPU stream.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from decoder.acceptance import AcceptanceConfig
from decoder.tree import TreeBuffers, path_of_length


@dataclass(frozen=True)
class StaticTree:
    """A tree's buffers as fixed-shape tensors on the device (T tokens, depth + 1 = W)."""

    buffers: TreeBuffers
    parents: torch.Tensor  # (T,) each token's parent, the root its own
    retrieve: torch.Tensor  # (P, W) root-to-leaf paths, padding clamped to the root
    valid: torch.Tensor  # (P, W) which entries of retrieve are real
    children: torch.Tensor  # (T, C) each token's children in rank order, -1 padded
    level_fanout: tuple[int, ...]  # per depth, the most children a node there has
    by_length: torch.Tensor  # (W + 1, W) row l: a path of l tokens (path_of_length), 0 padded

    @classmethod
    def of(cls, buffers: TreeBuffers) -> StaticTree:
        device = buffers.mask.device
        tree = buffers.tree
        width = buffers.retrieve.shape[1]
        fanout = max(1, max(len(c) for c in buffers.children))
        children = torch.full((tree.size, fanout), -1, dtype=torch.long)
        for node, kids in enumerate(buffers.children):
            children[node, : len(kids)] = torch.tensor(kids, dtype=torch.long)
        depths = tree.depths
        level = [0] * width
        for node, kids in enumerate(buffers.children):
            level[int(depths[node])] = max(level[int(depths[node])], len(kids))
        by_length = torch.zeros(width + 1, width, dtype=torch.long)
        for length in range(1, width + 1):
            path = path_of_length(buffers, length)
            by_length[length, : len(path)] = torch.tensor(path)
        return cls(
            buffers=buffers,
            parents=torch.as_tensor(tree.parents, device=device).clamp(min=0).long(),
            retrieve=buffers.retrieve.clamp(min=0),
            valid=buffers.retrieve >= 0,
            children=children.to(device),
            level_fanout=tuple(level),
            by_length=by_length.to(device),
        )

    @property
    def size(self) -> int:
        return self.buffers.size

    @property
    def width(self) -> int:
        return self.retrieve.shape[1]


@dataclass(frozen=True)
class Verdict:
    path: torch.Tensor  # (B, W) accepted node indices, root first; past `length`, the root
    length: torch.Tensor  # (B,) accepted tokens, root included
    next_root: torch.Tensor  # (B,) the model's next token after the path


def _rows(batch: int, device) -> torch.Tensor:
    return torch.arange(batch, device=device)


def _longest(ok: torch.Tensor, tree: StaticTree, log_prob: torch.Tensor | None = None):
    """Per sequence, the longest root-to-leaf prefix whose every node is ok (ok: (B, T));
    ties go to the first path, or with log_prob (B, T), to the most likely one."""
    node_ok = ok[:, tree.retrieve] & tree.valid  # (B, P, W)
    node_ok[:, :, 0] = True
    kept = node_ok.long().cumprod(dim=2)
    run = kept.sum(dim=2)  # (B, P)
    if log_prob is None:
        best = run.argmax(dim=1)
    else:
        along = torch.where(kept.bool(), log_prob[:, tree.retrieve], torch.zeros((), device=log_prob.device))
        score = along[:, :, 1:].sum(dim=2)
        longest = run == run.amax(dim=1, keepdim=True)
        best = torch.where(longest, score, torch.full_like(score, -torch.inf)).argmax(dim=1)
    rows = _rows(ok.shape[0], ok.device)
    length = run[rows, best]
    path = tree.retrieve[best] * (torch.arange(tree.width, device=ok.device) < length[:, None])
    return path, length


def last_node(path: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
    """(B,) each path's last accepted node."""
    return path.gather(1, (length - 1)[:, None])[:, 0]


def verify_greedy(candidates, logits, tree: StaticTree, config: AcceptanceConfig, generator=None) -> Verdict:
    prediction = logits.argmax(dim=-1)  # (B, T)
    ok = prediction[:, tree.parents] == candidates
    path, length = _longest(ok, tree)
    return Verdict(path, length, prediction.gather(1, last_node(path, length)[:, None])[:, 0])


def verify_typical(candidates, logits, tree: StaticTree, config: AcceptanceConfig, generator=None) -> Verdict:
    probs = torch.softmax(logits.float() / config.temperature, dim=-1)
    entropy = -(probs * torch.log(probs + 1e-10)).sum(-1)  # (B, T)
    threshold = torch.minimum(torch.full_like(entropy, config.eps), config.delta * torch.exp(-entropy))
    token_prob = probs[:, tree.parents].gather(2, candidates[:, :, None])[:, :, 0]  # at each token's parent
    ok = token_prob > threshold[:, tree.parents]
    path, length = _longest(ok, tree, torch.log(token_prob))
    rows = _rows(candidates.shape[0], candidates.device)
    return Verdict(path, length, logits[rows, last_node(path, length)].argmax(dim=-1))


def sample(probs: torch.Tensor, generator=None) -> torch.Tensor:
    """(B,) one token per row of the (unnormalised) probs (B, V), by inverse CDF: no host
    read, unlike torch.multinomial's checks."""
    cdf = probs.cumsum(dim=-1)
    u = (1.0 - torch.rand(probs.shape[0], 1, device=probs.device, generator=generator)) * cdf[:, -1:]
    return (cdf < u).sum(dim=-1).clamp(max=probs.shape[-1] - 1)


def verify_rejection(candidates, logits, tree: StaticTree, config: AcceptanceConfig, generator=None) -> Verdict:
    """Rejection sampling down the tree, every sequence at once: at each depth, the current
    node's children in rank order, each accepted with its probability under the residual;
    a rejected child's token is dropped from the residual; a sequence none of whose children
    is accepted stops and draws its next root from what is left."""
    probs = torch.softmax(logits.float() / config.temperature, dim=-1)  # (B, T, V)
    batch, device = candidates.shape[0], candidates.device
    rows = _rows(batch, device)
    node = torch.zeros(batch, dtype=torch.long, device=device)
    length = torch.ones(batch, dtype=torch.long, device=device)
    walking = torch.ones(batch, dtype=torch.bool, device=device)
    next_root = torch.zeros(batch, dtype=torch.long, device=device)
    path = torch.zeros(batch, tree.width, dtype=torch.long, device=device)
    residual = probs[:, 0].clone()
    for depth, fanout in enumerate(tree.level_fanout):
        moved = torch.zeros(batch, dtype=torch.bool, device=device)
        for rank in range(fanout):
            child = tree.children[node, rank]
            trying = walking & ~moved & (child >= 0)
            token = candidates[rows, child.clamp(min=0)]
            p = residual[rows, token] / residual.sum(dim=-1)
            take = trying & (torch.rand(batch, device=device, generator=generator) < p)
            dropped = residual.scatter(1, token[:, None], 0.0)
            residual = torch.where((trying & ~take)[:, None], dropped, residual)
            node = torch.where(take, child, node)
            moved |= take
        stopped = walking & ~moved
        next_root = torch.where(stopped, sample(residual, generator), next_root)
        walking &= moved
        length += moved.long()
        if depth + 1 < tree.width:
            path[:, depth + 1] = torch.where(moved, node, path[:, depth + 1])
        residual = torch.where(moved[:, None], probs[rows, node], residual)
    return Verdict(path, length, next_root)


VERIFY = {"greedy": verify_greedy, "typical": verify_typical, "rejection": verify_rejection}
