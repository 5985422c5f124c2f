"""One device's capacity plan at a tensor-parallel degree (plan_device), or at the degree
that gives the most tokens/s per device (plan_device_auto_tp): its memory fit, the best
tree per batch and the recommendation, or why the model does not fit and what would hold
it. perfmodel.planning.capacity.plan runs it for every device asked about.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from perfmodel.acceptance.rates import AcceptanceModel
from perfmodel.hardware.specs import HardwareSpec
from perfmodel.latency.step import StepFlavor
from perfmodel.latency.tensor_parallel import usable_degrees
from perfmodel.measured.device_view import DeviceView
from perfmodel.models.config import ModelConfig
from perfmodel.planning.deployment import Deployment
from perfmodel.planning.drafters import Drafter
from perfmodel.planning.measured_chain import drafter_memory
from perfmodel.planning.medusa_setting import MedusaSetting
from perfmodel.planning.memory import GB, DrafterMemory, MemoryFit, memory_fit
from perfmodel.planning.result import BAND_COLUMNS
from perfmodel.planning.simulations import pick_best, speedup_table
from perfmodel.planning.workload import Targets, Workload


@dataclass(frozen=True)
class Setting:
    """What one device's plan is of: a deployment (its tp None: the degree is searched) and
    what is asked of it."""

    deployment: Deployment
    workload: Workload
    targets: Targets
    accept: AcceptanceModel  # tokens per step by tree size, tabulated once (capacity.tabulated)
    batches: np.ndarray | None
    sizes: np.ndarray
    reserve: float
    medusa: str = "auto"  # auto: a tree where it wins; on: a tree at every batch; off: none
    # another drafter than the Medusa heads, for a deployment (perfmodel.planning.measured_chain); None: the heads
    drafter_for: Callable[[Deployment], Drafter] | None = None

    @property
    def model(self) -> ModelConfig:
        return self.deployment.model

    @property
    def view(self) -> DeviceView:
        return self.deployment.view

    @property
    def dtype(self) -> str:
        return self.deployment.dtype


# tensor_parallel=None tries these degrees (those that split the model and fit).
AUTO_TP = (1, 2, 4, 8)


def plan_device_auto_tp(setting: Setting):
    """The tensor-parallel degree with the most tokens/s per device (meeting the latency
    target where one is set) among those that fit; the smallest that fits when none does."""
    usable = usable_degrees(setting.model, setting.view.evidence)
    degrees = [tp for tp in AUTO_TP if tp in usable]
    tried = [plan for tp in degrees for plan in plan_splits(setting, tp)]
    return best_plan(tried)


def best_plan(tried: list):
    """Of plans (row, bands, configurations), the one with the most tokens/s per device meeting
    the latency target where one does; the last when none fits."""
    fitting = [t for t in tried if t[0]["fits"]]
    if not fitting:
        return tried[-1]
    meeting = [t for t in fitting if t[0]["meets_latency"]] or fitting

    def per_device(t):
        row, band, _ = t
        best = row["total_tokens_s"] if row["meets_latency"] else band["total_tokens_s"].max()
        return best / row["tensor_parallel"]

    return max(meeting, key=per_device)


def plan_splits(setting: Setting, tp: int) -> list:
    """plan_device at tp once per expert split the planner searches (Deployment.expert_splits:
    an MoE model's experts tensor- and expert-parallel); one plan for any other model."""
    return [
        plan_device(dataclasses.replace(setting, deployment=deployment), tp)
        for deployment in setting.deployment.at(tp).expert_splits()
    ]


def plan_degree(setting: Setting, tp: int):
    """The best of plan_splits at tp (the most tokens/s per device, as plan_device_auto_tp picks)."""
    return best_plan(plan_splits(setting, tp))


def runs_heads(setting: Setting) -> bool:
    """Whether the plan's deployment loads the Medusa heads: not with Medusa off, nor with another drafter."""
    return setting.drafter_for is None and setting.medusa != MedusaSetting.OFF and setting.model.medusa_heads > 0


def fit_degree(
    model: ModelConfig,
    spec: HardwareSpec,
    dtype: str,
    kv_tokens: int,
    reserve: float,
    heads: bool,
    drafter: DrafterMemory | None = None,
) -> int | None:
    """The fewest devices of `spec` that hold the model (with its heads, `heads`, or another
    drafter's memory) and one sequence, among the degrees that may be used there
    (tensor_parallel.usable_degrees); None where none does."""
    for tp in usable_degrees(model, spec):
        if memory_fit(model, spec, dtype, tp, kv_tokens, reserve, heads=heads, drafter=drafter).max_batch >= 1:
            return tp
    return None


def batch_grid(batches: np.ndarray | None, max_batch: int) -> np.ndarray:
    """The batches to plan: those given that fit, and the max batch where it is below the
    largest given; by default (None) every power of two up to the max batch, and it."""
    if batches is None:
        powers = 2 ** np.arange(int(max_batch).bit_length(), dtype=np.int64)
        return np.union1d(powers, [max_batch])
    planned = batches[batches <= max_batch]
    if max_batch < batches[-1] and max_batch not in planned:
        planned = np.append(planned, max_batch)
    return planned


def does_not_fit(model: ModelConfig, setting: Setting, fit: MemoryFit) -> tuple[str, int | None]:
    """Why the model does not fit at fit.tp, and the degree to use instead (one that splits
    the model and that the device can time; None where there is none)."""
    spec, w, reserve, tp = setting.view.spec, setting.workload, setting.reserve, fit.tp
    where = f"{tp} devices" if tp > 1 else "one device"
    if fit.weights + fit.heads > fit.usable:
        why = (
            f"{fit.holds} ({(fit.weights + fit.heads) / GB:,.1f} GB) exceed the {fit.usable / GB:,.1f} GB usable "
            f"on {where}"
        )
    else:
        why = (
            f"one {w.kv_tokens:,}-token sequence needs {fit.kv_sequence / GB:,.2f} GB of KV cache, "
            f"{fit.free / GB:,.2f} GB is left after the weights on {where}"
        )
    why = f"does not fit: {why} ({spec.memory_gb:g} GB each, less the {reserve:.0%} reserve)"
    degree = fit_degree(model, spec, setting.dtype, w.kv_tokens, reserve, runs_heads(setting), fit.drafter_memory)
    if degree is None:
        usable = usable_degrees(model, setting.view.evidence)
        return (
            f"{why}; no tensor-parallel degree holds it: {spec.key} can use {', '.join(map(str, usable))} (the degrees "
            f"that split {model.name} and over which its all-reduces can be timed), and {max(usable)} device(s) hold "
            "too little; use a device with more memory, a smaller dtype or shorter sequences"
        ), None
    auto = (
        "None or auto picks the degree with the most tokens/s per device"
        if degree <= max(AUTO_TP)
        else f"auto tries {', '.join(map(str, AUTO_TP))} only"
    )
    return (
        f"{why}; it needs {degree} devices in tensor parallel (tensor_parallel={degree} or --tp {degree}; {auto})",
        degree,
    )


def plan_device(setting: Setting, tp: int):
    """One device's row, bands and configurations at tensor-parallel degree tp."""
    model, spec, dtype, w = setting.model, setting.view.spec, setting.dtype, setting.workload
    accept, sizes = setting.accept, setting.sizes
    deployment = setting.deployment.at(tp)
    drafter = None if setting.drafter_for is None else setting.drafter_for(deployment)
    held = None if drafter is None else drafter_memory(drafter, model, dtype, tp)
    fit = memory_fit(model, spec, dtype, tp, w.kv_tokens, setting.reserve, heads=runs_heads(setting), drafter=held)
    row = dict(
        device=spec.key,
        name=spec.name,
        tensor_parallel=tp,
        memory_gb=spec.memory_gb * tp,
        usable_gb=fit.usable / GB,
        weights_gb=fit.weights / GB,
        heads_gb=fit.heads / GB,
        kv_mb_per_token=fit.kv_token / 1e6,
        kv_mb_per_seq=fit.kv_sequence / 1e6,
        max_batch=fit.max_batch,
        fits=fit.max_batch >= 1,
        latency_model="",
    )
    if fit.max_batch < 1:
        note, degree = does_not_fit(model, setting, fit)
        row.update(note=note, degree_to_fit=degree)
        return row | NO_RECOMMENDATION, None, None

    planned = batch_grid(setting.batches, fit.max_batch)
    step = deployment.step_model() if drafter is None else drafter.step(deployment.step_model())
    table = speedup_table(step, accept, planned, w.step_context, sizes).sort_values(
        ["batch", "tree_size"], ignore_index=True
    )
    table.insert(0, "device", spec.key)
    regime = f" ({step.shard.launch_label})" if deployment.launch is not None else ""
    row["latency_model"] = (
        step.label if deployment.step is StepFlavor.FULL else f"{deployment.step} step{regime}: {step.label}"
    )
    kv = table["batch"] * fit.kv_token * (w.kv_tokens + table["tree_size"] - 1)
    table["memory_gb"] = (fit.weights + fit.heads + kv) / GB
    table["fits"] = table["memory_gb"] * GB <= fit.usable
    table["per_token_s"] = table["medusa_step_s"] / table["acceptance"]
    table["total_tokens_s"] = table["batch"] / table["per_token_s"]

    # Best tree per batch among those whose KV fits (plain decoding always does): the most
    # speedup (so the least time per token at that batch), ties to the smaller tree.
    eligible = table["fits"]
    if setting.medusa == MedusaSetting.ON:  # a tree at every batch one fits at, even where it loses
        trees = eligible & (table["tree_size"] > 1)
        eligible = trees | (eligible & ~table["batch"].isin(table.loc[trees, "batch"]))
    band = pick_best(table, ["batch"], eligible=eligible).reset_index(drop=True)
    if setting.medusa == MedusaSetting.ON:
        band["speculate"] = band["tree_size"] > 1
    band["tree"] = np.where(band["speculate"], band["tree_size"].astype(str), "none")
    band["per_token_ms"] = band["per_token_s"] * 1e3
    band["user_tokens_s"] = 1 / band["per_token_s"]
    target = setting.targets
    band["meets_latency"] = True if target.latency_s is None else band["per_token_s"] <= target.latency_s
    band = band[BAND_COLUMNS]

    ok = band[band["meets_latency"]]
    fastest = band.loc[band["per_token_ms"].idxmin()]
    row["best_ms"] = fastest["per_token_ms"]
    if ok.empty:
        tree = f"tree of {fastest['tree']}" if fastest["speculate"] else "no tree"
        row.update(NO_RECOMMENDATION)
        row["note"] = (
            f"no batch meets {target.latency_s * 1e3:g} ms per token: the fastest is {fastest['per_token_ms']:.1f} "
            f"ms/token at batch {fastest['batch']} ({tree})."
        )
        return row, band, table
    pick = ok.loc[ok["total_tokens_s"].idxmax()]
    replicas = 1 if target.tokens_s is None else math.ceil(target.tokens_s / pick["total_tokens_s"])
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
