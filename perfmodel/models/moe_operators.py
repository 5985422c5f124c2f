"""What an MoE layer's fused expert kernel costs on one device (perfmodel.models.operators's
`moe` op): the router's GEMM and a shared expert are plain GEMMs beside it.

An engine runs the experts of a layer as one fused kernel: each token's top-k experts, their
gate and up projections (h -> 2 x expert size), the activation and the down projection back,
weighted and summed. Over t devices (moe_tp x moe_ep = t, either split) each holds 1/t of every
layer's expert weights and does 1/t of the math on average, so the counts are per device.
Bytes count the weights of the experts the step's tokens touch (as many as tokens x top-k
uniform picks are expected to reach: the kernel reads no other expert's weights), the tokens'
activations in and out, and the routed rows' intermediate activations.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodel.base.errors import PerfkitError
from perfmodel.models.kernels import Matmul

GATED_PROJECTIONS = 3  # gate, up and down: each h x expert size


@dataclass(frozen=True)
class ExpertGemms:
    tokens: object  # the step's tokens (an int or an integer array)
    hidden: int
    expert_size: int  # one whole expert's intermediate size
    top_k: int
    experts: int
    devices: int = 1  # the tensor-parallel degree the layer is spread over

    @property
    def flops(self):
        return 2 * self.tokens * self.top_k * GATED_PROJECTIONS * self.hidden * self.expert_size // self.devices

    @property
    def touched_experts(self):
        """Experts the step's tokens are expected to reach (tokens x top-k uniform picks)."""
        picks = np.asarray(self.tokens, dtype=float) * self.top_k
        return self.experts * -np.expm1(picks * np.log1p(-1 / self.experts)) if self.experts > 1 else picks * 0 + 1

    @property
    def weight_elements(self):
        per_expert = GATED_PROJECTIONS * self.hidden * self.expert_size
        return self.touched_experts * per_expert / self.devices

    @property
    def activation_elements(self):
        routed = self.tokens * self.top_k * GATED_PROJECTIONS * self.expert_size / self.devices
        return 2 * self.tokens * self.hidden + routed

    @property
    def elements(self):
        return self.weight_elements + self.activation_elements


def moe_kernels(op: str, model, tokens) -> tuple:
    """The router's GEMM, the fused experts, or the shared expert of an MoE layer over `tokens`."""
    moe = model.moe
    if moe is None:
        raise PerfkitError(f"{op}: {model.name} has no experts (a dense model's MLP is gate_up, act and down)")
    if op == "router":
        return (Matmul(1, tokens, model.hidden_size, moe.experts, weight=True),)
    if op == "moe":
        return (ExpertGemms(tokens, model.hidden_size, moe.expert_size, moe.top_k, moe.experts, model.tp),)
    shared = moe.shared_size // model.tp  # split as a dense MLP is
    return (Matmul(1, tokens, model.hidden_size, 2 * shared, True), Matmul(1, tokens, shared, model.hidden_size, True))
