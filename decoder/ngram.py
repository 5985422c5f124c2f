"""Prompt-lookup (n-gram) drafting: the proposer vLLM runs for `--speculative-config
'{"method": "ngram", ...}'`, in numpy.

It mirrors vLLM's `NgramProposer` (vllm/v1/spec_decode/ngram_proposer.py,
`_find_longest_matched_ngram_and_propose_tokens`): for one sequence's token history, find
the longest n-gram, n from max_n down to min_n (vLLM's prompt_lookup_max and
prompt_lookup_min), that ends the history and also occurs earlier in it; of its earlier
occurrences take the first (the earliest in the history); propose the up to k tokens that
followed it (fewer where the history ends sooner). No match of at least min_n tokens: no
proposal (an empty array). An earlier occurrence may overlap the n-gram itself (a run of one
repeated token matches), but it ends before the history's last token, so a match always has
at least one token after it.

Where it differs from vLLM, result aside (tests/test_ngram_59.py checks the result against a
plain transliteration of vLLM's loop on random histories):

- vLLM compiles a KMP failure function over the reversed history with numba, one scalar step
  per token. This is numpy, no numba: one vectorised comparison of every token with the
  history's last token gives the occurrences of the 1-gram, and each longer n narrows those
  to the ones whose preceding token matches too, up to max_n. Both are linear in the history.
- vLLM's batch call (`batch_propose`) reads a (sequences, max_model_len) array with each
  sequence's length, in numba's parallel loop over up to (cores / 2) / tp threads;
  `propose_batch` takes a list of 1-D histories and runs them one after the other, on one
  thread.
- max_model_len is optional: vLLM always caps k at max_model_len - len(history).

The proposal is a view of the history (as vLLM's is): copy it to keep it past a change.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from perfmodel.base.errors import PerfkitError

# vLLM's prompt_lookup_min and prompt_lookup_max where neither is given (its
# SpeculativeConfig, "arbitrarily chosen"): 5-grams only.
VLLM_DEFAULT_N = 5


def _is_count(value: object, least: int) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= least


@dataclass(frozen=True)
class NgramSettings:
    """What the proposer looks for: n-grams of min_n to max_n tokens (vLLM's prompt_lookup_min
    and prompt_lookup_max) and proposes up to k tokens after them (num_speculative_tokens)."""

    min_n: int
    max_n: int
    k: int

    def __post_init__(self) -> None:
        if not _is_count(self.min_n, 1):
            raise PerfkitError(f"n-gram min_n (prompt_lookup_min) must be an integer >= 1, got {self.min_n!r}")
        if not _is_count(self.max_n, int(self.min_n)):
            raise PerfkitError(
                f"n-gram max_n (prompt_lookup_max) must be an integer >= min_n ({self.min_n}), got {self.max_n!r}"
            )
        if not _is_count(self.k, 1):
            raise PerfkitError(f"n-gram k (tokens proposed per step) must be an integer >= 1, got {self.k!r}")

    def label(self) -> str:
        grams = f"{self.min_n}-grams" if self.min_n == self.max_n else f"{self.min_n}- to {self.max_n}-grams"
        return f"n-gram lookup of {grams}, up to {self.k} tokens proposed"


def _history(tokens) -> np.ndarray:
    """A history as the 1-D integer array the lookup reads (no copy of an array)."""
    history = np.asarray(tokens)
    if history.ndim != 1:
        raise PerfkitError(f"a token history must be 1-D (one sequence's token ids), got shape {history.shape}")
    if history.size == 0:
        return history.astype(np.int64, copy=False)
    if history.dtype.kind not in "iu":
        raise PerfkitError(f"a token history holds integer token ids, got {history.dtype} values")
    return history


def _lookup(history: np.ndarray, min_n: int, max_n: int, k: int) -> np.ndarray:
    """The proposal for a checked history and settings (module doc)."""
    total = history.shape[0]
    if total - 1 < min_n:  # a match ends before the last token: at most total - 1 long
        return history[:0]
    # ends[i]: where an earlier occurrence of the history's last `length` tokens ends.
    ends = np.flatnonzero(history[:-1] == history[-1])
    if ends.size == 0:
        return history[:0]
    length = 1
    while length < max_n:
        before = ends - length
        kept = ends[(before >= 0) & (history[np.maximum(before, 0)] == history[total - 1 - length])]
        if kept.size == 0:
            break
        ends, length = kept, length + 1
    if length < min_n:
        return history[:0]
    start = int(ends[0]) + 1  # the earliest occurrence of the longest n-gram
    return history[start : start + k]


def propose(tokens, min_n: int, max_n: int, k: int, max_model_len: int | None = None) -> np.ndarray:
    """Up to k tokens proposed after one history (a 1-D array of token ids): those that
    followed the earliest earlier occurrence of the longest n-gram (min_n <= n <= max_n)
    ending the history; empty where none occurs (module doc). max_model_len, as vLLM's: no
    proposal runs past it."""
    settings = NgramSettings(min_n, max_n, k)
    history = _history(tokens)
    if max_model_len is not None:
        k = min(k, int(max_model_len) - history.shape[0])
        if k <= 0:
            return history[:0]
    return _lookup(history, settings.min_n, settings.max_n, k)


def propose_batch(histories: Sequence, settings: NgramSettings) -> list[np.ndarray]:
    """One decoding step's proposals for a batch: propose() for each history, in order."""
    min_n, max_n, k = settings.min_n, settings.max_n, settings.k
    return [_lookup(_history(tokens), min_n, max_n, k) for tokens in histories]
