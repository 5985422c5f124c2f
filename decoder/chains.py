"""Greedy verification of drafted chains, as a serving engine verifies its proposers' drafts:
the target keeps the longest prefix of the chain its own greedy decoding agrees with, plus its
own next token. Greedy verification accepts exactly the drafts that match the target's greedy
continuation, so a twin plays the steps against that continuation (computed once): the path
each step accepts is what a real speculative run would accept, at a fraction of its cost.

Here too the chains of a standalone draft model (vLLM's `draft_model` method): each step the
draft continues the committed sequence greedily by `depth` tokens."""

from __future__ import annotations

from decoder.medusa import Decoder


def accepted_count(drafted: list[int], sequence: list[int], end: int) -> int:
    """How many of the chain `drafted` after position `end` (the newest committed token's
    index) the target accepts: those matching `sequence` (a prompt and the target's greedy
    continuation) there, while the continuation lasts."""
    accepted, ahead = 0, sequence[end + 1 :]
    while accepted < min(len(drafted), len(ahead)) and drafted[accepted] == ahead[accepted]:
        accepted += 1
    return accepted


def draft_model_path_lengths(
    draft: Decoder, sequences: list[list[int]], prompt_len: int, depth: int
) -> list[list[int]]:
    """Per sequence (a prompt of prompt_len tokens and the target's greedy continuation), each
    step's accepted path (its root, the target's own token, included) when a draft model
    drafts chains of `depth` tokens; the first new token comes from the prefill. Each step's
    chains are drafted for every unfinished sequence at once (one batched greedy decode)."""
    ends = [prompt_len] * len(sequences)  # the prefill made token prompt_len
    lengths: list[list[int]] = [[] for _ in sequences]
    while active := [i for i, s in enumerate(sequences) if ends[i] < len(s) - 1]:
        drafted = draft.generate([sequences[i][: ends[i] + 1] for i in active], depth).tokens
        for i, chain in zip(active, drafted):
            accepted = accepted_count(chain[:depth], sequences[i], ends[i])
            lengths[i].append(accepted + 1)
            ends[i] += accepted + 1
    return lengths
