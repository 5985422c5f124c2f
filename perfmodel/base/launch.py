"""How a decoding step is launched on its device: the regime a measured or predicted step time assumes.

- eager: the reference decoder as published Medusa code runs (Hugging Face style): one kernel
  launched from Python at a time, per-sequence Python loops in acceptance and commit, and host
  syncs that read each sequence's verdict mid-step. On a GPU such a step is often bound by the
  host issuing kernels, not by the kernels.
- static: the same step as tensor ops over the whole batch (decoder.static_step): a
  preallocated cache and tree buffers, no Python loop over sequences and no host sync inside
  the step, its forward pass fused as gpt-fast fuses it (decoder.fused: one GEMM for q/k/v
  and one for gate/up, torch's RMSNorm, RoPE in place, one KV write); still launched kernel
  by kernel from Python.
- graph: the static step captured once in a CUDA graph and replayed, as serving engines run
  their decode step: kernels rule.
- compiled: the static step through torch.compile (kernels fused by inductor).
"""

from __future__ import annotations

from enum import Enum

from perfmodel.base.errors import PerfkitError


class Launch(str, Enum):
    EAGER = "eager"
    STATIC = "static"
    GRAPH = "graph"
    COMPILED = "compiled"

    def __str__(self) -> str:
        return self.value

    @property
    def static(self) -> bool:
        """Whether the step runs as batched tensor ops (every regime but eager)."""
        return self is not Launch.EAGER

    @classmethod
    def parse(cls, value: str | Launch) -> Launch:
        try:
            return cls(value)
        except ValueError:
            raise PerfkitError(
                f"unknown launch regime {value!r}; choose one of: {', '.join(m.value for m in cls)}"
            ) from None
