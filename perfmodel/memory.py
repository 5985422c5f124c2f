"""Memory a model needs on a device: weights, Medusa heads and KV cache, counted from the
operator table (perfmodel.operators) so memory holds the same matrices the step's cost
reads. GB = 1e9 bytes, as the device specs give memory."""

from __future__ import annotations

import math

from perfmodel.dtypes import element_bytes
from perfmodel.hardware import HardwareSpec
from perfmodel.models import ModelConfig
from perfmodel.operators import op_kernels

GB = 1e9
DEFAULT_RESERVE = 0.1


LAYER_WEIGHT_OPS = ("q", "k", "v", "o", "up", "gate", "down")


def linear_params(op: str, model: ModelConfig) -> int:
    """Weights of operator `op`, shaped by the operator table (perfmodel.operators) so
    memory counts the same matrices the step's cost reads."""
    return sum(math.prod(m.right_shape) for m in op_kernels(op, "decode", model, 1, 1) if m.weight)


def weight_params(model: ModelConfig) -> int:
    """Parameters of the base model: embeddings, per layer the attention and MLP weights and
    2 norms, the final norm, and the lm_head unless it is the embedding matrix (tied)."""
    h = model.hidden_size
    layer = sum(linear_params(op, model) for op in LAYER_WEIGHT_OPS) + 2 * h
    lm_head = 0 if model.tie_word_embeddings else linear_params("lm_head", model)
    return model.vocab_size * h + model.num_layers * layer + h + lm_head


def head_params(model: ModelConfig) -> int:
    """Medusa heads: each a residual block (h x h weight and its bias of h; the operator
    table has no biases) and its own vocabulary projection (h x V)."""
    return linear_params("medusa_heads", model) + model.medusa_heads * model.hidden_size


def kv_bytes_per_token(model: ModelConfig, dtype: str) -> int:
    """Key and value of every layer for one token."""
    return 2 * model.num_layers * model.num_kv_heads * model.head_dim * element_bytes(dtype)


def usable_bytes(spec: HardwareSpec, reserve: float) -> float:
    return spec.memory_gb * GB * (1 - reserve)


def devices_to_fit(need_bytes: float, spec: HardwareSpec, reserve: float) -> int:
    """Fewest devices of this kind whose usable memory, evenly split, holds need_bytes."""
    return max(1, math.ceil(need_bytes / usable_bytes(spec, reserve)))
