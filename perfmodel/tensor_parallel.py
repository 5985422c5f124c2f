"""A decoding step split over tp devices (Megatron-style tensor parallelism): each device
runs its shard of the model (perfmodel.models.ModelConfig.shard), and every layer adds two
all-reduces of the step's activations (after attention's output projection and after the
MLP's down projection), timed by perfmodel.allreduce."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodel.allreduce import tp_comm_time_per_step
from perfmodel.step import StepModel


@dataclass(frozen=True)
class TensorParallelStep:
    """step_time of one shard's step plus its all-reduces (the shape of a StepModel that
    perfmodel.simulations.speedup_table reads)."""

    shard_step: StepModel
    tp: int
    all_reduce: object | None  # perfmodel.allreduce source; None when tp == 1
    dtype: str

    def comm_time(self, batch, candidates) -> np.ndarray:
        if self.tp == 1:
            return np.zeros(np.broadcast(batch, candidates).shape)
        tokens = np.asarray(batch) * np.asarray(candidates)
        return tp_comm_time_per_step(self.shard_step.model, self.tp, tokens, self.dtype, self.all_reduce)

    def step_time(self, batch, seq_len, candidates=1) -> np.ndarray:
        return self.shard_step.step_time(batch, seq_len, candidates) + self.comm_time(batch, candidates)

    @property
    def label(self) -> str:
        compute = self.shard_step.latency.label
        if self.tp == 1:
            return compute
        return f"{compute}; tp={self.tp}: 2 all-reduces per layer, {self.all_reduce.label}"
