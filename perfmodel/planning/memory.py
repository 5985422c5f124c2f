"""Memory a model needs on a device: weights, Medusa heads (or another drafter's weights) and
KV cache, counted from the operator table (perfmodel.models.operators) so memory holds the same
matrices the step's cost reads. GB = 1e9 bytes, as the device specs give memory."""

from __future__ import annotations

import math
from dataclasses import dataclass

from perfmodel.base.drafter_kind import DrafterKind
from perfmodel.base.dtypes import element_bytes
from perfmodel.base.precision import kv_bytes
from perfmodel.base.precision import weight_bytes as precision_weight_bytes
from perfmodel.hardware.specs import HardwareSpec
from perfmodel.models.config import ModelConfig
from perfmodel.models.mla_operators import mla_weight_elements
from perfmodel.models.operators import op_kernels
from perfmodel.models.window import kv_share

GB = 1e9
DEFAULT_RESERVE = 0.1


ATTENTION_WEIGHT_OPS = ("q", "k", "v", "o")
MLP_WEIGHT_OPS = ("up", "gate", "down")


def linear_params(op: str, model: ModelConfig) -> int:
    """Weights of operator `op`, shaped by the operator table (perfmodel.models.operators) so
    memory counts the same matrices the step's cost reads."""
    return sum(math.prod(m.right_shape) for m in op_kernels(op, "decode", model, 1, 1) if m.weight)


def expert_params(model: ModelConfig) -> int:
    """An MoE model's experts: each h x expert size thrice (gate, up, down), in every expert layer."""
    moe = model.moe
    return moe.moe_layers * 3 * model.hidden_size * moe.expert_size * moe.experts if moe else 0


def attention_params(model: ModelConfig) -> int:
    """One layer's attention weights: q, k, v and o, or a latent-attention module's projections."""
    if model.mla is not None:
        return mla_weight_elements(model)
    return sum(linear_params(op, model) for op in ATTENTION_WEIGHT_OPS)


def layer_linear_params(model: ModelConfig) -> int:
    """The decoder layers' linear weights (what a quantized checkpoint stores in its format):
    attention's in every layer, the dense MLP's in the dense layers, and in an MoE model's
    expert layers every expert and any shared one."""
    attention = model.num_layers * attention_params(model)
    dense = model.dense_layers * sum(linear_params(op, model) for op in MLP_WEIGHT_OPS)
    moe = model.moe
    shared = moe.moe_layers * linear_params("shared_expert", model) if moe and moe.shared_size else 0
    return attention + dense + expert_params(model) + shared


def weight_params(model: ModelConfig) -> int:
    """Parameters of the base model: embeddings, the layers' linear weights (layer_linear_params)
    and 2 norms a layer, an MoE layer's router (h x experts, kept in 16 bits), the final norm,
    and the lm_head unless it is the embedding matrix (tied)."""
    h = model.hidden_size
    routers = model.moe.moe_layers * linear_params("router", model) if model.moe else 0
    lm_head = 0 if model.tie_word_embeddings else linear_params("lm_head", model)
    return model.vocab_size * h + layer_linear_params(model) + 2 * h * model.num_layers + routers + h + lm_head


def weight_bytes(model: ModelConfig, dtype: str) -> float:
    """Bytes of the base model's weights: the decoder layers' linear weights in the model's
    quantized format (perfmodel.base.precision, its scales counted) where it has one, an MoE
    model's experts in their own where the checkpoint stores them apart (gpt-oss's mxfp4), the
    rest (embeddings, norms, routers, the LM head: every quantized checkpoint here keeps them
    in 16 bits) in `dtype`."""
    size = element_bytes(dtype)
    linear = layer_linear_params(model)
    experts = expert_params(model) if model.moe and model.moe.experts_format else 0
    stored = experts * precision_weight_bytes(model.moe.experts_format, size) if experts else 0.0
    layers = (linear - experts) * precision_weight_bytes(model.weights, size)
    return stored + layers + (weight_params(model) - linear) * size


def head_params(model: ModelConfig) -> int:
    """Medusa heads: each a residual block (h x h weight and its bias of h; the operator
    table has no biases) and its own vocabulary projection (h x V)."""
    return linear_params("medusa_heads", model) + model.medusa_heads * model.hidden_size


