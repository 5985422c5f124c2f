"""The serving simulation's costs from a real engine's step sweep alone (never its load runs),
and per load run's prompts the costs and gains its requests are simulated at.

How the engine's step sweep becomes the simulation's costs:
- a decoding step of b sequences at context c: the sweep's steps at each measured batch,
  linear in context through its two contexts, and linear in batch between measured batches;
- prefilling L tokens adds mixed(L) to the iteration that does it: measured as the lengthened
  step of requests decoding beside a one-token request (linear between measured lengths,
  and beyond the longest);
- an iteration that decodes nothing (the engine idle, or only prefilling) has no decoding step
  to carry its own cost (scheduling, the forward's fixed part, sampling, the idle loop waking),
  so it adds idle(L) to the prefill's mixed(L): what the sweep's lone prompt of L tokens took to
  its first token (kind prefill) beyond the fixed part below and mixed(L), per measured length
  and linear between (never below 0: an iteration costs at least its prefill). A lone request's
  predicted time to first token is then the sweep's lone probe of its length, not less;
- the rest of a request's time to first token is spent outside the engine's iteration loop
  (HTTP, the engine's queues, streaming the first token back): the simulation lets each
  request in that long after its arrival. It is what the sweep's requests that arrived
  beside b decoding ones took to their first token beyond what the loop gave them: half a
  step's wait for the iteration under way, then the step that decoded the b and prefilled
  them (the median over lengths). A lone request's time to first token is not used for it:
  load runs have others decoding, and a lone one's includes the idle iteration's own cost
  (priced above, for the iterations that decode nothing).
Every point is the median of its repeats over the sweep's two passes (before and after the
load runs: the machine's speed drifts).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import pandas as pd

from perfmodel.base.engine_speculation import EngineSpeculation
from perfmodel.base.errors import PerfkitError
from perfmodel.measured.engine_runs import EngineMeasurement
from perfmodel.serving.costs import ServingCosts, context_grid
from perfmodel.serving.engine_drafting import (
    NOT_DRAFTING,
    Drafting,
    decoder_drafting,
    iteration_steps,
    own_gains,
    request_drafts,
)
from perfmodel.serving.simulator import EngineConfig

DECODE, MIXED, MIXED_TTFT, PREFILL = "decode", "mixed", "mixed-ttft", "prefill"  # the step sweep's kinds of row
# About the context of the sweep's requests that decode beside a mixed probe: 64-token prompts
# and 40-250 tokens decoded by the time the probes arrive.
PROBE_CONTEXT = 200


@dataclass(frozen=True)
class EngineCosts:
    costs: ServingCosts
    entry_s: float  # the fixed part of a request's time to first token (see the module doc)
    engine: EngineConfig


def decode_table(decode: pd.DataFrame, contexts: np.ndarray, max_seqs: int) -> np.ndarray:
    """Step seconds [batch - 1, context point] from the sweep's decode rows."""
    batches = np.array(sorted(decode["batch"].unique()))
    by_batch = []
    for b in batches:
        rows = decode[decode["batch"] == b]
        if len(rows) > 1:
            slope, intercept = np.polyfit(rows["context"], rows["step_s"], 1)
            by_batch.append(np.maximum(intercept + slope * contexts, rows["step_s"].min()))
        else:
            by_batch.append(np.full(len(contexts), float(rows["step_s"].median())))
    measured = np.array(by_batch)
    wanted = np.arange(1, max_seqs + 1)
    if len(batches) == 1:
        return np.repeat(measured, max_seqs, axis=0)
    table = np.empty((max_seqs, len(contexts)))
    for j in range(len(contexts)):
        table[:, j] = np.interp(wanted, batches, measured[:, j])
        beyond = wanted > batches[-1]  # linear past the largest batch measured
        slope = (measured[-1, j] - measured[-2, j]) / (batches[-1] - batches[-2])
        table[beyond, j] = measured[-1, j] + slope * (wanted[beyond] - batches[-1])
    return table


def by_length(rows: pd.DataFrame) -> pd.Series:
    """Median seconds per prompt length over a kind's rows."""
    return rows.groupby("tokens")["step_s"].median()


