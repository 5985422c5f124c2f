"""python -m perfmodel.published_check: published measurements of speculative decoding on GPUs
(perfmodel/measured/published_speculation.csv) beside the toolkit's prediction of each from its
own stated accepted length: the measured speedup first, the predicted one and the error beside
it, the mean |error| per drafter family, and how many rows are not predicted yet and why.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from perfmodel.base.outputs import write_csv
from perfmodel.cli import Parser, options, run
from perfmodel.cli.fields import add_options, option, read_options, shared
from perfmodel.measured.published_speculation import DRAFTER_FAMILIES, PUBLISHED, read_published
from perfmodel.planning.published_prediction import DEFAULT_CONTEXT, predict_row, unpriced_reason


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
    csv: Path | None = field(default=None, metadata=shared(options.csv, what="every predicted row", default=None))


def build_parser() -> Parser:
    p = Parser(prog="python -m perfmodel.published_check", description=__doc__.split("\n\n")[0])
    add_options(p, PublishedCheckOptions)
    return p


def main(argv: list[str] | None = None) -> int:
    args = read_options(PublishedCheckOptions, build_parser().parse_args(argv))
    rows = read_published()
    rows = rows[rows["drafter"].isin(args.drafter)]
    reasons = rows.apply(unpriced_reason, axis=1)
    priced = rows[reasons.isna()]
    predictions = pd.DataFrame([predict_row(r, args.context) for _, r in priced.iterrows()], index=priced.index)
    table = pd.concat([priced, predictions], axis=1) if len(priced) else priced.assign(predicted_speedup=[])
    table["error"] = table["predicted_speedup"] / table["speedup"] - 1
    print(
        f"{len(rows)} published measurement(s) of speculative decoding ({PUBLISHED.name}); {len(table)} predicted from "
        f"their own accepted length by the full step at context {args.context} (measured: each source's own plain "
        "decoding as the baseline):"
    )
    for r in table.itertuples():
        print(
            f"  {r.gpu} -> {r.device}, {r.model}, {r.drafter} {r.tokens_verified} tokens, batch {r.batch}, accepted "
            f"{r.accept_length:g}: measured {r.speedup:.2f}x, predicted {r.predicted_speedup:.2f}x ({r.error:+.0%}) "
            f"[{r.source_title.split(' (')[0]}, {r.source_date}]"
        )
    for family, part in table.groupby("drafter"):
        print(f"  mean |error| {family}: {part['error'].abs().mean():.1%} over {len(part)} row(s)")
    if len(table):
        print(f"  how they are priced: {'; '.join(dict.fromkeys(table['priced_as']))}")
    left = reasons.dropna().value_counts()
    if len(left):
        print(f"  not predicted: {', '.join(f'{n} ({why})' for why, n in left.items())}")
    if args.csv:
        write_csv(table, args.csv)
        print(f"csv: {args.csv} ({len(table)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