def feature_head_bytes(kind: DrafterKind, head: ModelConfig, target: ModelConfig, dtype: str) -> float:
    """An EAGLE or EAGLE-3 head's or an MTP module's weights in bytes (perfmodel.latency.draft_weights):
    its fc (2h or, EAGLE-3's, 3h -> h), its layer(s) (EAGLE-3's q/k/v reading 2h; an MTP module's
    the target's own, its experts and latent attention too, in the target's format) with their
    norms, and its own LM head where its vocabulary is not the target's (EAGLE-3's
    draft_vocab_size); the embedding and an LM head of the target's vocabulary are the target's."""
    size = element_bytes(dtype)
    fc = linear_params("eagle3_fc" if kind == DrafterKind.EAGLE3 else "eagle_fc", head)
    if kind == DrafterKind.EAGLE3:
        ops = ("eagle3_qkv", "o", "up", "gate", "down")
        layers = head.num_layers * sum(linear_params(op, head) for op in ops) * size
    else:  # an MTP module is stored as its target's layers are; an EAGLE head in 16 bits
        stored = head.weights if kind == DrafterKind.MTP else None
        layers = layer_linear_params(head) * precision_weight_bytes(stored, size)
    routers = head.moe.moe_layers * linear_params("router", head) if head.moe else 0
    own_head = linear_params("lm_head", head) if head.vocab_size != target.vocab_size else 0
    return layers + (fc + 2 * head.hidden_size * head.num_layers + routers + own_head) * size


def kv_bytes_per_token(model: ModelConfig, dtype: str) -> int:
    """Key and value of every layer for one token (a latent-attention layer's one latent)."""
    per_layer = model.mla.cache_width if model.mla else 2 * model.num_kv_heads * model.head_dim
    return int(model.num_layers * per_layer * kv_bytes(model.kv_cache, element_bytes(dtype)))


def replica_kv_bytes_per_token(model: ModelConfig, dtype: str, tp: int) -> int:
    """Key and value of one token on all tp devices of a replica: each keeps its shard's KV
    heads, so where the model has fewer KV heads than tp they are replicated, not split (a
    latent-attention model's latent is every head's: each device keeps it whole)."""
    return tp * kv_bytes_per_token(model.shard(tp), dtype)


def usable_bytes(spec: HardwareSpec, reserve: float) -> float:
    return spec.memory_gb * GB * (1 - reserve)


@dataclass(frozen=True)
class DrafterMemory:
    """What a drafter outside the step holds beside the target, per replica: its weights and
    the KV cache it keeps per token (a head's layer, a draft model's every layer)."""

    weights: float
    kv_token: float
    what: str  # in words: "the EAGLE-3 head", "the draft model vicuna-68m", ...


@dataclass(frozen=True)
class MemoryFit:
    """One replica of tp devices: what it holds, in bytes over all its devices, and the
    largest batch of sequences of kv_tokens tokens that fits beside the weights."""

    tp: int
    weights: float
    heads: float
    kv_token: float
    kv_tokens: int
    usable: float
    drafter: str = "heads"  # what `heads` holds: the Medusa heads, or another drafter's weights
    drafter_memory: DrafterMemory | None = None  # that drafter's, where it is not the heads

    @property
    def holds(self) -> str:
        """What the fixed part is: the weights, with the heads (or the drafter) where counted."""
        return f"weights and {self.drafter}" if self.heads else "weights"

    @property
    def free(self) -> float:
        return self.usable - self.weights - self.heads

    @property
    def kv_sequence(self) -> float:
        return self.kv_token * self.kv_tokens

    @property
    def max_batch(self) -> int:
        return max(0, int(self.free // self.kv_sequence))


def memory_fit(
    model: ModelConfig,
    spec: HardwareSpec,
    dtype: str,
    tp: int,
    kv_tokens: int,
    reserve: float,
    *,
    heads: bool,
    drafter: DrafterMemory | None = None,
) -> MemoryFit:
    """Weights (and the Medusa heads where the configuration runs them, `heads`, or another
    drafter's weights and KV cache) split evenly over tp devices of `spec`, the KV cache as
    the shards keep it (replica_kv_bytes_per_token); `reserve` of each device is kept free. A
    deployment without Medusa loads no heads."""
    # windowed layers keep the last window's tokens only (perfmodel.models.window)
    kv_token = replica_kv_bytes_per_token(model, dtype, tp) * kv_share(model.window, model.num_layers, kv_tokens)
    usable = usable_bytes(spec, reserve) * tp
    weights = weight_bytes(model, dtype)
    if drafter is not None:
        total_kv = kv_token + drafter.kv_token
        return MemoryFit(tp, weights, drafter.weights, total_kv, kv_tokens, usable, drafter.what, drafter)
    return MemoryFit(
        tp, weights, head_params(model) * element_bytes(dtype) if heads else 0.0, kv_token, kv_tokens, usable
    )
