"""A continuous-batching serving simulation, iteration by iteration as engines schedule:

- requests queue on arrival and join the running batch while it has room: fewer than the
  engine's max sequences, and KV cache for their prompt, their whole output and the tree's
  spare slots (reserved on admission, as an engine that never preempts must);
- prefill is `separate` (an iteration prefilling every newly admitted prompt, before the
  next decoding step: vLLM's v0 and TGI's default) or `chunked` (each iteration decodes the
  running batch and prefills prompts in chunks up to a token budget, the step's own tokens
  counted against it: vLLM's v1 and SGLang's default). The prefill makes the first token; an
  iteration that decodes nothing also pays the costs' idle_s (the iteration's own cost,
  which a decoding step's time otherwise carries);
- a decoding step of b sequences at their mean context runs the tree the schedule names
  for (b, context), and every sequence gains that tree's expected tokens per step (its
  acceptance; 1 in plain decoding), times the request's own `gain` where the requests carry
  one (the engine check's, from each prompt's own drafts). Progress is the expectation, not a
  draw: without gains the latency percentiles come from queueing and batching alone;
- a sequence leaves when its output is complete, freeing its KV cache.

Why a loop of our own and not a discrete-event library (simpy): an engine's only events are
its iterations, each a function of the running batch, so a plain loop over iterations with
the costs tabulated once (perfmodel.serving.costs) is the whole model; it runs a 600-request
simulation in tens of milliseconds, which a search over devices, degrees and rates needs.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from functools import cached_property
from heapq import heappop, heappush

import numpy as np
import pandas as pd

from perfmodel.base.checks import is_count
from perfmodel.base.errors import PerfkitError
from perfmodel.planning.workload import Requests, Targets
from perfmodel.serving.costs import ServingCosts

PREFILL_MODES = ("separate", "chunked")
DEFAULT_CHUNK_TOKENS = 2048
DEFAULT_MAX_SEQS = 256  # vLLM's default max_num_seqs: the running batch's cap
# How far a sequence's gain (the difference of two large sums of fractional tokens) may fall
# short of its output by rounding alone and still complete it.
GAIN_ROUNDING = 1e-9
# The requests the percentiles and throughput are taken over: those arriving between these
# shares of the run, past the empty start and before the draining end.
STEADY = (0.1, 0.9)


@dataclass(frozen=True)
class EngineConfig:
    """How the engine schedules: its prefill mode and, chunked, its token budget per
    iteration; its cap on running sequences (the KV cache may hold fewer)."""

    prefill: str = "separate"
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    max_seqs: int = DEFAULT_MAX_SEQS

    def __post_init__(self) -> None:
        if self.prefill not in PREFILL_MODES:
            raise PerfkitError(f"unknown prefill mode {self.prefill!r}; choose one of: {', '.join(PREFILL_MODES)}")
        if not is_count(self.chunk_tokens):
            raise PerfkitError(f"chunk_tokens must be a positive integer, got {self.chunk_tokens!r}")
        if not is_count(self.max_seqs):
            raise PerfkitError(f"max_seqs must be a positive integer, got {self.max_seqs!r}")


@dataclass(frozen=True)
class ServingRun:
    """One simulation's outcome: per request its times (arrays in arrival order), and the
    steady-state statistics."""

    arrival_s: np.ndarray = field(repr=False)
    first_token_s: np.ndarray = field(repr=False)
    finish_s: np.ndarray = field(repr=False)
    prompt: np.ndarray = field(repr=False)
    output: np.ndarray = field(repr=False)
    tokens_s: float  # output tokens per second in the steady state
    mean_batch: float  # sequences per decoding step, averaged over decoding time
    tree_share: float  # share of decoding steps that ran a tree
    duration_s: float
    # Stopped once a target was certain to be missed (simulate's `give_up`): the statistics
    # cover the requests served by then only.
    missed: bool = False

    @property
    def ttft_s(self) -> np.ndarray:
        return self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> np.ndarray:
        """NaN for a one-token output."""
        spans = np.maximum(self.output - 1, 1)
        return np.where(self.output > 1, (self.finish_s - self.first_token_s) / spans, np.nan)

    @cached_property
    def requests(self) -> pd.DataFrame:
        """arrival_s, first_token_s, finish_s, prompt, output, ttft_s, tpot_s per request."""
        columns = ("arrival_s", "first_token_s", "finish_s", "prompt", "output", "ttft_s", "tpot_s")
        return pd.DataFrame({name: getattr(self, name) for name in columns})

    def percentile(self, what: str, q: float) -> float:
        """The q-th percentile of ttft_s or tpot_s over the steady-state requests."""
        if what not in ("ttft_s", "tpot_s"):
            raise PerfkitError(f"no percentile of {what!r}; choose ttft_s or tpot_s")
        values = getattr(self, what)[slice(*steady_range(len(self.arrival_s)))]
        values = values[~np.isnan(values)]
        return float(np.percentile(values, q)) if len(values) else math.nan


def steady(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.iloc[slice(*steady_range(len(frame)))]


def steady_range(n: int) -> tuple[int, int]:
    """The steady-state window of n requests in arrival order: [first, end)."""
    first = int(STEADY[0] * n)
    return first, max(int(STEADY[1] * n), first + 1)


@dataclass
class MissWatch:
    """Counts the steady-state requests over a target as their times become known, and says
    when the target's percentile is certain to be missed: once the value at its lower rank
    (numpy's linear percentile interpolates upward from there) is over the target, however
    the rest turn out. A search that only asks whether a rate meets the targets stops there."""

    ttft_s: float
    tpot_s: float
    first: int  # the steady window's requests: first <= i < end
    end: int
    ttft_needed: int  # requests over the target that make the miss certain
    tpot_needed: int
    ttft_over: int = 0
    tpot_over: int = 0

    @classmethod
    def of(cls, targets: Targets, output: np.ndarray) -> MissWatch:
        first, end = steady_range(len(output))
        q = targets.percentile
        return cls(
            math.inf if targets.ttft_s is None else targets.ttft_s,
            math.inf if targets.tpot_s is None else targets.tpot_s,
            first,
            end,
            certain_miss(end - first, q),
            certain_miss(int(np.count_nonzero(output[first:end] > 1)), q),
        )

    def ttft(self, i: int, seconds: float) -> bool:
        if seconds > self.ttft_s and self.first <= i < self.end:
            self.ttft_over += 1
        return self.ttft_over >= self.ttft_needed

    def tpot(self, i: int, seconds: float) -> bool:
        if seconds > self.tpot_s and self.first <= i < self.end:
            self.tpot_over += 1
        return self.tpot_over >= self.tpot_needed


def certain_miss(n: int, q: int) -> int:
    """How many of n values over a target put their q-th percentile over it for certain: all
    those from the percentile's lower rank up, one more where the rank is a whole number past
    0 (the float index numpy computes may then fall just below it)."""
    if n == 0:
        return 1  # never: no values, a NaN percentile, missed by the check after the run
    rank, rest = divmod(q * (n - 1), 100)
    return n - rank + (rest == 0 and rank > 0)


def simulate(
    requests: Requests, costs: ServingCosts, engine: EngineConfig = EngineConfig(), give_up: Targets | None = None
) -> ServingRun:
    """Serve `requests` on one replica priced by `costs` (see the module docstring). With
    `give_up`, stop as soon as one of its TTFT / TPOT percentile targets is certain to be
    missed (the run's `missed`): a search needs no more of that run."""
    n = len(requests)
    arrival, prompt, output = requests.arrival_s, requests.prompt, requests.output
    need = prompt + output + costs.spare_tokens
    too_long = np.flatnonzero(need > costs.kv_capacity)
    if too_long.size:
        i = too_long[0]
        raise PerfkitError(
            f"request {i} ({prompt[i]} prompt + {output[i]} output tokens) needs more KV cache than the replica holds "
            f"({costs.kv_capacity:,} tokens); use more devices, a smaller dtype or shorter requests"
        )
    lookup = costs.lookup
    prefill_of = costs.prefill(prompt).tolist()  # each prompt's whole prefill, seconds
    max_seqs, kv_capacity = costs.max_seqs, costs.kv_capacity
    arrival_at, prompt_of, output_of, need_of = arrival.tolist(), prompt.tolist(), output.tolist(), need.tolist()
    gain_of = [1.0] * n if requests.gain is None else requests.gain.tolist()
    first, finish = [math.nan] * n, [math.nan] * n
    prefilled = [0] * n  # prompt tokens prefilled so far
    # Every running sequence gains its own multiple (`gain_of`) of the same tokens per step, so
    # one counter, `progress`, tracks them all: a sequence's tokens are its gain times progress
    # less its value when it joined (`joined`). The running batch is a heap by the progress at
    # which each sequence completes, and its mean context running sums: an iteration costs the
    # same at any batch.
    progress, joined = 0.0, [0.0] * n
    running: list[tuple[float, int]] = []
    prompt_sum, gain_sum, joined_sum = 0, 0.0, 0.0  # over the running batch (joined_sum: gain x joined)
    waiting: deque[int] = deque()
    prefilling: list[int] = []
    kv_used, t, upcoming, done = 0, 0.0, 0, 0
    times, produced = [0.0], [0.0]  # iteration end times and output tokens made by then
    decode_time = batch_time = tree_steps = steps = 0.0
    chunked = engine.prefill == "chunked"
    watch = MissWatch.of(give_up, output) if give_up is not None and give_up.simulated else None
    missed = False

    while done < n:
        while upcoming < n and arrival_at[upcoming] <= t:
            waiting.append(upcoming)
            upcoming += 1
        while waiting and len(running) + len(prefilling) < max_seqs and kv_used + need_of[waiting[0]] <= kv_capacity:
            i = waiting.popleft()
            kv_used += need_of[i]
            prefilling.append(i)
        if not running and not prefilling:
            t = max(t, arrival_at[upcoming])
            continue

        made = 0.0
        if not chunked and prefilling:
            t += sum([prefill_of[i] for i in prefilling]) + lookup.idle(sum([prompt_of[i] for i in prefilling]))
            ready, prefilling = prefilling, []
        else:
            dt, budget = 0.0, engine.chunk_tokens
            if running:
                b = len(running)
                growth = gain_sum / b  # the mean context's tokens per unit of progress
                context = (prompt_sum - joined_sum) / b + progress * growth
                seconds, tokens, tree = lookup.step(b, context)
                count = 1
                if not prefilling:
                    # Nothing joins or leaves before the next arrival or completion: take the
                    # steps up to then at once.
                    left = running[0][0] - progress
                    next_arrival = arrival_at[upcoming] if upcoming < n else math.inf
                    count, seconds = lookup.steps(b, context, tokens, tree, left, next_arrival - t, tokens * growth)
                dt += seconds
                budget -= b * tree
                progress += tokens * count
                made += gain_sum * tokens * count
                decode_time += seconds
                batch_time += seconds * b
                tree_steps += count * (tree > 1)
                steps += count
            ready, chunks = [], 0
            for i in prefilling:
                if budget <= 0:
                    break
                chunk = min(prompt_of[i] - prefilled[i], budget)
                dt += lookup.prefill(prefilled[i] + chunk) - lookup.prefill(prefilled[i])
                prefilled[i] += chunk
                budget -= chunk
                chunks += chunk
                if prefilled[i] == prompt_of[i]:
                    ready.append(i)
            if not running:  # no decoding step carried the iteration's own cost
                dt += lookup.idle(chunks)
            prefilling = [i for i in prefilling if prefilled[i] < prompt_of[i]]
            t += dt
            while running and gain_of[j := running[0][1]] * (progress - joined[j]) >= output_of[j] - 1 - GAIN_ROUNDING:
                i = heappop(running)[1]
                finish[i] = t
                if watch is not None and watch.tpot(i, (t - first[i]) / (output_of[i] - 1)):
                    missed = True
                kv_used -= need_of[i]
                done += 1
                made -= gain_of[i] * (progress - joined[i]) - (output_of[i] - 1)  # tokens past the end are dropped
                prompt_sum -= prompt_of[i]
                gain_sum -= gain_of[i]
                joined_sum -= gain_of[i] * joined[i]
            if not running:
                gain_sum = joined_sum = 0.0  # no rounding carried into the next batch
        for i in ready:
            first[i] = t
            made += 1
            if watch is not None and watch.ttft(i, t - arrival_at[i]):
                missed = True
            if output_of[i] <= 1:
                finish[i] = t
                kv_used -= need_of[i]
                done += 1
            else:
                joined[i] = progress
                heappush(running, ((output_of[i] - 1) / gain_of[i] + progress, i))
                prompt_sum += prompt_of[i]
                gain_sum += gain_of[i]
                joined_sum += gain_of[i] * progress
        times.append(t)
        produced.append(produced[-1] + made)
        if missed:
            break

    first, finish = np.array(first), np.array(finish)
    return ServingRun(
        arrival,
        first,
        finish,
        prompt,
        output,
        math.nan if missed else steady_throughput(finish, np.array(times), np.array(produced)),
        batch_time / decode_time if decode_time else 0.0,
        tree_steps / steps if steps else 0.0,
        t,
        missed,
    )


def steady_throughput(finish_s: np.ndarray, times: np.ndarray, produced: np.ndarray) -> float:
    """Output tokens per second between the times the steady-state window's first and last
    requests finish (the span where the engine is neither filling nor draining), `produced`
    tokens having been made by each of `times`."""
    window = np.sort(finish_s)[slice(*steady_range(len(finish_s)))]
    window = window[~np.isnan(window)]
    start, end = (float(window[0]), float(window[-1])) if len(window) else (math.nan, math.nan)
    if not end > start:
        return float(produced[-1] / times[-1]) if times[-1] > 0 else math.nan
    made = np.interp([start, end], times, produced)
    return float((made[1] - made[0]) / (end - start))
