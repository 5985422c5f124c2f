"""Operator timings on one device: a grid's points measured into data-contract rows.

`Sweeper` times one (op, phase, batch, seq_len, candidates) point at a time, or many in
interleaved rounds (`InterleavedPoints`) that a caller can spread over other work, as the
closed loop does between its decoding runs. profilers.sweep_runs runs whole sweeps into a
file; python -m profilers.sweep is the command.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from perfmodel.base.errors import PerfkitError
from perfmodel.hardware.ceilings import Ceilings, judging_ceilings
from perfmodel.measured.contract import ContractPoint, contract_fields
from perfmodel.models.config import ModelConfig
from perfmodel.models.grid import PAPER_GRID, QUICK_GRID, Grid
from perfmodel.models.operators import DEFAULT_OPS, PHASES, cost_of, op_cost
from profilers.benchmarks import OpBenchmark
from profilers.ceilings import CEILING_TIMER
from profilers.device import DeviceInfo, available_bytes, cpu_state
from profilers.timer import (
    InterleavedSampler,
    TimerConfig,
    cache_flusher,
    time_cuda_events,
    time_cuda_graph,
    time_interleaved,
    time_wall,
)

GRIDS = {"paper": PAPER_GRID, "quick": QUICK_GRID}
# fine: linear ops also at perfmodel.models.grid.fine_token_grid's token counts; coarse: the grid only.
TOKEN_GRIDS = ("fine", "coarse")


class TimerMode(StrEnum):
    """How a GPU op is timed: CUDA events, replays of a CUDA graph, or auto (events, and a
    graph where an op runs too short for events to resolve). A str: configs write its name."""

    AUTO = "auto"
    EVENTS = "events"
    GRAPH = "graph"


TIMER_MODES = tuple(TimerMode)
# Below this, one kernel is short enough for launch overhead to matter: use a CUDA graph.
GRAPH_BELOW_S = 50e-6
# An event-timed median this many times its roofline floor (bytes at the measured bandwidth,
# FLOPs at the measured peak) holds gaps between the op's kernels, not work: time it in a graph.
FAR_ABOVE_FLOOR = 2.0
MAX_GRAPH_COPIES = 64


@dataclass(frozen=True)
class SweepConfig:
    device: str
    model: ModelConfig
    dtype: str
    grid: Grid
    out: Path
    ops: tuple[str, ...] = DEFAULT_OPS
    phases: tuple[str, ...] = PHASES
    timer: TimerConfig = field(default_factory=TimerConfig)
    timer_mode: str = TimerMode.AUTO
    ceilings: bool = True
    memory_cap_bytes: int | None = None
    threads: int | None = None
    progress: bool = True
    ceiling_timer: TimerConfig = CEILING_TIMER  # the timer of each ceiling measured before the sweep


def default_timer(device: str, budget_s: float | None = None, target_noise: float = 0.01) -> TimerConfig:
    """GPUs: 5+ reps within 2 s per configuration. CPUs run a 7B model's ops for
    milliseconds to seconds each, so 3+ reps within 0.4 s keep a quick sweep to minutes."""
    if device == "cuda":
        return TimerConfig(
            warmup=2, min_reps=5, target_noise=target_noise, budget_s=2.0 if budget_s is None else budget_s
        )
    return TimerConfig(warmup=1, min_reps=3, target_noise=target_noise, budget_s=0.4 if budget_s is None else budget_s)


def default_grid(device: str) -> str:
    """paper on CUDA; quick on a CPU, where a 7B model's ops take milliseconds to seconds."""
    return "paper" if device == "cuda" else "quick"


def default_token_grid(device: str) -> str:
    """fine on CUDA, where linear ops take microseconds and their latency steps with the
    token count; coarse on a CPU, so CPU sweeps stay short."""
    return "fine" if device == "cuda" else "coarse"


def with_token_grid(grid: Grid, device: str, token_grid: str | None = None) -> Grid:
    """`grid` with linear ops on the fine token grid or not, as `token_grid` says (fine or
    coarse; default: default_token_grid(device))."""
    choice = token_grid or default_token_grid(device)
    if choice not in TOKEN_GRIDS:
        raise PerfkitError(f"token grid {choice!r}: choose from {', '.join(TOKEN_GRIDS)}")
    return grid.with_fine_tokens(choice == "fine")


def sweep_grid(
    device: str, grid: str | None = None, token_grid: str | None = None, batches=None, seq_lens=None, candidates=None
) -> Grid:
    """The grid a sweep on `device` measures: the named grid (default: default_grid), any
    axis given replaced, linear ops on the fine token grid or not (with_token_grid)."""
    name = grid or default_grid(device)
    if name not in GRIDS:
        raise PerfkitError(f"grid {name!r}: choose from {', '.join(GRIDS)}")
    return with_token_grid(GRIDS[name].narrowed(batches, seq_lens, candidates), device, token_grid)


