"""python -m perfmodel.published_check: published measurements of speculative decoding on GPUs
(perfmodel/measured/published_speculation.csv) beside the toolkit's prediction of each from its
own stated accepted length: the measured speedup first, the predicted one and the error beside
it, the mean |error| per drafter family with the step time the measurements imply beyond the
prediction, and how many rows are not predicted yet and why.

Each row is priced in the regime its harness ran in (its `launch`): Spec-Bench's Hugging Face
eager loop as the reference decoder's eager step, traced kernel by kernel through the host and
device queues at a measured host's cost per op (--host-dispatch: by default the newest shipped
GPU check's), the drafters' passes and the draft model's steps the same way; an engine's row as
the full step. `--regime full` prices every row as the full step.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from perfmodel.base.attention_code import AttentionCode
from perfmodel.base.errors import PerfkitError
from perfmodel.base.launch import Launch
from perfmodel.base.outputs import write_csv
from perfmodel.cli import Parser, options
from perfmodel.cli.fields import add_options, option, read_options, shared
from perfmodel.hardware.specs import find_spec
from perfmodel.latency.pipeline import HostCosts
from perfmodel.latency.step import StepFlavor
from perfmodel.measured.published_speculation import DRAFTER_FAMILIES, PUBLISHED, read_published
from perfmodel.measured.store import measurement_roots
from perfmodel.planning.published_prediction import (
    DEFAULT_CONTEXT,
    full_steps,
    predict_row,
    unpriced_reason,
    unpriced_time,
)
from profilers.campaign_plan import HOST_DISPATCH_FILE as HOST_FILE
from reports.point_steps import point_steps


@dataclass(frozen=True)
class PublishedCheckOptions:
    """The command's options, each declared once (perfmodel.cli.fields)."""

    drafter: tuple[str, ...] = field(
        default=DRAFTER_FAMILIES,
        metadata=option(
            "--drafter", "drafter families to check (default: all)", nargs="+", choices=DRAFTER_FAMILIES, metavar="F"
        ),
    )
    context: int = field(
        default=DEFAULT_CONTEXT,
        metadata=option(
            "--context",
            "tokens cached before a step, where a row does not say (default %(default)s)",
            type=int,
            metavar="S",
        ),
    )
    gpu: list[str] | None = field(default=None, metadata=shared(options.gpu, many=True, default="every device's rows"))
    regime: str = field(
        default="row",
        metadata=option(
            "--regime",
            "row: each row in its harness's launch regime (default); full: every row as the full step",
            choices=("row", "full"),
        ),
    )
    host_dispatch: Path | None = field(
        default=None,
        metadata=option(
            "--host-dispatch",
            "the host's cost per op for eager rows (python -m profilers.host_dispatch's JSON; default: the newest "
            "shipped GPU check's)",
            type=Path,
            metavar="FILE",
        ),
    )
    csv: Path | None = field(default=None, metadata=shared(options.csv, what="every predicted row", default=None))


def build_parser() -> Parser:
    p = Parser(prog="python -m perfmodel.published_check", description=__doc__.split("\n\n")[0])
    add_options(p, PublishedCheckOptions)
    return p


def newest_host_dispatch() -> Path:
    """The newest shipped (or this user's) GPU host's measured cost per op: a GPU check's."""
    found = sorted(
        (path for root in measurement_roots() for path in root.glob(f"*/gpu-check-*/{HOST_FILE}")),
        key=lambda path: path.parent.name,
    )
    if not found:
        raise PerfkitError(
            f"no GPU host's cost per op is stored (*/gpu-check-*/{HOST_FILE}); give --host-dispatch FILE "
            "(python -m profilers.host_dispatch on the GPU's host writes one)"
        )
    return found[-1]


def shown(path: Path) -> str:
    """A host file as the output names it: from its device's folder where it is stored (the same
    on every clone), else as given."""
    for root in measurement_roots():
        if path.resolve().is_relative_to(root.resolve()):
            return str(path.resolve().relative_to(root.resolve()))
    return str(path)


