"""python -m profilers.allreduce: time all-reduce across processes with torch.distributed.

--ranks processes (gloo on --device cpu, NCCL on --device cuda, one GPU per rank) all-reduce
(sum) a tensor of each message size; one data-contract row per size (op all_reduce, phase
collective, batch = ranks, seq_len = elements per rank, bytes = the message per rank,
perfmodel.measured.collectives), appended as soon as it is timed, with the run's metadata
in FILE.meta.json. Rerun, it measures only the sizes the file lacks. Kept under the
measurements home (the default --out), the rows time the device's tensor-parallel
all-reduces for the planner (perfmodel.latency.allreduce, stack torch-gloo / torch-nccl):
`python -m perfmodel.plan --gpu cpu --tp 2` then prices tp=2 with them.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from perfmodel.base.dtypes import default_dtype
from perfmodel.base.errors import PerfkitError
from perfmodel.cli import Parser, options, positive_int, run
from perfmodel.cli.fields import add_options, option, read_options, shared
from perfmodel.measured.collectives import FOLDER, file_name
from perfmodel.measured.store import user_measurements_dir
from profilers.benchmarks import BENCH_DTYPES
from profilers.collectives import (
    DEFAULT_SIZES,
    DEFAULT_TIMER,
    QUICK_SIZES,
    QUICK_TIMER,
    CollectiveConfig,
    check_sizes,
    default_threads,
    measure_into,
    size_text,
)
from profilers.device import DeviceInfo, check_device, cpu_info, cuda_info

# --quick rows prove the command runs; they stay out of the measurements the planner reads.
QUICK_OUT = Path("perf-reports") / "allreduce"
MAX_RANKS = 64
UNITS = {"": 1, "k": 1024, "kib": 1024, "m": 1024**2, "mib": 1024**2, "g": 1024**3, "gib": 1024**3}


def message_size(text: str) -> int:
    """An argparse type: bytes, with an optional K/KiB, M/MiB or G/GiB suffix (powers of 1024)."""
    match = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    unit = match and UNITS.get(match.group(2).lower())
    if not unit or int(match.group(1)) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive number of bytes (8192, 8KiB, 64MiB), got {text!r}")
    return int(match.group(1)) * unit


@dataclass(frozen=True)
class AllreduceOptions:
    """The command's options, each declared once (perfmodel.cli.fields)."""

    device: str | None = field(default=None, metadata=shared(options.visible_device))
    ranks: int = field(
        default=2,
        metadata=option(
            "--ranks",
            "processes taking part, the tensor-parallel degree these rows time (at least 2; on cuda one GPU each) "
            "(default %(default)s)",
            type=positive_int,
            metavar="N",
        ),
    )
    dtype: str | None = field(default=None, metadata=shared(options.dtype, allowed=BENCH_DTYPES))
    sizes: tuple[int, ...] | None = field(
        default=None,
        metadata=option(
            "--sizes",
            f"message sizes per rank, e.g. 8KiB 1MiB (default: {size_text(DEFAULT_SIZES[0])} to "
            f"{size_text(DEFAULT_SIZES[-1])} in powers of two; --quick: {' '.join(map(size_text, QUICK_SIZES))})",
            nargs="+",
            type=message_size,
            metavar="BYTES",
        ),
    )
    budget: float | None = field(
        default=None,
        metadata=option(
            "--budget",
            f"time of the sampled calls per size before giving up on IQR/median <= {DEFAULT_TIMER.target_noise} "
            f"(default {DEFAULT_TIMER.budget_s:g}; at least {DEFAULT_TIMER.min_reps} samples are taken)",
            type=float,
            metavar="SECONDS",
        ),
    )
    quick: bool = field(
        default=False,
        metadata=option(
            "--quick",
            f"a few sizes and samples, into {QUICK_OUT}/ unless --out: proves the command runs, its numbers are not "
            "for planning",
            action="store_true",
        ),
    )
    out: Path | None = field(
        default=None,
        metadata=shared(
            options.out,
            default=f"<measurements home>/<device key>/{FOLDER}/<backend>-<dtype>-<ranks>ranks.csv, where the planner "
            "finds it",
            what="the rows, a .csv file",
            metavar="FILE",
        ),
    )


def build_parser() -> Parser:
    p = Parser(prog="python -m profilers.allreduce", description=__doc__.split("\n\n")[0])
    add_options(p, AllreduceOptions)
    return p


def check_ranks(device: str, ranks: int) -> int:
    if ranks < 2:
        raise PerfkitError(f"--ranks {ranks}: an all-reduce needs at least 2 ranks (processes); give 2 to {MAX_RANKS}")
    if ranks > MAX_RANKS:
        raise PerfkitError(f"--ranks {ranks}: at most {MAX_RANKS} ranks are timed on one machine")
    if device == "cuda":
        import torch

        visible = torch.cuda.device_count()
        if ranks > visible:
            raise PerfkitError(f"--ranks {ranks} on cuda needs one GPU per rank; {visible} are visible")
    elif ranks > (os.cpu_count() or 1):
        print(
            f"note: {ranks} ranks on {os.cpu_count()} CPU cores: ranks share cores, and the times include it",
            file=sys.stderr,
        )
    return ranks


def config_from_args(args) -> tuple[CollectiveConfig, DeviceInfo, Path]:
    import torch

    device = check_device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    ranks = check_ranks(device, args.ranks)
    dtype = args.dtype or default_dtype(device)
    if dtype not in BENCH_DTYPES:
        raise PerfkitError(f"--dtype {dtype!r}: all-reduce is timed in {', '.join(BENCH_DTYPES)}")
    sizes = check_sizes(args.sizes or (QUICK_SIZES if args.quick else DEFAULT_SIZES), dtype)
    timer = QUICK_TIMER if args.quick else DEFAULT_TIMER
    if args.budget is not None:
        if not 0 <= args.budget < float("inf"):
            raise PerfkitError(f"--budget {args.budget:g}: must be a number of seconds >= 0")
        timer = replace(timer, budget_s=args.budget)
    config = CollectiveConfig(device, ranks, dtype, sizes, timer, default_threads(device, ranks))
    info = cpu_info() if device == "cpu" else cuda_info()[0]
    root = QUICK_OUT if args.quick else user_measurements_dir()
    out = args.out or root / info.key / FOLDER / file_name(config.backend, dtype, ranks)
    return config, info, out


def main(argv: list[str] | None = None) -> int:
    args = read_options(AllreduceOptions, build_parser().parse_args(argv))
    started = time.perf_counter()
    config, info, out = config_from_args(args)
    result = measure_into(config, info, out)
    wall = time.perf_counter() - started
    print(f"{result.out}: {result.total_rows} rows ({len(result.measured)} measured now), {wall:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
