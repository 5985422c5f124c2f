"""The layers the engines' tables measured as whole modules, set on a latency source: an MoE
model's fused experts (perfmodel.latency.moe_table) and a latent-attention model's attention
module (perfmodel.latency.mla_table). The datasheet prices both from the roofline; any other
source takes them measured, or says in one line that the device has no such measurement."""

from __future__ import annotations

from perfmodel.latency.choice import LatencyMode
from perfmodel.latency.latency_model import LatencyModel
from perfmodel.latency.mla_table import mla_times
from perfmodel.latency.moe_table import moe_times
from perfmodel.measured.evidence import DeviceEvidence


def with_modules(source: LatencyModel, evidence: DeviceEvidence) -> LatencyModel:
    """`source` with its model's experts and latent attention measured (the module doc)."""
    model = source.model
    if source.mode == LatencyMode.DATASHEET:
        return source
    if model.moe is not None:
        source.experts = moe_times(evidence, source.stack, model, source.dtype)
    if model.mla is not None:
        source.latent = mla_times(evidence, source.stack, model, source.dtype)
    return source
