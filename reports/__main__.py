"""python -m reports build | compare: self-contained HTML (and PNG) performance reports."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from perfmodel.base.dtypes import DTYPES, check_dtype
from perfmodel.cli import TP_HELP, Parser, positive_int, run, tp_degree
from perfmodel.latency.source import LATENCY_CHOICES
from perfmodel.models.config import load_model
from reports.build import BuildConfig, build
from reports.compare import CompareConfig, compare

DEFAULT_OUT = Path("perf-reports")


def positive_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value


def build_parser() -> Parser:
    p = Parser(prog="python -m reports", description=__doc__)
    commands = p.add_subparsers(dest="command", required=True, metavar="build|compare", parser_class=Parser)

    b = commands.add_parser("build", help="one device and model: every figure and table the toolkit has, on one page")
    device = b.add_mutually_exclusive_group(required=True)
    device.add_argument(
        "--gpu",
        metavar="NAME",
        help="a device in hw_specs/ by name or alias (e.g. a100, h100), "
        "or cpu for this machine's CPU (from its measured ceilings)",
    )
    device.add_argument(
        "--spec", type=Path, metavar="FILE", help="a device spec YAML of your own (format: hw_specs/README.md)"
    )
    b.add_argument(
        "--model",
        required=True,
        metavar="NAME|PATH",
        help="model preset (llama-7b, ...) or a config.json / checkpoint folder",
    )
    b.add_argument("--dtype", help=f"one of {', '.join(DTYPES)} (default fp16; fp32 on a CPU)")
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
    b.add_argument(
        "--acceptance",
        metavar="FILE|paper|paper-ln",
        help="a python -m decoder.measure record "
        "(default: the checkpoint folder's own record, else paper = 0.477 log2 n; paper-ln reads it as ln n)",
    )
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
    b.add_argument(
        "--prompt-len",
        type=positive_int,
        default=512,
        metavar="TOKENS",
        help="mean prompt length for the capacity plan (default %(default)s)",
    )
    b.add_argument(
        "--response-len",
        type=positive_int,
        default=256,
        metavar="TOKENS",
        help="mean response length for the capacity plan (default %(default)s)",
    )
    b.add_argument(
        "--latency-ms", type=positive_number, metavar="MS", help="per-token latency target for the capacity plan"
    )
    b.add_argument("--tp", type=tp_degree, default=1, metavar="N|auto", help=TP_HELP)
    b.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help=f"output folder (default {DEFAULT_OUT}/report/<device>-<model>[-<dtype>], the device that was shown)",
    )
    b.add_argument("--jobs", type=positive_int, metavar="N", help="processes drawing figures (default: one per core)")

    c = commands.add_parser("compare", help="one model on several devices, side by side")
    c.add_argument(
        "--gpu",
        nargs="+",
        required=True,
        metavar="NAME",
        help="devices by name or alias (e.g. a100 a40 rtx-a6000 h100), or cpu",
    )
    c.add_argument(
        "--model",
        default="llama-7b",
        metavar="NAME|PATH",
        help="model preset or config.json path (default %(default)s)",
    )
    c.add_argument("--dtype", help=f"one of {', '.join(DTYPES)} (default fp16; fp32 on a CPU)")
    c.add_argument(
        "--acceptance",
        metavar="FILE|paper|paper-ln",
        help="a python -m decoder.measure record (default paper = 0.477 log2 n; paper-ln reads it as ln n)",
    )
    c.add_argument(
        "--prompt-len",
        type=positive_int,
        default=512,
        metavar="TOKENS",
        help="mean prompt length for the capacity plan (default %(default)s)",
    )
    c.add_argument(
        "--response-len",
        type=positive_int,
        default=256,
        metavar="TOKENS",
        help="mean response length for the capacity plan (default %(default)s)",
    )
    c.add_argument(
        "--latency-ms", type=positive_number, metavar="MS", help="per-token latency target for the capacity plan"
    )
    c.add_argument("--out", type=Path, metavar="DIR", help=f"output folder (default {DEFAULT_OUT}/compare/<model>)")
    c.add_argument("--jobs", type=positive_int, metavar="N", help="processes drawing figures (default: one per core)")
    for sub in (b, c):
        sub.add_argument(
            "--latency",
            choices=LATENCY_CHOICES,
            default="auto",
            help="latency source: auto (default: measured where the device was measured, else calibrated, borrowed "
            "or the datasheet roofline), or force measured, calibrated or datasheet",
        )
    return p


def model_name(model: str) -> str:

    return load_model(model).name


def shared(args) -> dict:
    """The options build and compare share, as their configs name them."""
    names = ("model", "dtype", "acceptance", "prompt_len", "response_len", "latency_ms", "jobs", "latency")
    return {name: getattr(args, name) for name in names}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "build":
        if args.dtype:
            check_dtype(args.dtype)

        def default_out(device_key: str) -> Path:
            return (
                DEFAULT_OUT
                / "report"
                / f"{device_key}-{model_name(args.model)}{'-' + args.dtype if args.dtype else ''}"
            )

        config = BuildConfig(
            out=args.out or default_out,
            gpu=args.gpu,
            spec=args.spec,
            measurements=tuple(args.measurements),
            validation=tuple(args.validation),
            ablation=tuple(args.ablation),
            measure=args.measure,
            tp=args.tp,
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
    sys.exit(run(main))
