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

import dataclasses
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.acceptance import PAPER_ACCEPTANCE, describe_acceptance, resolve_acceptance
from perfmodel.cli import Parser, positive_int, run
from perfmodel.device_view import resolve_devices
from perfmodel.dtypes import DTYPES, check_dtype, element_bytes
from perfmodel.errors import PerfkitError
from perfmodel.hardware import HardwareSpec, load_all_specs
from perfmodel.latency import RooflineLatency, RooflineParams
from perfmodel.models import ModelConfig, load_model
from perfmodel.operators import op_kernels
from perfmodel.simulations import CANDIDATE_SIZES, pick_best, speedup_table
from perfmodel.step import StepModel

DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DEFAULT_PROMPT_LEN = 512
DEFAULT_RESPONSE_LEN = 256
DEFAULT_RESERVE = 0.1
GB = 1e9


# ----------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class Lengths:
    """A length distribution in tokens: its mean (for latency) and its p95 (for memory)."""

    mean: float
    p95: int

    @classmethod
    def of(cls, value, name: str = "length") -> Lengths:
        """From an int, a (mean, p95) tuple, a sequence/array of samples, or a Lengths."""
        if isinstance(value, Lengths):
            return cls.checked(value.mean, value.p95, name)
        if isinstance(value, tuple) and len(value) == 2:
            return cls.checked(value[0], value[1], name)
        if isinstance(value, (Sequence, np.ndarray)) and not isinstance(value, (str, bytes)):
            samples = np.asarray(value)
            if samples.size == 0 or samples.dtype.kind not in "iuf":
                raise PerfkitError(f"{name}: samples must be a non-empty list of token counts, got {value!r}")
            if not np.isfinite(samples).all() or (samples < 1).any():
                raise PerfkitError(
                    f"{name}: every sample must be >= 1 token, got {samples[~(samples >= 1)].ravel()[:3].tolist()}"
                )
            return cls.checked(float(samples.mean()), math.ceil(float(np.quantile(samples, 0.95))), name)
        return cls.checked(value, value, name, labels=("", ""))

    @classmethod
    def checked(cls, mean, p95, name: str, labels=(" mean", " p95")) -> Lengths:
        for what, x in zip(labels, (mean, p95)):
            if (
                isinstance(x, bool)
                or not isinstance(x, (int, float, np.integer, np.floating))
                or not math.isfinite(x)
                or x < 1
            ):
                raise PerfkitError(
                    f"{name}{what} must be a number of tokens >= 1, got {x!r} (give an int, a (mean, p95) pair or a "
                    "list of samples)"
                )
        if p95 < mean:
            raise PerfkitError(f"{name}: p95 ({p95}) must be >= the mean ({mean})")
        return cls(float(mean), math.ceil(p95))

    def __str__(self) -> str:
        return f"{self.mean:g}" if self.mean == self.p95 else f"mean {self.mean:g}, p95 {self.p95}"


@dataclass(frozen=True)
class Workload:
    """What the deployment must serve: lengths, and the latency and throughput targets."""

    prompt: Lengths
    response: Lengths
    latency_target_s: float | None = None  # per output token, per user
    throughput_target: float | None = None  # output tokens/s, all users together

    def __post_init__(self) -> None:
        for name in ("latency_target_s", "throughput_target"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0
            ):
                raise PerfkitError(f"{name} must be a positive number, got {value!r}")

    @property
    def kv_tokens(self) -> int:
        """Tokens each sequence keeps in the KV cache: p95 prompt + p95 response."""
        return self.prompt.p95 + self.response.p95

    @property
    def step_context(self) -> int:
        """Context of the average decoding step: mean prompt + half the mean response."""
        return max(1, round(self.prompt.mean + self.response.mean / 2))


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


# ----------------------------------------------------------------------------- memory


LAYER_WEIGHT_OPS = ("q", "k", "v", "o", "up", "gate", "down")


def linear_params(op: str, model: ModelConfig) -> int:
    """Weights of operator `op`, shaped by the operator table (perfmodel.operators) so
    memory counts the same matrices the step's cost reads."""
    return sum(math.prod(m.right_shape) for m in op_kernels(op, "decode", model, 1, 1) if m.weight)


