"""Medusa heads: p_t^(k) = softmax(W2^(k) (SiLU(W1^(k) h_t) + h_t)), head k predicting t+k+1.

Laid out as the reference implementation lays them out (a ModuleList of Sequential(
ResBlock x num_layers, Linear(h, V))), so its heads files load unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ResBlock(nn.Module):
    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)  # starts as the identity: heads begin as the LM head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


class MedusaHeads(nn.ModuleList):
    def __init__(
        self,
        hidden_size: int,
        vocab_size: int,
        num_heads: int,
        num_layers: int = 1,
        lm_head: torch.Tensor | None = None,
    ):
        super().__init__(
            nn.Sequential(
                *[ResBlock(hidden_size) for _ in range(num_layers)], nn.Linear(hidden_size, vocab_size, bias=False)
            )
            for _ in range(num_heads)
        )
        if lm_head is not None:  # W2 starts from the LM head (Medusa-1 recipe)
            for head in self:
                head[-1].weight.data.copy_(lm_head)
        self.num_layers = num_layers

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits (heads, *hidden.shape[:-1], vocab)."""
        return torch.stack([head(hidden) for head in self])


def head_weights(num_heads: int, decay: float = 0.8) -> torch.Tensor:
    """lambda_k = decay^k for heads k = 1..K (Medusa-1)."""
    return decay ** torch.arange(1, num_heads + 1, dtype=torch.float32)


def medusa_loss(
    logits: torch.Tensor, tokens: torch.Tensor, decay: float = 0.8, target_mask: torch.Tensor | None = None
):
    """Sum_k lambda_k CE(head k at t, token t+k+1), and each head's top-1 accuracy.

    logits: (K, B, T, V) from hidden states of tokens[:, :T]; tokens: (B, T_total);
    target_mask: (B, T_total) bool, which tokens count as targets (default all).
    """
    weights = head_weights(logits.shape[0], decay).to(logits.device)
    total, accuracy = logits.new_zeros((), dtype=torch.float32), []
    for k in range(logits.shape[0]):
        shift = k + 2  # head k (0-based) at position t predicts token t + k + 2
        pred = logits[k, :, : tokens.shape[1] - shift]
        target = tokens[:, shift : shift + pred.shape[1]]
        keep = (
            torch.ones_like(target, dtype=torch.bool)
            if target_mask is None
            else target_mask[:, shift : shift + pred.shape[1]]
        )
        pred, target = pred[keep].float(), target[keep]
        total = total + weights[k] * F.cross_entropy(pred, target)
        accuracy.append((pred.argmax(-1) == target).float().mean())
    return total, torch.stack(accuracy)


def topk_accuracy(logits: torch.Tensor, tokens: torch.Tensor, topk: int, target_mask: torch.Tensor | None = None):
    """a_k^(i) as a (K, topk) numpy array: how often the rank-i prediction of head k is the
    token k+1 steps past the next (paper 2.3.3; top-i minus top-(i-1) accuracy)."""
    rows = []
    for k in range(logits.shape[0]):
        shift = k + 2
        ranked = logits[k, :, : tokens.shape[1] - shift].topk(topk, dim=-1).indices
        target = tokens[:, shift : shift + ranked.shape[1]]
        keep = (
            torch.ones_like(target, dtype=torch.bool)
            if target_mask is None
            else target_mask[:, shift : shift + ranked.shape[1]]
        )
        hits = (ranked == target[..., None])[keep].float()
        rows.append(hits.mean(0))
    return torch.stack(rows).numpy()
