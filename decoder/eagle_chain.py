"""Greedy speculative decoding as vLLM's EAGLE-1 proposer runs it, for a drafter in vLLM's
layout (decoder.eagle.EagleLayout.VLLM): each step the drafter reads (f_i, e(x_(i+1))) at every
committed position i before the newest token (the target's final-norm features, over the
whole prefix) and drafts a chain: its output at the last position gives the next token
(the target's LM head on it) and, with that token's embedding, the next position's input.
Each chain is verified greedily (decoder.chains), against the target's greedy continuation
computed once, with its features in one forward over the whole sequence."""

from __future__ import annotations

import torch

from decoder.chains import accepted_count
from decoder.eagle import EagleDrafter, EagleLayout
from decoder.model import Transformer
from perfmodel.base.errors import PerfkitError


def draft_chain(
    drafter: EagleDrafter, model: Transformer, features: torch.Tensor, tokens: torch.Tensor, end: int, depth: int
) -> list[int]:
    """`depth` tokens drafted after position `end` (the newest committed token's index) from
    the target's features (T, h) at positions < end and tokens (T,) at positions <= end."""
    embed, lm_head = model.model.embed_tokens, model.lm_head
    inputs, nexts = features[:end], embed(tokens[1 : end + 1])
    drafted = []
    for _ in range(depth):
        positions = torch.arange(len(inputs))[None]
        last = drafter(inputs[None], nexts[None], positions)[0, -1]
        token = int(lm_head(last).argmax())
        drafted.append(token)
        inputs, nexts = torch.cat([inputs, last[None]]), torch.cat([nexts, embed(torch.tensor([token]))])
    return drafted


def chain_path_lengths(
    drafter: EagleDrafter, model: Transformer, sequence: list[int], prompt_len: int, depth: int
) -> list[int]:
    """Each step's accepted path (its root, the target's own token, included) when `sequence`
    (a prompt of prompt_len tokens and the target's greedy continuation) is decoded with
    chains of `depth` drafted tokens; the first new token comes from the prefill. A draft is
    accepted while the continuation has its token, so the last step's path may end one past
    it (its own token beyond the budget, which the engine drops)."""
    if drafter.layout is not EagleLayout.VLLM:
        raise PerfkitError("vLLM's EAGLE chain runs a drafter in vLLM's layout (decoder.eagle.EagleLayout.VLLM)")
    tokens = torch.tensor(sequence)
    with torch.inference_mode():
        features = model.hidden(tokens[None])[0]
        lengths, end = [], prompt_len  # the prefill made token `prompt_len`
        while end < len(sequence) - 1:
            accepted = accepted_count(draft_chain(drafter, model, features, tokens, end, depth), sequence, end)
            lengths.append(accepted + 1)
            end += accepted + 1
    return lengths
