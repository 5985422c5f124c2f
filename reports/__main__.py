"""python -m reports build | compare: self-contained HTML (and PNG) performance reports."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

from perfmodel.base.dtypes import check_dtype
from perfmodel.cli import Parser, options, run, workload_options
from perfmodel.models.config import load_model
from perfmodel.planning.step_models import WHOLE_STEP_FLAVORS
from reports.build import BuildConfig, build
from reports.compare import CompareConfig, compare

DEFAULT_OUT = Path("perf-reports")


def build_parser() -> Parser:
    p = Parser(prog="python -m reports", description=__doc__)
    commands = p.add_subparsers(dest="command", required=True, metavar="build|compare", parser_class=Parser)

    b = commands.add_parser("build", help="one device and model: every figure and table the toolkit has, on one page")
    device = b.add_mutually_exclusive_group(required=True)
    options.gpu(device)
    options.spec(device)
    options.model(b)
    options.dtype(b)
    b.add_argument(
        "--measurements",
        type=Path,
        nargs="+",
        default=(),
        metavar="FILE",
        help="measured operator rows (profilers.sweep CSV/Parquet; default: the device's stored sweeps)",
    )
    b.add_argument(
        "--measure",
        action="store_true",
        help="first sweep this machine's device (--gpu cpu, or the GPU named) "
        "for the model on the quick grid, with its ceilings; "
        "kept with this machine's stored measurements for later commands (a few minutes; rerun to resume)",
    )
    options.acceptance_rates(b, own_record=True)
    b.add_argument(
        "--validation",
        type=Path,
        nargs="+",
        default=(),
        metavar="FILE",
        help="python -m perfmodel.validate --csv files (default: the device's shipped closed-loop runs)",
    )
    b.add_argument(
        "--ablation",
        type=Path,
        nargs="+",
        default=(),
        metavar="FILE",
        help="python -m decoder.ablation --csv files, the paper's Fig. 4 (default: the shipped ones for the model)",
    )
    options.tp(b)
    options.step(
        b,
        choices=WHOLE_STEP_FLAVORS,
        default="full",
        use="the whole step the page's recommendations, capacity plan and tree are priced by (traced is drawn beside "
        "the paper and full steps and adds about a minute)",
    )
    options.out(b, f"{DEFAULT_OUT}/report/<device>-<model>[-<dtype>], the device that was shown")
    options.jobs(b)

    c = commands.add_parser("compare", help="one model on several devices, side by side")
    options.gpu(c, many=True, required=True)
    options.model(c)
    options.dtype(c)
    options.acceptance_rates(c)
    options.out(c, f"{DEFAULT_OUT}/compare/<model>")
    options.jobs(c)
    options.tp(c)
    for sub in (b, c):
        workload_options.workload(sub)
        options.latency(sub)
    return p


def model_name(model: str) -> str:

    return load_model(model).name


def shared(args) -> dict:
    """The options build and compare share, as their configs name them."""
    names = ("model", "dtype", "jobs", "latency", "tp")
    return {
        "acceptance": args.acceptance_rates,
        "workload": workload_options.workload_settings(args),
        **{name: getattr(args, name) for name in names},
    }


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "build":
        if args.dtype:
            check_dtype(args.dtype)
        config = BuildConfig(
            out=args.out,  # None: reports.build names the folder after the device it resolves
            gpu=args.gpu,
            spec=args.spec,
            measurements=tuple(args.measurements),
            validation=tuple(args.validation),
            ablation=tuple(args.ablation),
            measure=args.measure,
            step=args.step,
            **shared(args),
        )
        report = build(config)
        print(f"html: {report.html}")
        for fact in report.facts:
            print(f"  {fact}")
        return 0

    config = CompareConfig(
        gpus=tuple(args.gpu), out=args.out or DEFAULT_OUT / "compare" / model_name(args.model), **shared(args)
    )
    result = compare(config)
    print(f"html: {result.html}")
    for line in result.lines:
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    status = run(main)
    # The process ends here: a last garbage collection would scan every object the run made
    # (pandas, matplotlib) for a fifth of a second, to free memory the exit frees anyway.
    gc.freeze()
    sys.exit(status)
