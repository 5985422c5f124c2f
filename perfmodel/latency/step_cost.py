"""What every step model answers, whichever way it prices a step: the StepCost protocol.

A step model prices one decoding step of a deployment: the whole model from its operator
inventory (perfmodel.latency.step.StepModel), the reference decoder's traced kernels
(perfmodel.latency.traced_step.TracedStep), a shard with its all-reduces
(perfmodel.latency.tensor_parallel.TensorParallelStep), an EAGLE or draft-model step that
drafts and verifies (perfmodel.latency.eagle.EagleStep, perfmodel.planning.drafters), or
decoding and prefill priced by two flavours (perfmodel.serving.capacity.ComposedStep). The
planners take any of them and ask only this.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from perfmodel.latency.choice import LatencyMode
from perfmodel.models.config import ModelConfig
from perfmodel.models.operators import LINEAR_OPS


@runtime_checkable
class StepCost(Protocol):
    @property
    def model(self) -> ModelConfig:
        """The model one device runs (a shard under tensor parallelism)."""
        ...

    @property
    def shard(self) -> StepCost:
        """The step one device runs: the step itself, or the shard under a tensor-parallel step."""
        ...

    @property
    def label(self) -> str:
        """What the step's times come from, in words (its latency source, fusion, all-reduces)."""
        ...

    @property
    def evidence(self) -> str:
        """What its times rest on: the latency source's mode (latency_evidence)."""
        ...

    def step_time(self, batch, seq_len, candidates=1) -> np.ndarray:
        """Seconds per decoding step at the points given (broadcast arrays)."""
        ...

    def prefill_time(self, batch, prompt_len, medusa: bool = False) -> np.ndarray:
        """Seconds to prefill `batch` prompts of `prompt_len` tokens each."""
        ...


def latency_evidence(latency) -> str:
    """What times from `latency` rest on: its mode (measured, calibrated, grid, borrowed,
    datasheet), where `measured` holds only if every linear op of the model was measured,
    else `calibrated`; `unknown` for a source that names no mode."""
    mode = getattr(latency, "mode", None)  # a bare RooflineLatency or a test's source has none
    if mode is None:
        return "unknown"
    if mode == LatencyMode.MEASURED and any(latency.linear_kind(op) != LatencyMode.MEASURED for op in LINEAR_OPS):
        return LatencyMode.CALIBRATED
    return mode


class PricedBySource:
    """A step one device runs whole, priced by its own `latency` source (StepModel, TracedStep)."""

    @property
    def shard(self):
        return self

    @property
    def evidence(self) -> str:
        return latency_evidence(self.latency)


class DraftsThenVerifies:
    """A step that drafts a tree and verifies it with `verify` (EAGLE, a draft model, n-gram
    lookup): what its times rest on is the verification's source, and a step is its drafting
    (the subclass's draft_time) and the verification."""

    def step_time(self, batch, seq_len, candidates=1) -> np.ndarray:
        """Seconds per step: drafting (none for plain decoding) plus the verification."""
        verify = np.asarray(self.verify.step_time(batch, seq_len, candidates), dtype=float)
        return verify + self.draft_time(batch, seq_len, candidates)

    @property
    def shard(self):
        return self

    @property
    def label(self) -> str:
        return self.verify.label

    @property
    def evidence(self) -> str:
        return self.verify.evidence
