"""A careful timer: warm-up, caches flushed between calls, repetitions until the noise is low.

Three ways to take one sample of a call:
- wall: perf_counter around the call (CPU; torch CPU ops return when done); several
  calls can be sampled in turn (InterleavedSampler, time_interleaved) so a drifting
  machine slows all alike, and their rounds spread over other work the caller times;
- cuda-events: CUDA events around each call, the L2 flushed by a large memset before it
  (outside the timed region; it also hides the CPU's launch latency behind GPU work);
- cuda-graph: the call captured once per operand copy into one CUDA graph, replayed, and
  each replay's time divided by the copies; for microsecond kernels whose launch overhead
  would otherwise dominate. Rotating through copies larger than L2 keeps reads cold.
Samples are taken until IQR/median <= target_noise (after min_reps), or the time budget
or max_reps is reached; the median is reported.

Every timer reads time from `clock` (time.perf_counter unless given): a test passes a fake
clock that its calls advance by known amounts, so warm-up, budget and statistics have
exact expected results instead of ones that depend on the machine's load.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from perfmodel.base.errors import PerfkitError

Clock = Callable[[], float]


@dataclass(frozen=True)
class TimerConfig:
    warmup: int = 2
    min_reps: int = 5
    max_reps: int = 200
    target_noise: float = 0.01  # IQR / median
    budget_s: float = 2.0  # wall time for repetitions (min_reps are always taken)
    flush_cache: bool = True
    # Bytes the flush writes; None: twice the last-level cache (evict everything). A
    # smaller value evicts only what the rest of a real step would (see cache_flusher).
    flush_bytes: int | None = None

    def __post_init__(self) -> None:
        if not (1 <= self.min_reps <= self.max_reps):
            raise PerfkitError(f"need 1 <= min_reps <= max_reps, got {self.min_reps}, {self.max_reps}")
        if self.warmup < 0 or self.budget_s < 0 or self.target_noise < 0:
            raise PerfkitError("warmup, budget_s and target_noise must be >= 0")


@dataclass(frozen=True)
class Timing:
    median_s: float
    iqr_s: float
    reps: int
    mode: str

    @property
    def noise(self) -> float:
        """Relative noise: interquartile range over median."""
        return self.iqr_s / self.median_s if self.median_s > 0 else float("inf")


def summarize(samples: Sequence[float], mode: str) -> Timing:
    q1, median, q3 = np.percentile(np.asarray(samples, dtype=float), [25, 50, 75])
    return Timing(float(median), float(q3 - q1), len(samples), mode)


def repeat_until_stable(
    take: Callable[[int], list[float]], config: TimerConfig, mode: str, clock: Clock = time.perf_counter
) -> Timing:
    """Call `take(n)` (which returns n new samples) until the statistics settle."""
    started = clock()
    samples = take(config.min_reps)
    while len(samples) < config.max_reps:
        if summarize(samples, mode).noise <= config.target_noise or clock() - started >= config.budget_s:
            break
        # Grow in steps of ~25% so a slow op does not overshoot its budget by much.
        samples += take(min(max(1, len(samples) // 4), config.max_reps - len(samples)))
    return summarize(samples, mode)


def warm_up(fn: Callable[[], object], config: TimerConfig, clock: Clock = time.perf_counter) -> None:
    """Run `fn` config.warmup times, or fewer if that would eat a quarter of the budget."""
    started = clock()
    for _ in range(config.warmup):
        fn()
        if clock() - started > config.budget_s / 4:
            break


def time_wall(
    fn: Callable[[], object],
    config: TimerConfig,
    flush: Callable[[], object] = lambda: None,
    clock: Clock = time.perf_counter,
) -> Timing:
    warm_up(fn, config, clock)

    def take(n: int) -> list[float]:
        out = []
        for _ in range(n):
            flush()
            t0 = clock()
            fn()
            out.append(clock() - t0)
        return out

    return repeat_until_stable(take, config, "wall", clock)


class InterleavedSampler:
    """Wall-clock samples of several calls taken in turn, a round at a time: each round
    times every call once, in a fresh random order.

    A machine whose speed drifts over seconds (a virtual machine's neighbours, a laptop's
    clock) would give calls timed one after another each its own phase of the drift, off
    by 10-30% against each other. In turn, every call sees the same machine, so their
    ratios hold. Rounds are taken on demand, so a caller can spread them over other work
    it times (decoding runs, say) and the calls see the machine that work saw."""

    def __init__(
        self,
        calls: Sequence[Callable[[], object]],
        config: TimerConfig,
        flush: Callable[[], object] = lambda: None,
        seed: int = 0,
        clock: Clock = time.perf_counter,
        prepare: Sequence[Callable[[], object]] | None = None,
    ):
        """prepare: per call, run untimed right before each of its samples (after `flush`),
        e.g. to bring the inputs into cache that the call finds there in real use."""
        self.calls, self.config, self.flush, self.clock = list(calls), config, flush, clock
        self.prepare = list(prepare) if prepare is not None else [lambda: None] * len(self.calls)
        if len(self.prepare) != len(self.calls):
            raise PerfkitError(f"{len(self.prepare)} prepare callables for {len(self.calls)} calls")
        self.rng = np.random.default_rng(seed)
        self.samples: list[list[float]] = [[] for _ in self.calls]
        for fn in self.calls:
            warm_up(fn, config, clock)

    @property
    def rounds(self) -> int:
        return len(self.samples[0]) if self.samples else 0

    def round(self) -> None:
        for i in self.rng.permutation(len(self.calls)):
            self.flush()
            self.prepare[i]()
            t0 = self.clock()
            self.calls[i]()
            self.samples[i].append(self.clock() - t0)

    def sample_for(self, seconds: float) -> None:
        """Rounds until `seconds` have passed (one at least), up to max_reps in all."""
        started = self.clock()
        while self.rounds < self.config.max_reps:
            self.round()
            if self.clock() - started >= seconds:
                break

    def settled(self) -> bool:
        return all(summarize(s, "wall").noise <= self.config.target_noise for s in self.samples)

    def timings(self) -> list[Timing]:
        if self.rounds == 0:
            raise PerfkitError("no round of samples taken yet")
        return [summarize(s, "wall-interleaved") for s in self.samples]


def time_interleaved(
    calls: Sequence[Callable[[], object]],
    config: TimerConfig,
    flush: Callable[[], object] = lambda: None,
    seed: int = 0,
    clock: Clock = time.perf_counter,
) -> list[Timing]:
    """Wall-clock timings of several calls sampled in turn (InterleavedSampler), rounds
    on end until every call meets the noise target (after min_reps), or max_reps, or the
    budget (budget_s per call, as time_wall spends it) is spent."""
    sampler = InterleavedSampler(calls, config, flush, seed, clock)
    started = clock()
    while sampler.rounds < config.max_reps:
        sampler.round()
        if sampler.rounds < config.min_reps:
            continue
        if sampler.settled() or clock() - started >= config.budget_s * len(calls):
            break
    return sampler.timings()


def time_cuda_events(
    fn: Callable[[], object],
    config: TimerConfig,
    flush: Callable[[], object] = lambda: None,
    clock: Clock = time.perf_counter,
) -> Timing:
    """CUDA-event samples; `clock` only paces the warm-up and the budget."""
    import torch

    warm_up(fn, config, clock)
    torch.cuda.synchronize()

    def take(n: int) -> list[float]:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for start, end in zip(starts, ends):
            flush()
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) / 1e3 for start, end in zip(starts, ends)]

    return repeat_until_stable(take, config, "cuda-events", clock)


def time_cuda_graph(
    calls: Sequence[Callable[[], object]], config: TimerConfig, clock: Clock = time.perf_counter
) -> Timing:
    """Per-call time of `calls` (one per operand copy) run back to back in one CUDA graph;
    `clock` only paces the budget."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as graph capture requires
        for _ in range(max(1, config.warmup)):
            for call in calls:
                call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    torch.cuda.synchronize()

    def take(n: int) -> list[float]:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for start, end in zip(starts, ends):
            start.record()
            graph.replay()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) / 1e3 / len(calls) for start, end in zip(starts, ends)]

    return repeat_until_stable(take, config, "cuda-graph", clock)


def cache_flusher(device: str, cache_bytes: int, flush_bytes: int | None = None) -> Callable[[], object]:
    """A function that evicts the last-level cache by writing a buffer twice its size, or
    `flush_bytes` when given: a model whose weights fit in the last-level cache (a small
    model on a CPU) finds them there at each op in a real step, evicted from the smaller
    caches only by the rest of the step, so the flush writes about the model's size.

    For CUDA this is one memset kernel; for the CPU a multi-threaded fill.
    """
    import torch

    size = 2 * cache_bytes if flush_bytes is None else flush_bytes
    buffer = torch.empty(max(size, 1 << 20) // 4, dtype=torch.int32, device=device)
    return buffer.zero_
