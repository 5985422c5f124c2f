"""python -m profilers.sweep: time every operator of a decoding step over a grid.

One row per (op, phase, batch, seq_len, candidates) in the data-contract format, appended
to --out as soon as it is measured: a sweep killed at any moment resumes on rerun with
nothing lost or repeated, and a rerun of a complete sweep does nothing. Configurations
that do not fit in memory are recorded as skipped, with the reason.

On CUDA (or with --token-grid fine) linear ops are also timed on the fine token grid
(perfmodel.models.grid.fine_token_grid: 1, 2, 4, 8, 16, ..., 512, then powers of two), to catch
the steps of GEMM latency in the token count; those are prefill rows of one sequence,
(batch 1, seq_len = tokens, candidates 1).
"""

from __future__ import annotations

import math
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from perfmodel.base.dtypes import check_dtype, default_dtype
from perfmodel.base.errors import PerfkitError
from perfmodel.base.outputs import writable_file
from perfmodel.cli import Parser, batch_size, positive_int, run, token_count
from perfmodel.hardware.specs import resolve_spec
from perfmodel.measured.contract import contract_fields
from perfmodel.measured.device_view import is_cpu_name
from perfmodel.measured.store import user_measurements_dir
from perfmodel.models.config import ModelConfig, load_model
from perfmodel.models.grid import FINE_TOKEN_STEP, FINE_TOKENS_UP_TO, PAPER_GRID, QUICK_GRID, Grid, iter_points
from perfmodel.models.operators import DEFAULT_OPS, LINEAR_OPS, PHASES, STEP_OPS, op_cost
from profilers.benchmarks import BENCH_DTYPES, OpBenchmark, check_bench_dtype
from profilers.ceilings import measure_ceilings
from profilers.device import (
    DeviceInfo,
    available_bytes,
    check_device,
    cpu_info,
    cpu_state,
    cuda_info,
)
from profilers.store import Journal, output_lock, record_run
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
TIMER_MODES = ("auto", "events", "graph")
# Below this, one kernel is short enough for launch overhead to matter: use a CUDA graph.
GRAPH_BELOW_S = 50e-6
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
    timer_mode: str = "auto"
    ceilings: bool = True
    memory_cap_bytes: int | None = None
    threads: int | None = None
    progress: bool = True


@dataclass
class SweepResult:
    out: Path
    measured: int
    skipped: int
    total_rows: int
    median_noise: float
    run_id: str | None
    ceilings: dict | None


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


def is_out_of_memory(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, MemoryError) or "out of memory" in text or "can't allocate memory" in text


class Sweeper:
    """Measures grid points on one device; holds the flush buffer and cached weights."""

    def __init__(self, config: SweepConfig, info: DeviceInfo, nvml=None):
        self.config, self.info, self.nvml = config, info, nvml
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
            if cfg.timer_mode in ("auto", "events"):
                timing = time_cuda_events(calls[0], cfg.timer, self.flush)
            if cfg.timer_mode == "graph" or (cfg.timer_mode == "auto" and timing.median_s < GRAPH_BELOW_S):
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

    def measure_interleaved(
        self, points: list[tuple[str, str, int, int, int]], run_id: str, extra_calls=()
    ) -> tuple[list[dict], list]:
        """Rows for many (op, phase, b, s, q) points, and wall-clock Timings of
        `extra_calls` (whole decoding steps, say) taken in the same rounds, all timed now
        (see `interleaved` to spread the rounds over other work)."""
        timing = self.interleaved(points, run_id, extra_calls)
        timing.sample_share(1)
        return timing.finish()

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
        sampler = InterleavedSampler(calls + extra_calls, self.config.timer, self.flush)
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
            self.info.key,
            cfg.model.name,
            cfg.dtype,
            b.op,
            b.phase,
            b.batch,
            b.seq_len,
            b.candidates,
            cost,
            median,
            "measured",
            timing.noise if timing else None,
            run_id,
        )
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


def run_sweep(config: SweepConfig, log=print) -> SweepResult:
    """Measure what `config.out` lacks of the grid, holding the file's lock throughout: a
    second sweep into the same file is refused, not run beside this one."""
    writable_file(config.out, "sweep output")  # before ceilings and torch, which take minutes
    with output_lock(config.out):
        return _run_sweep(config, log)


