"""Capacity planning: what fits on a device, which Medusa tree to run at each batch, how fast.

`plan(model, devices, ...)` answers, for one model on one or more devices, a dtype and a
prompt/response length distribution:

- memory fit: weights + Medusa heads + KV cache, and the largest batch that fits;
- per batch (a "band"): the best tree size, or "none" where speculation loses to plain
  decoding, its speedup, per-token latency, per-user and aggregate tokens/s;
- per device: the recommended batch and tree (the most aggregate tokens/s that meets the
  latency target), and the devices needed for a throughput target.

`python -m perfmodel.plan --model llama-7b --gpu a100 h100 --latency-ms 30` prints the same.

Modelling choices (each a simplification to keep in mind):

- Lengths: an int, a (mean, p95) pair, a sequence of samples, or `Lengths`. The KV cache
  is sized for p95 prompt + p95 response tokens per sequence (the longest sequence planned
  for; summing the two p95s is conservative), plus the tree's tree_size - 1 speculative
  tokens during a Medusa step. The step latency is taken at the mean context during
  generation: mean prompt + mean response / 2.
- Memory: weights = parameters x element bytes, from the model's shapes (embeddings, per
  layer q/k/v/o/gate/up/down and two norms, final norm, an lm_head unless tied to the
  embeddings); Medusa heads = medusa_heads x (h*h + h + h*V); KV per token = 2 x layers x
  kv_heads x head_dim x element bytes, in the model's dtype (in tensor parallel, tp x a
  shard's: KV heads are replicated where there are fewer than tp). `memory_reserve` (default
  10%) of each device is kept for activations, logits, the CUDA context and
  fragmentation, which are not counted.
  Memory is in GB = 1e9 bytes, as the device specs give it.
- Tensor parallelism (Megatron style): each of the tp devices runs its shard of the model
  (ModelConfig.shard: query heads, KV heads and the MLP split tp ways), timed by the
  device's latency source for that shard's shapes, plus two all-reduces per layer of
  batch x tokens x hidden (perfmodel.latency.allreduce: measured tables where shipped, else a ring
  model on the spec's interconnect). Weights are split evenly. `tensor_parallel=None` picks
  the degree with the most tokens/s per device. A model that does not fit is told the
  fewest devices that hold it among the degrees that split it and that the device can time
  (tensor_parallel.usable_degrees), or that none does.
- Batches: by default every power of two up to the max batch that fits, and that batch.
- Latency: perfmodel.latency.source (measured > calibrated > borrowed > datasheet); the
  devices table's `latency_model` names the one used. The step it times is the whole
  model's operator inventory, or with step="traced" every kernel the reference decoder's
  step launches (perfmodel.planning.step_models).
- Devices needed for a throughput target = tensor_parallel x ceil(target / the best
  aggregate tokens/s of one replica that meets the latency target).

A configuration is one (device, batch, tree size) point: its memory fit, step time,
acceptance, per-token latency and tokens/s. `python -m perfmodel.plan --benchmark` times
plan() over more than 10,000 of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.acceptance.rates import (
    PAPER_ACCEPTANCE,
    AcceptanceModel,
    AcceptanceSetting,
    describe_acceptance,
    medusa_acceptance,
)
from perfmodel.base.checks import is_real, split_options
from perfmodel.base.drafter_kind import DrafterKind
from perfmodel.base.errors import PerfkitError
from perfmodel.models.config import ModelConfig
from perfmodel.planning.deployment import Deployment, DeploymentChoices, resolve
from perfmodel.planning.device_plan import Setting, plan_degree, plan_device_auto_tp
from perfmodel.planning.lengths import DEFAULT_PROMPT_LEN, DEFAULT_RESPONSE_LEN, Lengths
from perfmodel.planning.measured_chain import measured_chain
from perfmodel.planning.medusa_setting import MedusaSetting, check_medusa
from perfmodel.planning.memory import DEFAULT_RESERVE
from perfmodel.planning.result import DEVICE_COLUMNS, PlanResult
from perfmodel.planning.simulations import CANDIDATE_SIZES
from perfmodel.planning.workload import Targets, Workload, positive

# batches=None plans every power of two up to the device's max batch, and that batch.
DEFAULT_BATCHES = None
# One positive integer or several (a list, tuple or array), as positive_ints reads them: batches,
# tree sizes, a schedule's contexts.
Ints = int | Sequence[int] | np.ndarray
# A length as a request gives it (Lengths.of reads each): tokens, a (mean, p95) pair, samples or a Lengths.
LengthSetting = float | tuple[float, float] | Sequence[float] | np.ndarray | Lengths


@dataclass(frozen=True)
class PlanRequest:
    """What a capacity plan is asked, beside its deployments.

    prompt_len / response_len: an int, a (mean, p95) pair or a list of samples.
    latency_target_s: seconds per output token per user. throughput_target: output tokens/s
    in all. acceptance: "paper", a decoder.measure JSON path or an acceptance model (tokens
    per step as a function of tree size), as perfmodel.acceptance.rates.resolve_acceptance
    reads it. batches: batch sizes to evaluate (the device's max batch is added where it is
    below the largest), or None (default): every power of two up to the device's max batch,
    and the max batch itself. sizes: tree sizes (root included) to search; 1 (plain
    decoding) is always included. memory_reserve: the fraction of each device kept free.
    medusa: "auto" (the best tree or none per batch), "on" (the best tree per batch even
    where plain decoding is faster) or "off" (plain decoding). drafter: who drafts, the Medusa
    heads (default) or, from their measured per-position acceptance `position_rates` (and
    their own config.json, `draft_config`), eagle, eagle3, mtp, draft or ngram: a tree of n
    tokens is then their chain of n - 1 drafts (perfmodel.planning.measured_chain), searched
    up to the rates' length, and memory holds their weights and KV cache instead of heads."""

    prompt_len: LengthSetting = DEFAULT_PROMPT_LEN
    response_len: LengthSetting = DEFAULT_RESPONSE_LEN
    latency_target_s: float | None = None
    throughput_target: float | None = None
    acceptance: AcceptanceSetting = PAPER_ACCEPTANCE
    batches: Ints | None = DEFAULT_BATCHES
    sizes: Ints = CANDIDATE_SIZES
    memory_reserve: float = DEFAULT_RESERVE
    medusa: str = MedusaSetting.AUTO
    drafter: str = DrafterKind.MEDUSA
    position_rates: tuple[float, ...] | None = None
    draft_config: str | Path | None = None

    @property
    def workload(self) -> Workload:
        return Workload(Lengths.of(self.prompt_len, "prompt_len"), Lengths.of(self.response_len, "response_len"))

    @property
    def targets(self) -> Targets:
        # checked under the names plan() takes them by
        latency = positive(self.latency_target_s, "latency_target_s")
        return Targets(latency_s=latency, tokens_s=positive(self.throughput_target, "throughput_target"))


