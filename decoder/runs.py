"""Decoding runs the measurements share: held-out prompts, prompts decoded a batch at a
time, and several settings decoded in turn so their timings see the same machine."""

from __future__ import annotations

from functools import lru_cache

from tokenizers import Tokenizer

from decoder.checkpoint import Checkpoint
from decoder.corpus import sample_prompts, split_corpus
from decoder.medusa import Decoder, DecodeResult
from perfmodel.base.errors import PerfkitError


def heldout_prompts(ckpt: Checkpoint, count: int, length: int, seed: int) -> list[list[int]]:
    if ckpt.tokenizer is None:
        raise PerfkitError(f"{ckpt.folder} has no tokenizer.json, needed to encode the held-out prompts")
    documents = _heldout_documents(ckpt.tokenizer.to_str())
    return [list(prompt) for prompt in sample_prompts(documents, count, length, seed)]


@lru_cache(maxsize=4)
def _heldout_documents(tokenizer_json: str) -> tuple[tuple[int, ...], ...]:
    """The held-out documents as the tokenizer (serialised: the cache's key) encodes them.
    Every measurement of a process draws its prompts from the same documents, and encoding
    them takes a quarter second, so a process encodes them once per tokenizer."""
    _, heldout, _ = split_corpus()
    return tuple(tuple(e.ids) for e in Tokenizer.from_str(tokenizer_json).encode_batch(heldout))


def decode_batches(decoder: Decoder, prompts, batch: int, max_new: int, **kwargs) -> DecodeResult:
    """Decode the prompts `batch` at a time; one result with everything concatenated."""
    total = DecodeResult([], [], [])
    for start in range(0, len(prompts), batch):
        _append(total, decoder.generate(prompts[start : start + batch], max_new, **kwargs))
    return total


def decode_interleaved(
    decoder: Decoder, prompts, batch: int, max_new: int, settings: dict, rounds: int = 1, progress=None, **kwargs
) -> dict:
    """Decode the prompts with every setting (name -> generate() keyword arguments), one
    batch of prompts at a time through all settings in turn, `rounds` times over.

    A shared or virtual machine drifts in speed by 10-20% over seconds; settings timed one
    after another would each catch a different phase of it. Taking them in turn on every
    batch (in an order rotated from batch to batch) lets each see the same machine, so
    their ratios (the speedups) hold even where the absolute times wander.
    `progress()`, if given, is called after every batch of prompts.
    Returns name -> DecodeResult over all rounds."""
    if rounds < 1:
        raise PerfkitError(f"rounds must be >= 1, got {rounds}")
    names = list(settings)
    totals = {name: DecodeResult([], [], []) for name in names}
    turn = 0
    for _ in range(rounds):
        for start in range(0, len(prompts), batch):
            chunk = prompts[start : start + batch]
            for name in names[turn % len(names) :] + names[: turn % len(names)]:
                part = decoder.generate(chunk, max_new, **kwargs, **settings[name])
                _append(totals[name], part)
            turn += 1
            if progress is not None:
                progress()
    return totals


def warm_up(decoder: Decoder, prompts, batch: int, max_new: int, settings: dict, **kwargs) -> dict:
    """Decode the first `batch` prompts once with every setting (name -> generate() keyword
    arguments), untimed, at the token count the timed runs decode: each setting is then warm
    at the shapes it is timed at (its KV cache of the timed length, the attention lengths up
    to it; a compiled step or CUDA graph, which decoder.static_decode keeps per shape: a
    shorter warm-up run would leave the timed run's to its first call). Returns name -> that
    run's result, whose warmup_s is the setting's capture or compilation."""
    return {name: decoder.generate(prompts[:batch], max_new, **kwargs, **settings[name]) for name in settings}


def _append(total: DecodeResult, part: DecodeResult) -> None:
    total.tokens += part.tokens
    total.accepted += part.accepted
    total.tree_sizes += part.tree_sizes
    total.path_lengths += part.path_lengths
    total.prefill_s += part.prefill_s
    total.warmup_s += part.warmup_s
    total.decode_s += part.decode_s
    if total.steps == len(part.tree_sizes):  # the first part: its parts (a static step times others)
        total.times = dict.fromkeys(part.times, 0.0)
    for phase, seconds in part.times.items():
        total.times[phase] += seconds


def mean_accepted(result: DecodeResult) -> float:
    steps = [a for row in result.accepted for a in row]
    return sum(steps) / len(steps)
