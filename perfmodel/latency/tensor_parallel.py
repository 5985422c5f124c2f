"""A decoding step split over tp devices (Megatron-style tensor parallelism): each device
runs its shard of the model (perfmodel.models.config.ModelConfig.shard), and every layer adds two
all-reduces of the step's activations (after attention's output projection and after the
MLP's down projection), timed by perfmodel.latency.allreduce: an engine stack's own all-reduce
where the latency rests on an engine's measurements and the device has that engine's table
(vLLM's and SGLang's custom all-reduce, TensorRT-LLM's AllReduce op), else the device's
default collective (its NCCL tables where shipped). The vocabulary-split LM head's logits
(and the Medusa heads') are gathered once per step (perfmodel.latency.logits_gather).

`tensor_parallel_steps` builds these steps for a resolved device: the capacity plan
(perfmodel.planning.capacity) and the speedup simulations (perfmodel.planning.simulations) both price a
sharded model through it. `usable_degrees` is the one rule for which degrees may be used
or advised on a device; `check_degree` refuses any other in one line."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodel.base.checks import is_count
from perfmodel.base.errors import PerfkitError
from perfmodel.hardware.specs import HardwareSpec
from perfmodel.latency.allreduce import AllReduceSource, all_reduce_source, tp_comm_time_per_step
from perfmodel.latency.allreduce_tables import engine_all_reduce_stack
from perfmodel.latency.logits_gather import GatherSource, gather_source, gather_time
from perfmodel.latency.source import view_latency
from perfmodel.latency.step import StepFlavor, StepModel
from perfmodel.latency.traced_step import TracedStep
from perfmodel.measured.device_view import DeviceView
from perfmodel.measured.evidence import DeviceEvidence, as_evidence
from perfmodel.models.config import ModelConfig
from perfmodel.models.moe import layer_slice


@dataclass(frozen=True)
class TensorParallelStep:
    """step_time of one shard's step plus its all-reduces and logits gather (the shape of a
    StepModel that perfmodel.planning.simulations.speedup_table reads)."""

    shard_step: StepModel | TracedStep  # one device's step, priced by its own latency source
    tp: int
    all_reduce: AllReduceSource | None  # None when tp == 1
    dtype: str
    gather: GatherSource | None = None  # None when tp == 1

    def __post_init__(self) -> None:
        if self.tp > 1 and (self.all_reduce is None or self.gather is None):
            raise PerfkitError(f"a tp={self.tp} step needs its all-reduce and logits-gather sources")

    def comm_time(self, batch, tokens_per_seq) -> np.ndarray:
        """All-reduce seconds of a step over `tokens_per_seq` query tokens per sequence (the
        tree's tokens in a Medusa step, the prompt in a prefill)."""
        tokens = np.asarray(batch) * np.asarray(tokens_per_seq)
        # the paper's step is one layer: its two all-reduces only
        layers = 1 if self.shard_step.flavor == StepFlavor.PAPER else self.shard_step.model.num_layers
        return self.layers_comm_time(tokens, layers)

    def layers_comm_time(self, tokens, layers: int) -> np.ndarray:
        """All-reduce seconds of `layers` of the shard's layers over `tokens` tokens (two per
        layer; 0 at tp 1): the step's, or a drafter's own layers run on the same devices."""
        if self.tp == 1:
            return np.zeros(np.shape(tokens))
        model = layer_slice(self.shard_step.model, layers, dense=False)  # its all-reduces count layers only
        return tp_comm_time_per_step(model, self.tp, tokens, self.dtype, self.all_reduce)

    def logits_rows(self, batch, tokens_per_seq, medusa) -> np.ndarray:
        """Rows of vocabulary-wide logits a step gathers: one per token the LM head runs on,
        and one per sequence and Medusa head where the step runs the heads. The paper's step
        (one layer) has no LM head."""
        if self.shard_step.flavor == StepFlavor.PAPER:
            return np.zeros(np.broadcast(batch, tokens_per_seq).shape)
        heads = self.shard_step.model.medusa_heads if self.shard_step.with_heads else 0
        b = np.asarray(batch)
        return b * np.asarray(tokens_per_seq) + np.where(medusa, b * heads, 0)

    def gather_time(self, batch, tokens_per_seq, medusa) -> np.ndarray:
        """Seconds to gather the step's logits from the tp devices (0 at tp 1)."""
        return self.rows_gather_time(self.logits_rows(batch, tokens_per_seq, medusa))

    def rows_gather_time(self, rows) -> np.ndarray:
        """Seconds to gather `rows` rows of vocabulary-split logits from the tp devices (0 at tp 1)."""
        return gather_time(rows, self.shard_step.model.vocab_size, self.tp, self.dtype, self.gather)

    def step_time(self, batch, seq_len, candidates=1) -> np.ndarray:
        q = np.asarray(candidates)
        shard = self.shard_step.step_time(batch, seq_len, candidates)
        return shard + self.comm_time(batch, candidates) + self.gather_time(batch, q, q > 1)

    def prefill_time(self, batch, prompt_len, medusa: bool = False) -> np.ndarray:
        """The shard's prefill of `batch` prompts plus its all-reduces over every prompt token
        and the gather of the last token's logits (and the heads', with medusa)."""
        shard = self.shard_step.prefill_time(batch, prompt_len, medusa)
        return shard + self.comm_time(batch, prompt_len) + self.gather_time(batch, 1, medusa)

    @property
    def model(self) -> ModelConfig:
        return self.shard_step.model

    @property
    def shard(self) -> StepModel:
        return self.shard_step

    @property
    def evidence(self) -> str:
        return self.shard_step.evidence

    @property
    def label(self) -> str:
        compute = self.shard_step.label
        if self.tp == 1:
            return compute
        return (
            f"{compute}; tp={self.tp}: 2 all-reduces per layer, {self.all_reduce.label_for(self.tp)}; "
            f"logits gathered, {self.gather.label_for(self.tp)}"
        )


@dataclass(frozen=True)
class Collectives:
    """How a tp-way step's collectives are timed: its all-reduces and its logits gather."""

    all_reduce: AllReduceSource | None
    gather: GatherSource | None


# A device as the collectives take it: its evidence, or a spec (resolved to its evidence).
Device = HardwareSpec | DeviceEvidence


def step_collectives(
    device: Device, tp: int, dtype: str, stack: str | None = None, all_reduce_stack: str | None = None
) -> Collectives:
    """The collectives of a step split tp ways on `device` whose latency rests on `stack`'s
    measurements (perfmodel.latency.latency_model.LatencyModel.stack): the all-reduce stack asked
    for (perfmodel.latency.allreduce.all_reduce_source), else an engine stack's own all-reduce
    where the device has its table, else the device's default collective; none at tp 1."""
    if tp == 1:
        return Collectives(None, None)
    evidence = as_evidence(device)
    own = all_reduce_stack or engine_all_reduce_stack(evidence, stack)
    all_reduce = all_reduce_source(evidence, stack=own, dtype=dtype)
    return Collectives(all_reduce, step_gather(evidence, dtype))


def step_gather(device: Device, dtype: str | None = None) -> GatherSource:
    """What gathers a step's vocabulary-split logits: the device's NCCL all_gather tables, else
    half its default all-reduce (perfmodel.latency.logits_gather.gather_source)."""
    evidence = as_evidence(device)
    return gather_source(evidence, all_reduce_source(evidence, dtype=dtype))


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
    flavor), plus the all-reduces and logits gather where tp > 1 (step_collectives, on the
    latency source's stack, or the all-reduce stack asked for)."""
    shard = model.shard(tp)
    source = view_latency(view, shard, dtype, latency)
    comm = step_collectives(view.evidence, tp, dtype, source.stack, all_reduce_stack)
    return {
        f: TensorParallelStep(StepModel(shard, source, f), tp, comm.all_reduce, dtype, comm.gather) for f in flavors
    }


def usable_degrees(model: ModelConfig, device: Device, all_reduce_stack: str | None = None) -> list[int]:
    """The tensor-parallel degrees that split the model (ModelConfig.tensor_parallel_degrees,
    the rule --tp is checked by) and over which the device's all-reduce and logits gather can
    be timed (a measured table holds some worker counts only: 2, 4 and 8 GPUs of one node in
    most shipped ones, 2 and 4 on the GB200 and GB300 trays, the rank counts measured by
    python -m profilers.allreduce in ours; a device without an interconnect or measurements,
    such as an unmeasured CPU, none): 1 always."""
    evidence = as_evidence(device)
    try:
        source = all_reduce_source(evidence, stack=all_reduce_stack)
        gather = step_gather(evidence)
    except PerfkitError:
        if all_reduce_stack is not None:  # a stack asked for and not there is the caller's error
            raise
        return [1]
    out = [1]
    for tp in model.tensor_parallel_degrees(model.num_heads)[1:]:
        try:
            source.time(1024, tp)
            gather.time(1024, tp)
        except PerfkitError:
            continue
        out.append(tp)
    return out


def check_degree(model: ModelConfig, device: Device, tp: int) -> None:
    """One line where tensor parallelism of degree `tp` is not among usable_degrees on `device`:
    why (it does not split the model, or the device's collectives cannot be timed over tp
    devices: no measured table holds that count and the interconnect joins fewer), and the
    largest degree the device can serve."""
    if not is_count(tp):
        raise PerfkitError(f"tensor parallel degree must be a positive integer, got {tp!r}")
    evidence = as_evidence(device)
    usable = usable_degrees(model, evidence)
    if tp in usable:
        return
    if tp not in model.tensor_parallel_degrees(tp):
        why = (
            f"it does not split {model.name}: {model.num_heads} query heads, {model.num_kv_heads} KV heads, "
            f"intermediate size {model.intermediate_size}"
        )
    else:
        try:
            all_reduce_source(evidence).time(1024, tp)
            step_gather(evidence).time(1024, tp)
            why = "its collectives cannot be timed over that many devices"
        except PerfkitError as exc:
            why = str(exc)
    raise PerfkitError(
        f"tensor parallel {tp} cannot be served on {evidence.key} ({why}); the largest degree it can serve for "
        f"{model.name} is {max(usable)} (usable: {', '.join(map(str, usable))})"
    )
