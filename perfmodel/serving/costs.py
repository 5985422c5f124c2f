"""What a serving simulation reads from the performance model, tabulated once per
configuration: the decoding step's time and tokens per sequence at every running batch and
context (at the tree the schedule runs there), a prompt's prefill time by length, what an
iteration that decodes nothing pays beyond its prefill work, and the KV cache's capacity in
tokens.

Tabulating first keeps the simulation's loop free of the latency model: one vectorised
pricing of batch x context (about 256 x 16 points) per configuration, then lookups."""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from perfmodel.base.errors import PerfkitError

# Contexts the step is priced at (tokens); between them the step time is interpolated
# linearly, as attention's cost is linear in the context it reads.
CONTEXT_POINTS = 16


@dataclass(frozen=True)
class ServingCosts:
    """One replica's costs. Arrays are indexed [batch - 1, context point]."""

    contexts: np.ndarray  # the context grid, tokens
    step_s: np.ndarray  # seconds per decoding step at the tree run there
    tokens: np.ndarray  # tokens each sequence gains per step (the tree's acceptance; 1 plain)
    tree: np.ndarray  # the tree size run (1: plain decoding)
    prefill_lengths: np.ndarray  # prompt lengths the prefill is priced at
    prefill_s: np.ndarray  # seconds to prefill one prompt of each length
    kv_capacity: int  # KV-cache tokens the replica holds beside its weights
    spare_tokens: int  # KV slots a step's tree adds per sequence beyond its context (tree - 1)
    label: str  # what the costs rest on
    # Seconds an iteration that runs no decoding step (prefill alone) takes beyond its prefill
    # work, by the prompt tokens it prefills (at prefill_lengths). An engine's per-iteration work
    # (scheduling, the forward's fixed part, sampling, an idle loop's wake-up) is part of a
    # decoding step's measured time, so a prefill beside decoding sequences adds only its own
    # work; alone, the iteration's own cost remains. None: nothing beyond (a step model's
    # prefill_time is a whole forward already).
    idle_s: np.ndarray | None = None

    @property
    def max_seqs(self) -> int:
        return self.step_s.shape[0]

    @cached_property
    def lookup(self) -> StepLookup:
        return StepLookup(
            self.contexts.tolist(),
            self.step_s.tolist(),
            self.tokens.tolist(),
            self.tree.tolist(),
            self.prefill_lengths.tolist(),
            self.prefill_s.tolist(),
            [] if self.idle_s is None else self.idle_s.tolist(),
        )

    def step(self, batch: int, context: float) -> tuple[float, float, int]:
        """(seconds, tokens per sequence, tree size) of a step of `batch` sequences at a mean
        context of `context` tokens."""
        return self.lookup.step(batch, context)

    def prefill(self, tokens) -> np.ndarray:
        """Seconds to prefill a prompt prefix of `tokens` tokens (the cost of a chunk from p to
        p + c is prefill(p + c) - prefill(p))."""
        t = np.asarray(tokens, dtype=float)
        return np.where(t <= 0, 0.0, np.interp(t, self.prefill_lengths, self.prefill_s))


