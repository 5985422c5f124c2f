"""What one layer's latent-attention module costs on one device (perfmodel.models.operators's
`mla` op; the shapes: perfmodel.models.latent_attention), kernel by kernel:

- the down-projection, whole on every device: h -> query latent + KV latent + rotary key;
- the query's up-projection (query latent -> the device's heads x (nope + rope)), or without a
  query latent the query projected from the hidden state;
- decoding (one token, or a tree's tokens, per sequence): the key up-projection absorbed into
  each head's query (nope -> KV latent), attention over the cached latents as one KV head
  (scores against latent + rotary key, values the latent), the value up-projection absorbed
  after it (KV latent -> v), as FlashMLA and TensorRT-LLM's MLA kernels run it;
- prefill: the KV latent expanded by the KV up-projection (latent -> heads x (nope + v)) and
  causal attention of query/key size nope + rope and value size v;
- the output projection (heads x v -> h).

The module's norms and RoPE are small elementwise work and not counted here (the measured
module tables time them with the rest).
"""

from __future__ import annotations

from dataclasses import dataclass

from perfmodel.base.errors import PerfkitError
from perfmodel.models.kernels import FusedAttention, Matmul


@dataclass(frozen=True)
class LatentAttentionKernel:
    """Decoding attention over cached latents: `heads` query heads of `q_len` tokens per
    sequence score against the kv_len cached latents (width `cache_width`: the KV latent and the
    rotary key) and sum the KV latent (width `latent`) by those scores. The cache is read once
    (keys and values are the same latents); the scores never reach memory."""

    batch: object
    heads: int
    q_len: object
    kv_len: object
    cache_width: int
    latent: int

    @property
    def flops(self):
        return 2 * self.batch * self.heads * self.q_len * self.kv_len * (self.cache_width + self.latent)

    @property
    def cached_elements(self):
        return self.batch * self.kv_len * self.cache_width

    @property
    def elements(self):
        queries = self.batch * self.heads * self.q_len * (self.cache_width + self.latent)  # read, and the output
        return queries + self.cached_elements


def mla_kernels(model, prefill: bool, batch, q_len, kv_len) -> tuple:
    """The module's kernels on one device (`model` a shard: its num_heads are the device's) for
    `batch` sequences of `q_len` new tokens attending to `kv_len` tokens (the module doc)."""
    mla = model.mla
    if mla is None:
        raise PerfkitError(f"mla: {model.name} has no latent attention (its attention is qkv, sdpa and o)")
    h, n = model.hidden_size, model.num_heads
    tokens = batch * q_len

    def linear(k: int, width: int) -> Matmul:
        return Matmul(1, tokens, k, width, weight=True)

    down = (linear(h, mla.down_width),)
    query = linear(mla.q_lora_rank, n * mla.qk_head_dim) if mla.q_lora_rank else linear(h, n * mla.qk_head_dim)
    out = linear(n * mla.v_head_dim, h)
    if prefill:
        keys_values = linear(mla.kv_lora_rank, n * (mla.qk_nope_head_dim + mla.v_head_dim))
        # query/key width nope + rope, value width v: their mean as one head size counts both exactly
        size = (mla.qk_head_dim + mla.v_head_dim) / 2
        attention = FusedAttention(batch, n, n, q_len, kv_len, size, causal=True)
        return (*down, query, keys_values, attention, out)
    # each head's slice of the KV up-projection, a weight batched over the heads
    absorb_keys = Matmul(n, tokens, mla.qk_nope_head_dim, mla.kv_lora_rank, weight=True)
    attention = LatentAttentionKernel(batch, n, q_len, kv_len, mla.cache_width, mla.kv_lora_rank)
    absorb_values = Matmul(n, tokens, mla.kv_lora_rank, mla.v_head_dim, weight=True)
    return (*down, query, absorb_keys, attention, absorb_values, out)


def mla_weight_elements(model) -> int:
    """The module's projection weights on one device: its prefill form's weight GEMMs (the
    absorbed decoding form reads the same KV up-projection, split in two); its two latents'
    norms (their widths) are too small to count."""
    kernels = mla_kernels(model, True, 1, 1, 1)
    return int(sum(k.k * k.n for k in kernels if isinstance(k, Matmul) and k.weight))
