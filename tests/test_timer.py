import time

import pytest

from perfmodel.errors import PerfkitError
from profilers.timer import TimerConfig, repeat_until_stable, summarize, time_wall


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