@dataclass(frozen=True)
class StepLookup:
    """ServingCosts' step table as plain Python lists, and its lookups in Python floats: the
    simulation calls them once per iteration, tens of thousands of times per search, where
    numpy's per-call overhead on a 16-point row was most of the loop's time. The arithmetic
    is numpy's (np.interp's slope form, argmin's first-of-equals)."""

    contexts: list  # the context grid, tokens
    step_s: list  # [batch - 1][context point], as ServingCosts
    tokens: list
    tree: list
    prefill_lengths: list
    prefill_s: list
    idle_s: list  # as ServingCosts' ([]: None)

    def step(self, batch: int, context: float) -> tuple[float, float, int]:
        """See ServingCosts.step."""
        row, c = batch - 1, self.contexts
        j = min(max(bisect_left(c, context), 1), len(c) - 1)
        f = min(max((context - c[j - 1]) / (c[j] - c[j - 1]), 0.0), 1.0)
        # The tree of the nearer grid point, and its own step time and acceptance.
        k = j if f >= 0.5 else j - 1
        seconds = self.step_s[row]
        return seconds[j - 1] + f * (seconds[j] - seconds[j - 1]), float(self.tokens[row][k]), int(self.tree[row][k])

    def steps(
        self,
        batch: int,
        context: float,
        tokens: float,
        tree: int,
        left: float,
        until: float,
        growth: float | None = None,
    ) -> tuple[int, float]:
        """How many steps of `batch` sequences from a mean context of `context` run before the
        first sequence, `left` tokens of progress (`tokens` a step) from its end, completes, or
        before the step that starts after `until` seconds, while the tree stays `tree`; and
        their seconds in all. At least one step.

        Each step's time is linear in its context between two grid points, and the mean context
        grows by `growth` a step (`tokens` unless the sequences gain their own multiples), so a
        run of steps within one grid segment (and one nearest grid point, whose tree it runs) is
        an arithmetic series: summed and cut at `until` in closed form, a few operations per
        segment rather than per step (a sequence decoding alone runs hundreds of steps between
        events)."""
        count = max(1, math.ceil(left / tokens - 1e-9))
        growth = tokens if growth is None else growth
        c, seconds, trees = self.contexts, self.step_s[batch - 1], self.tree[batch - 1]
        last = len(c) - 1
        k, total = 0, 0.0
        while k < count:
            if k and total >= until:
                break
            ahead = context + growth * k
            j = bisect_right(c, ahead) - 1
            # This run's nearest grid point, the context it ends at (`inclusive`: a step at
            # exactly that context still belongs to it) and its step time a + b * step index.
            if j < 0:
                nearest, bound, inclusive, a, b = 0, c[0], False, seconds[0], 0.0
            elif j == last:
                nearest, bound, inclusive, a, b = last, math.inf, False, seconds[last], 0.0
            else:
                slope = (seconds[j + 1] - seconds[j]) / (c[j + 1] - c[j])
                a, b = seconds[j] + slope * (context - c[j]), slope * growth
                middle = (c[j] + c[j + 1]) / 2
                nearest, bound, inclusive = (j, middle, True) if ahead <= middle else (j + 1, c[j + 1], False)
            if k and trees[nearest] != tree:
                break
            end = min(count, first_step_past(context, growth, bound, inclusive, k + 1))
            # (0 only at the first step, when `until` is already past: it runs all the same)
            n = max(1, steps_to_reach(until - total, a + b * k, b, end - k))
            total += n * (a + b * k) + b * n * (n - 1) / 2
            k += n
            if k < end:  # `until` reached inside the run
                break
        return k, total

    def prefill(self, tokens: int) -> float:
        """See ServingCosts.prefill, for one prefix."""
        return 0.0 if tokens <= 0 else interpolate(tokens, self.prefill_lengths, self.prefill_s)

    def idle(self, tokens: int) -> float:
        """Seconds an iteration that decodes nothing and prefills `tokens` prompt tokens takes
        beyond their prefill (ServingCosts.idle_s)."""
        if not self.idle_s or tokens <= 0:
            return 0.0
        return interpolate(tokens, self.prefill_lengths, self.idle_s)


def first_step_past(context: float, tokens: float, bound: float, inclusive: bool, least: int) -> int:
    """The first step index (at least `least`) whose context (context + tokens * index) lies
    past `bound` (beyond it if `inclusive`, at or beyond it if not)."""
    if bound == math.inf:
        return math.inf
    index = max(least, math.floor((bound - context) / tokens))
    # the estimate is off by a step at most, where the division rounds
    if inclusive:
        while index > least and context + tokens * (index - 1) > bound:
            index -= 1
        while not context + tokens * index > bound:
            index += 1
    else:
        while index > least and context + tokens * (index - 1) >= bound:
            index -= 1
        while not context + tokens * index >= bound:
            index += 1
    return index


