"""The untimed passes of the closed loop: the trees each run uses and the acceptance the
prediction takes, from the heads' record on plain decoding (and, with typical acceptance,
on a typical pass)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from decoder.acceptance import AcceptanceConfig
from decoder.measure import head_accuracy
from decoder.runs import decode_batches
from decoder.tree import Drafting
from perfmodel.acceptance.batching import (
    acceptance_survival,
    accepted_lengths,
    dynamic_survival,
    probability_calibration,
    replayed_tokens,
    simulated_tokens,
)
from perfmodel.acceptance.trees import greedy_tree
from perfmodel.models.operators import HEAD_TOP_K
from profilers.closed_loop.config import ValidateConfig
from profilers.closed_loop.tree_kind import TreeKind


@dataclass
class UntimedPasses:
    """What the untimed passes give the prediction: the trees and their acceptance."""

    accuracy: np.ndarray  # a_k^(i) of the scheme's record, all prompts
    per_prompt: list[np.ndarray]  # the same, each prompt's own
    hits: list[np.ndarray]  # per prompt (positions, heads, topk): which head predictions came (greedy, else [])
    step_probs: list[np.ndarray]  # per prompt (positions, heads, topk): the heads' top-k probabilities (--dynamic)
    calibrate: object  # heads' probability -> hit rate, measured on the record (--dynamic, else None)
    settings: dict  # (tree kind, size) -> decoder.generate keyword arguments, plain decoding first
    survivals: dict = dataclasses.field(default_factory=dict)  # (tree kind, size) -> each prompt's s[d]
    # (tree kind, size) -> each prompt's generations (perfmodel.acceptance.batching), what the prediction uses
    generations: dict = dataclasses.field(default_factory=dict)


def head_predictions(decoder, prompt, output) -> tuple[np.ndarray, np.ndarray]:
    """At each position where a step could start in one decoded prompt: the heads' top-k
    probabilities (positions, heads, topk), and whether each was the token that came
    (NaN where that token lies past the end)."""
    row = torch.tensor([prompt + output], device=decoder.device)
    with torch.inference_mode():
        logits = decoder.heads(decoder.model.hidden(row))[:, 0].float()  # (heads, T, V)
    top = torch.softmax(logits, -1).topk(HEAD_TOP_K, dim=-1)
    width, first = row.shape[1], len(prompt) - 1  # the step after the prompt's last token is the first
    positions = np.arange(first, width - 1)
    probs = top.values[:, positions].permute(1, 0, 2).cpu().numpy()
    hits = np.full(probs.shape, np.nan)
    for k in range(probs.shape[1]):
        target = positions + k + 2  # head k at t names token t + k + 2
        inside = target < width
        hits[inside, k] = (top.indices[k, positions[inside]] == row[0, target[inside], None]).cpu().numpy()
    return probs, hits


def decode_kwargs(config: ValidateConfig) -> dict:
    """decoder.generate's keyword arguments every pass of the run shares."""
    return dict(acceptance=AcceptanceConfig(config.acceptance, seed=config.seed))


def untimed_passes(decoder, prompts, config: ValidateConfig, log) -> UntimedPasses:
    """The untimed passes: plain decoding for the heads' accuracies, which choose the trees,
    and, with greedy acceptance, the heads' predictions at every position, which a static
    tree's steps are replayed through; with typical acceptance, then a typical pass with
    the largest tree for the scheme's own record (its acceptance simulated from accuracies:
    what it emits depends on the tree); with --dynamic, the heads' per-step probabilities
    and how often each probability was right."""
    kwargs = decode_kwargs(config)
    log(f"plain decoding of {len(prompts)} held-out prompts for the heads' accuracies ...")
    outputs = decode_batches(decoder, prompts, config.batch, config.new_tokens, **kwargs).tokens
    accuracy = head_accuracy(decoder, prompts, outputs)
    if config.acceptance != "greedy":
        log(f"{config.acceptance} acceptance with the largest tree, for the scheme's own record ...")
        largest = Drafting(greedy_tree(accuracy, max(config.sizes) - 1))
        outputs = decode_batches(decoder, prompts, config.batch, config.new_tokens, drafting=largest, **kwargs).tokens
        accuracy = head_accuracy(decoder, prompts, outputs)
    per_prompt = [head_accuracy(decoder, [p], [o]) for p, o in zip(prompts, outputs)]
    settings = {(TreeKind.PLAIN, 1): {}} | {
        (TreeKind.STATIC, n): {"drafting": Drafting(greedy_tree(accuracy, n - 1))} for n in config.sizes
    }
    greedy = config.acceptance == "greedy"
    predictions = (
        [head_predictions(decoder, p, o) for p, o in zip(prompts, outputs)] if greedy or config.dynamic else []
    )
    hits = [h for _, h in predictions] if greedy else []
    step_probs, calibrate = [], None
    if config.dynamic:  # only a dynamic tree is predicted from the heads' per-step probabilities
        settings |= {(TreeKind.DYNAMIC, n): {"drafting": Drafting(dynamic_nodes=n - 1)} for n in config.sizes}
        step_probs = [probs for probs, _ in predictions]
        calibrate = probability_calibration(np.concatenate(step_probs), np.concatenate([h for _, h in predictions]))
    record = UntimedPasses(accuracy, per_prompt, hits, step_probs, calibrate, settings)
    medusa = [(kind, n) for kind, n in settings if kind != TreeKind.PLAIN]
    record.survivals = {(kind, n): prompt_survivals(kind, n, record) for kind, n in medusa}
    record.generations = {(kind, n): prompt_generations(kind, n, record, config) for kind, n in medusa}
    return record


def prompt_survivals(kind: str, size: int, record: UntimedPasses) -> list[np.ndarray]:
    """Each prompt's s[d] (perfmodel.acceptance.batching) for one Medusa run: from its head accuracies
    for a static tree, from calibrated per-position probabilities for a dynamic one."""
    if kind == TreeKind.STATIC:
        return [acceptance_survival(record.settings[kind, size]["drafting"].tree, a) for a in record.per_prompt]
    return [dynamic_survival(p, size - 1, record.calibrate) for p in record.step_probs]


def prompt_generations(kind: str, size: int, record: UntimedPasses, config: ValidateConfig) -> list[np.ndarray]:
    """Each prompt's tokens after every step (perfmodel.acceptance.batching): a static tree under
    greedy acceptance replayed through the heads' recorded predictions (the decoder's
    steps exactly: greedy verification is deterministic and lossless, so its text is the
    plain pass's); otherwise simulated from the prompt's survival curve."""
    if kind == TreeKind.STATIC and record.hits:
        tree = record.settings[kind, size]["drafting"].tree
        return replayed_tokens([accepted_lengths(tree, h) for h in record.hits], config.new_tokens)
    return simulated_tokens(record.survivals[kind, size], config.new_tokens, seed=config.seed)