def plan(model: str | Path | ModelConfig, devices, **options) -> PlanResult:
    """Plan serving `model` on each of `devices` (see the module docstring for the model).

    model: a preset name, a config.json path or a ModelConfig. devices: names (cpu: this
    machine's CPU from its stored measurements), spec files, HardwareSpecs or DeviceViews,
    one or many. options: how it is deployed, the fields of
    perfmodel.planning.deployment.DeploymentChoices (dtype, tensor_parallel: default 1, None
    for the degree with the most tokens/s per device among those that fit and split the
    model, latency, step, tracer, launch, params), and what is asked, the fields of
    PlanRequest (prompt_len, response_len, latency_target_s, throughput_target, acceptance,
    batches, sizes, memory_reserve, medusa). plan_deployments() takes resolved deployments.

    Raises PerfkitError for bad input, and when the model fits on none of the devices.
    """
    deployment, request = split_options(options, (DeploymentChoices, PlanRequest), "plan()")
    return plan_deployments(resolve(model, devices, DeploymentChoices(**deployment)), PlanRequest(**request))


def plan_deployments(deployments, request: PlanRequest | None = None) -> PlanResult:
    """The capacity plan of one model's deployments (perfmodel.planning.deployment.resolve),
    one device each, for `request` (default: PlanRequest())."""
    deployments = (deployments,) if isinstance(deployments, Deployment) else tuple(deployments)
    request = request or PlanRequest()
    model = deployments[0].model
    if any(d.model != model for d in deployments):
        raise PerfkitError("plan_deployments plans one model: its deployments name several")
    workload, targets = request.workload, request.targets
    memory_reserve = request.memory_reserve
    if not is_real(memory_reserve, finite=False) or not 0 <= memory_reserve < 1:
        raise PerfkitError(f"memory_reserve must be a fraction in [0, 1), got {memory_reserve!r}")
    batches = None if request.batches is None else positive_ints(request.batches, "batches")
    medusa = check_medusa(request.medusa)
    chain = measured_chain(request.drafter, request.position_rates, request.draft_config)
    if chain is not None:
        sizes, acceptance, said = chain.sizes, chain.acceptance, chain.describe()
    else:
        speculate = model.medusa_heads and medusa != MedusaSetting.OFF
        sizes = np.union1d(positive_ints(request.sizes, "tree sizes"), [1]) if speculate else np.array([1])
        acceptance = medusa_acceptance(request.acceptance).model
        said = describe_acceptance(acceptance)
    accept = tabulated(acceptance, sizes)
    rows, bands, configs = [], [], []
    for deployment in deployments:
        drafter_for = None if chain is None else chain.drafter_on
        setting = Setting(deployment, workload, targets, accept, batches, sizes, memory_reserve, medusa, drafter_for)
        row, device_bands, device_configs = (
            plan_degree(setting, deployment.tp) if deployment.tp else plan_device_auto_tp(setting)
        )
        rows.append(row)
        bands.append(device_bands)
        configs.append(device_configs)
    devices_df = pd.DataFrame(rows, columns=DEVICE_COLUMNS).astype(
        {"batch": "Int64", "tree_size": "Int64", "devices_needed": "Int64"}
    )
    dtype = "/".join(dict.fromkeys(d.dtype for d in deployments))  # one name, or each device's default
    if not devices_df["fits"].any():
        raise DoesNotFit(
            f"{model.name} in {dtype} fits on none of the devices: "
            + "; ".join(f"{r['device']}: {r['note'].removeprefix('does not fit: ')}" for r in rows),
            {r["device"]: r["degree_to_fit"] for r in rows},
        )
    bands_df, configs_df = (
        pd.concat([t for t in tables if t is not None], ignore_index=True) for tables in (bands, configs)
    )
    return PlanResult(model, dtype, workload, targets, said, devices_df, bands_df, configs_df, drafter=request.drafter)


