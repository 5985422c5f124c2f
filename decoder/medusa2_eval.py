"""What Medusa-2 changed against the original model: how far its next-token distributions
and its greedy decoding depart from the original's, and the tokens per step its heads' trees
gain over Medusa-1's.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from decoder.model import Transformer
from perfmodel.acceptance.trees import expected_acceptance, greedy_tree


def greedy_agreement(original: torch.Tensor, other: torch.Tensor, prompt_len: int) -> dict:
    """How far greedy decoding of `other` departs from the original's, on the same prompts."""
    a, b = original[:, prompt_len:], other[:, prompt_len:]
    same = a == b
    prefix = torch.where(same.all(1), same.shape[1], (~same).int().argmax(1))
    return {
        "tokens_identical": round(float(same.float().mean()), 4),
        "continuations_identical": round(float(same.all(1).float().mean()), 4),
        "mean_identical_prefix_tokens": round(float(prefix.float().mean()), 2),
        "continuation_tokens": int(a.shape[1]),
    }


def heldout_kl(original: Transformer, other: Transformer, sequences: torch.Tensor, prompt_len: int) -> float:
    """Mean KL(original || other) over the continuation positions of held-out sequences."""
    total, count = 0.0, 0
    with torch.inference_mode():
        for i in range(0, len(sequences), 32):
            chunk = sequences[i : i + 32]
            p = F.log_softmax(original(chunk)[:, prompt_len - 1 : -1].float(), dim=-1)
            q = F.log_softmax(other(chunk)[:, prompt_len - 1 : -1].float(), dim=-1)
            kl = (p.exp() * (p - q)).sum(-1)
            total, count = total + float(kl.sum()), count + kl.numel()
    return total / count


def tree_gains(medusa1: np.ndarray, medusa2: np.ndarray, sizes: list[int]) -> list[dict]:
    """Expected tokens per step of the paper's greedy tree of each size (tokens, root
    included), each built from its own heads' accuracies."""
    rows = []
    for tokens in sizes:
        one = expected_acceptance(greedy_tree(medusa1, tokens - 1), medusa1)
        two = expected_acceptance(greedy_tree(medusa2, tokens - 1), medusa2)
        rows.append(
            {
                "tree_tokens": tokens,
                "medusa1": round(one, 3),
                "medusa2": round(two, 3),
                "gain": round(two / one, 4),
            }
        )
    return rows
