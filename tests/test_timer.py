import time

import pytest

from perfmodel.errors import PerfkitError
from profilers.timer import TimerConfig, repeat_until_stable, summarize, time_interleaved, time_wall


def busy_wait(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_summary_statistics():
    timing = summarize([5.0, 1.0, 3.0, 2.0, 4.0], "wall")
    assert timing.median_s == 3.0
    assert timing.iqr_s == 2.0  # 75th percentile 4 minus 25th percentile 2
    assert timing.noise == pytest.approx(2 / 3)
    assert timing.reps == 5


def test_an_operation_of_known_duration():
    timing = time_wall(lambda: busy_wait(0.002), TimerConfig(warmup=1, min_reps=5, budget_s=0.5))
    assert timing.median_s == pytest.approx(0.002, rel=0.05)
    assert timing.mode == "wall"
    assert 5 <= timing.reps <= 200


def test_stops_as_soon_as_the_noise_is_low():
    calls = []

    def take(n):
        calls.append(n)
        return [1.0] * n

    timing = repeat_until_stable(take, TimerConfig(min_reps=7, max_reps=100, target_noise=0.01), "wall")
    assert calls == [7] and timing.noise == 0


def test_noisy_samples_repeat_until_max_reps_or_budget():
    values = iter([1.0, 2.0] * 1000)
    many = repeat_until_stable(lambda n: [next(values) for _ in range(n)], TimerConfig(min_reps=4, max_reps=40, budget_s=60), "wall")
    assert many.reps == 40

    def slow(n):
        busy_wait(0.01 * n)
        return [float(i % 2 + 1) for i in range(n)]

    budgeted = repeat_until_stable(slow, TimerConfig(min_reps=3, max_reps=10_000, budget_s=0.1), "wall")
    assert 3 <= budgeted.reps < 30  # stopped by the 0.1 s budget, not by max_reps


def test_flush_runs_outside_the_timed_region():
    timing = time_wall(lambda: None, TimerConfig(warmup=0, min_reps=5, max_reps=5), flush=lambda: busy_wait(0.005))
    assert timing.median_s < 0.001


def test_bad_config():
    with pytest.raises(PerfkitError, match="min_reps <= max_reps"):
        TimerConfig(min_reps=10, max_reps=5)


class DriftingMachine:
    """Every call on it takes `base` seconds times a slowdown that grows with each call
    made so far: a machine drifting in speed over the run."""

    def __init__(self, drift_per_call: float):
        self.calls, self.drift = 0, drift_per_call

    def op(self, base: float):
        def run():
            self.calls += 1
            busy_wait(base * (1 + self.drift * self.calls))

        return run


def test_interleaved_timing_lets_identical_calls_see_the_same_drift():
    config = TimerConfig(warmup=0, min_reps=20, max_reps=20, budget_s=5)
    machine = DriftingMachine(drift_per_call=0.05)
    apart = [time_wall(machine.op(0.0005), config) for _ in range(2)]
    assert apart[1].median_s / apart[0].median_s > 1.5  # one after the other: off by the drift
    machine = DriftingMachine(drift_per_call=0.05)
    together = time_interleaved([machine.op(0.0005), machine.op(0.0005)], config)
    assert together[1].median_s / together[0].median_s == pytest.approx(1, abs=0.15)
    assert [t.reps for t in together] == [20, 20] and together[0].mode == "wall-interleaved"


def test_interleaved_timing_keeps_each_calls_own_duration():
    timings = time_interleaved([lambda: busy_wait(0.002), lambda: busy_wait(0.0005)], TimerConfig(warmup=1, min_reps=5, budget_s=0.5))
    assert timings[0].median_s == pytest.approx(0.002, rel=0.1)
    assert timings[1].median_s == pytest.approx(0.0005, rel=0.2)
    assert all(5 <= t.reps <= 200 for t in timings)
