"""Tokens per sequence and step when prompts decode together, and how a step's accepted
length is distributed.

A batch of prompts takes tree steps until its slowest sequence has all its tokens; the
sequences that finish first wait. Its tokens per sequence and step are therefore set by
the expected *maximum* of the prompts' step counts, which is larger than the maximum of
their expected step counts (the two differ most where prompts are alike and many).

Both measures take each prompt's generations: (draws, new_tokens) tokens emitted after
each step, cumulative. Two sources give them:
- a replay (replayed_tokens): greedy verification is deterministic, so a static tree's
  steps can be walked through the heads' recorded predictions along the prompt's own
  plain continuation (accepted_lengths), every step starting where the last one stopped;
  this keeps what an average hides: heads right together, and stretches of text easier
  than others (a prompt whose hard part falls where its steps start is slower);
- a simulation (simulated_tokens) from each prompt's survival curve
  s[d] = P(at least d tokens past the root accepted), steps drawn independently, where
  no recorded walk exists (head accuracies only, typical acceptance, dynamic trees).
Either way the count carries the last step's cut (a step never emits past the budget).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from perfmodel.acceptance.trees import Tree, greedy_tree, path_value
from perfmodel.base.errors import PerfkitError

DRAWS = 2000  # simulated generations per prompt: the batch acceptance to about 0.3%


def acceptance_survival(tree: Tree, accuracy) -> np.ndarray:
    """s[d], d = 0..depth, for a static tree under the independence model: at most one node
    per depth is the model's own token, so s[d] is the sum of the depth-d nodes' values."""
    accuracy = np.asarray(accuracy, dtype=float)
    survival = np.zeros(tree.depth + 1)
    survival[0] = 1.0
    for path in tree.paths:
        survival[len(path)] += path_value(path, accuracy)
    return np.minimum.accumulate(np.clip(survival, 0.0, 1.0))


def dynamic_survival(step_probs: np.ndarray, nodes: int, calibrate: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Mean s[d] of the dynamic tree of `nodes` nodes over decoding positions.

    step_probs: (positions, heads, topk) the heads' top-k probabilities at each position,
    from which the decoder builds that step's tree (the greedy construction on them);
    calibrate maps them to how often such a prediction is right, which values the tree's
    nodes as the static model values them with head accuracies."""
    step_probs = np.asarray(step_probs, dtype=float)
    if step_probs.ndim != 3 or not len(step_probs):
        raise PerfkitError(f"step_probs must be (positions, heads, topk) with positions > 0, got {step_probs.shape}")
    heads = step_probs.shape[1]
    total = np.zeros(heads + 1)
    for probs in step_probs:
        survival = acceptance_survival(greedy_tree(probs, nodes), calibrate(probs))
        total[: len(survival)] += survival
    return total / len(step_probs)


def probability_calibration(probs: np.ndarray, hits: np.ndarray, bins: int = 20) -> Callable[[np.ndarray], np.ndarray]:
    """p -> how often a head's prediction of probability p is the model's token, per head.

    probs, hits: (positions, heads, topk) top-k probabilities and whether each was right
    (NaN hits, past the end of a sequence, are left out). Per head, predictions are binned by
    probability into equal-count bins and the hit rate read off by interpolation between
    the bins' mean probabilities (a small model's heads are far from calibrated)."""
    probs, hits = np.asarray(probs, dtype=float), np.asarray(hits, dtype=float)
    if probs.shape != hits.shape or probs.ndim != 3:
        raise PerfkitError(f"probs and hits must both be (positions, heads, topk); got {probs.shape}, {hits.shape}")
    curves = []
    for k in range(probs.shape[1]):
        p, h = probs[:, k].ravel(), hits[:, k].ravel()
        keep = ~np.isnan(h)
        p, h = p[keep], h[keep]
        if not len(p):
            raise PerfkitError(f"head {k + 1} has no positions with a known token to calibrate on")
        order = np.argsort(p)
        groups = np.array_split(order, min(bins, len(p)))
        curves.append((np.array([p[g].mean() for g in groups]), np.array([h[g].mean() for g in groups])))

    def calibrate(step: np.ndarray) -> np.ndarray:
        step = np.asarray(step, dtype=float)
        return np.stack([np.interp(step[k], *curves[k]) for k in range(step.shape[0])])

    return calibrate


def simulated_tokens(
    survivals: Sequence[np.ndarray], new_tokens: int, draws: int = DRAWS, seed: int = 0
) -> list[np.ndarray]:
    """Per prompt, (draws, new_tokens) tokens accepted after each step (cumulative), every
    step accepting 1 + d tokens with probability s[d] - s[d + 1]; a prompt is done at the
    first step that reaches `new_tokens` (new_tokens steps always suffice)."""
    if new_tokens < 1:
        raise PerfkitError(f"new_tokens must be >= 1, got {new_tokens}")
    rng = np.random.default_rng(seed)
    out = []
    for survival in survivals:
        tail = np.asarray(survival, dtype=float)[1:]
        if (tail < 0).any() or (tail > 1).any() or (np.diff(tail) > 1e-12).any():
            raise PerfkitError(f"survival curve must fall from 1 within [0, 1], got {np.round(survival, 4).tolist()}")
        uniform = rng.random((draws, new_tokens))
        out.append(np.cumsum(1 + (uniform[..., None] < tail).sum(-1), axis=1))
    return out


