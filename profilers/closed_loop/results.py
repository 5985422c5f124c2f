"""A closed loop's runs as the Markdown tables of a results page: measured first, then
predicted, then the error, each cell run by run.

    python -m profilers.closed_loop.results RUN1.csv RUN2.csv > tables.md

Each RUN.csv is what `python -m perfmodel.validate --csv RUN.csv` wrote (any drafter, batch
and tree sizes; a twin's run too, whose per-kernel-class tables
`python -m profilers.closed_loop.twin_results` adds).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from perfmodel.base.errors import PerfkitError
from perfmodel.cli import Parser, run
from perfmodel.cli.fields import POSITIONAL, add_options, option, read_options
from profilers.closed_loop.config import TARGET_ERROR

KEYS = ["batch", "tree_size"]
REQUIRED = (*KEYS, "measured_step_s", "predicted_step_s", "measured_speedup", "predicted_speedup", "error")
# Tokens per sequence and step: a twin replays a record's, a real run measures its batch's.
TOKENS_COLUMNS = ("tokens_per_step", "measured_batch_acceptance")


def read_runs(paths: list[Path]) -> list[pd.DataFrame]:
    runs = []
    for path in paths:
        if not path.is_file():
            raise PerfkitError(f"{path}: no such file (a python -m perfmodel.validate --csv file)")
        table = pd.read_csv(path)
        missing = [
            c for c in ("batch", "tree_size", "measured_speedup", "predicted_speedup", "error") if c not in table
        ]
        if missing:
            raise PerfkitError(f"{path}: not a closed loop's --csv (no {', '.join(missing)} column)")
        runs.append(table)
    return runs


def joined(values, fmt: str) -> str:
    """Run by run; '-' where a run has no such point (runs of other batches side by side)."""
    return " / ".join("-" if pd.isna(v) else format(v, fmt) for v in values)


def tokens_per_step(row) -> float:
    return next(row[c] for c in TOKENS_COLUMNS if c in row.index)


def speedup_table(runs: list[pd.DataFrame]) -> str:
    """Per batch and tree: tokens per step, step ms and speedup measured then predicted, and
    the error, each cell run by run (the tokens per step of the first run)."""
    first = runs[0].set_index(KEYS)
    others = [r.set_index(KEYS).reindex(first.index) for r in runs]
    lines = [
        "| batch | tree | tokens/step | step ms measured | predicted | speedup measured | predicted | error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key in first.index:
        rows = [r.loc[key] for r in others]
        lines.append(
            f"| {key[0]} | {key[1]} | {tokens_per_step(rows[0]):.3f} "
            f"| {joined([r['measured_step_s'] * 1e3 for r in rows], '.1f')} "
            f"| {joined([r['predicted_step_s'] * 1e3 for r in rows], '.1f')} "
            f"| {joined([r['measured_speedup'] for r in rows], '.3f')} "
            f"| {joined([r['predicted_speedup'] for r in rows], '.3f')} "
            f"| {joined([r['error'] * 100 for r in rows], '+.1f')}% |"
        )
    return "\n".join(lines)


def worst(runs: list[pd.DataFrame], names: list[str]) -> str:
    """The largest |error| of each run, and whether every point is within the target."""
    parts = []
    for name, table in zip(names, runs):
        trees = table[table["tree_size"] > 1]
        row = trees.loc[trees["error"].abs().idxmax()]
        parts.append(f"{name}: {abs(row['error']) * 100:.1f}% (batch {row['batch']}, tree {row['tree_size']})")
    within = all((t["error"].abs() <= TARGET_ERROR).all() for t in runs)
    verdict = "every point within" if within else "NOT every point within"
    return f"largest |error| {'; '.join(parts)}: {verdict} the {TARGET_ERROR:.0%} target"


def tables(paths: list[Path]) -> str:
    """The page's tables for these runs, in order."""
    runs = read_runs(paths)
    names = [p.stem for p in paths]
    return f"Each cell is run by run: {' / '.join(names)}.\n\n{speedup_table(runs)}\n\n{worst(runs, names)}\n"


@dataclass(frozen=True)
class ResultsOptions:
    """The command's one argument (perfmodel.cli.fields)."""

    runs: tuple[Path, ...] = field(
        default=(),
        metadata=option(POSITIONAL, "closed-loop runs, in order", nargs="+", type=Path, metavar="RUN.csv"),
    )


def build_parser() -> Parser:
    p = Parser(prog="python -m profilers.closed_loop.results", description=__doc__.split("\n\n")[0])
    add_options(p, ResultsOptions)
    return p


def main(argv: list[str] | None = None) -> int:
    print(tables(read_options(ResultsOptions, build_parser().parse_args(argv)).runs))
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
