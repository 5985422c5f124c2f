"""A continuous-batching serving simulation, iteration by iteration as engines schedule:

- requests queue on arrival and join the running batch while it has room: fewer than the
  engine's max sequences, and KV cache for their prompt, their whole output and the tree's
  spare slots (reserved on admission, as an engine that never preempts must);
- prefill is `separate` (an iteration prefilling every newly admitted prompt, before the
  next decoding step: vLLM's v0 and TGI's default) or `chunked` (each iteration decodes the
  running batch and prefills prompts in chunks up to a token budget, the step's own tokens
  counted against it: vLLM's v1 and SGLang's default). The prefill makes the first token;
- a decoding step of b sequences at their mean context runs the tree the schedule names
  for (b, context), and every sequence gains that tree's expected tokens per step (its
  acceptance; 1 in plain decoding). Progress is the expectation, not a draw: the latency
  percentiles come from queueing and batching, not from acceptance luck;
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
from heapq import heappop, heappush

import numpy as np
import pandas as pd

from perfmodel.base.checks import is_count
from perfmodel.base.errors import PerfkitError
from perfmodel.planning.workload import Requests
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
    """One simulation's outcome: per request its times, and the steady-state statistics."""

    requests: pd.DataFrame = field(repr=False)  # arrival_s, first_token_s, finish_s, prompt, output, ttft_s, tpot_s
    tokens_s: float  # output tokens per second in the steady state
    mean_batch: float  # sequences per decoding step, averaged over decoding time
    tree_share: float  # share of decoding steps that ran a tree
    duration_s: float

    def percentile(self, what: str, q: float) -> float:
        """The q-th percentile of ttft_s or tpot_s over the steady-state requests."""
        values = steady(self.requests)[what].dropna()
        return float(np.percentile(values, q)) if len(values) else math.nan


def steady(frame: pd.DataFrame) -> pd.DataFrame:
    n = len(frame)
    return frame.iloc[int(STEADY[0] * n) : max(int(STEADY[1] * n), int(STEADY[0] * n) + 1)]


def simulate(requests: Requests, costs: ServingCosts, engine: EngineConfig = EngineConfig()) -> ServingRun:
    """Serve `requests` on one replica priced by `costs` (see the module docstring)."""
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
    prefill_of = costs.prefill(prompt)  # each prompt's whole prefill, seconds
    arrival_at, prompt_of, output_of, need_of = arrival.tolist(), prompt.tolist(), output.tolist(), need.tolist()
    first, finish = [math.nan] * n, [math.nan] * n
    prefilled = [0] * n  # prompt tokens prefilled so far
    # Every running sequence gains the same tokens per step, so one counter, `progress`,
    # tracks them all: a sequence's gain is progress less its value when it joined (`joined`).
    # The running batch is a heap by the progress at which each sequence completes, and its
    # mean context a running sum: an iteration costs the same at any batch.
    progress, joined = 0.0, [0.0] * n
    running: list[tuple[float, int]] = []
    prompt_sum, joined_sum = 0, 0.0  # over the running batch
    waiting: deque[int] = deque()
    prefilling: list[int] = []
    kv_used, t, upcoming, done = 0, 0.0, 0, 0
    times, produced = [0.0], [0.0]  # iteration end times and output tokens made by then
    decode_time = batch_time = tree_steps = steps = 0.0
    chunked = engine.prefill == "chunked"

    while done < n:
        while upcoming < n and arrival_at[upcoming] <= t:
            waiting.append(upcoming)
            upcoming += 1
        while (
            waiting
            and len(running) + len(prefilling) < costs.max_seqs
            and kv_used + need_of[waiting[0]] <= costs.kv_capacity
        ):
            i = waiting.popleft()
            kv_used += need_of[i]
            prefilling.append(i)
        if not running and not prefilling:
            t = max(t, arrival_at[upcoming])
            continue

        made = 0.0
        if not chunked and prefilling:
            t += float(prefill_of[prefilling].sum())
            ready, prefilling = prefilling, []
        else:
            dt, budget = 0.0, engine.chunk_tokens
            if running:
                b = len(running)
                context = (prompt_sum - joined_sum) / b + progress
                seconds, tokens, tree = lookup.step(b, context)
                count = 1
                if not prefilling:
                    # Nothing joins or leaves before the next arrival or completion: take the
                    # steps up to then at once.
                    left = running[0][0] - progress
                    next_arrival = arrival_at[upcoming] if upcoming < n else math.inf
                    count, seconds = lookup.steps(b, context, tokens, tree, left, next_arrival - t)
                dt += seconds
                budget -= b * tree
                progress += tokens * count
                made += b * tokens * count
                decode_time += seconds
                batch_time += seconds * b
                tree_steps += count * (tree > 1)
                steps += count
            ready = []
            for i in prefilling:
                if budget <= 0:
                    break
                chunk = min(prompt_of[i] - prefilled[i], budget)
                dt += lookup.prefill(prefilled[i] + chunk) - lookup.prefill(prefilled[i])
                prefilled[i] += chunk
                budget -= chunk
                if prefilled[i] == prompt_of[i]:
                    ready.append(i)
            prefilling = [i for i in prefilling if prefilled[i] < prompt_of[i]]
            t += dt
            while running and progress - joined[running[0][1]] >= output_of[running[0][1]] - 1 - GAIN_ROUNDING:
                i = heappop(running)[1]
                finish[i] = t
                kv_used -= need_of[i]
                done += 1
                made -= progress - joined[i] - (output_of[i] - 1)  # tokens past the end are dropped
                prompt_sum -= prompt_of[i]
                joined_sum -= joined[i]
            if not running:
                joined_sum = 0.0  # no rounding carried into the next batch
        for i in ready:
            first[i] = t
            made += 1
            if output_of[i] <= 1:
                finish[i] = t
                kv_used -= need_of[i]
                done += 1
            else:
                joined[i] = progress
                heappush(running, (output_of[i] - 1 + progress, i))
                prompt_sum += prompt_of[i]
                joined_sum += progress
        times.append(t)
        produced.append(produced[-1] + made)

    first, finish = np.array(first), np.array(finish)
    frame = pd.DataFrame(
        {"arrival_s": arrival, "first_token_s": first, "finish_s": finish, "prompt": prompt, "output": output}
    )
    frame["ttft_s"] = frame["first_token_s"] - frame["arrival_s"]
    frame["tpot_s"] = np.where(output > 1, (finish - first) / np.maximum(output - 1, 1), np.nan)
    return ServingRun(
        frame,
        steady_throughput(frame, np.array(times), np.array(produced)),
        batch_time / decode_time if decode_time else 0.0,
        tree_steps / steps if steps else 0.0,
        t,
    )


def steady_throughput(frame: pd.DataFrame, times: np.ndarray, produced: np.ndarray) -> float:
    """Output tokens per second between the times the steady-state window's first and last
    requests finish (the span where the engine is neither filling nor draining)."""
    window = steady(frame.sort_values("finish_s"))
    start, end = float(window["finish_s"].min()), float(window["finish_s"].max())
    if not end > start:
        return float(produced[-1] / times[-1]) if times[-1] > 0 else math.nan
    made = np.interp([start, end], times, produced)
    return float((made[1] - made[0]) / (end - start))