def accepted_lengths(tree: Tree, hits: np.ndarray) -> np.ndarray:
    """Per position of a decoded sequence, the tokens past the root a greedy step with
    `tree` starting there accepts, from the heads' recorded predictions.

    hits: (positions, heads, topk), 1 where head k's rank-r prediction at that position was
    the token that came, 0 where not, NaN where that token lies past the end (a miss: the
    budget cuts the step there anyway). Greedy verification accepts the longest tree path
    whose every node is its head's right prediction; a head has at most one right rank, so
    the path is the right ranks' prefix, cut where it leaves the tree."""
    hits = np.asarray(hits, dtype=float)
    if hits.ndim != 3:
        raise PerfkitError(f"hits must be (positions, heads, topk), got shape {hits.shape}")
    right = np.nan_to_num(hits, nan=0.0) == 1
    ranks = np.where(right.any(-1), right.argmax(-1), -1)  # (positions, heads)
    nodes = set(tree.paths)
    lengths = np.zeros(len(hits), dtype=np.int64)
    for position, row in enumerate(ranks[:, : tree.depth].tolist()):
        depth = 0
        while depth < len(row) and row[depth] >= 0 and tuple(row[: depth + 1]) in nodes:
            depth += 1
        lengths[position] = depth
    return lengths


def conditional_accuracy(hits: np.ndarray) -> np.ndarray:
    """a_k^(i) of a drafter whose depth k + 1 drafts from depth k's (EAGLE): how often rank i at
    depth k + 1 is the token that came, among the positions where every shallower depth's
    token came within the top-k (where a tree can reach depth k + 1 at all). hits:
    (positions, depth, topk), as accepted_lengths takes them. A depth no position reaches
    gets accuracy 0."""
    hits = np.asarray(hits, dtype=float)
    if hits.ndim != 3:
        raise PerfkitError(f"hits must be (positions, depth, topk), got shape {hits.shape}")
    accuracy = np.zeros(hits.shape[1:])
    reached = np.ones(len(hits), dtype=bool)
    for k in range(hits.shape[1]):
        known = reached & ~np.isnan(hits[:, k]).any(-1)
        if known.any():
            accuracy[k] = hits[known, k].mean(axis=0)
        reached &= np.nan_to_num(hits[:, k], nan=0.0).sum(-1) > 0
    return accuracy


def replayed_tokens(lengths: Sequence[np.ndarray], new_tokens: int) -> list[np.ndarray]:
    """Per prompt, (1, new_tokens) tokens emitted after each step (cumulative), walked
    through the prompt's recorded positions: a step starting after the i-th new token
    (lengths[i], accepted_lengths) emits 1 + lengths[i] tokens and the next step starts
    after them. Past the budget a step counts one token, as simulated_tokens does."""
    if new_tokens < 1:
        raise PerfkitError(f"new_tokens must be >= 1, got {new_tokens}")
    out = []
    for accepted in lengths:
        accepted = np.asarray(accepted, dtype=np.int64)
        if len(accepted) < new_tokens:
            raise PerfkitError(f"a replay of {new_tokens} tokens needs as many recorded positions, got {len(accepted)}")
        emitted, cum = 0, np.empty(new_tokens, dtype=np.int64)
        for step in range(new_tokens):
            emitted += 1 + (int(accepted[emitted]) if emitted < new_tokens else 0)
            cum[step] = emitted
        out.append(cum[None, :])
    return out


def step_counts(generations: Sequence[np.ndarray], new_tokens: int) -> np.ndarray:
    """(prompts, draws) steps each prompt takes to emit `new_tokens` tokens."""
    if not len(generations):
        return np.empty((0, 0), dtype=np.int64)
    return np.stack([(cum < new_tokens).sum(axis=1) + 1 for cum in generations])


def attended_context(generations: Sequence[np.ndarray], batch: int, prompt_len: int, new_tokens: int) -> float:
    """Cached tokens the attention of a batch's tree steps spans, on average over its steps,
    where every sequence is padded to the batch's longest (decoder.medusa runs each step
    over kv_len = max(lengths) + tree): prompt_len plus the tokens the leading sequence has
    committed before the step, a finished one keeping its length. A batch of one attends
    to its own prefix; the more prompts and the more their acceptance differs, the further
    ahead the leader and the longer every step's attention. generations: per prompt,
    (draws, new_tokens) cumulative tokens (replayed_tokens, simulated_tokens)."""
    if batch < 1:
        raise PerfkitError(f"batch must be >= 1, got {batch}")
    total = steps = 0.0
    for start in range(0, len(generations), batch):
        committed, done_at = [], []
        for cum in generations[start : start + batch]:
            finished = (cum < new_tokens).sum(axis=1)  # index of the step that reaches the budget
            before = np.concatenate([np.zeros((cum.shape[0], 1), cum.dtype), cum[:, :-1]], axis=1)
            committed.append(np.minimum(before, cum[np.arange(len(cum)), finished][:, None]))
            done_at.append(finished + 1)
        leader = np.max(committed, axis=0)  # (draws, new_tokens)
        running = np.arange(new_tokens)[None, :] < np.max(done_at, axis=0)[:, None]
        total += (leader * running).sum()
        steps += running.sum()
    return prompt_len + total / steps


def batch_acceptance(generations: Sequence[np.ndarray], batch: int, new_tokens: int) -> float:
    """Tokens per sequence and step of prompts decoded `batch` at a time, in order, each
    emitting `new_tokens`: chunks x new_tokens over the expected sum of every chunk's
    slowest step count. At batch 1 this is total tokens over total steps.
    generations: per prompt, (draws, new_tokens) cumulative tokens, every prompt the same
    number of draws (replayed_tokens, simulated_tokens)."""
    if batch < 1:
        raise PerfkitError(f"batch must be >= 1, got {batch}")
    steps = step_counts(generations, new_tokens)
    chunks = [steps[i : i + batch].max(axis=0).mean() for i in range(0, len(steps), batch)]
    return len(chunks) * new_tokens / sum(chunks)
