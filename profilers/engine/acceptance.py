"""The project's decoder drafting as the engine drafts, on the engine's own prompts: where a
measurement ran vLLM's Medusa speculation, the decoder (decoder.medusa) decodes every load
run's prompts greedily with the same heads as a chain of each head's top-1 (what vLLM's
Medusa proposer drafts: one token per head, no tree); where it ran vLLM's EAGLE, the same
drafter (vLLM's layout) drafts chains of the engine's length over the target's greedy
continuation (decoder.eagle_chain); where it ran a draft model, the same draft model does
(decoder.chains). Each way it counts, as /metrics does, the drafts and the tokens accepted
at each draft position. Greedy decoding is deterministic, so the engine's counts and the
decoder's differ only by what each engine does differently.

`python -m profilers.engine acceptance --out FOLDER` writes them per request to the folder's
decoder-requests.csv (each prompt's own acceptance: what spreads the engine's TPOT) and per
run's prompts to decoder-speculation.csv; `measure --speculation medusa|eagle|draft` does it
after its load runs."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from decoder.chains import draft_model_path_lengths
from decoder.checkpoint import Checkpoint, load_checkpoint, load_eagle
from decoder.draft_train import draft_for
from decoder.eagle import EagleLayout
from decoder.eagle_chain import chain_path_lengths
from decoder.medusa import Decoder
from decoder.runs import decode_batches
from decoder.tree import Drafting, resolve_tree
from perfmodel.base.engine_speculation import DRAFT_TOKENS, EngineSpeculation
from perfmodel.base.errors import PerfkitError
from perfmodel.measured.engine_runs import (
    DECODER_REQUEST_COLUMNS,
    DECODER_REQUESTS_FILE,
    DECODER_SPECULATION_COLUMNS,
    DECODER_SPECULATION_FILE,
    EngineMeasurement,
    read_engine_measurement,
)
from profilers.engine.load import request_prompts

DECODE_BATCH = 16


def chain_counts(path_lengths: list[list[int]], depth: int) -> tuple[int, list[int]]:
    """Drafts (decoding steps) and, per draft position 1..depth, the steps that accepted the
    token there (each accepted path counts the root: a path of n tokens accepted n - 1)."""
    lengths = np.array([n for row in path_lengths for n in row], dtype=int)
    return len(lengths), [int((lengths > position).sum()) for position in range(1, depth + 1)]


def decoder_requests(
    measurement: EngineMeasurement, batch: int = DECODE_BATCH, log: Callable[[str], None] = print
) -> pd.DataFrame:
    """One row per request of each load run's prompts (repeat): the decoder's drafts and
    accepted tokens per draft position on that request's prompt."""
    speculating = measurement.speculating
    if speculating not in DRAFTED:
        raise PerfkitError(
            f"{measurement.folder}: the decoder drafts as the engine only with Medusa heads, an EAGLE drafter or a "
            f"draft model (measured with --speculation {', '.join(DRAFTED)}), not {speculating}"
        )
    if measurement.speculation is None:
        raise PerfkitError(f"{measurement.folder} has no speculation.csv: its load runs are not measured yet")
    plan = measurement.meta["plan"]
    checkpoint = load_checkpoint(plan["model"], dtype=torch.float32)
    paths, depth = DRAFTED[speculating](checkpoint, batch)
    vocab = int(measurement.meta["model"]["vocab_size"])
    rows = []
    for repeat in sorted(int(r) for r in measurement.speculation["repeat"].unique()):
        prompts = request_prompts([plan["prompt_len"]] * plan["requests"], vocab, seed=repeat)
        for request, lengths in enumerate(paths(prompts, plan["response_len"])):
            drafts, accepted = chain_counts([lengths], depth)
            rows.append((repeat, request, drafts, json.dumps(accepted)))
        log(f"repeat {repeat}: the decoder drafted chains of {depth} on {len(prompts)} prompts")
    return pd.DataFrame(rows, columns=list(DECODER_REQUEST_COLUMNS))


def by_repeat(requests: pd.DataFrame) -> pd.DataFrame:
    """decoder_requests() summed per load run's prompts: one row per repeat, with the draft
    tokens verified (each draft a whole chain)."""
    rows = []
    for repeat, frame in requests.groupby("repeat", sort=True):
        accepted = np.sum([json.loads(a) for a in frame["accepted_per_position"]], axis=0)
        drafts = int(frame["drafts"].sum())
        rows.append((int(repeat), drafts, drafts * len(accepted), json.dumps(accepted.tolist())))
    return pd.DataFrame(rows, columns=list(DECODER_SPECULATION_COLUMNS))


def medusa_paths(checkpoint: Checkpoint, batch: int):
    """The decoder with the model's heads drafting a chain of each head's top-1 (vLLM's Medusa
    proposer): each step's accepted path lengths, and the chain's length."""
    if checkpoint.heads is None:
        raise PerfkitError(f"{checkpoint.folder} has no Medusa heads to draft with")
    depth = len(checkpoint.heads)
    tree, decoder = resolve_tree(f"chain-{depth}", checkpoint), Decoder(checkpoint)

    def paths(prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        return decode_batches(decoder, prompts, batch, new_tokens, drafting=Drafting(tree)).path_lengths

    return paths, depth


def eagle_paths(checkpoint: Checkpoint, batch: int):
    """The model's EAGLE drafter in vLLM's layout drafting chains of the engine's length over
    the target's greedy continuation (decoder.eagle_chain): each step's accepted path lengths."""
    drafter = load_eagle(checkpoint.folder, checkpoint.config, EagleLayout.VLLM, torch.float32)
    if drafter is None:
        raise PerfkitError(f"{checkpoint.folder} has no EAGLE drafter in vLLM's layout to draft with")
    decoder = Decoder(checkpoint)

    def paths(prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        continued = decode_batches(decoder, prompts, batch, new_tokens).tokens  # the target's greedy output
        model = checkpoint.model
        return [chain_path_lengths(drafter, model, p + new, len(p), DRAFT_TOKENS) for p, new in zip(prompts, continued)]

    return paths, DRAFT_TOKENS


def draft_model_paths(checkpoint: Checkpoint, batch: int):
    """The model's draft model (decoder.draft_train) drafting chains of the engine's length
    over the target's greedy continuation (decoder.chains): each step's accepted path lengths."""
    draft = Decoder(load_checkpoint(draft_for(checkpoint.folder.name), dtype=torch.float32))
    decoder = Decoder(checkpoint)

    def paths(prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        continued = decode_batches(decoder, prompts, batch, new_tokens).tokens  # the target's greedy output
        sequences = [p + new for p, new in zip(prompts, continued)]
        return draft_model_path_lengths(draft, sequences, len(prompts[0]), DRAFT_TOKENS)

    return paths, DRAFT_TOKENS


DRAFTED = {
    EngineSpeculation.MEDUSA: medusa_paths,
    EngineSpeculation.EAGLE: eagle_paths,
    EngineSpeculation.DRAFT: draft_model_paths,
}


def write_decoder_speculation(folder: Path, log: Callable[[str], None] = print) -> Path:
    """decoder_requests() of a measurement folder and their sums per run's prompts, written
    into it; returns the per-run file."""
    measurement = read_engine_measurement(folder)
    requests = decoder_requests(measurement, log=log)
    requests.to_csv(measurement.folder / DECODER_REQUESTS_FILE, index=False)
    path = measurement.folder / DECODER_SPECULATION_FILE
    by_repeat(requests).to_csv(path, index=False)
    return path