def weight_params(model: ModelConfig) -> int:
    """Parameters of the base model: embeddings, per layer the attention and MLP weights and
    2 norms, the final norm, and the lm_head unless it is the embedding matrix (tied)."""
    h = model.hidden_size
    layer = sum(linear_params(op, model) for op in LAYER_WEIGHT_OPS) + 2 * h
    lm_head = 0 if model.tie_word_embeddings else linear_params("lm_head", model)
    return model.vocab_size * h + model.num_layers * layer + h + lm_head


def head_params(model: ModelConfig) -> int:
    """Medusa heads: each a residual block (h x h weight and its bias of h; the operator
    table has no biases) and its own vocabulary projection (h x V)."""
    return linear_params("medusa_heads", model) + model.medusa_heads * model.hidden_size


def kv_bytes_per_token(model: ModelConfig, dtype: str) -> int:
    """Key and value of every layer for one token."""
    return 2 * model.num_layers * model.num_kv_heads * model.head_dim * element_bytes(dtype)


def usable_bytes(spec: HardwareSpec, reserve: float) -> float:
    return spec.memory_gb * GB * (1 - reserve)


def tensor_parallel_spec(spec: HardwareSpec, n: int) -> HardwareSpec:
    """n devices as one: n x memory, bandwidth and FLOP/s (communication ignored)."""
    if n == 1:
        return spec
    return dataclasses.replace(
        spec,
        memory_gb=spec.memory_gb * n,
        memory_bandwidth_gb_s=spec.memory_bandwidth_gb_s * n,
        peak_tflops={k: v * n for k, v in spec.peak_tflops.items()},
    )


def devices_to_fit(need_bytes: float, spec: HardwareSpec, reserve: float) -> int:
    """Fewest devices of this kind whose usable memory, evenly split, holds need_bytes."""
    return max(1, math.ceil(need_bytes / usable_bytes(spec, reserve)))


# ----------------------------------------------------------------------------- result


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
        w = self.workload
        lines = [
            f"{self.model.name} ({self.dtype}): prompts {w.prompt} tokens, responses {w.response}; KV cache sized "
            f"for {w.kv_tokens:,} tokens "
            f"per sequence, step latency at a {w.step_context:,}-token context.",
            f"Acceptance: {self.acceptance}.",
        ]
        targets = []
        if w.latency_target_s is not None:
            targets.append(f"<= {w.latency_target_s * 1e3:g} ms per token per user")
        if w.throughput_target is not None:
            targets.append(f"{w.throughput_target:,.0f} tokens/s in all")
        if targets:
            lines.append("Target: " + " and ".join(targets) + ".")
        paragraphs = [
            device_paragraph(row, self.bands[self.bands["device"] == row.device], w)
            for row in self.devices.itertuples()
        ]
        return "\n".join(lines) + "\n\n" + "\n\n".join([*paragraphs, overall(self.devices, w)])


def tree_bands(bands: pd.DataFrame) -> str:
    """'batch 1: tree 160 (2.01x), 2: 80 (1.74x); batch 16-256: none' for one device."""
    parts, run_start, prev = [], None, None
    for row in bands.itertuples():
        if row.speculate:
            if run_start is not None:
                parts.append(none_run(run_start, prev))
                run_start = None
            parts.append(f"batch {row.batch}: tree {row.tree_size} ({row.speedup:.2f}x)")
        elif run_start is None:
            run_start = row.batch
        prev = row.batch
    if run_start is not None:
        parts.append(none_run(run_start, prev))
    return "; ".join(parts)


def none_run(first: int, last: int) -> str:
    batches = f"batch {first}" if first == last else f"batch {first}-{last}"
    return f"{batches}: none (plain decoding is faster)"


