"""A static batch's latencies from a step model: `batch` prompts of `prompt_len` tokens
prefilled together, then decoded together for `response_len` tokens, every sequence alike.

TTFT is the batch's prefill (its collectives also apart); TPOT is the mean plain decoding step over the contexts the
batch decodes at (prompt_len + 1 ... prompt_len + response_len - 1: the first token comes
with the prefill). This is what aiconfigurator's static mode estimates, and the unloaded
end of every serving answer. Each step's time is also split by component, so a comparison
can say where two estimates part.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodel.base.checks import is_count
from perfmodel.base.errors import PerfkitError
from perfmodel.latency.step import WINDOW_ATTENTION
from perfmodel.models.operators import WEIGHT_OPS

COMPONENTS = ("gemm", "attention", "moe", "elementwise", "communication")
# Which component each step op is; RoPE and the KV-cache write go with attention, where an
# engine that fuses them runs them (perfmodel.latency.fusion). The rest is elementwise work.
# A latent-attention module (its projections among them) is attention: the peer reads the same module rows.
ATTENTION_PARTS = ("sdpa", WINDOW_ATTENTION, "qk", "pv", "rope", "kv_write", "mla")


def component(op_name: str) -> str:
    if op_name in ("moe", "shared_expert"):  # an MoE layer's experts, routed and shared (its router is a GEMM)
        return "moe"
    if op_name in WEIGHT_OPS:
        return "gemm"
    return "attention" if op_name in ATTENTION_PARTS else "elementwise"


@dataclass(frozen=True)
class StaticBatch:
    """Predicted seconds of one static batch: time to first token, time per output token, and
    the TPOT's split by component (COMPONENTS)."""

    ttft_s: float
    tpot_s: float
    tpot_parts: dict[str, float]
    ttft_communication_s: float = 0.0  # the prefill's all-reduces and logits gather


def static_batch(step, batch: int, prompt_len: int, response_len: int) -> StaticBatch:
    """The static batch of a tensor-parallel step model (perfmodel.latency.tensor_parallel)."""
    for name, value in (("batch", batch), ("prompt_len", prompt_len), ("response_len", response_len)):
        if not is_count(value):
            raise PerfkitError(f"{name} must be an integer >= 1, got {value!r}")
    if response_len < 2:
        raise PerfkitError(f"response_len must be >= 2 for a time per output token, got {response_len}")
    contexts = prompt_len + np.arange(1, response_len)
    batches = np.full(contexts.shape, batch)
    parts = dict.fromkeys(COMPONENTS, 0.0)
    for name, seconds in step.shard.op_times(batches, contexts, 1).items():
        parts[component(name)] += float(np.mean(seconds))
    parts["communication"] = float(np.mean(step.comm_time(batches, 1) + step.gather_time(batches, 1, False)))
    tpot = float(np.mean(step.step_time(batches, contexts, 1)))
    ttft = float(step.prefill_time(batch, prompt_len))
    collectives = float(step.comm_time(batch, prompt_len) + step.gather_time(batch, 1, False))
    return StaticBatch(ttft, tpot, parts, collectives)
