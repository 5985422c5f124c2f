"""python -m reports build | compare: self-contained HTML (and PNG) performance reports."""

from __future__ import annotations

import gc
import sys
from dataclasses import dataclass, field
from pathlib import Path

from perfmodel.base.dtypes import check_dtype
from perfmodel.cli import Parser, options, pricing_options, run
from perfmodel.cli.fields import add_options, nested, option, read_options, shared
from perfmodel.cli.workload_options import WorkloadOptions
from perfmodel.latency.choice import LatencyChoice
from perfmodel.models.config import load_model
from perfmodel.planning.step_models import WHOLE_STEP_FLAVORS
from reports.build import BuildConfig, build
from reports.chain_section import CHAIN_PAGE_DRAFTERS
from reports.compare import CompareConfig, compare

DEFAULT_OUT = Path("perf-reports")


STEP_USE = (
    "the whole step the page's recommendations, capacity plan and tree are priced by (traced is drawn beside "
    "the paper and full steps and adds about a minute)"
)


@dataclass(frozen=True)
class BuildOptions:
    """`build`'s options, each declared once (the parser is generated from them,
    perfmodel.cli.fields); config() is what reports.build.build takes."""

    gpu: str | None = field(default=None, metadata=shared(options.gpu, exclusive=("device", True)))
    spec: Path | None = field(default=None, metadata=shared(options.spec, exclusive=("device", True)))
    model: str = field(default="llama-7b", metadata=shared(options.model))
    dtype: str | None = field(default=None, metadata=shared(options.dtype))
    measurements: tuple[Path, ...] = field(
        default=(),
        metadata=option(
            "--measurements",
            "measured operator rows (profilers.sweep CSV/Parquet; default: the device's stored sweeps)",
            type=Path,
            nargs="+",
            metavar="FILE",
        ),
    )
    measure: bool = field(
        default=False,
        metadata=option(
            "--measure",
            "first sweep this machine's device (--gpu cpu, or the GPU named) for the model on the quick grid, with its "
            "ceilings; kept with this machine's stored measurements for later commands (a few minutes; rerun to "
            "resume)",
            action="store_true",
        ),
    )
    acceptance_rates: str | None = field(default=None, metadata=shared(options.acceptance_rates, own_record=True))
    validation: tuple[Path, ...] = field(
        default=(),
        metadata=option(
            "--validation",
            "python -m perfmodel.validate --csv files (default: the device's shipped closed-loop runs)",
            type=Path,
            nargs="+",
            metavar="FILE",
        ),
    )
    ablation: tuple[Path, ...] = field(
        default=(),
        metadata=option(
            "--ablation",
            "python -m decoder.ablation --csv files, the paper's Fig. 4 (default: the shipped ones for the model)",
            type=Path,
            nargs="+",
            metavar="FILE",
        ),
    )
    tp: int | None = field(default=1, metadata=shared(pricing_options.tp))
    step: str = field(
        default="full", metadata=shared(options.step, choices=WHOLE_STEP_FLAVORS, default="full", use=STEP_USE)
    )
    out: Path | None = field(
        default=None,
        metadata=shared(
            options.out, default=f"{DEFAULT_OUT}/report/<device>-<model>[-<dtype>], the device that was shown"
        ),
    )
    jobs: int | None = field(default=None, metadata=shared(options.jobs))
    workload: WorkloadOptions = field(default_factory=WorkloadOptions, metadata=nested(WorkloadOptions))
    latency: str | LatencyChoice = field(default="auto", metadata=shared(pricing_options.latency))  # parsed: a choice
    drafter: str = field(default="medusa", metadata=shared(options.drafter, choices=CHAIN_PAGE_DRAFTERS))
    position_rates: tuple[float, ...] | None = field(
        default=None,
        metadata=shared(options.position_rates, use="with --drafter: a section of its best chain per batch"),
    )
    draft_config: Path | None = field(
        default=None, metadata=shared(options.draft_config, use="with --drafter and --position-rates")
    )

    def config(self) -> BuildConfig:
        if self.dtype:
            check_dtype(self.dtype)
        return BuildConfig(
            out=self.out,  # None: reports.build names the folder after the device it resolves
            gpu=self.gpu,
            spec=self.spec,
            measurements=self.measurements,
            validation=self.validation,
            ablation=self.ablation,
            measure=self.measure,
            step=self.step,
            drafter=self.drafter,
            position_rates=self.position_rates,
            draft_config=self.draft_config,
            **shared_settings(self),
        )


@dataclass(frozen=True)
class CompareOptions:
    """`compare`'s options (as BuildOptions); config() is what reports.compare.compare takes."""

    gpu: tuple[str, ...] = field(default=(), metadata=shared(options.gpu, many=True, required=True))
    model: str = field(default="llama-7b", metadata=shared(options.model))
    dtype: str | None = field(default=None, metadata=shared(options.dtype))
    acceptance_rates: str | None = field(default=None, metadata=shared(options.acceptance_rates))
    out: Path | None = field(default=None, metadata=shared(options.out, default=f"{DEFAULT_OUT}/compare/<model>"))
    jobs: int | None = field(default=None, metadata=shared(options.jobs))
    tp: int | None = field(default=1, metadata=shared(pricing_options.tp))
    workload: WorkloadOptions = field(default_factory=WorkloadOptions, metadata=nested(WorkloadOptions))
    latency: str | LatencyChoice = field(default="auto", metadata=shared(pricing_options.latency))  # parsed: a choice

    def config(self) -> CompareConfig:
        out = self.out or DEFAULT_OUT / "compare" / model_name(self.model)
        return CompareConfig(gpus=tuple(self.gpu), out=out, **shared_settings(self))


COMMANDS = {
    "build": (BuildOptions, "one device and model: every figure and table the toolkit has, on one page"),
    "compare": (CompareOptions, "one model on several devices, side by side"),
}


def build_parser() -> Parser:
    p = Parser(prog="python -m reports", description=__doc__)
    commands = p.add_subparsers(dest="command", required=True, metavar="build|compare", parser_class=Parser)
    for name, (declared, said) in COMMANDS.items():
        add_options(commands.add_parser(name, help=said), declared)
    return p


def model_name(model: str) -> str:

    return load_model(model).name


def shared_settings(given: BuildOptions | CompareOptions) -> dict:
    """The options build and compare share, as their configs name them."""
    names = ("model", "dtype", "jobs", "latency", "tp")
    return {
        "acceptance": given.acceptance_rates,
        "workload": given.workload.settings(),
        **{name: getattr(given, name) for name in names},
    }


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    given = read_options(COMMANDS[args.command][0], args)
    if isinstance(given, BuildOptions):
        report = build(given.config())
        print(f"html: {report.html}")
        for fact in report.facts:
            print(f"  {fact}")
        return 0
    result = compare(given.config())
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
