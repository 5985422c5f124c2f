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

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.acceptance.rates import PAPER_ACCEPTANCE, describe_acceptance, medusa_acceptance
from perfmodel.base.checks import is_count, is_real
from perfmodel.base.dtypes import check_dtype, default_dtype
from perfmodel.base.errors import PerfkitError
from perfmodel.base.launch import Launch
from perfmodel.hardware.efficiencies import RooflineParams
from perfmodel.latency.source import LATENCY_CHOICES
from perfmodel.measured.device_view import DeviceView, resolve_devices
from perfmodel.models.config import ModelConfig, load_model
from perfmodel.planning.device_plan import Setting, plan_device, plan_device_auto_tp
from perfmodel.planning.lengths import DEFAULT_PROMPT_LEN, DEFAULT_RESPONSE_LEN, Lengths, Workload
from perfmodel.planning.medusa_setting import MedusaSetting, check_medusa
from perfmodel.planning.memory import DEFAULT_RESERVE
from perfmodel.planning.result import DEVICE_COLUMNS, PlanResult
from perfmodel.planning.simulations import CANDIDATE_SIZES
from perfmodel.planning.step_models import WHOLE_STEP_FLAVORS, check_flavors, check_launch_step, check_tracer

# batches=None plans every power of two up to the device's max batch, and that batch.
DEFAULT_BATCHES = None


def plan(
    model: str | Path | ModelConfig,
    devices,
    dtype: str | None = None,
    prompt_len=DEFAULT_PROMPT_LEN,
    response_len=DEFAULT_RESPONSE_LEN,
    latency_target_s: float | None = None,
    throughput_target: float | None = None,
    acceptance=PAPER_ACCEPTANCE,
    batches=DEFAULT_BATCHES,
    sizes=CANDIDATE_SIZES,
    memory_reserve: float = DEFAULT_RESERVE,
    tensor_parallel: int | None = 1,
    params: RooflineParams | None = None,
    latency: str = "auto",
    step: str = "full",
    tracer=None,
    medusa: str = "auto",
    launch: Launch | str | None = None,
) -> PlanResult:
    """Plan serving `model` on each of `devices` (see the module docstring for the model).

    model: a preset name, a config.json path or a ModelConfig. devices: names (cpu: this
    machine's CPU from its stored measurements), spec files, HardwareSpecs or DeviceViews,
    one or many, resolved by perfmodel.measured.device_view.resolve_devices. dtype: the weights' and
    KV cache's type, or None for each device's default (perfmodel.base.dtypes.default_dtype: fp32
    on a CPU, fp16 on a GPU, as every command has it). prompt_len /
    response_len: an int, a (mean, p95) pair or a list of samples. latency_target_s: seconds per output token per user.
    throughput_target: output tokens/s in all. acceptance: "paper", a decoder.measure JSON
    path or an acceptance model (tokens per step as a function of tree size), as
    perfmodel.acceptance.rates.resolve_acceptance reads it. batches: batch sizes to evaluate (the
    device's max batch is added where it is below the largest), or None (default): every
    power of two up to the device's max batch, and the max batch itself, so the
    recommendation may be any batch that fits. sizes: tree sizes (root
    included) to search; 1 (plain decoding) is always included. tensor_parallel: devices
    per model replica, or None (auto) for the degree that gives the most tokens/s per device
    among those that fit and split the model (powers of two up to 8). params: the datasheet
    roofline's efficiencies for every device, or None for each device's own (the public
    defaults on a datasheet, none on a CPU's measured ceilings). latency: the latency source
    (perfmodel.latency.source: auto = measured where the device was measured, else
    calibrated, borrowed or datasheet; or force measured, calibrated or datasheet). step: the
    step flavour the configurations are timed by (perfmodel.planning.step_models): "full", the
    whole model's operator inventory, or "traced", every kernel of the reference decoder's
    step, which needs `tracer` (decoder.trace.StepTracer; python -m perfmodel.plan --step
    traced hands it in). medusa: "auto" (the best tree or none per batch), "on" (the best
    tree per batch even where plain decoding is faster) or "off" (plain decoding). launch:
    the launch regime the traced step is priced in end to end (perfmodel.base.launch.Launch:
    eager, static or graph, its tracer tracing that regime's step), None for its kernels' sum.

    Raises PerfkitError for bad input, and when the model fits on none of the devices.
    """
    model = model if isinstance(model, ModelConfig) else load_model(model)
    if dtype is not None:
        check_dtype(dtype)
    views = resolve_devices(devices)
    dtypes = [dtype or default_dtype(view) for view in views]
    workload = Workload(
        Lengths.of(prompt_len, "prompt_len"),
        Lengths.of(response_len, "response_len"),
        latency_target_s,
        throughput_target,
    )
    if not is_real(memory_reserve, finite=False) or not 0 <= memory_reserve < 1:
        raise PerfkitError(f"memory_reserve must be a fraction in [0, 1), got {memory_reserve!r}")
    if tensor_parallel is not None and not is_count(tensor_parallel):
        raise PerfkitError(f"tensor_parallel must be a positive integer or None (auto), got {tensor_parallel!r}")
    batches = None if batches is None else positive_ints(batches, "batches")
    medusa = check_medusa(medusa)
    speculate = model.medusa_heads and medusa != MedusaSetting.OFF
    sizes = np.union1d(positive_ints(sizes, "tree sizes"), [1]) if speculate else np.array([1])
    acceptance = medusa_acceptance(acceptance).model
    accept = tabulated(acceptance, sizes)

    if latency not in LATENCY_CHOICES:
        raise PerfkitError(f"unknown latency source {latency!r}; choose from: {', '.join(LATENCY_CHOICES)}")
    check_flavors([step], WHOLE_STEP_FLAVORS)
    check_tracer([step], tracer)
    launch = check_launch_step(launch, step)
    if tensor_parallel is not None:
        model.shard(tensor_parallel)  # one line naming the degrees that split the model
    rows, bands, configs = [], [], []
    for view, view_dtype in zip(views, dtypes):
        if params is not None:
            view = dataclasses.replace(view, params=params)
        setting = Setting(
            model,
            view,
            view_dtype,
            workload,
            accept,
            batches,
            sizes,
            memory_reserve,
            latency,
            step,
            tracer,
            medusa,
            launch,
        )
        row, device_bands, device_configs = (
            plan_device(setting, tensor_parallel) if tensor_parallel else plan_device_auto_tp(setting)
        )
        rows.append(row)
        bands.append(device_bands)
        configs.append(device_configs)
    devices_df = pd.DataFrame(rows, columns=DEVICE_COLUMNS).astype(
        {"batch": "Int64", "tree_size": "Int64", "devices_needed": "Int64"}
    )
    dtype = "/".join(dict.fromkeys(dtypes))  # one name, or each device's default where they differ
    if not devices_df["fits"].any():
        raise DoesNotFit(
            f"{model.name} in {dtype} fits on none of the devices: "
            + "; ".join(f"{r['device']}: {r['note'].removeprefix('does not fit: ')}" for r in rows),
            {r["device"]: r["degree_to_fit"] for r in rows},
        )
    bands_df, configs_df = (
        pd.concat([t for t in tables if t is not None], ignore_index=True) for tables in (bands, configs)
    )
    return PlanResult(model, dtype, workload, describe_acceptance(acceptance), devices_df, bands_df, configs_df)


