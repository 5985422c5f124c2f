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
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from decoder.tree import TreeBuffers
from perfmodel.errors import PerfkitError

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
        if self.temperature <= 0:
            raise PerfkitError(f"temperature must be > 0, got {self.temperature}")

    @property
    def samples(self) -> bool:
        """Whether decoding draws random tokens (so its baseline samples too)."""
        return self.scheme == "rejection"


def _longest_path(ok: torch.Tensor, buffers: TreeBuffers) -> list[int]:
    """Token indices of the longest root-to-leaf prefix whose every node is ok (ok: (T,) bool)."""
    retrieve = buffers.retrieve
    valid = retrieve >= 0
    node_ok = ok[retrieve.clamp(min=0)] & valid
    node_ok[:, 0] = True  # the root is always kept
    run = node_ok.long().cumprod(dim=1).sum(dim=1)  # accepted tokens along each path
    best = int(run.argmax())
    return retrieve[best, : int(run[best])].tolist()


def _parent_check(candidates: torch.Tensor, buffers: TreeBuffers, passes) -> torch.Tensor:
    """ok[i] = passes(parent of i, candidate token of i), for every non-root token i."""
    parents = torch.as_tensor(buffers.tree.parents).clamp(min=0)
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
    ok = _parent_check(candidates, buffers, lambda parents, tokens: probs[parents, tokens] > threshold[parents])
    path = _longest_path(ok, buffers)
    return path, int(logits[path[-1]].argmax())


def rejection(candidates, logits, buffers: TreeBuffers, config: AcceptanceConfig, generator=None):
    probs = torch.softmax(logits.float() / config.temperature, dim=-1)
    node, path = 0, [0]
    while True:
        residual = probs[node].clone()
        for child in buffers.children[node]:
            token = int(candidates[child])
            if torch.rand((), generator=generator) < residual[token]:
                node = child
                break
            residual[token] = 0.0
            residual /= residual.sum()
        else:  # every draft rejected (or a leaf): the next token comes from what is left
            return path, int(torch.multinomial(residual, 1, generator=generator))
        path.append(node)


ACCEPT = {"greedy": greedy, "typical": typical, "rejection": rejection}


def next_token(logits: torch.Tensor, config: AcceptanceConfig, generator=None) -> int:
    """Plain decoding's choice from one position's logits (the baseline and the first root)."""
    if config.samples:
        return int(torch.multinomial(torch.softmax(logits.float() / config.temperature, -1), 1, generator=generator))
    return int(logits.argmax())
