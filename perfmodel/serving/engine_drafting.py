"""How a speculating engine's decoding advances, from measurements beside the load runs: its
iteration at each decoding point of the step sweep, and the tokens each sequence gains per
iteration, which the project's decoder counted drafting as the engine does on the same prompts
(profilers.engine acceptance): per run's prompts on average, and per request where it counted
each one's drafts (a prompt's own acceptance is what spreads the engine's TPOT)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pandas as pd

from perfmodel.base.engine_speculation import EngineSpeculation
from perfmodel.base.errors import PerfkitError
from perfmodel.measured.engine_runs import EngineMeasurement

# The engine's drafting the project's decoder also runs (profilers.engine acceptance), in words
DRAFTING = {
    EngineSpeculation.MEDUSA: "a chain of each Medusa head's top-1",
    EngineSpeculation.EAGLE: "a chain from the EAGLE drafter in vLLM's layout",
    EngineSpeculation.DRAFT: "a chain of the draft model's greedy tokens",
}
DRAFTER_TWINS = tuple(DRAFTING)


@dataclass(frozen=True)
class Drafting:
    """How a speculating engine's steps advance: the tokens each sequence gains per step (one
    plus its accepted drafts, on average) and the draft tokens each step verifies beside it."""

    tokens_per_step: float = 1.0
    draft_tokens: int = 0


NOT_DRAFTING = Drafting()  # plain decoding


def iteration_steps(decode: pd.DataFrame, folder) -> pd.DataFrame:
    """A speculating engine's decoding points as iteration times: the median gap between the
    streamed chunks the sweep measured, one an iteration; in a sweep from before it did, the
    per-token gap times the point's own tokens per step (1 + its accepted / drafts, /metrics),
    which mixes one stream's gaps with all streams' acceptance."""
    drafts = decode["drafts"]
    if drafts.isna().any() or (drafts <= 0).any():
        raise PerfkitError(
            f"{folder}: its step sweep counted no drafts at its decoding points (measured before the sweep "
            "did): measure it again to predict its speculation"
        )
    per_token = decode["step_s"] * (1 + decode["accepted"] / drafts)
    return decode.assign(step_s=decode["iteration_s"].fillna(per_token))


def decoder_drafting(measurement: EngineMeasurement) -> dict[int, Drafting]:
    """Per load run's prompts (repeat), the drafting the project's decoder measured on them
    (profilers.engine acceptance): what the prediction takes as the engine's acceptance."""
    twin = measurement.decoder_speculation
    if measurement.speculating not in DRAFTER_TWINS or twin is None:
        raise PerfkitError(
            f"{measurement.folder}: the engine's {measurement.speculating} speculation is predicted only with "
            "Medusa heads, an EAGLE drafter or a draft model and the decoder's acceptance on the same prompts "
            f"(python -m profilers.engine acceptance --out {measurement.folder})"
        )
    return {
        int(row.repeat): Drafting(
            1 + sum(json.loads(row.accepted_per_position)) / row.drafts, round(row.draft_tokens / row.drafts)
        )
        for row in twin.itertuples(index=False)
    }


def own_gains(ordered: pd.DataFrame, drafts: pd.Series, tokens_per_step: float) -> np.ndarray:
    """Each request's tokens per decoding step, as a multiple of `tokens_per_step`: its output
    past the first token over the steps the decoder drafted it in (`drafts`, by request), so
    that the simulation decodes it in that many steps."""
    steps = drafts.reindex(ordered["request"]).to_numpy(float)
    if np.isnan(steps).any():
        missing = ordered["request"].to_numpy()[np.isnan(steps)]
        raise PerfkitError(f"the decoder's per-request acceptance has no row for request(s) {missing[:5].tolist()}")
    output = ordered["output"].to_numpy(float)
    own = np.where((steps > 0) & (output > 1), (output - 1) / np.maximum(steps, 1), tokens_per_step)
    return own / tokens_per_step


def request_drafts(measurement: EngineMeasurement) -> dict[int, pd.Series]:
    """Per load run's prompts (repeat), the decoder's drafts (decoding steps) per request; none
    in a folder measured before the decoder counted them per request."""
    per_request = measurement.decoder_requests
    if per_request is None:
        return {}
    return {int(r): rows.set_index("request")["drafts"] for r, rows in per_request.groupby("repeat")}
