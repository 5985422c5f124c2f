"""A published measurement of speculative decoding predicted from its own stated acceptance
(perfmodel.measured.published_speculation): the row's device, model, drafter and shape priced
by the toolkit's step models at the row's batch, the speedup = acceptance / overhead set beside
the measured one.

Only rows that say how they are priced (`device`, `preset`, `tokens_verified`, `priced_as`)
are predicted; `unpriced_reason` says in one line why any other is not. A row's `launch` says
the regime its harness ran in (eager: Hugging Face transformers' eager loop, one kernel issued
from Python at a time): the caller's StepMaker builds the step of that regime (the full step
where none is named; a traced step launched eager needs the decoder's tracer, which the
command hands in).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pandas as pd

from perfmodel.acceptance.reference_trees import reference_tree
from perfmodel.base.attention_code import AttentionCode
from perfmodel.base.drafter_kind import FEATURE_DRAFTERS, DrafterKind
from perfmodel.latency.choice import LatencyChoice, LatencySetting
from perfmodel.latency.eagle import DraftShape, StaticTreeDraft
from perfmodel.latency.step import StepFlavor
from perfmodel.latency.step_cost import StepCost
from perfmodel.measured.ngram_host import ngram_host_cost
from perfmodel.models.checkpoints_dir import CHECKPOINTS
from perfmodel.models.config import ModelConfig
from perfmodel.models.drafter_config import drafter_model
from perfmodel.planning.deployment import Deployment, DeploymentChoices, resolve
from perfmodel.planning.drafter_point import DraftedShape, drafter_point, point_drafter, with_draft_steps
from perfmodel.planning.drafters import Drafter
from perfmodel.planning.step_point import step_point

# A context a harness's prompts run at when its rows do not say: MT-Bench-like prompts and
# answers of a few hundred tokens.
DEFAULT_CONTEXT = 512
# A deployment's steps in a launch regime ("" for the full step) with its attention run as a
# perfmodel.base.attention_code: {flavour: step}, one flavour.
StepMaker = Callable[[Deployment, str, AttentionCode], dict[str, StepCost]]


def full_steps(deployment: Deployment, launch: str, code: AttentionCode = AttentionCode.SDPA) -> dict[str, StepCost]:
    """The full step, whatever the regime and attention code: what the analytic core prices on
    its own (its attention is one operator)."""
    return deployment.steps([StepFlavor.FULL])


def unpriced_reason(row: pd.Series) -> str | None:
    """Why a published row is not predicted (None: it is)."""
    if row["drafter"] not in tuple(DrafterKind):
        return f"{row['drafter']} drafting is not priced yet"
    if pd.isna(row["batch"]):
        return "no batch stated (a load instead)"
    if not row["device"]:
        return "no device and shape mapped yet"
    if pd.isna(row["accept_length"]) or pd.isna(row["speedup"]):
        return "no accepted length or no speedup stated"
    if row["drafter"] == DrafterKind.DRAFT and not row["draft_config"]:
        return "no draft model config shipped"
    return None


def row_code(row: pd.Series) -> AttentionCode:
    """The attention code the row's method ran (its harness's plain decoding runs SDPA)."""
    return AttentionCode(row["model_code"] or AttentionCode.SDPA)


def row_drafter(row: pd.Series, target: ModelConfig, choices: DeploymentChoices, make: StepMaker) -> Drafter:
    """The drafter a row names, as it ran: a feature-level drafter's tree of the row's depth and
    top-k, the draft model of its shipped config (its own steps), n-gram lookup at this host's
    measured cost."""
    kind = DrafterKind(row["drafter"])
    if kind == DrafterKind.DRAFT:
        own = drafter_model(CHECKPOINTS / row["draft_config"], kind, target)
        (drafting,) = resolve(own, row["device"], choices)
        return with_draft_steps(point_drafter(kind, target, own), make(drafting, row["launch"], row_code(row)))
    own = drafter_model(CHECKPOINTS / row["draft_config"], kind, target) if row["draft_config"] else None
    drafter = point_drafter(kind, target, own, host=ngram_host_cost() if kind == DrafterKind.NGRAM else None)
    if row["draft_tree"]:  # a static tree, drafted pass by pass with the draft's KV cache
        shape = StaticTreeDraft((reference_tree(row["draft_tree"]),), window=0, cached=True)
        drafter = dataclasses.replace(drafter, shape=shape)
    elif kind in FEATURE_DRAFTERS:
        shape = DraftShape(depth=int(row["draft_depth"]), top_k=int(row["draft_top_k"]))
        drafter = dataclasses.replace(drafter, shape=shape)
    return drafter


def predict_row(row: pd.Series, context: int = DEFAULT_CONTEXT, make: StepMaker = full_steps) -> dict:
    """The row's speedup as its regime's step (`make`) predicts it at its stated accepted
    length, with its step times: {predicted_speedup, plain_step_ms, step_ms, draft_ms,
    draft_passes, step, latency_model}."""
    tp = 1 if pd.isna(row["num_gpus"]) else int(row["num_gpus"])
    latency = LatencyChoice.of(LatencySetting.AUTO, row["stack"] or None)
    choices = DeploymentChoices(dtype=row["dtype"] or None, tensor_parallel=tp, latency=latency)
    (deployment,) = resolve(row["preset"], row["device"], choices)
    # the method's step in its own model code; plain decoding, the baseline, in the harness's (SDPA)
    steps = make(deployment, row["launch"], row_code(row))
    plain = make(deployment, row["launch"], AttentionCode.SDPA)
    batch, tokens, accepted = int(row["batch"]), int(row["tokens_verified"]), float(row["accept_length"])
    if row["drafter"] == DrafterKind.MEDUSA:
        point = step_point(steps, batch, context, tokens, accepted).iloc[0]
        step_ms, draft_ms, passes = point["medusa_step_ms"], 0.0, 0
    else:
        drafter = row_drafter(row, deployment.model, choices, make)
        point = drafter_point(steps, drafter, DraftedShape(tokens), batch, context, accepted).iloc[0]
        step_ms, draft_ms, passes = point["step_ms"], point["draft_ms"], int(point["draft_passes"])
    plain_ms = float(next(iter(plain.values())).step_time(batch, context, 1)) * 1e3
    return {
        "predicted_speedup": accepted * plain_ms / float(step_ms),
        "plain_step_ms": plain_ms,
        "step_ms": float(step_ms),
        "draft_ms": float(draft_ms),
        "draft_passes": passes,
        "step": point["step"],
        "latency_model": point["latency_model"],
    }


def unpriced_time(table: pd.DataFrame) -> pd.DataFrame:
    """Where a prediction misses, how much step time the measurement implies beyond it: the
    measured step is plain x accepted / measured speedup (the source's own baseline priced as
    the toolkit's plain step), so `unpriced_ms` = that - the predicted step, and per draft pass
    (or draft step, or lookup) where the drafter has any."""
    implied = table["plain_step_ms"] * table["accept_length"] / table["speedup"]
    passes = table["draft_passes"].where(table["draft_passes"] > 0)
    return table.assign(
        implied_step_ms=implied,
        unpriced_ms=implied - table["step_ms"],
        unpriced_per_pass_ms=(implied - table["step_ms"]) / passes,
    )