def _run_sweep(config: SweepConfig, log) -> SweepResult:
    import torch

    check_bench_dtype(check_dtype(config.dtype))
    check_device(config.device)
    if config.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 rows must be fp32, not TF32
    if config.threads:
        torch.set_num_threads(config.threads)
    elif config.device == "cpu":
        torch.set_num_threads(cpu_info().details["logical_cpus"])  # all threads in use
    points = list(iter_points(config.model, config.grid, config.ops, config.phases))  # validates ops and phases
    info, nvml = cuda_info() if config.device == "cuda" else (cpu_info(), None)
    journal = Journal(config.out)
    todo = [p for p in points if not journal.has((info.key, config.model.name, config.dtype, *p))]
    if not todo:
        log(f"nothing to do: all {len(points)} configurations are in {journal.path}")
        return summarize_result(config, journal, 0, 0, None, None)

    run_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
    fine = f", linear ops at {len(config.grid.linear_tokens)} token counts" if config.grid.linear_tokens else ""
    log(
        f"{info.name} ({info.key}), {config.model.name} {config.dtype}: {len(todo)} of {len(points)} configurations "
        f"to measure{fine}, run {run_id}"
    )
    ceilings = None
    if config.ceilings:
        log("measuring ceilings")
        ceilings = measure_ceilings(info, log=log).as_dict()
    record_run(config.out, run_id, run_metadata(config, info, ceilings, started=time.time()))

    sweeper = Sweeper(config, info, nvml)
    measured = skipped = 0
    bar = progress_bar(len(todo), config.progress)
    current_op = None
    for op, phase, b, s, q in todo:
        if op != current_op:
            sweeper.weights.clear()  # free the previous op's weights
            current_op = op
        bar.set_description(f"{op} {phase} b={b} s={s} q={q}")
        row = sweeper.measure(op, phase, b, s, q, run_id)
        journal.append(row)
        measured += row["status"] == "ok"
        skipped += row["status"] != "ok"
        bar.update()
    bar.close()
    meta = run_metadata(config, info, ceilings, started=None)
    record_run(config.out, run_id, {**meta, "finished": time.time(), "measured": measured, "skipped": skipped})
    return summarize_result(config, journal, measured, skipped, run_id, ceilings)


def measure_now(gpu: str | None, spec_file, models: list[ModelConfig], dtype: str, grid: Grid, log=print) -> list[Path]:
    """--measure: quick sweeps of the device a command names (`cpu`: this machine's CPU;
    a GPU name: the GPU here, which must be that one), stored for later commands. Linear
    ops get the device's default token grid (fine on a GPU)."""

    if is_cpu_name(gpu):
        return measure_and_store("cpu", models, dtype, grid, log=log)
    return measure_and_store(check_device("cuda"), models, dtype, grid, resolve_spec(gpu, spec_file).key, log)


def measure_and_store(
    device: str,
    models: list[ModelConfig],
    dtype: str,
    grid: Grid,
    wanted_key: str | None = None,
    log=print,
    token_grid: str | None = None,
) -> list[Path]:
    """Sweeps of this machine's device, one per model, kept in the user's measurements
    folder (<folder>/<device key>/<model>-<dtype>.csv), where every later command finds
    them as this device's stored measurements. Resumable: a rerun measures only what is
    missing. `wanted_key`: the GPU the caller asked for, which must be the one here.
    `token_grid`: fine or coarse for linear ops (default: default_token_grid(device))."""
    check_device(device)
    grid = with_token_grid(grid, device, token_grid)
    info = cuda_info()[0] if device == "cuda" else cpu_info()
    if wanted_key is not None and device == "cuda" and info.spec_key != wanted_key:
        raise PerfkitError(
            f"--measure times this machine's GPU, {info.name} ({info.key}), not {wanted_key}; use --gpu {info.key}"
        )
    folder = user_measurements_dir() / info.key
    files = []
    for model in models:
        config = SweepConfig(
            device, model, dtype, grid, folder / f"{model.name}-{dtype}.csv", timer=default_timer(device)
        )
        log(f"measuring {model.name} {dtype} on {info.name} into {config.out} (resumable: rerun to continue)")
        files.append(run_sweep(config, log).out)
    return files


def progress_bar(total: int, enabled: bool):
    from tqdm import tqdm

    # disable=None: shown on a terminal, silent in logs and pipes.
    return tqdm(
        total=total, unit="cfg", disable=None if enabled else True, dynamic_ncols=True, file=sys.stderr, mininterval=0.5
    )


def run_metadata(config: SweepConfig, info: DeviceInfo, ceilings: dict | None, started: float | None) -> dict:
    meta = {
        "device": info.as_dict(),
        "model": asdict(config.model),
        "dtype": config.dtype,
        "grid": asdict(config.grid),
        "ops": list(config.ops),
        "phases": list(config.phases),
        "timer": asdict(config.timer),
        "timer_mode": config.timer_mode,
        "ceilings": ceilings,
    }
    if started is not None:
        meta["started"] = started
    return meta