def regime_steps(host: HostCosts):
    """A StepMaker (perfmodel.planning.published_prediction): an eager row's step as the
    reference decoder's eager step at `host`'s cost per op, its attention run as the row's
    method ran it (its harness's plain decoding: SDPA), any other the full step. One traced
    step per model, device and attention code, so the rows of one target share its traces (its
    SDPA plain step is every row's baseline)."""
    made: dict[tuple, dict] = {}

    def make(deployment, launch: str, code: AttentionCode = AttentionCode.SDPA) -> dict:
        if launch != Launch.EAGER:
            return full_steps(deployment, launch, code)
        key = (deployment.model, deployment.view.spec.key, deployment.dtype, deployment.tp, deployment.latency, code)
        if key not in made:
            made[key] = point_steps(deployment, [StepFlavor.TRACED], regime=Launch.EAGER, host=host, attention=code)
        return made[key]

    return make


def main(argv: list[str] | None = None) -> int:
    args = read_options(PublishedCheckOptions, build_parser().parse_args(argv))
    rows = read_published()
    rows = rows[rows["drafter"].isin(args.drafter)]
    if args.gpu:
        rows = rows[rows["device"].isin({find_spec(name).key for name in args.gpu})]
    reasons = rows.apply(unpriced_reason, axis=1)
    priced = rows[reasons.isna()]
    make = full_steps
    if args.regime == "row" and (priced["launch"] == Launch.EAGER).any():
        host_file = args.host_dispatch or newest_host_dispatch()
        host = HostCosts.from_json(host_file)
        make = regime_steps(host)
        print(f"eager rows: the reference decoder's eager step, {shown(host_file)}: {host.label()}")
        own = priced[(priced["launch"] == Launch.EAGER) & (priced["model_code"] != "")]
        if len(own):
            print(
                f"  {len(own)} of them ran the method's own model code (model_code): its step traced with its "
                f"attention as that code runs it ({', '.join(sorted(set(own['model_code'])))}), the baseline with "
                "the harness's plain decoding's (sdpa)"
            )
    # disable=None: a bar on a terminal, nothing in logs and pipes (an eager row traces its steps)
    rows_priced = tqdm(priced.iterrows(), total=len(priced), desc="rows", unit="row", disable=None, file=sys.stderr)
    predictions = pd.DataFrame([predict_row(r, args.context, make) for _, r in rows_priced], index=priced.index)
    table = pd.concat([priced, predictions], axis=1) if len(priced) else priced.assign(predicted_speedup=[])
    table["error"] = table["predicted_speedup"] / table["speedup"] - 1
    table = unpriced_time(table) if len(table) else table
    regime = "each in its harness's regime" if args.regime == "row" else "as the full step"
    print(
        f"{len(rows)} published measurement(s) of speculative decoding ({PUBLISHED.name}); {len(table)} predicted from "
        f"their own accepted length, {regime}, at context {args.context} (measured: each source's own plain "
        "decoding as the baseline):"
    )
    for r in table.itertuples():
        print(
            f"  {r.gpu} -> {r.device} {r.step}, {r.model}, {r.drafter} {r.tokens_verified} tokens, batch {r.batch}, "
            f"accepted {r.accept_length:g}: measured {r.speedup:.2f}x, predicted {r.predicted_speedup:.2f}x "
            f"({r.error:+.0%}) [{r.source_title.split(' (')[0]}, {r.source_date}]"
        )
    for priced_as in dict.fromkeys(table["priced_as"]):
        print(f"  priced as: {priced_as}")
    for family, part in table.groupby("drafter"):
        per_pass = part["unpriced_per_pass_ms"].mean()
        where = "" if pd.isna(per_pass) else f", {per_pass:.2f} ms per draft pass or step"
        share = (part["unpriced_ms"] / part["plain_step_ms"]).mean()
        print(
            f"  mean |error| {family}: {part['error'].abs().mean():.1%} over {len(part)} row(s); the measured steps "
            f"imply {part['unpriced_ms'].mean():+.2f} ms a step ({share:+.0%} of the plain step) beyond the "
            f"prediction{where}"
        )

    left = reasons.dropna().value_counts()
    if len(left):
        print(f"  not predicted: {', '.join(f'{n} ({why})' for why, n in left.items())}")
    if args.csv:
        write_csv(table, args.csv)
        print(f"csv: {args.csv} ({len(table)} rows)")
    return 0