def steps_to_reach(budget: float, first: float, growth: float, most: int) -> int:
    """How many steps of an arithmetic series of times (first, first + growth, ...) run, at
    most `most`, while the time so far is under `budget`: the smallest n whose first n steps
    take `budget` or more, else `most`. Step times are positive, so the sum only grows."""
    if budget <= 0:
        return 0
    if most * first + growth * most * (most - 1) / 2 < budget:
        return most
    if growth == 0:
        n = max(1, math.ceil(budget / first))
    else:  # the root of growth / 2 n^2 + half n = budget, in the form without cancellation
        half = first - growth / 2
        root = math.sqrt(max(half * half + 2 * growth * budget, 0.0))
        n = max(1, math.ceil(2 * budget / (half + root) if half > 0 else (root - half) / growth))
    n = min(most, n)
    while n > 1 and (n - 1) * first + growth * (n - 1) * (n - 2) / 2 >= budget:
        n -= 1
    while n * first + growth * n * (n - 1) / 2 < budget:
        n += 1
    return n


def interpolate(x: float, xs: list, values: list) -> float:
    """np.interp(x, xs, values) for one x, in numpy's arithmetic (its slope form, a grid
    point's own value)."""
    if x <= xs[0]:
        return values[0]
    if x >= xs[-1]:
        return values[-1]
    j = bisect_right(xs, x) - 1
    if xs[j] == x:
        return values[j]
    return (values[j + 1] - values[j]) / (xs[j + 1] - xs[j]) * (x - xs[j]) + values[j]


def context_grid(max_context: int, points: int = CONTEXT_POINTS) -> np.ndarray:
    """Contexts from 1 to max_context, geometric (dense where short contexts change the step
    most), as integers."""
    grid = np.unique(np.rint(np.geomspace(1, max(max_context, 2), points)).astype(np.int64))
    return grid


@dataclass(frozen=True)
class CostBounds:
    """How far a replica's costs are tabulated: batches 1..max_seqs, contexts up to
    max_context; the KV tokens the cache holds, and the largest tree the schedule may run
    (whose spare KV slots every sequence keeps free)."""

    max_seqs: int
    max_context: int
    kv_capacity: int
    max_tree: int


def tabulate_costs(
    step,
    acceptance: Callable[[np.ndarray], np.ndarray],
    tree_size: Callable[[np.ndarray, np.ndarray], np.ndarray],
    bounds: CostBounds,
    label: str,
    medusa: bool,
) -> ServingCosts:
    """The costs of `step` (a step model with step_time and prefill_time; tensor parallel
    included) within `bounds`. tree_size(batch, context) -> the tree run there (1: plain;
    arrays); acceptance(n) -> tokens per step."""
    max_seqs, max_context, kv_capacity, max_tree = (
        bounds.max_seqs,
        bounds.max_context,
        bounds.kv_capacity,
        bounds.max_tree,
    )
    if max_seqs < 1:
        raise PerfkitError(f"the running batch must hold at least one sequence, got {max_seqs}")
    contexts = context_grid(max_context)
    batch = np.arange(1, max_seqs + 1, dtype=np.int64)[:, None]
    b, s = np.broadcast_arrays(batch, contexts[None, :])
    tree = np.asarray(tree_size(b, s), dtype=np.int64).reshape(b.shape)
    step_s = np.asarray(step.step_time(b, s, tree), dtype=float).reshape(b.shape)
    tokens = np.where(tree > 1, np.asarray(acceptance(np.maximum(tree, 1)), dtype=float).reshape(b.shape), 1.0)
    # Every length: measured GEMM times are staircases an interpolation would smooth away.
    lengths = np.arange(1, max(max_context, 2) + 1, dtype=np.int64)
    prefill_s = np.asarray(step.prefill_time(1, lengths, medusa), dtype=float)
    return ServingCosts(contexts, step_s, tokens, tree, lengths, prefill_s, kv_capacity, max_tree - 1, label)
