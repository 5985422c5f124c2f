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
  kv_heads x head_dim x element bytes, in the model's dtype. `memory_reserve` (default
  10%) of each device is kept for activations, logits, the CUDA context and
  fragmentation, which are not counted.
  Memory is in GB = 1e9 bytes, as the device specs give it.
- Tensor parallelism is a simple even split: N devices act as one device with N x the
  memory, bandwidth and FLOP/s; communication (all-reduce) is ignored, so multi-device
  speeds are optimistic. `tensor_parallel=None` picks the smallest power of two that fits.
- Speed: per-token latency = Medusa step time / tokens accepted per step (the mean time
  between a user's tokens; Medusa emits them in bursts); per-user tokens/s = 1 / that;
  aggregate tokens/s = batch x per-user. Prefill (time to first token) is not modelled:
  these are decoding speeds. Step times come from the roofline latency model
  (perfmodel.latency) over the whole step (perfmodel.step, flavor "full").
- Devices needed for a throughput target = tensor_parallel x ceil(target / the best
  aggregate tokens/s of one replica that meets the latency target).

A configuration is one (device, batch, tree size) point: its memory fit, step time,
acceptance, per-token latency and tokens/s. `python -m perfmodel.plan --benchmark` times
plan() over more than 10,000 of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.acceptance import PAPER_ACCEPTANCE, describe_acceptance, resolve_acceptance
from perfmodel.device_view import resolve_devices
from perfmodel.dtypes import check_dtype, element_bytes
from perfmodel.errors import PerfkitError
from perfmodel.latency import RooflineLatency, RooflineParams
from perfmodel.memory import (
    DEFAULT_RESERVE,
    GB,
    devices_to_fit,
    head_params,
    kv_bytes_per_token,
    tensor_parallel_spec,
    usable_bytes,
    weight_params,
)
from perfmodel.models import ModelConfig, load_model
from perfmodel.plan_summary import plan_summary
from perfmodel.simulations import CANDIDATE_SIZES, pick_best, speedup_table
from perfmodel.step import StepModel
from perfmodel.workload import DEFAULT_PROMPT_LEN, DEFAULT_RESPONSE_LEN, Lengths, Workload

DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class PlanResult:
    """The plan's tables and the inputs they answer.

    devices: one row per device: memory, max batch, the recommended batch and tree, speeds
             and devices needed (fits False with a `note` where the model does not fit).
    bands:   one row per device x batch that fits: the best tree ("none" where plain
             decoding wins), speedup, per-token latency, per-user and aggregate tokens/s.
    configs: every (device, batch, tree size) configuration evaluated.
    Memory and tokens/s are per replica: all `tensor_parallel` devices of it together.
    """

    model: ModelConfig
    dtype: str
    workload: Workload
    acceptance: str
    devices: pd.DataFrame = field(repr=False)
    bands: pd.DataFrame = field(repr=False)
    configs: pd.DataFrame = field(repr=False)

    @property
    def feasible(self) -> bool:
        """True where some device fits and meets the latency target."""
        return bool(self.devices["meets_latency"].any())

    def summary(self) -> str:
        """The plan in words (perfmodel.plan_summary)."""
        return plan_summary(self)


def plan(
    model: str | Path | ModelConfig,
    devices,
    dtype: str = "fp16",
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
) -> PlanResult:
    """Plan serving `model` on each of `devices` (see the module docstring for the model).

    model: a preset name, a config.json path or a ModelConfig. devices: names (cpu: this
    machine's CPU from its stored measurements), spec files, HardwareSpecs or DeviceViews,
    one or many, resolved by perfmodel.device_view.resolve_devices. prompt_len /
    response_len: an int, a (mean, p95) pair or a list of samples. latency_target_s: seconds per output token per user.
    throughput_target: output tokens/s in all. acceptance: "paper", a decoder.measure JSON
    path or an acceptance model (tokens per step as a function of tree size), as
    perfmodel.acceptance.resolve_acceptance reads it. batches: batch sizes to evaluate (the
    device's max batch is added where it is below the largest). sizes: tree sizes (root
    included) to search; 1 (plain decoding) is always included. tensor_parallel: devices
    per model replica, or None for the smallest power of two that fits. params: the latency
    model's efficiencies for every device, or None for each device's own (the public
    defaults on a datasheet, none on a CPU's measured ceilings).

    Raises PerfkitError for bad input, and when the model fits on none of the devices.
    """
    model = model if isinstance(model, ModelConfig) else load_model(model)
    check_dtype(dtype)
    views = resolve_devices(devices)
    workload = Workload(
        Lengths.of(prompt_len, "prompt_len"),
        Lengths.of(response_len, "response_len"),
        latency_target_s,
        throughput_target,
    )
    if isinstance(memory_reserve, bool) or not isinstance(memory_reserve, (int, float)) or not 0 <= memory_reserve < 1:
        raise PerfkitError(f"memory_reserve must be a fraction in [0, 1), got {memory_reserve!r}")
    if tensor_parallel is not None and (
        isinstance(tensor_parallel, bool) or not isinstance(tensor_parallel, int) or tensor_parallel < 1
    ):
        raise PerfkitError(f"tensor_parallel must be a positive integer or None (auto), got {tensor_parallel!r}")
    batches = positive_ints(batches, "batches")
    sizes = np.union1d(positive_ints(sizes, "tree sizes"), [1]) if model.medusa_heads else np.array([1])
    acceptance = resolve_acceptance(acceptance).model
    accept = tabulated(acceptance, sizes)

    rows, bands, configs = [], [], []
    for view in views:
        row, device_bands, device_configs = plan_device(
            model,
            view.spec,
            dtype,
            workload,
            accept,
            batches,
            sizes,
            memory_reserve,
            tensor_parallel,
            params or view.params,
        )
        rows.append(row)
        bands.append(device_bands)
        configs.append(device_configs)
    devices_df = pd.DataFrame(rows, columns=DEVICE_COLUMNS).astype(
        {"batch": "Int64", "tree_size": "Int64", "devices_needed": "Int64"}
    )
    if not devices_df["fits"].any():
        raise PerfkitError(
            f"{model.name} in {dtype} fits on none of the devices: "
            + "; ".join(f"{r['device']}: {r['note'].removeprefix('does not fit: ')}" for r in rows)
        )
    bands_df, configs_df = (
        pd.concat([t for t in tables if t is not None], ignore_index=True) for tables in (bands, configs)
    )
    return PlanResult(model, dtype, workload, describe_acceptance(acceptance), devices_df, bands_df, configs_df)


def plan_device(model, spec, dtype, w: Workload, accept, batches, sizes, reserve, tensor_parallel, params):
    """One device's row, bands and configurations."""
    weights = weight_params(model) * element_bytes(dtype)
    heads = head_params(model) * element_bytes(dtype)
    kv_token = kv_bytes_per_token(model, dtype)
    one_sequence = weights + heads + kv_token * w.kv_tokens
    needed = devices_to_fit(one_sequence, spec, reserve)
    tp = tensor_parallel or 2 ** math.ceil(math.log2(needed))
    usable = usable_bytes(spec, reserve) * tp
    free = usable - weights - heads
    max_batch = max(0, int(free // (kv_token * w.kv_tokens)))
    row = dict(
        device=spec.key,
        name=spec.name,
        tensor_parallel=tp,
        memory_gb=spec.memory_gb * tp,
        usable_gb=usable / GB,
        weights_gb=weights / GB,
        heads_gb=heads / GB,
        kv_mb_per_token=kv_token / 1e6,
        kv_mb_per_seq=kv_token * w.kv_tokens / 1e6,
        max_batch=max_batch,
        fits=max_batch >= 1,
    )
    if max_batch < 1:
        where = f"{tp} devices" if tp > 1 else "one device"
        if weights + heads > usable:
            why = (
                f"weights + heads ({(weights + heads) / GB:,.1f} GB) exceed the {usable / GB:,.1f} GB usable on {where}"
            )
        else:
            why = (
                f"one {w.kv_tokens:,}-token sequence needs {kv_token * w.kv_tokens / GB:,.2f} GB of KV cache, "
                f"{free / GB:,.2f} GB is left after the weights on {where}"
            )
        row.update(
            note=f"does not fit: {why} ({spec.memory_gb:g} GB each, less the {reserve:.0%} reserve); it needs "
            f"{needed} devices in tensor parallel (tensor_parallel={needed} or --tp {needed}; None or auto picks a "
            "power of two)"
        )
        return row | NO_RECOMMENDATION, None, None

    planned = batches[batches <= max_batch]
    if max_batch < batches[-1] and max_batch not in planned:
        planned = np.append(planned, max_batch)
    step = StepModel(model, RooflineLatency(tensor_parallel_spec(spec, tp), model, dtype, params))
    table = speedup_table(step, accept, planned, w.step_context, sizes).sort_values(
        ["batch", "tree_size"], ignore_index=True
    )
    table.insert(0, "device", spec.key)
    table["memory_gb"] = (weights + heads + table["batch"] * kv_token * (w.kv_tokens + table["tree_size"] - 1)) / GB
    table["fits"] = table["memory_gb"] * GB <= usable
    table["per_token_s"] = table["medusa_step_s"] / table["acceptance"]
    table["total_tokens_s"] = table["batch"] / table["per_token_s"]

    # Best tree per batch among those whose KV fits (plain decoding always does): the most
    # speedup (so the least time per token at that batch), ties to the smaller tree.
    band = pick_best(table, ["batch"], eligible=table["fits"]).reset_index(drop=True)
    band["tree"] = np.where(band["speculate"], band["tree_size"].astype(str), "none")
    band["per_token_ms"] = band["per_token_s"] * 1e3
    band["user_tokens_s"] = 1 / band["per_token_s"]
    band["meets_latency"] = True if w.latency_target_s is None else band["per_token_s"] <= w.latency_target_s
    band = band[BAND_COLUMNS]

    ok = band[band["meets_latency"]]
    fastest = band.loc[band["per_token_ms"].idxmin()]
    row["best_ms"] = fastest["per_token_ms"]
    if ok.empty:
        tree = f"tree of {fastest['tree']}" if fastest["speculate"] else "no tree"
        row.update(NO_RECOMMENDATION)
        row["note"] = (
            f"no batch meets {w.latency_target_s * 1e3:g} ms per token: the fastest is {fastest['per_token_ms']:.1f} "
            f"ms/token at batch {fastest['batch']} ({tree})."
        )
        return row, band, table
    pick = ok.loc[ok["total_tokens_s"].idxmax()]
    replicas = 1 if w.throughput_target is None else math.ceil(w.throughput_target / pick["total_tokens_s"])
    row.update(
        batch=int(pick["batch"]),
        tree=pick["tree"],
        tree_size=int(pick["tree_size"]),
        speculate=bool(pick["speculate"]),
        speedup=pick["speedup"],
        per_token_ms=pick["per_token_ms"],
        user_tokens_s=pick["user_tokens_s"],
        total_tokens_s=pick["total_tokens_s"],
        meets_latency=True,
        devices_needed=tp * replicas,
        note="",
    )
    return row, band, table


DEVICE_COLUMNS = [
    "device",
    "name",
    "tensor_parallel",
    "memory_gb",
    "usable_gb",
    "weights_gb",
    "heads_gb",
    "kv_mb_per_token",
    "kv_mb_per_seq",
    "max_batch",
    "fits",
    "batch",
    "tree",
    "tree_size",
    "speculate",
    "speedup",
    "per_token_ms",
    "user_tokens_s",
    "total_tokens_s",
    "meets_latency",
    "devices_needed",
    "best_ms",
    "note",
]
BAND_COLUMNS = [
    "device",
    "batch",
    "tree",
    "tree_size",
    "speculate",
    "speedup",
    "acceptance",
    "medusa_step_s",
    "per_token_ms",
    "user_tokens_s",
    "total_tokens_s",
    "memory_gb",
    "meets_latency",
]
# The bands' columns a reader wants, in the CLI and the report.
BAND_SHOWN = [
    "batch",
    "tree",
    "speedup",
    "acceptance",
    "per_token_ms",
    "user_tokens_s",
    "total_tokens_s",
    "memory_gb",
    "meets_latency",
]
NO_RECOMMENDATION = dict(
    batch=pd.NA,
    tree="",
    tree_size=pd.NA,
    speculate=False,
    speedup=np.nan,
    per_token_ms=np.nan,
    user_tokens_s=np.nan,
    total_tokens_s=np.nan,
    meets_latency=False,
    devices_needed=pd.NA,
)


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
