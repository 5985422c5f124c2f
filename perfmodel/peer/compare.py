"""The project's static-batch TPOT and TTFT beside aiconfigurator's, over a grid of points,
with the ratios' statistics and where the two part, by component."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import pandas as pd

from perfmodel.hardware.specs import find_spec
from perfmodel.latency.allreduce_tables import engine_all_reduce_stack
from perfmodel.latency.choice import LatencyChoice
from perfmodel.latency.tensor_parallel import tensor_parallel_steps, usable_degrees
from perfmodel.measured.device_view import resolve_view
from perfmodel.models.config import from_hf_config
from perfmodel.peer.aiconfigurator_peer import model_config_path, peer_estimate, peer_quant, peer_split
from perfmodel.peer.static_batch import COMPONENTS, static_batch

# The grid the acceptance asks for: 8B on one device, 70B on 2, 4 and 8.
DEFAULT_MODELS = (("meta-llama/Meta-Llama-3.1-8B", (1,)), ("meta-llama/Meta-Llama-3.1-70B", (2, 4, 8)))
DEFAULT_DEVICES = ("h100-sxm", "a100-sxm")
# Checkpoints quantized as fleets serve them (issue 60), each in the precision its files declare
# on both sides (aiconfigurator infers it from the same files): Qwen3-32B-FP8's fp8-block weights,
# its per-tensor twin with an fp8 KV cache, and NVIDIA's Llama-3.1-70B-Instruct-FP8 (fp8 weights
# and KV cache). On the devices with fp8 tensor cores the acceptance names.
MODEL_SETS = {
    "bf16": (DEFAULT_MODELS, DEFAULT_DEVICES),
    "fp8": (
        (
            ("Qwen/Qwen3-32B-FP8", (1, 2)),
            ("Qwen/Qwen3-32B-FP8-Static-PerTensor", (1, 2)),
            ("nvidia/Llama-3.1-70B-Instruct-FP8", (2, 4, 8)),
        ),
        ("h100-sxm", "h200", "b200"),
    ),
    # Mixture-of-experts models (issue 60): Qwen3-MoE at two sizes (the smaller in bf16 and in its
    # fp8-block checkpoint) and gpt-oss with its MXFP4 experts and windowed layers; the experts split
    # as the project's tables priced them. (The peer ships Mixtral's config but reads it from
    # Hugging Face, which an offline machine cannot.)
    "moe": (
        (
            ("Qwen/Qwen3-30B-A3B", (1, 2)),
            ("Qwen/Qwen3-30B-A3B-FP8", (1, 2)),
            ("openai/gpt-oss-20b", (1, 2)),
            ("Qwen/Qwen3-235B-A22B", (8,)),
        ),
        ("h100-sxm", "h200", "b200"),
    ),
    # NVFP4 (W4A4, Blackwell only): NVIDIA's Qwen3-235B-A22B-NVFP4, experts and layers in NVFP4 over an
    # fp8 KV cache, as its hf_quant_config.json declares.
    "nvfp4": ((("nvidia/Qwen3-235B-A22B-NVFP4", (4, 8)),), ("b200",)),
    # Latent attention (issue 60): DeepSeek-V3 in its fp8-block checkpoint (experts too) on 8 GPUs, the
    # H100s' 640 GB being too few for its 671B parameters.
    "mla": ((("deepseek-ai/DeepSeek-V3", (8,)),), ("h200", "b200")),
}
# The routing a model is priced at on both sides where the peer's model fixes its own (its DeepSeek
# class routes power_law_1.01 whatever it is told); else both take power_law_1.2.
PEER_ROUTING = {"deepseek-ai/DeepSeek-V3": "power_law_1.01"}
DEFAULT_STACKS = ("vllm", "trtllm")
DEFAULT_BATCHES = (1, 4, 16, 64, 128)
DTYPE = "bf16"  # the peer's compute dtype: a quantized checkpoint's formats are its own (ModelConfig.precision)


@dataclass(frozen=True)
class Point:
    device: str
    stack: str
    model: str  # a Hugging Face id the peer ships a config for
    tp: int
    batch: int


def grid(devices, stacks, models, batches) -> tuple[list[Point], list[str]]:
    """The points to compare, and a line for each degree left out: one over which the
    device's all-reduce or all-gather was never measured (the GB200's and GB300's NCCL tables
    stop at a compute tray's 4 GPUs), which the project does not price from a table."""
    points, left_out = [], []
    for device in devices:
        for stack in stacks:
            for model, degrees in models:
                usable = timed_degrees(device, stack, model)
                skipped = [tp for tp in degrees if tp not in usable]
                if skipped:
                    left_out.append(
                        f"{device} {stack} {model.split('/')[-1]}: tp {', '.join(map(str, skipped))} left out, no "
                        f"measured all-reduce or logits all-gather over that many GPUs (tp "
                        f"{', '.join(map(str, usable))} can be timed)"
                    )
                points += [Point(device, stack, model, tp, b) for tp in degrees if tp in usable for b in batches]
    return points, left_out


