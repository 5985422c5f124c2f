"""The static step's forward pass, fused as gpt-fast-style decoders fuse theirs, computing what
the reference model (decoder.model) computes.

The reference layer launches some 40 kernels: each RMSNorm eight (an fp32 upcast, square,
mean, add, rsqrt, multiply, downcast, weight), RoPE ten (a negation, a concatenation and three
elementwise ops for q and again for k), q, k and v three GEMMs, gate and up two, and the KV
write one scatter each for keys and values. The H200's CUDA-graph step streamed its weights at
35% of HBM bandwidth at batch 1 where its GEMMs alone reach 66-72%: the rest was those small
kernels (issue 57). Here, per layer 18 kernels instead of 40:

- q, k and v are one GEMM, gate and up another: the projections' weights joined row-wise
  (joined_weight), each output element the same dot product as before;
- each RMSNorm is torch's own (F.rms_norm, one kernel on a GPU: _fused_rms_norm), its weight
  applied after, as the reference rounds x * rsqrt(mean(x^2) + eps) to the model's dtype before
  weighting it (with the weight inside, torch rounds once and the outputs move);
- RoPE runs in place on q and k together, in four kernels: the rotated half is the roll of
  each head by half its width times a sin whose first half carries the minus sign (Rope): the
  same products and the same sum as the reference's cat of -x2 and x1;
- keys and values are written together, one index_put_ into the cache (KVCache.kv holds both).

Left as the reference runs them: the residual adds (summing the residual into the norm's
kernel, or into the GEMM's epilogue, rounds once where the reference rounds twice), the SwiGLU
product, attention itself, and the embedding, final projection and LM head. On a CPU every
op here gives the reference's bits (tests/test_fused_step_57.py: greedy tokens equal in the
static and compiled regimes, on the bundled model and the twin); on a GPU the fused norm
reduces in its own order, as a joined GEMM may pick another kernel, so there the check is
greedy tokens equal on a lent GPU (`pytest -m gpu`: tests/test_gpu.py's graph step, and the
twin's in tests/test_fused_step_57.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from decoder.model import DecoderLayer, KVCache, LlamaConfig, Transformer, rope_cos_sin
from perfmodel.base.errors import PerfkitError


def joined_weight(linears: list[nn.Linear]) -> torch.Tensor:
    """The weights of `linears` stacked row-wise in one tensor, each linear's weight then a view
    of its rows: the checkpoint's weights are held once (no copy beside them), and the eager
    reference, which runs the linears themselves, reads the same values. Joined once: on a
    model already joined, the tensor its weights already view."""
    for linear in linears:
        if type(linear) is not nn.Linear or linear.bias is not None:
            raise PerfkitError(
                f"the static step joins plain bias-free projections; got {type(linear).__name__} (a LoRA-adapted "
                "model decodes with --launch eager, or merge its adapters first)"
            )
    weights = [linear.weight for linear in linears]
    first = weights[0]
    rows = sum(w.shape[0] for w in weights)
    if is_joined(weights):
        return first.detach().as_strided((rows, first.shape[1]), first.stride())
    with torch.inference_mode(False), torch.no_grad():  # a plain tensor, whatever the caller's mode
        joined = torch.cat([w.detach() for w in weights])
        for linear, part in zip(linears, joined.split([w.shape[0] for w in weights])):
            linear.weight.data = part  # the same Parameter, now over the joined storage
    return joined


def is_joined(weights: list[torch.Tensor]) -> bool:
    """Whether `weights` are consecutive row blocks of one storage (joined_weight's work)."""
    storage = weights[0].untyped_storage()._cdata
    offset = weights[0].storage_offset()
    for w in weights:
        if w.untyped_storage()._cdata != storage or w.storage_offset() != offset or not w.is_contiguous():
            return False
        offset += w.numel()
    return True


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """decoder.model.RMSNorm's output through torch's RMSNorm: the normalised x in x's dtype,
    then the weight (see the module doc)."""
    return weight * F.rms_norm(x, (x.shape[-1],), None, eps)


@dataclass(frozen=True)
class Rope:
    """A step's rotary tables, (B, T, 1, head_dim) to broadcast over the heads of (B, T, heads,
    head_dim): cos, and sin with its first half negated, so that x * cos + roll(x) * sin is the
    reference's x * cos + cat(-x2, x1) * sin (a product's sign is exact)."""

    cos: torch.Tensor
    sin: torch.Tensor

    @classmethod
    def of(cls, positions: torch.Tensor, config: LlamaConfig, dtype: torch.dtype) -> Rope:
        cos, sin = rope_cos_sin(positions, config.head_dim, config.rope_theta, dtype)
        half = config.head_dim // 2
        signed = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)
        return cls(cos.transpose(1, 2), signed.transpose(1, 2))

    def rotate_(self, x: torch.Tensor) -> None:
        """Rotate x (B, T, heads, head_dim) in place: four kernels."""
        rolled = x.roll(x.shape[-1] // 2, dims=-1)
        rolled.mul_(self.sin)
        x.mul_(self.cos).add_(rolled)


@dataclass(frozen=True)
class KVSlots:
    """Where a step's keys and values go in a layer's KVCache.kv slice (2, B, kv_heads, max_len,
    head_dim): index tensors broadcasting to (B, T, 2, kv_heads), the layout of the k and v
    columns of the joined projection's output, so one index_put_ writes both."""

    part: torch.Tensor  # (1, 1, 2, 1): keys, values
    rows: torch.Tensor  # (B, 1, 1, 1)
    heads: torch.Tensor  # (1, 1, 1, kv_heads)
    slots: torch.Tensor  # (B, T, 1, 1)

    @classmethod
    def of(cls, slots: torch.Tensor, kv_heads: int) -> KVSlots:
        device = slots.device
        return cls(
            torch.arange(2, device=device).view(1, 1, 2, 1),
            torch.arange(slots.shape[0], device=device).view(-1, 1, 1, 1),
            torch.arange(kv_heads, device=device).view(1, 1, 1, -1),
            slots.view(*slots.shape, 1, 1),
        )

    def write(self, cache: KVCache, layer: int, kv: torch.Tensor) -> None:
        """Store kv (B, T, 2, kv_heads, head_dim) at the slots of `layer`."""
        cache.kv[:, layer].index_put_((self.part, self.rows, self.heads, self.slots), kv)


class FusedLayer(nn.Module):
    """One decoder layer's forward, fused (module doc). Holds views of the layer's weights, no
    parameters of its own; a module, so a trace tags its kernels as a layer's
    (decoder.trace_recorder.module_calls)."""

    def __init__(self, layer: DecoderLayer, config: LlamaConfig):
        super().__init__()
        attn, mlp = layer.self_attn, layer.mlp
        self.heads, self.kv_heads, self.head_dim = attn.heads, attn.kv_heads, attn.head_dim
        self.eps = config.rms_norm_eps
        # plain tensors (views), not parameters: the model owns them
        self.qkv = joined_weight([attn.q_proj, attn.k_proj, attn.v_proj])
        self.gate_up = joined_weight([mlp.gate_proj, mlp.up_proj])
        self.o = attn.o_proj.weight.detach()
        self.down = mlp.down_proj.weight.detach()
        self.input_norm = layer.input_layernorm.weight.detach()
        self.post_norm = layer.post_attention_layernorm.weight.detach()

    def forward(self, x, rope: Rope, cache: KVCache, layer: int, where: KVSlots, mask, kv_len: int) -> torch.Tensor:
        b, t, _ = x.shape
        heads, kv_heads = self.heads, self.kv_heads
        qkv = F.linear(rms_norm(x, self.input_norm, self.eps), self.qkv).view(b, t, heads + 2 * kv_heads, -1)
        rope.rotate_(qkv[:, :, : heads + kv_heads])
        where.write(cache, layer, qkv[:, :, heads:].unflatten(2, (2, kv_heads)))
        q = qkv[:, :, :heads].transpose(1, 2)
        keys, values = cache.k[layer][:, :, :kv_len], cache.v[layer][:, :, :kv_len]
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=heads != kv_heads)
        x = x + F.linear(out.transpose(1, 2).reshape(b, t, -1), self.o)
        gate, up = F.linear(rms_norm(x, self.post_norm, self.eps), self.gate_up).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, self.down)


@dataclass(frozen=True)
class FusedForward:
    """Transformer.hidden for a cache, fused: the static step's forward in every static regime
    (static, graph, compiled). Built once per step from the model's own weights (joined in
    place the first time: no second copy); the eager decoder keeps the reference."""

    model: Transformer
    layers: tuple[FusedLayer, ...]

    @classmethod
    def of(cls, model: Transformer) -> FusedForward:
        return cls(model, tuple(FusedLayer(layer, model.config) for layer in model.model.layers))

    def hidden(self, tokens, positions, cache: KVCache, slots, mask, kv_len: int) -> torch.Tensor:
        """Final-norm hidden states (B, T, h) of `tokens` written to cache `slots` (B, T),
        attending to cache slots [0, kv_len) through `mask` (Transformer.hidden's contract)."""
        config = self.model.config
        x = self.model.model.embed_tokens(tokens)
        rope = Rope.of(positions, config, x.dtype)
        where = KVSlots.of(slots, config.num_key_value_heads)
        for i, layer in enumerate(self.layers):
            x = layer(x, rope, cache, i, where, mask, kv_len)
        return rms_norm(x, self.model.model.norm.weight.detach(), config.rms_norm_eps)