def device_paragraph(row, bands: pd.DataFrame, w: Workload) -> str:
    tp = f" x{row.tensor_parallel} (tensor parallel)" if row.tensor_parallel > 1 else ""
    head = f"{row.name} ({row.device}){tp}: "
    if not row.fits:
        return head + row.note
    text = head + (
        f"{row.weights_gb:.1f} GB of weights + {row.heads_gb:.1f} GB of Medusa heads; "
        f"{row.kv_mb_per_seq:,.0f} MB of KV cache per sequence -> max batch {row.max_batch:,}. "
        f"Trees: {tree_bands(bands)}. "
    )
    if not row.meets_latency:
        return text + row.note[0].upper() + row.note[1:]
    tree = f"tree of {row.tree_size}" if row.speculate else "no tree"
    text += (
        f"Recommended: batch {row.batch}, {tree}: {row.per_token_ms:.1f} ms/token, "
        f"{row.user_tokens_s:,.0f} tokens/s per user, {row.total_tokens_s:,.0f} tokens/s in all"
    )
    if w.throughput_target is not None:
        text += f"; {row.devices_needed:,} device(s) for {w.throughput_target:,.0f} tokens/s"
    return text + "."


def overall(devices: pd.DataFrame, w: Workload) -> str:
    fits = devices[devices["fits"]]
    ok = fits[fits["meets_latency"]]
    if ok.empty:
        fastest = fits.loc[fits["best_ms"].idxmin()]
        return (
            f"No device meets {w.latency_target_s * 1e3:g} ms per token: the fastest is {fastest['device']} at "
            f"{fastest['best_ms']:.1f} ms/token; relax the target, shorten the context or use a faster device."
        )
    if w.throughput_target is not None:
        best = ok.loc[ok["devices_needed"].idxmin()]
        return (
            f"Fewest devices for {w.throughput_target:,.0f} tokens/s: {int(best['devices_needed'])} x {best['device']}."
        )
    best = ok.loc[ok["total_tokens_s"].idxmax()]
    return (
        f"Most tokens/s per replica: {best['device']} ({best['total_tokens_s']:,.0f} tokens/s at batch "
        f"{best['batch']})."
    )


# ----------------------------------------------------------------------------- planning


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


# ----------------------------------------------------------------------------- benchmark


def benchmark(model: str = "llama-7b", repeats: int = 3) -> tuple[int, float]:
    """Configurations planned and the best time of `repeats` plan() calls: every shipped
    device x batches 1..64 (up to its max batch) x the 22 candidate tree sizes: 11,638
    configurations for llama-7b."""
    devices = list(load_all_specs())
    best = math.inf
    for _ in range(repeats):
        started = time.perf_counter()
        result = plan(model, devices, batches=range(1, 65), latency_target_s=0.05, throughput_target=10_000)
        best = min(best, time.perf_counter() - started)
    return len(result.configs), best


# ----------------------------------------------------------------------------- CLI


DEVICE_FIELDS = {
    "name": "name",
    "tensor_parallel": "tensor parallel",
    "usable_gb": "usable memory (GB)",
    "weights_gb": "weights (GB)",
    "heads_gb": "Medusa heads (GB)",
    "kv_mb_per_token": "KV cache per token (MB)",
    "kv_mb_per_seq": "KV cache per sequence (MB)",
    "max_batch": "max batch",
    "batch": "recommended batch",
    "tree": "recommended tree",
    "speedup": "speedup vs plain",
    "per_token_ms": "per-token latency (ms)",
    "user_tokens_s": "tokens/s per user",
    "total_tokens_s": "tokens/s in all",
    "devices_needed": "devices needed",
}
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


def format_devices(devices: pd.DataFrame) -> str:
    shown = devices.set_index("device")[list(DEVICE_FIELDS)].rename(columns=DEVICE_FIELDS)
    return shown.T.to_string(float_format=lambda x: f"{x:,.2f}")


def format_bands(bands: pd.DataFrame) -> str:
    return bands[BAND_SHOWN].to_string(index=False, float_format=lambda x: f"{x:,.2f}")


def length_arg(values: list[float], flag: str):
    if len(values) > 2:
        raise PerfkitError(f"{flag} takes a mean and optionally a p95, got {len(values)} values")
    return values[0] if len(values) == 1 else tuple(values)


