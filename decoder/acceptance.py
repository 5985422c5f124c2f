"""Which candidates of one tree step a sequence keeps, and the token that comes next.

Each scheme gets the tree's candidate tokens (T,), the model's logits at every tree token
(T, V) and the tree buffers, and returns (accepted token indices, root first; next root).
The next root is the model's own next token after the last accepted one: the first token
of the following step, always accepted there.

- greedy: a candidate is kept iff it is the argmax at its parent; the output is then
  exactly greedy decoding's (lossless).
- typical: a candidate x is kept iff p(x) > min(eps, delta * exp(-H(p))) at its parent,
  with p at `temperature`; the next root is the argmax (paper section 2.3.1).
- rejection: exact sampling from the model at `temperature`. The tree's children of a
  node are deterministic drafts, so each is accepted with its probability under the
  residual distribution, which drops it and renormalises when it is rejected; when all
  are rejected the next root is drawn from what is left. Every emitted token is then an
  exact sample of the model's distribution.

Random draws use one CPU generator (decoder.medusa makes it) and are taken on CPU copies
of the probabilities, whatever device the model runs on: torch refuses a CPU generator for
a CUDA tensor, and one CPU stream gives a seed the same random numbers on every device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from decoder.tree import TreeBuffers
from perfmodel.base.errors import PerfkitError

SCHEMES = ("greedy", "typical", "rejection")


@dataclass(frozen=True)
class AcceptanceConfig:
    scheme: str = "greedy"
    temperature: float = 0.7
    eps: float = 0.09  # typical acceptance hard threshold (reference posterior_threshold)
    delta: float = 0.3  # entropy-scaled threshold (reference posterior_alpha), ~ sqrt(eps)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise PerfkitError(f"unknown acceptance {self.scheme!r}; choose one of: {', '.join(SCHEMES)}")
        t = self.temperature
        if not (isinstance(t, (int, float)) and math.isfinite(t) and t > 0):
            raise PerfkitError(f"temperature must be a finite number > 0, got {self.temperature!r}")

    @property
    def samples(self) -> bool:
        """Whether decoding draws random tokens (so its baseline samples too)."""
        return self.scheme == "rejection"


def uniform(generator=None) -> float:
    """A uniform draw in [0, 1) from the (CPU) generator."""
    return float(torch.rand((), generator=generator))


def draw(probs: torch.Tensor, generator=None) -> int:
    """A token drawn from `probs` (V,) with the (CPU) generator, on a CPU copy: probs may
    live on any device."""
    return int(torch.multinomial(probs.detach().float().cpu(), 1, generator=generator))


def _longest_path(ok: torch.Tensor, buffers: TreeBuffers, log_prob: torch.Tensor | None = None) -> list[int]:
    """Token indices of the longest root-to-leaf prefix whose every node is ok (ok: (T,) bool).

    Among paths of that length, the first; or, given each token's log-probability under the
    model at its parent (log_prob: (T,)), the most likely: the largest sum over the accepted
    tokens, as the reference implementation's typical acceptance picks (evaluate_posterior)."""
    retrieve = buffers.retrieve
    valid = retrieve >= 0
    node_ok = ok[retrieve.clamp(min=0)] & valid
    node_ok[:, 0] = True  # the root is always kept
    kept = node_ok.long().cumprod(dim=1)
    run = kept.sum(dim=1)  # accepted tokens along each path
    if log_prob is None:
        best = int(run.argmax())
    else:
        along = torch.where(kept.bool(), log_prob[retrieve.clamp(min=0)], torch.zeros((), device=log_prob.device))
        score = along[:, 1:].sum(dim=1)  # the root is no candidate
        score = torch.where(run == run.max(), score, torch.full_like(score, -torch.inf))
        best = int(score.argmax())
    return retrieve[best, : int(run[best])].tolist()


def _parent_check(candidates: torch.Tensor, buffers: TreeBuffers, passes) -> torch.Tensor:
    """ok[i] = passes(parent of i, candidate token of i), for every non-root token i."""
    parents = torch.as_tensor(buffers.tree.parents, device=candidates.device).clamp(min=0)
    ok = passes(parents, candidates)
    ok[0] = True
    return ok


def greedy(candidates, logits, buffers: TreeBuffers, config: AcceptanceConfig, generator=None):
    prediction = logits.argmax(-1)
    ok = _parent_check(candidates, buffers, lambda parents, tokens: prediction[parents] == tokens)
    path = _longest_path(ok, buffers)
    return path, int(prediction[path[-1]])


def typical(candidates, logits, buffers: TreeBuffers, config: AcceptanceConfig, generator=None):
    probs = torch.softmax(logits.float() / config.temperature, dim=-1)
    entropy = -(probs * torch.log(probs + 1e-10)).sum(-1)
    threshold = torch.minimum(torch.full_like(entropy, config.eps), config.delta * torch.exp(-entropy))
    parents = torch.as_tensor(buffers.tree.parents, device=probs.device).clamp(min=0)
    token_prob = probs[parents, candidates]  # each token's probability at its parent
    ok = token_prob > threshold[parents]
    ok[0] = True
    path = _longest_path(ok, buffers, torch.log(token_prob))
    return path, int(logits[path[-1]].argmax())


def rejection(candidates, logits, buffers: TreeBuffers, config: AcceptanceConfig, generator=None):
    probs = torch.softmax(logits.float() / config.temperature, dim=-1)
    node, path = 0, [0]
    while True:
        residual = probs[node].clone()
        for child in buffers.children[node]:
            token = int(candidates[child])
            if uniform(generator) < float(residual[token]):
                node = child
                break
            residual[token] = 0.0
            residual /= residual.sum()
        else:  # every draft rejected (or a leaf): the next token comes from what is left
            return path, draw(residual, generator)
        path.append(node)


ACCEPT = {"greedy": greedy, "typical": typical, "rejection": rejection}


def next_token(logits: torch.Tensor, config: AcceptanceConfig, generator=None) -> int:
    """Plain decoding's choice from one position's logits (the baseline and the first root)."""
    if config.samples:
        return draw(torch.softmax(logits.float() / config.temperature, -1), generator)
    return int(logits.argmax())
