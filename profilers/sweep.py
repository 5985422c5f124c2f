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
from pathlib import Path

from perfmodel.base.dtypes import check_dtype, default_dtype
from perfmodel.cli import Parser, batch_size, options, positive_int, run, token_count
from perfmodel.models.config import load_model
from perfmodel.models.grid import FINE_TOKEN_STEP, FINE_TOKENS_UP_TO
from perfmodel.models.operators import DEFAULT_OPS, LINEAR_OPS, PHASES, STEP_OPS
from profilers.benchmarks import BENCH_DTYPES
from profilers.device import check_device
from profilers.sweep_runs import run_sweep
from profilers.sweeper import GRIDS, TIMER_MODES, TOKEN_GRIDS, SweepConfig, default_grid, default_timer, sweep_grid

DEFAULT_OUT = Path("perf-reports") / "sweeps"


def build_parser() -> Parser:
    p = Parser(prog="python -m profilers.sweep", description=__doc__.split("\n\n")[0])
    options.visible_device(p)
    options.model(p)
    options.dtype(p, allowed=BENCH_DTYPES)
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
    options.out(
        p,
        f"{DEFAULT_OUT}/<device>-<model>-<dtype>-<grid>.csv",
        what="the rows, a .csv or .parquet file",
        metavar="FILE",
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
    out = args.out or DEFAULT_OUT / f"{device}-{model.name}-{dtype}-{custom}.csv"
    timer = default_timer(device, args.budget, args.target_noise)
    cap = int(args.max_memory_gb * 1e9) if args.max_memory_gb else None
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