def summarize_result(config, journal: Journal, measured: int, skipped: int, run_id, ceilings) -> SweepResult:
    out = journal.finish()
    rows = journal.rows()
    ok = rows[rows["status"] == "ok"]
    noise = float(ok["noise"].median()) if len(ok) else float("nan")
    return SweepResult(out, measured, skipped, len(rows), noise, run_id, ceilings)


def build_parser() -> Parser:
    p = Parser(prog="python -m profilers.sweep", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), help="where to measure (default: cuda if visible, else cpu)")
    p.add_argument(
        "--model", default="llama-7b", metavar="NAME|PATH", help="model preset or config.json (default %(default)s)"
    )
    p.add_argument("--dtype", help=f"one of {', '.join(BENCH_DTYPES)} (default fp16 on cuda, fp32 on cpu)")
    p.add_argument(
        "--grid",
        choices=tuple(GRIDS),
        help="paper: 49 (b, s) settings per op, q in {1,16,...,112}; quick: a few minutes on a CPU (default: paper "
        "on cuda, quick on cpu)",
    )
    p.add_argument(
        "--token-grid",
        choices=TOKEN_GRIDS,
        help=f"fine: linear ops ({' '.join(LINEAR_OPS)}) also at 1, 2, 4 and every {FINE_TOKEN_STEP} tokens up to "
        f"{FINE_TOKENS_UP_TO}, then powers of two up to the longest sequence, as prefill rows of batch 1 (seq_len = "
        "tokens), to catch the steps of GEMM latency; coarse: the grid only (default: fine on cuda, coarse on cpu)",
    )
    p.add_argument("--batch", nargs="+", type=batch_size, metavar="B", help="custom batch sizes (replace the grid's)")
    p.add_argument("--seq", nargs="+", type=token_count, metavar="S", help="custom sequence lengths")
    p.add_argument(
        "--candidates", nargs="+", type=token_count, metavar="Q", help="custom candidate counts for the tree phase"
    )
    p.add_argument(
        "--ops",
        nargs="+",
        default=list(DEFAULT_OPS),
        metavar="OP",
        help=f"ops to time (default: {' '.join(DEFAULT_OPS)}; also: {' '.join(STEP_OPS)})",
    )
    p.add_argument(
        "--phases", nargs="+", default=list(PHASES), metavar="PHASE", help=f"phases (default all: {' '.join(PHASES)})"
    )
    p.add_argument(
        "--out",
        type=Path,
        metavar="FILE",
        help="output .csv or .parquet (default perf-reports/sweeps/<device>-<model>-<dtype>-<grid>.csv)",
    )
    p.add_argument(
        "--timer",
        choices=TIMER_MODES,
        default="auto",
        help="cuda timing: events per call, a CUDA graph, or graphs below 50 us (default)",
    )
    p.add_argument(
        "--budget",
        type=float,
        metavar="SECONDS",
        help="time per configuration before giving up on the noise target (default 2 on cuda, 0.4 on cpu)",
    )
    p.add_argument(
        "--target-noise",
        type=float,
        default=0.01,
        metavar="F",
        help="stop repeating once IQR/median <= F (default %(default)s)",
    )
    p.add_argument("--max-memory-gb", type=float, metavar="GB", help="skip configurations needing more than this")
    p.add_argument("--threads", type=positive_int, metavar="N", help="CPU threads (default: all)")
    p.add_argument("--no-ceilings", action="store_true", help="do not measure bandwidth and peak FLOP/s first")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def config_from_args(args) -> SweepConfig:
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    check_device(device)
    dtype = check_dtype(args.dtype or default_dtype(device))
    model = load_model(args.model)
    grid_name = args.grid or default_grid(device)
    grid = sweep_grid(device, grid_name, args.token_grid, args.batch, args.seq, args.candidates)
    custom = "custom" if (args.batch or args.seq or args.candidates) else grid_name
    out = args.out or Path("perf-reports") / "sweeps" / f"{device}-{model.name}-{dtype}-{custom}.csv"
    timer = default_timer(device, args.budget, args.target_noise)
    cap = int(args.max_memory_gb * 1e9) if args.max_memory_gb else None
    return SweepConfig(
        device,
        model,
        dtype,
        grid,
        out,
        tuple(args.ops),
        tuple(args.phases),
        timer,
        args.timer,
        not args.no_ceilings,
        cap,
        args.threads,
        not args.no_progress,
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = config_from_args(args)
    started = time.perf_counter()
    result = run_sweep(config)
    print(
        f"{result.out}: {result.total_rows} rows ({result.measured} measured and {result.skipped} skipped now), "
        f"median noise {result.median_noise:.1%}, {time.perf_counter() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
