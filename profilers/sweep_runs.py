"""Whole sweeps: what a measurement file lacks of a grid, measured and appended row by row.

`run_sweep` resumes where a killed sweep stopped and does nothing for a complete one;
`measure_now` / `measure_and_store` are the commands' --measure: quick sweeps of this
machine's device, kept where every later command finds them.
"""

from __future__ import annotations

import sys
import time
import uuid
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from perfmodel.base.dtypes import check_dtype
from perfmodel.base.errors import PerfkitError
from perfmodel.base.outputs import writable_file
from perfmodel.hardware.specs import resolve_spec
from perfmodel.measured.device_view import is_cpu_name
from perfmodel.measured.store import user_measurements_dir
from perfmodel.models.config import ModelConfig
from perfmodel.models.grid import Grid, iter_points
from profilers.benchmarks import check_bench_dtype
from profilers.ceilings import CEILING_TIMER, measure_ceilings
from profilers.device import DeviceInfo, check_device, cpu_info, cuda_info, torch_threads
from profilers.store import Journal, journal_path, output_lock, record_run
from profilers.sweeper import SweepConfig, Sweeper, default_timer, with_token_grid
from profilers.timer import TimerConfig


@dataclass
class SweepResult:
    out: Path
    measured: int
    skipped: int
    total_rows: int
    median_noise: float
    run_id: str | None
    ceilings: dict | None


def run_sweep(config: SweepConfig, log=print, ceilings: dict | None = None) -> SweepResult:
    """Measure what `config.out` lacks of the grid, holding the file's lock throughout: a
    second sweep into the same file is refused, not run beside this one. `ceilings`: the
    device's ceilings measured already (Ceilings.as_dict()), recorded with the run instead of
    measuring them again."""
    writable_file(config.out, "sweep output")  # before ceilings and torch, which take minutes
    with output_lock(config.out):
        return _run_sweep(config, log, ceilings)


def new_run_id() -> str:
    """The id every row of one run carries and its metadata is keyed by: when, and a nonce."""
    return f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"


@contextmanager
def torch_set_up(device: str, threads: int | None = None):
    """What every sweep sets while it times, and puts back after: fp32 is fp32 on a GPU, and
    a CPU uses the threads asked for, else all of them. Left set, a process that swept once
    (a test worker, a notebook, a report's --measure) would go on with every thread, each
    waiting on the others' cores wherever other work shares them."""
    import torch

    tf32 = torch.backends.cuda.matmul.allow_tf32
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 rows must be fp32, not TF32
    count = threads or (cpu_info().details["logical_cpus"] if device == "cpu" else None)  # all threads in use
    try:
        with torch_threads(count):
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def missing_points(config: SweepConfig, device_key: str, journal: Journal | None = None) -> list[tuple]:
    """The grid points (op, phase, batch, seq_len, candidates) of `config` that its output
    lacks for the device `device_key`: all of them while the output does not exist (nothing
    is written to find out)."""
    points = list(iter_points(config.model, config.grid, config.ops, config.phases))  # validates ops and phases
    if journal is None:
        if not journal_path(config.out).exists() and not config.out.exists():
            return points
        journal = Journal(config.out)
    return [p for p in points if not journal.has((device_key, config.model.name, config.dtype, *p))]


def _run_sweep(config: SweepConfig, log, known_ceilings: dict | None) -> SweepResult:
    check_bench_dtype(check_dtype(config.dtype))
    check_device(config.device)
    with torch_set_up(config.device, config.threads):
        return _sweep(config, log, known_ceilings)


def _sweep(config: SweepConfig, log, known_ceilings: dict | None) -> SweepResult:
    points = list(iter_points(config.model, config.grid, config.ops, config.phases))  # validates ops and phases
    info, nvml = cuda_info() if config.device == "cuda" else (cpu_info(), None)
    journal = Journal(config.out)
    todo = missing_points(config, info.key, journal)
    if not todo:
        log(f"nothing to do: all {len(points)} configurations are in {journal.path}")
        return summarize_result(config, journal, 0, 0, None, None)

    run_id = new_run_id()
    fine = f", linear ops at {len(config.grid.linear_tokens)} token counts" if config.grid.linear_tokens else ""
    log(
        f"{info.name} ({info.key}), {config.model.name} {config.dtype}: {len(todo)} of {len(points)} configurations "
        f"to measure{fine}, run {run_id}"
    )
    ceilings = known_ceilings
    if ceilings is None and config.ceilings:
        log("measuring ceilings")
        ceilings = measure_ceilings(info, log=log, config=config.ceiling_timer).as_dict()
    started = time.time()
    record_run(config.out, run_id, run_metadata(config, info, ceilings, started=started))

    sweeper = Sweeper(config, info, nvml, ceilings)
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
    meta = run_metadata(config, info, ceilings, started=started)  # kept: the newest run is found by it
    record_run(config.out, run_id, {**meta, "finished": time.time(), "measured": measured, "skipped": skipped})
    return summarize_result(config, journal, measured, skipped, run_id, ceilings)


def measure_now(gpu: str | None, spec_file, models: list[ModelConfig], dtype: str, grid: Grid, log=print) -> list[Path]:
    """--measure: quick sweeps of the device a command names (`cpu`: this machine's CPU;
    a GPU name: the GPU here, which must be that one), stored for later commands. Linear
    ops get the device's default token grid (fine on a GPU)."""

    if is_cpu_name(gpu):
        return measure_and_store("cpu", models, dtype, grid, log=log)
    return measure_and_store(check_device("cuda"), models, dtype, grid, resolve_spec(gpu, spec_file).key, log)


def ceiling_timer(device: str) -> TimerConfig:
    """The timer of each ceiling a --measure sweep measures first (profilers.ceilings: the
    device's bandwidth, peaks and launch cost), on any device."""
    return CEILING_TIMER


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
            device,
            model,
            dtype,
            grid,
            folder / f"{model.name}-{dtype}.csv",
            timer=default_timer(device),
            ceiling_timer=ceiling_timer(device),
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
