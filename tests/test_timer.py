import time

import numpy as np
import pytest

from perfmodel.base.errors import PerfkitError
from profilers.timer import (
    InterleavedSampler,
    TimerConfig,
    repeat_until_stable,
    summarize,
    time_interleaved,
    time_wall,
    warm_up,
)

# Durations are powers of two so that sums and differences of fake clock readings are
# exact and the timings can be compared with ==.
MS = 2.0**-10


class FakeClock:
    """A clock that moves only when a call advances it."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def op(self, *durations: float, log: list | None = None, name: object = None):
        """A call taking each of `durations` in turn (cycling), noting `name` in `log`."""
        calls = [0]

        def run():
            if log is not None:
                log.append(name)
            self.now += durations[calls[0] % len(durations)]
            calls[0] += 1

        run.calls = calls
        return run


def test_summary_statistics():
    timing = summarize([5.0, 1.0, 3.0, 2.0, 4.0], "wall")
    assert timing.median_s == 3.0
    assert timing.iqr_s == 2.0  # 75th percentile 4 minus 25th percentile 2
    assert timing.noise == pytest.approx(2 / 3)
    assert timing.reps == 5


def test_a_steady_call_is_timed_exactly_after_its_warm_up():
    clock = FakeClock()
    fn = clock.op(3 * MS)
    timing = time_wall(fn, TimerConfig(warmup=2, min_reps=5, budget_s=1.0), clock=clock)
    assert (timing.median_s, timing.iqr_s, timing.reps, timing.mode) == (3 * MS, 0.0, 5, "wall")
    assert fn.calls[0] == 2 + 5  # warm-up, then min_reps: zero noise needs no more


def test_warm_up_stops_after_a_quarter_of_the_budget():
    clock = FakeClock()
    fn = clock.op(0.25)
    warm_up(fn, TimerConfig(warmup=10, budget_s=2.0), clock)
    assert fn.calls[0] == 3  # 0.75 s > 2.0 / 4 after the third call


def test_stops_as_soon_as_the_noise_is_low():
    calls = []

    def take(n):
        calls.append(n)
        return [1.0] * n

    timing = repeat_until_stable(take, TimerConfig(min_reps=7, max_reps=100, target_noise=0.01), "wall", FakeClock())
    assert calls == [7] and timing.noise == 0


def test_noisy_calls_repeat_until_max_reps():
    clock = FakeClock()
    timing = time_wall(clock.op(MS, 3 * MS), TimerConfig(warmup=0, min_reps=4, max_reps=40, budget_s=60), clock=clock)
    assert timing.reps == 40
    assert timing.median_s == 2 * MS and timing.iqr_s == 2 * MS  # half the samples 1 ms, half 3 ms


def test_noisy_calls_stop_when_the_budget_is_spent():
    clock = FakeClock()
    fn = clock.op(2.0**-7, 3 * 2.0**-7)  # pairs of 1/32 s, far too noisy to settle
    timing = time_wall(fn, TimerConfig(warmup=0, min_reps=4, max_reps=10_000, budget_s=0.25), clock=clock)
    # 4 samples (1/16 s), then batches of max(1, n // 4): 1, 1, 1, 1, 2, 2, 3, 3 samples;
    # the budget check before each batch first sees >= 0.25 s after 18 samples (0.28125 s).
    assert timing.reps == 18
    assert clock.now == 0.28125


def test_flush_runs_outside_the_timed_region_but_inside_the_budget():
    clock = FakeClock()
    flush = clock.op(1.0)
    timing = time_wall(
        clock.op(MS, 3 * MS), TimerConfig(warmup=0, min_reps=3, max_reps=100, budget_s=2.0), flush=flush, clock=clock
    )
    assert timing.median_s == MS  # samples 1, 3, 1 ms: none of the flushes' seconds
    assert timing.reps == 3  # three 1 s flushes already spent the 2 s budget


def test_bad_config():
    with pytest.raises(PerfkitError, match="min_reps <= max_reps"):
        TimerConfig(min_reps=10, max_reps=5)


def drifting(clock: FakeClock, base: float, drift_per_call: float):
    """Calls on a machine that gets slower by `drift_per_call` of `base` with every call
    made on it so far."""
    made = [0]

    def op():
        def run():
            made[0] += 1
            clock.now += base * (1 + drift_per_call * made[0])

        return run

    return op


def test_interleaved_timing_lets_identical_calls_see_the_same_drift():
    config = TimerConfig(warmup=0, min_reps=20, max_reps=20, budget_s=5)
    clock = FakeClock()
    op = drifting(clock, MS, 0.05)
    apart = [time_wall(op(), config, clock=clock) for _ in range(2)]
    # one after the other: the second's median call is the 30th on the machine, the first's the 10th
    assert apart[1].median_s / apart[0].median_s == pytest.approx((1 + 0.05 * 30.5) / (1 + 0.05 * 10.5))
    clock = FakeClock()
    op = drifting(clock, MS, 0.05)
    together = time_interleaved([op(), op()], config, clock=clock)
    # in turn, the two medians come from calls at most one apart in the order of the run
    assert together[1].median_s / together[0].median_s == pytest.approx(1, abs=0.05 / (1 + 0.05 * 20))
    assert [t.reps for t in together] == [20, 20] and together[0].mode == "wall-interleaved"


def test_interleaved_timing_keeps_each_calls_own_duration():
    clock = FakeClock()
    timings = time_interleaved(
        [clock.op(2 * MS), clock.op(MS / 2)], TimerConfig(warmup=1, min_reps=5, budget_s=0.5), clock=clock
    )
    assert [t.median_s for t in timings] == [2 * MS, MS / 2]
    assert [t.reps for t in timings] == [5, 5]  # both settled at min_reps


def test_each_round_times_every_call_once_in_a_fresh_order():
    clock, log = FakeClock(), []
    calls = [clock.op(MS, 3 * MS, log=log, name=i) for i in range(4)]
    time_interleaved(calls, TimerConfig(warmup=0, min_reps=6, max_reps=6, budget_s=60), seed=3, clock=clock)
    rounds = [log[i : i + 4] for i in range(0, len(log), 4)]
    assert len(rounds) == 6 and all(sorted(r) == [0, 1, 2, 3] for r in rounds)
    rng = np.random.default_rng(3)
    assert rounds == [list(rng.permutation(4)) for _ in range(6)]  # reproducible from the seed
    assert len({tuple(r) for r in rounds}) > 1  # not one fixed order, which a drift would bias


def test_interleaved_rounds_stop_when_the_budget_of_every_call_is_spent():
    clock = FakeClock()
    calls = [clock.op(2.0**-6, 3 * 2.0**-6) for _ in range(2)]  # rounds of 1/32 s and 3/32 s
    timings = time_interleaved(calls, TimerConfig(warmup=0, min_reps=2, max_reps=1000, budget_s=0.25), clock=clock)
    assert [t.reps for t in timings] == [8, 8]  # 0.5 s (0.25 s per call) spent after 8 rounds
    assert clock.now == 0.5


def test_rounds_on_demand_spread_over_other_work_see_what_that_work_saw():
    """A machine twice as slow while some other work ran: rounds taken between pieces of
    that work sample both phases, as the work itself did; rounds taken all after it see
    only the last phase."""
    clock = FakeClock()
    slow = [1]

    def op():
        clock.now += MS * slow[0]

    config = TimerConfig(warmup=0, min_reps=1, max_reps=1000, budget_s=60)
    spread = InterleavedSampler([op], config, clock=clock)
    for phase in (1, 2, 2, 1):  # four pieces of other work, the middle two on a slow machine
        slow[0] = phase
        spread.sample_for(8 * MS * phase)  # as long as 8 calls of the phase
    assert spread.rounds == 32
    assert spread.timings()[0].median_s == pytest.approx(1.5 * MS)  # half of the samples fast, half slow
    after = InterleavedSampler([op], config, clock=clock)
    after.sample_for(32 * MS)
    assert after.timings()[0].median_s == MS


def test_sampling_for_a_time_takes_one_round_at_least_and_never_past_max_reps():
    clock = FakeClock()
    sampler = InterleavedSampler(
        [clock.op(MS), clock.op(MS)], TimerConfig(warmup=1, min_reps=1, max_reps=5), clock=clock
    )
    assert sampler.rounds == 0 and clock.now == 2 * MS  # the warm-up ran, nothing sampled
    with pytest.raises(PerfkitError, match="no round"):
        sampler.timings()
    sampler.sample_for(0)
    assert sampler.rounds == 1
    sampler.sample_for(3600)
    assert sampler.rounds == 5 and [t.reps for t in sampler.timings()] == [5, 5]


def test_real_clock_smoke():
    """The default clock times real work: a busy wait cannot be timed shorter than it is."""

    def busy_wait():
        end = time.perf_counter() + 0.002
        while time.perf_counter() < end:
            pass

    timing = time_wall(busy_wait, TimerConfig(warmup=1, min_reps=5, budget_s=0.5))
    assert 0.002 <= timing.median_s < 0.05 and timing.mode == "wall" and 5 <= timing.reps <= 200


def test_the_sampler_prepares_each_call_untimed_right_before_each_of_its_samples():
    events, now = [], [0.0]

    def clock():
        return now[0]

    def call(name, seconds):
        def run():
            events.append(name)
            now[0] += seconds

        return run

    def prepare(name):
        def run():
            events.append(f"prepare {name}")
            now[0] += 5.0  # slow preparation: none of it may reach the samples

        return run

    config = TimerConfig(warmup=0, min_reps=2, max_reps=2, budget_s=0.0)
    sampler = InterleavedSampler(
        [call("a", 1.0), call("b", 2.0)], config, clock=clock, prepare=[prepare("a"), prepare("b")]
    )
    sampler.round()
    sampler.round()
    assert [t.median_s for t in sampler.timings()] == [1.0, 2.0]
    for i, event in enumerate(events):
        if not event.startswith("prepare"):
            assert events[i - 1] == f"prepare {event}"
    with pytest.raises(PerfkitError, match="1 prepare callables for 2 calls"):
        InterleavedSampler([call("a", 1.0), call("b", 1.0)], config, prepare=[prepare("a")])
