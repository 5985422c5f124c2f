"""python -m profilers.sweep: time every operator of a decoding step over a grid.

One row per (op, phase, batch, seq_len, candidates) in the data-contract format, appended
to --out as soon as it is measured: a sweep killed at any moment resumes on rerun with
nothing lost or repeated, and a rerun of a complete sweep does nothing. Configurations
that do not fit in memory are recorded as skipped, with the reason.

On CUDA (or with --token-grid fine) linear ops are also timed on the fine token grid
(perfmodel.models.grid.fine_token_grid: 1, 2, 4, 8, 16, ..., 512, then powers of two), to catch
the steps of GEMM latency in the token count; those are prefill rows of one sequence,
(batch 1, seq_len = tokens, candidates 1).

The sweeper itself is a library: profilers.sweeper times grid points, profilers.sweep_runs
runs whole sweeps into a file.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from perfmodel.base.dtypes import check_dtype, default_dtype
from perfmodel.cli import Parser, batch_size, options, positive_int, positive_number, run, token_count
from perfmodel.cli.fields import add_options, option, read_options, shared
from perfmodel.cli.parser import number_in, positive_number_up_to
from perfmodel.models.config import load_model
from perfmodel.models.grid import FINE_TOKEN_STEP, FINE_TOKENS_UP_TO, check_ops
from perfmodel.models.operators import DEFAULT_OPS, LINEAR_OPS, PHASES, STEP_OPS
from perfmodel.models.unpriced import check_dense
from profilers.benchmarks import BENCH_DTYPES
from profilers.device import check_device
from profilers.sweep_runs import run_sweep
from profilers.sweeper import GRIDS, TIMER_MODES, TOKEN_GRIDS, SweepConfig, default_grid, default_timer, sweep_grid

DEFAULT_OUT = Path("perf-reports") / "sweeps"
MAX_MEMORY_GB = 1e6  # --max-memory-gb's largest: its bytes stay an integer a comparison takes


@dataclass(frozen=True)
class SweepOptions:
    """The command's options, each declared once (perfmodel.cli.fields); config_from_args
    reads them."""

    device: str | None = field(default=None, metadata=shared(options.visible_device))
    model: str = field(default="llama-7b", metadata=shared(options.model))
    dtype: str | None = field(default=None, metadata=shared(options.dtype, allowed=BENCH_DTYPES))
    grid: str | None = field(
        default=None,
        metadata=option(
            "--grid",
            "paper: 49 (b, s) settings per op, q in {1,16,...,112}; quick: a few minutes on a CPU (default: paper "
            "on cuda, quick on cpu)",
            choices=tuple(GRIDS),
        ),
    )
    token_grid: str | None = field(
        default=None,
        metadata=option(
            "--token-grid",
            f"fine: linear ops ({' '.join(LINEAR_OPS)}) also at 1, 2, 4 and every {FINE_TOKEN_STEP} tokens up to "
            f"{FINE_TOKENS_UP_TO}, then powers of two up to the longest sequence, as prefill rows of batch 1 "
            "(seq_len = tokens), to catch the steps of GEMM latency; coarse: the grid only (default: fine on cuda, "
            "coarse on cpu)",
            choices=TOKEN_GRIDS,
        ),
    )
    batch: tuple[int, ...] | None = field(
        default=None,
        metadata=option("--batch", "custom batch sizes (replace the grid's)", nargs="+", type=batch_size, metavar="B"),
    )
    seq: tuple[int, ...] | None = field(
        default=None,
        metadata=option("--seq", "custom sequence lengths", nargs="+", type=token_count, metavar="S"),
    )
    candidates: tuple[int, ...] | None = field(
        default=None,
        metadata=option(
            "--candidates", "custom candidate counts for the tree phase", nargs="+", type=token_count, metavar="Q"
        ),
    )
    ops: tuple[str, ...] = field(
        default=tuple(DEFAULT_OPS),
        metadata=option(
            "--ops",
            f"ops to time (default: {' '.join(DEFAULT_OPS)}; also: {' '.join(STEP_OPS)})",
            nargs="+",
            metavar="OP",
        ),
    )
    phases: tuple[str, ...] = field(
        default=tuple(PHASES),
        metadata=option("--phases", f"phases (default all: {' '.join(PHASES)})", nargs="+", metavar="PHASE"),
    )
    out: Path | None = field(
        default=None,
        metadata=shared(
            options.out,
            default=f"{DEFAULT_OUT}/<device>-<model>-<dtype>-<grid>.csv",
            what="the rows, a .csv or .parquet file",
            metavar="FILE",
        ),
    )
    timer: str = field(
        default="auto",
        metadata=option(
            "--timer",
            "cuda timing: events per call, a CUDA graph, or graphs below 50 us (default)",
            choices=TIMER_MODES,
        ),
    )
    budget: float | None = field(
        default=None,
        metadata=option(
            "--budget",
            "time per configuration before giving up on the noise target (default 2 on cuda, 0.4 on cpu)",
            type=positive_number,
            metavar="SECONDS",
        ),
    )
    target_noise: float = field(
        default=0.01,
        metadata=option(
            "--target-noise",
            "stop repeating once IQR/median <= F (default %(default)s)",
            type=positive_number,
            metavar="F",
        ),
    )
    flush_mb: float | None = field(
        default=None,
        metadata=option(
            "--flush-mb",
            "MiB the cache flush writes before each sample (default: twice the last-level cache, which evicts "
            "everything; 0: no flush). A CPU whose cores report a whole socket's L3 (a virtual machine's) pays "
            "for twice that at every sample",
            type=number_in(0, 1 << 20, "of MiB from 0 to 1048576"),
            metavar="MIB",
        ),
    )
    max_memory_gb: float | None = field(
        default=None,
        metadata=option(
            "--max-memory-gb",
            "skip configurations needing more than this",
            type=positive_number_up_to(MAX_MEMORY_GB, "a petabyte, past any one machine's memory"),
            metavar="GB",
        ),
    )
    threads: int | None = field(
        default=None, metadata=option("--threads", "CPU threads (default: all)", type=positive_int, metavar="N")
    )
    no_ceilings: bool = field(
        default=False,
        metadata=option("--no-ceilings", "do not measure bandwidth and peak FLOP/s first", action="store_true"),
    )
    no_progress: bool = field(default=False, metadata=option("--no-progress", "no progress bar", action="store_true"))


def build_parser() -> Parser:
    p = Parser(prog="python -m profilers.sweep", description=__doc__.split("\n\n")[0])
    add_options(p, SweepOptions)
    return p


def config_from_args(args) -> SweepConfig:
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    check_device(device)
    dtype = check_dtype(args.dtype or default_dtype(device))
    model = load_model(args.model)
    check_dense(model, "a sweep (it times a dense model's ops)")
    grid_name = args.grid or default_grid(device)
    grid = sweep_grid(device, grid_name, args.token_grid, args.batch, args.seq, args.candidates)
    custom = "custom" if (args.batch or args.seq or args.candidates) else grid_name
    out = args.out or DEFAULT_OUT / f"{device}-{model.name}-{dtype}-{custom}.csv"
    timer = default_timer(device, args.budget, args.target_noise)
    if args.flush_mb is not None:
        timer = replace(timer, flush_cache=args.flush_mb > 0, flush_bytes=int(args.flush_mb * 2**20) or None)
    cap = None if args.max_memory_gb is None else int(args.max_memory_gb * 1e9)
    check_ops(args.ops, args.phases)  # before the output is locked and anything is timed
    return SweepConfig(
        device,
        model,
        dtype,
        grid,
        out,
        ops=tuple(args.ops),
        phases=tuple(args.phases),
        timer=timer,
        timer_mode=args.timer,
        ceilings=not args.no_ceilings,
        memory_cap_bytes=cap,
        threads=args.threads,
        progress=not args.no_progress,
    )


def main(argv: list[str] | None = None) -> int:
    args = read_options(SweepOptions, build_parser().parse_args(argv))
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