def number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        import argparse

        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None


def build_parser() -> Parser:
    p = Parser(prog="python -m perfmodel.plan", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", metavar="NAME|PATH", help="a model preset (e.g. llama-7b) or a config.json path")
    p.add_argument(
        "--gpu",
        nargs="+",
        default=[],
        metavar="NAME",
        help="devices in hw_specs/ by name or alias (e.g. a100 h100), or cpu (this machine, from its measurements)",
    )
    p.add_argument(
        "--spec", nargs="+", default=[], type=Path, metavar="FILE", help="device spec YAML files of your own"
    )
    p.add_argument("--dtype", default="fp16", help=f"one of {', '.join(DTYPES)} (default %(default)s)")
    p.add_argument(
        "--prompt-len",
        nargs="+",
        type=number,
        default=[DEFAULT_PROMPT_LEN],
        metavar="TOKENS",
        help=f"prompt tokens: MEAN [P95] (default {DEFAULT_PROMPT_LEN})",
    )
    p.add_argument(
        "--response-len",
        nargs="+",
        type=number,
        default=[DEFAULT_RESPONSE_LEN],
        metavar="TOKENS",
        help=f"response tokens: MEAN [P95] (default {DEFAULT_RESPONSE_LEN})",
    )
    p.add_argument("--latency-ms", type=number, metavar="MS", help="per-token latency target per user, in ms")
    p.add_argument("--throughput", type=number, metavar="TOKENS_S", help="aggregate throughput target, output tokens/s")
    p.add_argument(
        "--acceptance",
        default="paper",
        metavar="paper|FILE.json",
        help="paper = acc(n) = 0.477 ln(n) (default); FILE = a python -m decoder.measure record (the closer to its "
        "measurements of its log fit and head-accuracy model)",
    )
    p.add_argument(
        "--batch",
        nargs="+",
        type=positive_int,
        metavar="B",
        help=f"batch sizes (default {' '.join(map(str, DEFAULT_BATCHES))})",
    )
    p.add_argument(
        "--tp",
        default="1",
        metavar="N|auto",
        help="devices per model replica, tensor parallel (default 1; auto: the smallest power of two that fits)",
    )
    p.add_argument(
        "--reserve",
        type=number,
        default=DEFAULT_RESERVE,
        metavar="FRACTION",
        help="memory kept free per device (default %(default)s)",
    )
    p.add_argument("--csv", type=Path, metavar="FILE", help="write the bands table (device x batch) to this CSV file")
    p.add_argument(
        "--benchmark", action="store_true", help="time plan() over >= 10,000 configurations and print the rate"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.benchmark:
        count, seconds = benchmark(args.model or "llama-7b")
        print(f"{count:,} configurations (device x batch x tree size) in {seconds:.3f} s ({count / seconds:,.0f}/s)")
        return 0
    if not args.model or not (args.gpu or args.spec):
        p.error("--model and at least one --gpu or --spec are required")
    if args.tp == "auto":
        tp = None
    elif args.tp.isdigit() and int(args.tp) >= 1:
        tp = int(args.tp)
    else:
        p.error(f"argument --tp: must be a positive integer or auto, got {args.tp!r}")
    result = plan(
        args.model,
        [*args.gpu, *args.spec],
        dtype=args.dtype,
        prompt_len=length_arg(args.prompt_len, "--prompt-len"),
        response_len=length_arg(args.response_len, "--response-len"),
        latency_target_s=None if args.latency_ms is None else args.latency_ms / 1e3,
        throughput_target=args.throughput,
        acceptance=args.acceptance,
        batches=args.batch or DEFAULT_BATCHES,
        memory_reserve=args.reserve,
        tensor_parallel=tp,
    )
    print("Devices\n" + format_devices(result.devices))
    for device, bands in result.bands.groupby("device", sort=False):
        print(f"\nBands on {device} (best tree per batch)\n" + format_bands(bands))
    print("\n" + result.summary())
    if args.csv:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        result.bands.to_csv(args.csv, index=False)
        print(f"\nbands written to {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