def decode_rows(steps: pd.DataFrame) -> pd.DataFrame:
    return steps[steps["kind"] == DECODE]


def engine_costs(measurement: EngineMeasurement, drafting: Drafting = NOT_DRAFTING) -> EngineCosts:
    meta, steps = measurement.meta, measurement.steps
    server = meta["server"]
    max_seqs, max_context = int(server["max_num_seqs"]), int(server["max_model_len"])
    kinds = {kind: steps[steps["kind"] == kind] for kind in (DECODE, MIXED, MIXED_TTFT, PREFILL)}
    if any(rows.empty for rows in kinds.values()):
        raise PerfkitError(f"{measurement.folder}/steps.csv needs decode, mixed, mixed-ttft and prefill rows")
    if measurement.speculating is not EngineSpeculation.OFF:
        kinds[DECODE] = iteration_steps(kinds[DECODE], measurement.folder)
    contexts = context_grid(max_context)
    step_s = decode_table(kinds[DECODE], contexts, max_seqs)
    mixed, beside = by_length(kinds[MIXED]), by_length(kinds[MIXED_TTFT])
    lengths = np.arange(1, max_context + 1)
    known = np.concatenate([[0], mixed.index.to_numpy()]), np.concatenate([[0.0], mixed.to_numpy()])
    added = np.interp(lengths, *known)
    if len(mixed) > 1:  # linear past the longest prompt measured
        slope = (mixed.iloc[-1] - mixed.iloc[-2]) / (mixed.index[-1] - mixed.index[-2])
        beyond = lengths > mixed.index[-1]
        added[beyond] = mixed.iloc[-1] + slope * (lengths[beyond] - mixed.index[-1])
    batch = int(kinds[MIXED]["batch"].iloc[0])
    step = float(np.interp(min(PROBE_CONTEXT, max_context), contexts, step_s[batch - 1]))
    entry = float(np.median(beside - mixed - 1.5 * step))
    idle = idle_table(by_length(kinds[PREFILL]), lengths, added, entry)
    tokens = np.full_like(step_s, drafting.tokens_per_step)
    verified = np.full(step_s.shape, 1 + drafting.draft_tokens, dtype=np.int64)  # tokens a step runs per sequence
    label = f"{meta['engine']['name']} {meta['engine']['version']} step sweep ({len(steps)} points)"
    kv_tokens = int(meta["engine"]["kv_cache_tokens"])
    costs = ServingCosts(
        contexts, step_s, tokens, verified, lengths, added, kv_tokens, drafting.draft_tokens, label, idle
    )
    engine = EngineConfig("chunked", int(server["max_num_batched_tokens"]), max_seqs)
    return EngineCosts(costs, entry, engine)


def idle_table(lone: pd.Series, lengths: np.ndarray, added: np.ndarray, entry_s: float) -> np.ndarray:
    """Per prompt length (`lengths`, from 1), what an iteration that decodes nothing adds to the
    prefill's own `added` seconds: the lone probe's time to first token (`lone`, by length) less
    the fixed part outside the loop and the prefill; measured lengths only, linear between and
    held beyond (see the module doc)."""
    measured = lone[(lone.index >= 1) & (lone.index <= lengths[-1])]
    over = measured.to_numpy() - entry_s - added[measured.index.to_numpy() - 1]
    return np.interp(lengths, measured.index.to_numpy(), np.maximum(over, 0.0))


def run_pricing(measurement: EngineMeasurement) -> dict[int, tuple[EngineCosts, Callable | None]]:
    """Per load run's prompts (repeat), the costs its runs are simulated at and, where the
    decoder counted each request's drafts, each request's own gain
    (perfmodel.serving.engine_check.predicted_run's)."""
    if measurement.speculating is EngineSpeculation.OFF:
        return dict.fromkeys(measurement.runs["repeat"].unique(), (engine_costs(measurement), None))
    drafting, drafts = decoder_drafting(measurement), request_drafts(measurement)
    return {
        repeat: (
            engine_costs(measurement, d),
            partial(own_gains, drafts=drafts[repeat], tokens_per_step=d.tokens_per_step) if repeat in drafts else None,
        )
        for repeat, d in drafting.items()
    }
