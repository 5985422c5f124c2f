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

Drafting trees with it: one sequence's in decoder.eagle_tree, a whole batch's at once in
decoder.eagle_batch.
"""

from __future__ import annotations

from enum import StrEnum

import torch
from torch import nn

from decoder.model import DecoderLayer, LlamaConfig, RMSNorm, rope_cos_sin

CONTEXT = 4  # accepted positions the drafter attends to besides the tree
EAGLE_DEPTH = 5  # the dynamic tree's draft passes: the deepest the drafter is trained for
EAGLE_FILE = "eagle_drafter.safetensors"


class EagleLayout(StrEnum):
    """The drafter's layer as this project builds it, or as vLLM's EAGLE-1 drafter
    (vllm/model_executor/models/llama_eagle.py) runs one: fc without a bias, no input norm
    before the layer's attention, no norm after the layer, and attention over every earlier
    position (vLLM keeps the drafter's KV cache over the whole prefix), not a window."""

    PROJECT = "project"
    VLLM = "vllm"


EAGLE_FILES = {EagleLayout.PROJECT: EAGLE_FILE, EagleLayout.VLLM: "eagle_drafter_vllm.safetensors"}
EAGLE_CARDS = {EagleLayout.PROJECT: "eagle", EagleLayout.VLLM: "eagle_vllm"}  # its training.json entry


class EagleDrafter(nn.Module):
    def __init__(self, config: LlamaConfig, layout: EagleLayout = EagleLayout.PROJECT):
        super().__init__()
        h = config.hidden_size
        self.config, self.layout = config, EagleLayout(layout)
        vllm = self.layout is EagleLayout.VLLM
        self.fc = nn.Linear(2 * h, h, bias=not vllm)
        self.layer = DecoderLayer(config)
        self.norm = RMSNorm(h, config.rms_norm_eps)
        if vllm:
            self.layer.input_layernorm, self.norm = nn.Identity(), nn.Identity()
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)

    @property
    def window(self) -> int | None:
        """The positions it attends to (None: all earlier ones)."""
        return None if self.layout is EagleLayout.VLLM else CONTEXT

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
