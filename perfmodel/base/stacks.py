"""The software stacks whose measurements a latency can rest on, one name each.

A stack folder is named `<engine>-<version>` (vllm-0.24.0, nccl-2.27.3, torch-2.11.0); the
engine part is one of these. Vidur's per-model profiles are a harness of their own with no
version folder."""

from __future__ import annotations

from enum import StrEnum


class Engine(StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"
    TRTLLM = "trtllm"
    NCCL = "nccl"
    TORCH = "torch"  # this project's own GPU campaigns (profilers.campaign_stack)
    VIDUR = "vidur"


# The serving engines, in the order `auto` prefers them: vLLM first (the most used serving
# engine, and the harness closest to Vidur's, which was built on vLLM's kernels).
SERVING_ENGINES = (Engine.VLLM, Engine.SGLANG, Engine.TRTLLM)


def engine_of(stack: str) -> Engine | None:
    """The engine a stack name (vllm, vllm-0.24.0, torch-gloo) belongs to; None for a name of
    no known engine."""
    head = stack.split("-")[0]
    return Engine(head) if head in Engine._value2member_map_ else None