class DoesNotFit(PerfkitError):
    """The model fits on none of the devices planned. degrees: per device key, the fewest
    devices that hold it among the degrees usable there, or None where none does."""

    def __init__(self, message: str, degrees: dict[str, int | None]):
        super().__init__(message)
        self.degrees = degrees


def serving_plan(
    model: ModelConfig,
    view: DeviceView,
    dtype: str,
    tensor_parallel: int | None,
    acceptance=PAPER_ACCEPTANCE,
    latency: str = "auto",
    prompt_len=DEFAULT_PROMPT_LEN,
    response_len=DEFAULT_RESPONSE_LEN,
    latency_target_s: float | None = None,
    step: str = "full",
    tracer=None,
    medusa: str = "auto",
) -> tuple[int, PlanResult | str]:
    """The tensor-parallel degree to price `model` at on one device, and its capacity plan;
    the one meaning of --tp for every command. tensor_parallel: that degree, or None for the
    plan's choice (plan(tensor_parallel=None)).

    Where the model does not fit at the degree but another degree usable on the device
    holds it, a DoesNotFit error names that degree. Where no usable degree holds it, there
    is nothing to advise: (the degree asked, or 1, and why it does not fit), for the caller
    to say beside numbers that then price its steps as if it did. step, tracer, medusa: plan()'s."""
    try:
        result = plan(
            model,
            [view],
            dtype,
            prompt_len,
            response_len,
            latency_target_s,
            acceptance=acceptance,
            tensor_parallel=tensor_parallel,
            latency=latency,
            step=step,
            tracer=tracer,
            medusa=medusa,
        )
    except DoesNotFit as exc:
        if any(degree is not None for degree in exc.degrees.values()):
            raise
        return tensor_parallel or 1, str(exc)
    return int(result.devices["tensor_parallel"].iloc[0]), result


def tabulated(acceptance, sizes: np.ndarray):
    """The acceptance model evaluated once per tree size, looked up afterwards (the
    head-accuracy model builds a tree per call, too slow to call per configuration)."""
    values = np.asarray(acceptance(sizes), dtype=float)

    def lookup(n):
        return values[np.searchsorted(sizes, n)]

    return lookup


def positive_ints(values, name: str) -> np.ndarray:
    array = np.atleast_1d(np.asarray(values))
    if array.size == 0 or array.dtype.kind not in "iu" or (array < 1).any():
        raise PerfkitError(f"{name} must be positive integers, got {np.ravel(values)[:5].tolist()}")
    return np.unique(array.astype(np.int64))
