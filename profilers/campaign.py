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
from dataclasses import dataclass, field
from pathlib import Path

from perfmodel.base.errors import PerfkitError
from perfmodel.cli import Parser, options, run
from perfmodel.cli.fields import add_options, option, read_options, shared
from profilers.benchmarks import BENCH_DTYPES
from profilers.campaign_estimate import DEFAULT_GPU, dry_run_lines
from profilers.campaign_run import run_campaign
from profilers.campaign_variants import plan_for
from profilers.device import check_device

DEFAULT_OUT = Path("perf-reports") / "campaign"


@dataclass(frozen=True)
class CampaignOptions:
    """The command's options, each declared once (perfmodel.cli.fields)."""

    device: str | None = field(default=None, metadata=shared(options.visible_device))
    out: Path = field(
        default=DEFAULT_OUT,
        metadata=shared(
            options.out,
            default=f"{DEFAULT_OUT}",
            what="the campaign's folder, its files under DIR/<device key>/",
            value=DEFAULT_OUT,
        ),
    )
    dtype: str | None = field(default=None, metadata=shared(options.dtype, allowed=BENCH_DTYPES))
    quick: bool = field(
        default=False,
        metadata=option(
            "--quick",
            "every stage on the bundled model and a few points, with a timer of a few samples: proves the campaign "
            "runs (CI), its numbers are not for committing",
            action="store_true",
        ),
    )
    stage: str | None = field(
        default=None,
        metadata=option(
            "--stage",
            "gpu-check: the short check for a lease of minutes (the host's dispatch cost per op, GEMMs of 1-64 "
            "token rows and tree attention re-timed in CUDA graphs under 50 us, the Llama-2-7B twin at batches 1/4/16 "
            "with trees of 16 and 64 tokens in eager and CUDA-graph steps, each printed beside its prediction); on a "
            "CPU the same in small",
            choices=("gpu-check",),
        ),
    )
    dry_run: bool = field(
        default=False,
        metadata=option(
            "--dry-run", "print the stages, their sizes and estimated times; measure nothing", action="store_true"
        ),
    )
    gpu: str | None = field(
        default=None,
        metadata=shared(options.gpu, default=f"--dry-run only, the GPU it plans for: the GPU here, else {DEFAULT_GPU}"),
    )
    no_progress: bool = field(default=False, metadata=option("--no-progress", "no progress bars", action="store_true"))


def build_parser() -> Parser:
    p = Parser(prog="python -m profilers.campaign", description=__doc__.split("\n\n")[0])
    add_options(p, CampaignOptions)
    return p


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def main(argv: list[str] | None = None) -> int:
    args = read_options(CampaignOptions, build_parser().parse_args(argv))
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
