"""EAGLE-style feature drafting (Li et al. 2024): one small decoder layer that drafts the
target's next feature from its current feature and the embedding of the token after it.

At position p the drafter reads (f_p, e(x_(p+1))): the target's final hidden state f_p and
the embedding of the token that follows, fused by fc: 2h -> h, runs one decoder layer (the
target's own layer shapes) and a norm, and predicts f_(p+1); the target's LM head reads the
token after that from it. Repeating this from the predicted feature drafts deeper tokens,
which is what makes EAGLE autoregressive where Medusa's heads all read the same state.
The drafter shares the target's embedding and LM head (not its own parameters).

Attention: the drafter sees a short window, not the whole prefix: the last CONTEXT accepted
positions' inputs and, in a tree, the node's draft ancestors. It is trained with the same
window (a sliding causal mask of CONTEXT + depth positions), so drafting sees what training
saw; the target's feature already carries the long context. EAGLE proper keeps a KV cache
of the drafter over the whole prefix; this keeps the drafter's cost independent of context
on a model whose features are its context's summary.

Drafting a static tree (a Tree of rank paths, as Medusa's): depth by depth, every node of
the depth above is run (with its ancestors and the context window), and each child takes
rank r of its parent's drafted distribution. `dynamic_eagle_tree` expands instead the most
confident nodes (EAGLE-2's rule) up to a token budget and depth.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from decoder.model import DecoderLayer, LlamaConfig, RMSNorm, rope_cos_sin
from perfmodel.acceptance.trees import Tree

CONTEXT = 4  # accepted positions the drafter attends to besides the tree
EAGLE_FILE = "eagle_drafter.safetensors"


class EagleDrafter(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        h = config.hidden_size
        self.config = config
        self.fc = nn.Linear(2 * h, h, bias=True)
        self.layer = DecoderLayer(config)
        self.norm = RMSNorm(h, config.rms_norm_eps)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)

    def forward(self, features, embeddings, positions, mask=None) -> torch.Tensor:
        """Predicted next features (B, T, h) from features and next-token embeddings (B, T, h)
        at integer positions (B, T); mask (B, 1, T, T) bool, or None for causal."""
        x = self.fc(torch.cat([embeddings, features], dim=-1))
        cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, x.dtype)
        return self.norm(self.layer(x, cos, sin, None, 0, None, mask, 0))


def parameters_of(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def window_mask(length: int, window: int, device=None) -> torch.Tensor:
    """(1, 1, T, T) bool: causal, each position seeing itself and the window - 1 before it."""
    i = torch.arange(length, device=device)
    rel = i[:, None] - i[None, :]
    return ((rel >= 0) & (rel < window))[None, None]


def eagle_loss(
    drafter: EagleDrafter, features, tokens, embed, lm_head, window: int, cls_weight: float = 0.1, keep=None
):
    """L_reg + w_cls L_cls over sequences: position p reads (f_p, e(x_(p+1))) and is scored
    against f_(p+1) (smooth L1) and x_(p+2) (cross entropy of the LM head on its prediction).
    features: (B, T, h) the target's; tokens: (B, T); keep: (B, T) bool, the targets counted.
    Returns the loss and the top-1 token accuracy."""
    inputs = features[:, :-2]
    predicted = drafter(
        inputs,
        embed(tokens[:, 1:-1]),
        _positions(tokens[:, :-2]),
        window_mask(inputs.shape[1], window, features.device),
    )
    target_feature, target_token = features[:, 1:-1], tokens[:, 2:]
    mask = torch.ones_like(target_token, dtype=torch.bool) if keep is None else keep[:, 2:]
    regression = F.smooth_l1_loss(predicted[mask].float(), target_feature[mask].float())
    logits = lm_head(predicted[mask]).float()
    classification = F.cross_entropy(logits, target_token[mask])
    accuracy = (logits.argmax(-1) == target_token[mask]).float().mean()
    return regression + cls_weight * classification, accuracy


def _positions(tokens: torch.Tensor) -> torch.Tensor:
    return torch.arange(tokens.shape[1], device=tokens.device).expand(tokens.shape[0], -1)


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
        self.features[row] = (self.features[row] + list(features))[-(CONTEXT + 1) :]
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
    device = root_feature.device
    size, depths, parents = tree.size, torch.as_tensor(tree.depths), tree.parents
    ranks = [-1] + [p[-1] for p in tree.paths]
    context_features, context_tokens = history
    c = len(context_features)
    ctx_f = torch.stack(context_features) if c else root_feature.new_zeros(0, root_feature.shape[-1])
    ctx_t = torch.tensor(context_tokens, dtype=torch.long, device=device)
    tokens = torch.full((size,), root, dtype=torch.long, device=device)
    feats = root_feature.expand(size, -1).clone()
    ancestors = torch.as_tensor(tree.ancestor_mask, device=device)
    for depth in range(int(depths.max()) if size > 1 else 0):
        run = torch.nonzero(depths <= depth).ravel().to(device)
        n = c + len(run)
        mask = torch.zeros(n, n, dtype=torch.bool, device=device)
        mask[:c, :c] = window_mask(c, c + 1, device)[0, 0]
        mask[c:, :c] = True
        mask[c:, c:] = ancestors[run][:, run]
        positions = torch.cat([torch.arange(position - c, position, device=device), position + depths.to(device)[run]])
        out = drafter(
            torch.cat([ctx_f, feats[run]])[None],
            embed(torch.cat([ctx_t, tokens[run]]))[None],
            positions[None],
            mask[None, None],
        )[0, c:]
        drafted = dict(zip(run.tolist(), out))
        children = [i for i in range(1, size) if depths[i] == depth + 1]
        wanted = max(ranks[i] for i in children) + 1
        for parent in {int(parents[i]) for i in children}:
            top = lm_head(drafted[parent]).topk(wanted).indices
            for child in (i for i in children if int(parents[i]) == parent):
                tokens[child] = top[ranks[child]]
                feats[child] = drafted[parent]
    return tokens
