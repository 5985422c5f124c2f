"""The project's decoder drafting as the engine drafts, on the engine's own prompts: where a
measurement ran vLLM's Medusa speculation, the decoder (decoder.medusa) decodes every load
run's prompts greedily with the same heads as a chain of each head's top-1 (what vLLM's
Medusa proposer drafts: one token per head, no tree); where it ran vLLM's EAGLE, the same
drafter (vLLM's layout) drafts chains of the engine's length over the target's greedy
continuation (decoder.eagle_chain). Either way it counts, as /metrics does, the drafts and
the tokens accepted at each draft position. Greedy decoding is deterministic,
so the engine's counts and the decoder's differ only by what each engine does differently.

`python -m profilers.engine acceptance --out FOLDER` writes them to the folder's
decoder-speculation.csv; `measure --speculation medusa` does it after its load runs."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from decoder.checkpoint import Checkpoint, load_checkpoint, load_eagle
from decoder.eagle import EagleLayout
from decoder.eagle_chain import chain_path_lengths
from decoder.medusa import Decoder
from decoder.runs import decode_batches
from decoder.tree import resolve_tree
from perfmodel.base.engine_speculation import DRAFT_TOKENS, EngineSpeculation
from perfmodel.base.errors import PerfkitError
from perfmodel.measured.engine_runs import (
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


def decoder_speculation(
    measurement: EngineMeasurement, batch: int = DECODE_BATCH, log: Callable[[str], None] = print
) -> pd.DataFrame:
    """One row per load run's prompts (repeat): the decoder's drafts and accepted tokens."""
    speculating = measurement.speculating
    if speculating not in DRAFTED:
        raise PerfkitError(
            f"{measurement.folder}: the decoder drafts as the engine only with Medusa heads or an EAGLE drafter "
            f"(measured with --speculation medusa or eagle), not {speculating}"
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
        drafts, accepted = chain_counts(paths(prompts, plan["response_len"]), depth)
        log(f"repeat {repeat}: the decoder drafted {drafts:,} chains of {depth}, accepted {accepted}")
        rows.append((repeat, drafts, drafts * depth, json.dumps(accepted)))
    return pd.DataFrame(rows, columns=list(DECODER_SPECULATION_COLUMNS))


def medusa_paths(checkpoint: Checkpoint, batch: int):
    """The decoder with the model's heads drafting a chain of each head's top-1 (vLLM's Medusa
    proposer): each step's accepted path lengths, and the chain's length."""
    if checkpoint.heads is None:
        raise PerfkitError(f"{checkpoint.folder} has no Medusa heads to draft with")
    depth = len(checkpoint.heads)
    tree, decoder = resolve_tree(f"chain-{depth}", checkpoint), Decoder(checkpoint)

    def paths(prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        return decode_batches(decoder, prompts, batch, new_tokens, tree=tree).path_lengths

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


DRAFTED = {EngineSpeculation.MEDUSA: medusa_paths, EngineSpeculation.EAGLE: eagle_paths}


def write_decoder_speculation(folder: Path, log: Callable[[str], None] = print) -> Path:
    """decoder_speculation() of a measurement folder, written into it; returns the file."""
    measurement = read_engine_measurement(folder)
    table = decoder_speculation(measurement, log=log)
    path = measurement.folder / DECODER_SPECULATION_FILE
    table.to_csv(path, index=False)
    return path
