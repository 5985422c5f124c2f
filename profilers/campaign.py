"""python -m profilers.campaign: measure this machine's GPU (or CPU) for the toolkit, in one resumable run.

The stages (--dry-run prints them with their sizes and estimated times): the device's
ceilings and NVML identity; the paper's models' linear ops on the fine token grid; their
attention (qk, pv and sdpa with the causal or tree mask) over the paper grid; the GEMM
shapes of every model preset at tensor-parallel degrees 1, 2, 4 and 8 over 1..4096 tokens.
Everything lands under --out/<device key>/ in the data-contract format with its run
metadata, ready to copy into profilers/measurements/; campaign.json says what ran, when,
and on which torch, CUDA and driver. Interrupted, rerun the same command: complete stages
are skipped and a stage half done continues where its journal stopped.

--quick runs every stage on the bundled model and a few points (well under a minute on a
CPU): a proof that the campaign runs, which CI runs with --device cpu.
"""

from __future__ import annotations

import sys
from pathlib import Path

from perfmodel.base.errors import PerfkitError
from perfmodel.cli import Parser, options, run
from profilers.benchmarks import BENCH_DTYPES
from profilers.campaign_estimate import DEFAULT_GPU, dry_run_lines
from profilers.campaign_plan import plan_for
from profilers.campaign_run import run_campaign
from profilers.device import check_device

DEFAULT_OUT = Path("perf-reports") / "campaign"


def build_parser() -> Parser:
    p = Parser(prog="python -m profilers.campaign", description=__doc__.split("\n\n")[0])
    options.device(p, default=None, default_said="cuda if visible, else cpu")
    options.out(p, f"{DEFAULT_OUT}", what="the campaign's folder, its files under DIR/<device key>/", value=DEFAULT_OUT)
    options.dtype(p, allowed=BENCH_DTYPES)
    p.add_argument(
        "--quick",
        action="store_true",
        help="every stage on the bundled model and a few points, with a timer of a few samples: proves the campaign "
        "runs (CI), its numbers are not for committing",
    )
    p.add_argument(
        "--stage",
        choices=("gpu-check",),
        help="gpu-check: the short check for a lease of minutes (the host's dispatch cost per op, GEMMs of 1-64 "
        "token rows and tree attention re-timed in CUDA graphs under 50 us, the Llama-2-7B twin at batches 1/4/16 "
        "with trees of 16 and 64 tokens in eager and CUDA-graph steps, each printed beside its prediction); on a "
        "CPU the same in small",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="print the stages, their sizes and estimated times; measure nothing"
    )
    options.gpu(p, default=f"--dry-run only, the GPU it plans for: the GPU here, else {DEFAULT_GPU}")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    device = args.device or default_device()
    if args.quick and args.stage:
        raise PerfkitError("--quick and --stage are two plans: give one")
    variant = args.stage or ("quick" if args.quick else "full")
    if args.gpu is not None and not (args.dry_run and device == "cuda"):
        raise PerfkitError(
            f"--gpu {args.gpu} names the GPU whose datasheet prices a cuda --dry-run; a campaign measures the device "
            "it runs on"
        )
    if args.dry_run:
        print("\n".join(dry_run_lines(plan_for(device, variant, args.dtype), args.out, args.gpu)))
        return 0
    check_device(device)  # a one-line error before anything else, e.g. no CUDA device here
    result = run_campaign(plan_for(device, variant, args.dtype), args.out, progress=not args.no_progress)
    if result.done:
        measured = sum(d.measured for d in result.done)
        print(
            f"{result.folder}: {len(result.done)} stage(s) measured now ({measured:,} points), "
            f"{len(result.complete)} already complete; campaign.json says what ran when"
        )
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
