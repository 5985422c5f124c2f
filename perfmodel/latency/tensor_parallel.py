"""A decoding step split over tp devices (Megatron-style tensor parallelism): each device
runs its shard of the model (perfmodel.models.config.ModelConfig.shard), and every layer adds two
all-reduces of the step's activations (after attention's output projection and after the
MLP's down projection), timed by perfmodel.latency.allreduce (the device's measured NCCL
tables by default).

`tensor_parallel_steps` builds these steps for a resolved device: the capacity plan
(perfmodel.planning.capacity) and the speedup simulations (perfmodel.planning.simulations) both price a
sharded model through it. `usable_degrees` is the one rule for which degrees may be used
or advised on a device."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from perfmodel.base.errors import PerfkitError
from perfmodel.hardware.specs import HardwareSpec
from perfmodel.latency.allreduce import all_reduce_source, tp_comm_time_per_step
from perfmodel.latency.source import view_latency
from perfmodel.latency.step import StepModel
from perfmodel.measured.device_view import DeviceView
from perfmodel.models.config import ModelConfig


@dataclass(frozen=True)
class TensorParallelStep:
    """step_time of one shard's step plus its all-reduces (the shape of a StepModel that
    perfmodel.planning.simulations.speedup_table reads)."""

    shard_step: StepModel
    tp: int
    all_reduce: object | None  # perfmodel.latency.allreduce source; None when tp == 1
    dtype: str

    def comm_time(self, batch, tokens_per_seq) -> np.ndarray:
        """All-reduce seconds of a step over `tokens_per_seq` query tokens per sequence (the
        tree's tokens in a Medusa step, the prompt in a prefill)."""
        if self.tp == 1:
            return np.zeros(np.broadcast(batch, tokens_per_seq).shape)
        tokens = np.asarray(batch) * np.asarray(tokens_per_seq)
        model = self.shard_step.model
        if self.shard_step.flavor == "paper":  # the paper's step is one layer: its two all-reduces only
            model = dataclasses.replace(model, num_layers=1)
        return tp_comm_time_per_step(model, self.tp, tokens, self.dtype, self.all_reduce)

    def step_time(self, batch, seq_len, candidates=1) -> np.ndarray:
        return self.shard_step.step_time(batch, seq_len, candidates) + self.comm_time(batch, candidates)

    def prefill_time(self, batch, prompt_len, medusa: bool = False) -> np.ndarray:
        """The shard's prefill of `batch` prompts plus its all-reduces over every prompt token."""
        return self.shard_step.prefill_time(batch, prompt_len, medusa) + self.comm_time(batch, prompt_len)

    @property
    def label(self) -> str:
        compute = self.shard_step.latency.label
        if self.tp == 1:
            return compute
        return f"{compute}; tp={self.tp}: 2 all-reduces per layer, {self.all_reduce.label_for(self.tp)}"


def tensor_parallel_steps(
    view: DeviceView,
    model: ModelConfig,
    dtype: str,
    tp: int,
    latency: str = "auto",
    flavors=("full",),
    all_reduce_stack: str | None = None,
) -> dict[str, TensorParallelStep]:
    """One step model per flavor for `model` split tp ways on `view`: the shard timed by the
    view's latency source (perfmodel.latency.source.view_latency, one source for every
    flavor), plus the all-reduces where tp > 1, timed by
    perfmodel.latency.allreduce.all_reduce_source(view.spec, stack=all_reduce_stack, dtype=dtype)
    (None: per worker count the device's own measurements (python -m profilers.allreduce),
    else its NCCL tables where shipped, else Vidur's, else the ring model)."""
    shard = model.shard(tp)
    source = view_latency(view, shard, dtype, latency)
    comm = all_reduce_source(view.spec, stack=all_reduce_stack, dtype=dtype) if tp > 1 else None
    return {f: TensorParallelStep(StepModel(shard, source, f), tp, comm, dtype) for f in flavors}


def usable_degrees(model: ModelConfig, spec: HardwareSpec, all_reduce_stack: str | None = None) -> list[int]:
    """The tensor-parallel degrees that split the model (ModelConfig.tensor_parallel_degrees,
    the rule --tp is checked by) and over which the device's all-reduce can be timed
    (a measured table holds some worker counts only: 2, 4 and 8 GPUs of one node in every
    shipped one, the rank counts measured by python -m profilers.allreduce in ours; a device
    without an interconnect or measurements, such as an unmeasured CPU, none): 1 always."""
    try:
        source = all_reduce_source(spec, stack=all_reduce_stack)
    except PerfkitError:
        if all_reduce_stack is not None:  # a stack asked for and not there is the caller's error
            raise
        return [1]
    out = [1]
    for tp in model.tensor_parallel_degrees(model.num_heads)[1:]:
        try:
            source.time(1024, tp)
        except PerfkitError:
            continue
        out.append(tp)
    return out
