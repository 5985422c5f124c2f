"""The bytes a plain decoding step of the reference decoder reads from memory: the figure the
twin divides by the plain step's time for its bandwidth (profilers.closed_loop.twin.streamed).

Every weight is read once, save the embedding table: a step gathers only the rows of the
tokens it embeds (one a sequence in the plain step), so the rest of the table (llama-2-7b's
32000 x 4096 fp16: 0.26 GB) stays in memory unread. Where the LM head is tied to the table
(the checkpoint's config.tie_word_embeddings, decoder.model.Transformer shares the tensor),
the LM head's GEMM reads the table whole, and the parameters count it once. Then the KV cache
the step attends over: every layer's keys and values over `kv_tokens` positions a sequence.
"""

from __future__ import annotations

from torch import nn


def plain_step_bytes(model: nn.Module, batch: int, kv_tokens: int) -> int:
    """Bytes one plain step of `model` (decoder.model.Transformer: `config`, `model.embed_tokens`)
    reads at `batch` sequences over a cache of `kv_tokens` positions (module doc)."""
    cfg = model.config
    params = list(model.parameters())  # a tied LM head and table are one parameter, counted once
    element = params[0].element_size()
    weights = sum(p.numel() * p.element_size() for p in params)
    if not cfg.tie_word_embeddings:
        table = model.model.embed_tokens.weight
        weights += (batch * cfg.hidden_size - table.numel()) * table.element_size()
    kv = 2 * cfg.num_hidden_layers * batch * cfg.num_key_value_heads * cfg.head_dim * kv_tokens * element
    return int(weights + kv)
