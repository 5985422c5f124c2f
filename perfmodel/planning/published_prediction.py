"""A published measurement of speculative decoding predicted from its own stated acceptance
(perfmodel.measured.published_speculation): the row's device, model, drafter and shape priced
by the toolkit's step models at the row's batch, the speedup = acceptance / overhead set beside
the measured one.

Only rows that say how they are priced (`device`, `preset`, `tokens_verified`, `priced_as`)
are predicted; `unpriced_reason` says in one line why any other is not.
"""

from __future__ import annotations

import dataclasses

import pandas as pd

from perfmodel.base.drafter_kind import DrafterKind
from perfmodel.latency.eagle import DraftShape
from perfmodel.latency.step import StepFlavor
from perfmodel.planning.deployment import DeploymentChoices, resolve
from perfmodel.planning.drafter_point import DraftedShape, drafter_point
from perfmodel.planning.drafters import drafters_for
from perfmodel.planning.step_point import step_point

# The drafters whose steps the toolkit prices at a point (perfmodel.planning.drafter_point).
PRICEABLE = (DrafterKind.MEDUSA, DrafterKind.EAGLE)
# A context a harness's prompts run at when its rows do not say: MT-Bench-like prompts and
# answers of a few hundred tokens.
DEFAULT_CONTEXT = 512


def unpriced_reason(row: pd.Series) -> str | None:
    """Why a published row is not predicted (None: it is)."""
    if row["drafter"] == DrafterKind.DRAFT:
        return "a draft model is priced from a cost ratio, not yet from its own config"
    if row["drafter"] not in PRICEABLE:
        return f"{row['drafter']} drafting is not priced yet"
    if pd.isna(row["batch"]):
        return "no batch stated (a load instead)"
    if not row["device"]:
        return "no device and shape mapped yet"
    if pd.isna(row["accept_length"]) or pd.isna(row["speedup"]):
        return "no accepted length or no speedup stated"
    return None


def predict_row(row: pd.Series, context: int = DEFAULT_CONTEXT) -> dict:
    """The row's speedup as the full step predicts it at its stated accepted length, with its
    step times: {predicted_speedup, plain_step_ms, step_ms, latency_model}."""
    (deployment,) = resolve(row["preset"], row["device"], DeploymentChoices(dtype=row["dtype"] or None))
    steps = deployment.steps([StepFlavor.FULL])
    batch, tokens, accepted = int(row["batch"]), int(row["tokens_verified"]), float(row["accept_length"])
    if row["drafter"] == DrafterKind.MEDUSA:
        point = step_point(steps, batch, context, tokens, accepted).iloc[0]
        step_ms = point["medusa_step_ms"]
    else:
        (eagle,) = drafters_for("eagle")
        shape = DraftShape(depth=int(row["draft_depth"]), top_k=int(row["draft_top_k"]))
        eagle = dataclasses.replace(eagle, shape=shape)
        point = drafter_point(steps, eagle, DraftedShape(tokens), batch, context, accepted).iloc[0]
        step_ms = point["step_ms"]
    return {
        "predicted_speedup": float(point["speedup"]),
        "plain_step_ms": float(point["plain_step_ms"]),
        "step_ms": float(step_ms),
        "latency_model": point["latency_model"],
    }