def floor_seconds(bench, ceilings: dict | None) -> float | None:
    """The least time `bench` can take at the measured ceilings (Ceilings.floor_seconds);
    None without measured ceilings."""
    if not ceilings or not ceilings.get("bandwidth_gb_s"):
        return None
    cost = cost_of(bench.kernels, bench.dtype)
    return float(Ceilings.from_dict(ceilings).floor_seconds(cost.flops, cost.bytes, bench.dtype))


def retime_in_graph(median_s: float, floor_s: float | None) -> bool:
    """Whether a CUDA-event timing is launch-bound rather than the kernels' own: under 50 us,
    or far above its roofline floor."""
    return median_s < GRAPH_BELOW_S or (floor_s is not None and median_s > FAR_ABOVE_FLOOR * floor_s)


def is_out_of_memory(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, MemoryError) or "out of memory" in text or "can't allocate memory" in text


class Sweeper:
    """Measures grid points on one device; holds the flush buffer and cached weights.
    ceilings: the device's measured ceilings (a Ceilings dict), which say where an event
    timing sits far above its floor."""

    def __init__(self, config: SweepConfig, info: DeviceInfo, nvml=None, ceilings: dict | None = None):
        self.config, self.info, self.nvml, self.ceilings = config, info, nvml, ceilings
        # Without measured ceilings (a GPU check), the datasheet's: an event timing of a
        # many-kernel op can pass 50 us on gaps alone (tree attention on an H200, 73-94 us
        # against 15-18 us in a graph), and only its floor says so.
        self.floor_ceilings = judging_ceilings(ceilings, info.spec_key)
        self.flush = (
            cache_flusher(info.kind, info.cache_bytes, config.timer.flush_bytes)
            if config.timer.flush_cache
            else (lambda: None)
        )
        self.weights: dict = {}

    def state(self) -> dict:
        if self.nvml is not None:
            return self.nvml.state()
        return cpu_state() if self.info.kind == "cpu" else {}

    def free_bytes(self) -> int:
        free = available_bytes(self.info)
        cap = self.config.memory_cap_bytes
        if cap is not None:
            free = min(free, cap - sum(t.numel() * t.element_size() for t in self.weights.values()))
        return free

    def time(self, bench: OpBenchmark):
        """Timing of one benchmark, or a reason it could not run."""
        cfg = self.config
        need = bench.bytes_needed()
        if need > 0.9 * self.free_bytes():
            return None, f"needs {need / 1e9:.1f} GB of memory, {max(self.free_bytes(), 0) / 1e9:.1f} GB free"
        try:
            calls = bench.build(1, self.weights)
            if self.info.kind == "cpu":
                return time_wall(calls[0], cfg.timer, self.flush), ""
            timing = None
            if cfg.timer_mode in (TimerMode.AUTO, TimerMode.EVENTS):
                timing = time_cuda_events(calls[0], cfg.timer, self.flush)
            if cfg.timer_mode == TimerMode.GRAPH or (
                cfg.timer_mode == TimerMode.AUTO
                and retime_in_graph(timing.median_s, floor_seconds(bench, self.floor_ceilings))
            ):
                # Enough operand copies to overflow L2, so back-to-back replays read cold data.
                copies = min(MAX_GRAPH_COPIES, max(1, math.ceil(2 * self.info.cache_bytes / bench.operand_bytes())))
                copies = max(1, min(copies, int(0.5 * self.free_bytes() // max(bench.bytes_needed(), 1))))
                timing = time_cuda_graph(bench.build(copies, self.weights), cfg.timer)
            return timing, ""
        except Exception as exc:  # noqa: BLE001 - only memory exhaustion is a recorded skip
            if not is_out_of_memory(exc):
                raise
            return None, f"out of memory: {str(exc).splitlines()[0][:200]}"
        finally:
            calls = None
            if self.info.kind == "cuda":
                import torch

                torch.cuda.empty_cache()

    def measure(self, op: str, phase: str, b: int, s: int, q: int, run_id: str) -> dict:
        bench = self.benchmark(op, phase, b, s, q)
        before = self.state()
        timing, reason = self.time(bench)
        return self.row(bench, timing, reason, run_id, worst_state(before, self.state()))

    def interleaved(
        self, points: list[tuple[str, str, int, int, int]], run_id: str, extra_calls=()
    ) -> InterleavedPoints:
        """The points and extra calls ready to be timed in rounds (InterleavedPoints): on a
        CPU every sample is taken in turn (timer.InterleavedSampler), so a machine drifting
        in speed slows every point alike; GPUs, steady under a fixed clock, time each point
        apart with their own timers when the rounds finish."""
        extra_calls = list(extra_calls)
        if self.info.kind != "cpu":
            return InterleavedPoints(self, points, run_id, extra_calls, None, [])
        benches = [self.benchmark(*point) for point in points]
        need = sum(bench.bytes_needed() for bench in benches)
        if need > 0.9 * self.free_bytes():
            raise PerfkitError(
                f"timing {len(points)} points together needs {need / 1e9:.1f} GB of memory, "
                f"{self.free_bytes() / 1e9:.1f} GB free"
            )
        calls = [bench.build(1, self.weights)[0] for bench in benches]
        # Each op sampled with its activations in cache, as the op before it leaves them in a step.
        prepare = [call.warm for call in calls] + [lambda: None] * len(extra_calls)
        sampler = InterleavedSampler(calls + extra_calls, self.config.timer, self.flush, prepare=prepare)
        return InterleavedPoints(self, points, run_id, extra_calls, sampler, benches)

    def benchmark(self, op: str, phase: str, b: int, s: int, q: int) -> OpBenchmark:
        cfg = self.config
        return OpBenchmark(cfg.model, op, phase, b, s, q, cfg.dtype, self.info.kind)

    def row(self, bench: OpBenchmark, timing, reason: str, run_id: str, state: dict) -> dict:
        """The data-contract row of one measured (or skipped) benchmark."""
        cfg, b = self.config, bench
        cost = op_cost(b.op, b.phase, cfg.model, cfg.dtype, b.batch, b.seq_len, b.candidates)
        median = timing.median_s if timing else None
        row = contract_fields(
            ContractPoint(self.info.key, cfg.model.name, cfg.dtype, b.op, b.phase, b.batch, b.seq_len, b.candidates),
            cost,
            median,
            "measured",
            timing.noise if timing else None,
            run_id,
        )
        return self.with_timing(row, timing, reason, state)

    def with_timing(self, row: dict, timing, reason: str, state: dict) -> dict:
        """A row's data-contract fields completed with how it was timed (or why not) and the
        device's state around it: the columns a sweep writes beyond the contract."""
        row.update(
            status="ok" if timing else "skipped",
            reason=reason,
            mode=timing.mode if timing else "",
            reps=timing.reps if timing else 0,
            threads=self.info.threads,
        )
        row.update(state)
        return row


class InterleavedPoints:
    """Operator points (and extra calls) timed in rounds that the caller spreads over
    other work: `sample_share(shares)` after each of `shares` pieces of it spends that
    share of the timer's budget (budget_s per call) on rounds, and `finish()` gives the
    rows and the extra calls' Timings. The calls then see the machine as that work saw it,
    which matters where their times are compared with that work's (a closed loop's
    prediction against its decoding runs). On a GPU the rounds are no-ops and `finish()`
    times every point apart, then the extra calls in turn."""

    def __init__(self, sweeper: Sweeper, points, run_id: str, extra_calls: list, sampler, benches: list):
        self.sweeper, self.points, self.run_id = sweeper, list(points), run_id
        self.extra_calls, self.sampler, self.benches = extra_calls, sampler, benches
        self.before = sweeper.state()

    def sample_share(self, shares: int) -> None:
        if self.sampler is None:
            return
        if shares < 1:
            raise PerfkitError(f"shares must be >= 1, got {shares}")
        timer = self.sweeper.config.timer
        self.sampler.sample_for(timer.budget_s * len(self.sampler.calls) / shares)

    def finish(self) -> tuple[list[dict], list]:
        sweeper = self.sweeper
        if self.sampler is None:
            rows = [sweeper.measure(*point, self.run_id) for point in self.points]
            extra = time_interleaved(self.extra_calls, sweeper.config.timer) if self.extra_calls else []
            return rows, extra
        while self.sampler.rounds < sweeper.config.timer.min_reps:
            self.sampler.round()
        timings = self.sampler.timings()
        state = worst_state(self.before, sweeper.state())
        rows = [sweeper.row(bench, timing, "", self.run_id, state) for bench, timing in zip(self.benches, timings)]
        return rows, timings[len(self.benches) :]


def worst_state(before: dict, after: dict) -> dict:
    """One value per state field for a configuration: the lower clock, the higher power and
    temperature, and every clock-event reason seen before or after."""
    merged = {}
    for key in ("sm_clock_mhz", "mem_clock_mhz", "power_w", "temp_c", "cpu_mhz"):
        values = [v for v in (before.get(key), after.get(key)) if v is not None]
        merged[key] = (min(values) if "clock" in key else max(values)) if values else None
    reasons = {r for state in (before, after) for r in (state.get("throttle") or "").split("+") if r}
    merged["throttle"] = "+".join(sorted(reasons))
    return merged