class DoesNotFit(PerfkitError):
    """The model fits on none of the devices planned. degrees: per device key, the fewest
    devices that hold it among the degrees usable there, or None where none does."""

    def __init__(self, message: str, degrees: dict[str, int | None]):
        super().__init__(message)
        self.degrees = degrees


def serving_plan(deployment: Deployment, request: PlanRequest | None = None) -> tuple[int, PlanResult | str]:
    """The tensor-parallel degree to price a deployment at (its own, or where it has none,
    None, the plan's choice), and its capacity plan; the one meaning of --tp for every command.

    Where the model does not fit at the degree but another degree usable on the device
    holds it, a DoesNotFit error names that degree. Where no usable degree holds it, there
    is nothing to advise: (the degree asked, or 1, and why it does not fit), for the caller
    to say beside numbers that then price its steps as if it did."""
    try:
        result = plan_deployments(deployment, request)
    except DoesNotFit as exc:
        if any(degree is not None for degree in exc.degrees.values()):
            raise
        return deployment.tp or 1, str(exc)
    return int(result.devices["tensor_parallel"].iloc[0]), result


def tabulated(acceptance: AcceptanceModel, sizes: np.ndarray) -> AcceptanceModel:
    """The acceptance model evaluated once per tree size, looked up afterwards (the
    head-accuracy model builds a tree per call, too slow to call per configuration)."""
    values = np.asarray(acceptance(sizes), dtype=float)

    def lookup(n):
        return values[np.searchsorted(sizes, n)]

    return lookup


def positive_ints(values: Ints, name: str) -> np.ndarray:
    array = np.atleast_1d(np.asarray(values))
    if array.size == 0 or array.dtype.kind not in "iu" or (array < 1).any():
        raise PerfkitError(f"{name} must be positive integers, got {np.ravel(values)[:5].tolist()}")
    return np.unique(array.astype(np.int64))