def timed_degrees(device: str, stack: str, model: str) -> list[int]:
    """The degrees the model splits into and the stack's all-reduce on the device was measured at."""
    return usable_degrees(project_config(model), find_spec(device), engine_all_reduce_stack(device, stack))


@functools.lru_cache(maxsize=16)
def project_config(model: str):
    """The config the peer ships for a model id, as the project reads it (its precision included),
    routed as the peer routes it (PEER_ROUTING)."""
    return from_hf_config(model_config_path(model)).as_served(routing=PEER_ROUTING.get(model))


@functools.lru_cache(maxsize=64)
def project_step(device: str, stack: str, model: str, tp: int):
    """The project's full step of the model split tp ways, priced on the stack's measurements."""
    config = project_config(model)
    view = resolve_view(device, None, [], log=lambda _: None)
    return tensor_parallel_steps(view, config, DTYPE, tp, LatencyChoice.of("auto", stack))["full"]


def compare(point: Point, prompt_len: int, response_len: int) -> dict:
    """One row: both sides' TPOT and TTFT in ms, their ratios (project / peer), and each
    component's TPOT share on both sides."""
    step = project_step(point.device, point.stack, point.model, point.tp)
    ours = static_batch(step, point.batch, prompt_len, response_len)
    quant = peer_quant(project_config(point.model)) | peer_split(step.shard.latency)
    peer = peer_estimate(point.model, point.device, point.stack, point.tp, point.batch, prompt_len, response_len, quant)
    row = {
        "device": point.device,
        "stack": point.stack,
        "peer_version": peer.version,
        "model": point.model.split("/")[-1],
        "tp": point.tp,
        "batch": point.batch,
        "prompt_len": prompt_len,
        "response_len": response_len,
        "tpot_ms": ours.tpot_s * 1e3,
        "peer_tpot_ms": peer.tpot_s * 1e3,
        "tpot_ratio": ours.tpot_s / peer.tpot_s,
        "ttft_ms": ours.ttft_s * 1e3,
        "peer_ttft_ms": peer.ttft_s * 1e3,
        "ttft_ratio": ours.ttft_s / peer.ttft_s,
        "ttft_communication_ms": ours.ttft_communication_s * 1e3,
        "peer_ttft_communication_ms": peer.ttft_communication_s * 1e3,
        "peer_oom": peer.oom,
        "latency": step.label,
    }
    for part in COMPONENTS:
        row[f"{part}_ms"] = ours.tpot_parts[part] * 1e3
        row[f"peer_{part}_ms"] = peer.tpot_parts[part] * 1e3
    return row


@dataclass(frozen=True)
class Summary:
    """|ratio - 1| of TPOT and TTFT over the points the peer fits in memory."""

    points: int
    tpot_median: float
    tpot_worst: float
    tpot_worst_at: str
    ttft_median: float
    ttft_worst: float
    ttft_worst_at: str
    tpot_by_tp: dict[int, float]  # median ratio per tensor-parallel degree


def where(row) -> str:
    return f"{row['model']} tp{row['tp']} b{row['batch']} on {row['device']} {row['stack']}"


def summarize(rows: pd.DataFrame) -> Summary:
    fit = rows[~rows["peer_oom"]]
    stats = {}
    for what in ("tpot", "ttft"):
        deviation = (fit[f"{what}_ratio"] - 1).abs()
        worst = fit.loc[deviation.idxmax()]
        stats[what] = (float(deviation.median()), float(deviation.max()), where(worst))
    by_tp = {int(tp): float(part["tpot_ratio"].median()) for tp, part in fit.groupby("tp")}
    return Summary(len(fit), *stats["tpot"], *stats["ttft"], by_tp)


def ttft_collectives(rows: pd.DataFrame) -> pd.DataFrame:
    """Per stack, the median milliseconds of the prefill's collectives on both sides (the
    all-reduces, the logits gather, an MoE layer's dispatch): where TTFT parts by them."""
    fit = rows[~rows["peer_oom"]]
    medians = fit.groupby(["device", "stack"], sort=False)[["ttft_communication_ms", "peer_ttft_communication_ms"]]
    return medians.median().reset_index()


def component_ratios(rows: pd.DataFrame) -> pd.DataFrame:
    """Per stack and component, the median project / peer ratio of its TPOT share and the
    median difference in ms: where the two estimates part."""
    fit = rows[~rows["peer_oom"]]
    out = []
    for (device, stack), part in fit.groupby(["device", "stack"], sort=False):
        for name in COMPONENTS:
            ours, theirs = part[f"{name}_ms"], part[f"peer_{name}_ms"]
            ratio = np.where(theirs > 0, ours / theirs.where(theirs > 0, 1.0), np.nan)
            out.append(
                {
                    "device": device,
                    "stack": stack,
                    "component": name,
                    "median_ratio": float(np.nanmedian(ratio)) if np.isfinite(ratio).any() else np.nan,
                    "median_diff_ms": float((ours - theirs).median()),
                }
            )
    return pd.DataFrame(out)
