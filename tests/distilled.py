"""A small random model with Medusa heads self-distilled on its own greedy continuations
(Medusa-1 in miniature), so trees really accept several tokens per step: built once per
test session (conftest's `decoder` fixture) for every test that decodes with it."""

from __future__ import annotations

from pathlib import Path

import torch

from decoder.checkpoint import Checkpoint
from decoder.heads import MedusaHeads, medusa_loss
from decoder.medusa import Decoder
from decoder.model import LlamaConfig, Transformer

CONFIG = LlamaConfig(
    vocab_size=48,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    rope_theta=500.0,
)
PROMPTS = [[1, 2, 3, 4, 5, 6], [7, 8], [9, 10, 11, 12, 13, 14, 15, 3, 4, 5], [5]]


def distilled_decoder(saved: Path | None = None) -> Decoder:
    """The distilled decoder; with `saved`, its weights are read from that file where it
    exists (another xdist worker of the run trained them), else trained and written there."""
    if saved is not None and saved.exists():
        weights = torch.load(saved, weights_only=True)
        model = Transformer(CONFIG).eval()
        model.load_state_dict(weights["model"])
        heads = MedusaHeads(32, 48, 4, lm_head=model.lm_head.weight.data)
        heads.load_state_dict(weights["heads"])
        return Decoder(Checkpoint(None, CONFIG, model, heads.eval(), None, None, {}))
    torch.manual_seed(0)
    model = Transformer(CONFIG).eval()
    heads = MedusaHeads(32, 48, 4, lm_head=model.lm_head.weight.data)
    plain = Decoder(Checkpoint(None, CONFIG, model, None, None, None, {}))
    prompts = torch.randint(0, 48, (64, 4)).tolist()
    sequences = torch.tensor([p + t for p, t in zip(prompts, plain.generate(prompts, 40).tokens)])
    with torch.no_grad():
        hidden = model.hidden(sequences)
    optimizer = torch.optim.Adam(heads.parameters(), lr=1e-2)
    for _ in range(150):
        loss, _ = medusa_loss(heads(hidden), sequences)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if saved is not None:
        torch.save({"model": model.state_dict(), "heads": heads.state_dict()}, saved)
    return Decoder(Checkpoint(None, CONFIG, model, heads.eval(), None, None, {}))
