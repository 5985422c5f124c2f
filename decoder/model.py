"""A Llama-family transformer in plain torch: RMSNorm, RoPE, grouped-query attention, SwiGLU.

Module names mirror Hugging Face's LlamaForCausalLM, so a checkpoint's state dict loads
with no key mapping. Inference runs over a preallocated KV cache with explicit position
ids and an attention mask, which is all tree attention needs: every tree node gets
position prefix_length + depth and sees the cached prefix plus its ancestors.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from perfmodel.base.attention_code import AttentionCode
from perfmodel.base.errors import PerfkitError
from perfmodel.models.hf_config import HFConfig, parse_hf_config


@dataclass(frozen=True)
class LlamaConfig(HFConfig):
    """A config.json the decoder can run: its fields are perfmodel.models.hf_config.HFConfig's
    (the one list, so the decoder runs exactly the shapes the cost model counts); this adds
    only what the decoder implements: plain RoPE, query heads a multiple of the KV heads."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.rope_type != "default":
            raise PerfkitError(f"config.json uses RoPE scaling {self.rope_type!r}; only plain RoPE is implemented")
        if self.num_attention_heads % self.num_key_value_heads:
            raise PerfkitError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of num_key_value_heads "
                f"{self.num_key_value_heads}"
            )

    @classmethod
    def from_hf(cls, cfg: HFConfig | dict) -> LlamaConfig:
        """From a config.json parsed by perfmodel.models.config (or its dict, parsed here the
        same way)."""
        if isinstance(cfg, dict):
            cfg = parse_hf_config(cfg)
        return cls(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(HFConfig)})

    def to_hf(self) -> dict:
        """The config.json to save: plain RoPE needs no rope key, so rope_type is left out
        (as transformers writes it); a model without heads says 0 rather than leaving the
        cost model to assume the default heads."""
        cfg = {k: v for k, v in dataclasses.asdict(self).items() if k != "rope_type"}
        cfg.update(
            medusa_num_heads=self.medusa_num_heads or 0,
            architectures=["LlamaForCausalLM"],
            model_type="llama",
            hidden_act="silu",
            attention_bias=False,
            mlp_bias=False,
        )
        return cfg


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos and sin (B, 1, T, head_dim) for integer positions (B, T), HF's half-split layout."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)[:, None]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class KVCache:
    """Keys and values of every layer, preallocated: (layers, batch, kv_heads, max_len, head_dim).

    Both live in one tensor, `kv` (keys then values), of which `k` and `v` are views: the
    static step's fused forward (decoder.fused) writes a layer's keys and values in one kernel."""

    def __init__(self, config: LlamaConfig, batch: int, max_len: int, device="cpu", dtype=torch.float32):
        shape = (config.num_hidden_layers, batch, config.num_key_value_heads, max_len, config.head_dim)
        self.kv = torch.zeros((2, *shape), device=device, dtype=dtype)
        self.k, self.v = self.kv.unbind(0)
        self.max_len = max_len

    def write(self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v (B, kv_heads, T, D) at cache slots `positions` (B, T), per sequence."""
        index = positions[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[3])
        self.k[layer].scatter_(2, index, k)
        self.v[layer].scatter_(2, index, v)

    def move(self, batch_index: int, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy slots src -> dst (1-D index tensors) of one sequence, in every layer."""
        self.k[:, batch_index, :, dst] = self.k[:, batch_index, :, src]
        self.v[:, batch_index, :, dst] = self.v[:, batch_index, :, src]


def matmul_attention(q, keys, values, mask) -> torch.Tensor:
    """Attention written out as Medusa's and EAGLE's modeling_llama_kv.py write it
    (perfmodel.base.attention_code): q k^T, scaled, the mask added (or, boolean, applied), a
    float32 softmax cast back, then the values; the KV heads repeated for grouped queries."""
    if keys.shape[1] != q.shape[1]:
        keys = keys.repeat_interleave(q.shape[1] // keys.shape[1], dim=1)
        values = values.repeat_interleave(q.shape[1] // values.shape[1], dim=1)
    scores = torch.matmul(q, keys.transpose(2, 3)) / q.shape[-1] ** 0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min) if mask.dtype == torch.bool else scores + mask
    return torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), values)


class Attention(nn.Module):
    """Grouped-query attention over the KV cache; `code` (perfmodel.base.attention_code) is
    the attention the cached step runs: torch's fused SDPA, or written out as matmuls."""

    def __init__(self, config: LlamaConfig, code: AttentionCode = AttentionCode.SDPA):
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.code = AttentionCode(code)
        self.heads, self.kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, d
        self.q_proj = nn.Linear(h, self.heads * d, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.heads * d, h, bias=False)

    def forward(self, x, cos, sin, cache: KVCache | None, layer: int, slots, mask, kv_len: int) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        gqa = self.heads != self.kv_heads
        if cache is None:  # training / full recompute: plain causal attention over x itself
            out = F.scaled_dot_product_attention(q, k, v, is_causal=mask is None, attn_mask=mask, enable_gqa=gqa)
        else:
            cache.write(layer, slots, k, v)
            keys, values = cache.k[layer][:, :, :kv_len], cache.v[layer][:, :, :kv_len]
            if self.code is AttentionCode.MATMUL:
                out = matmul_attention(q, keys, values, mask)
            else:
                out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=gqa)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, cos, sin, cache, layer, slots, mask, kv_len):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, layer, slots, mask, kv_len)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class Transformer(nn.Module):
    """LlamaForCausalLM's structure: `model` (embeddings, layers, final norm) and `lm_head`."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        for module in self.modules():  # Llama's initializer_range; torch's defaults blow up tied logits
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def hidden(
        self, tokens, positions=None, cache: KVCache | None = None, slots=None, mask=None, kv_len: int = 0
    ) -> torch.Tensor:
        """Final-norm hidden states (B, T, h).

        Without a cache: causal attention over `tokens` (training, full recompute).
        With a cache: tokens are written to cache `slots` (B, T) and attend to cache slots
        [0, kv_len) through the additive or boolean `mask` (B, 1, T, kv_len).
        """
        if positions is None:
            positions = torch.arange(tokens.shape[1], device=tokens.device).expand(tokens.shape[0], -1)
        x = self.model.embed_tokens(tokens)
        cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, x.dtype)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, cache, i, slots, mask, kv_len)
        return self.model.norm(x)

    def forward(self, tokens, **kwargs) -> torch.Tensor:
        return self.lm_head(self.hidden(tokens, **kwargs))

    def with_attention(self, code: AttentionCode) -> Transformer:
        """This model with its cached steps' attention run as `code` (perfmodel.base.attention_code)."""
        for layer in self.model.layers:
            layer.self_attn.code = AttentionCode(code)
        return self
