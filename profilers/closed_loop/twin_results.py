"""The twin closed loop's runs as the Markdown tables of its results page: the speedup
tables of profilers.closed_loop.results, then where each step's time goes by kernel class.

    python -m profilers.closed_loop.twin_results RUN1.csv RUN2.csv > tables.md

Each RUN.csv is what `python -m perfmodel.validate --weights dummy --csv RUN.csv` wrote; its
per-class table is read from beside it (classes_path).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from perfmodel.cli import Parser, run
from perfmodel.cli.fields import POSITIONAL, add_options, option, read_options
from profilers.closed_loop.capture import WARMUP_COLUMN
from profilers.closed_loop.results import read_runs, tables
from profilers.closed_loop.twin_print import WARMUP_NOTE, classes_path


def read_classes(path: Path) -> pd.DataFrame | None:
    """A run's per-class table; None where the run profiled none (the GPU check's twin stages
    time steps only: a profiled pass costs minutes of a short lease)."""
    return pd.read_csv(classes_path(path)) if classes_path(path).is_file() else None


def class_table(classes: pd.DataFrame) -> str:
    """ms per step by kernel class of the largest tree: measured by torch.profiler / replayed."""
    largest = classes[classes["tree_size"] == classes["tree_size"].max()]
    kinds = list(dict.fromkeys(largest["kernel_class"]))
    lines = ["| batch | " + " | ".join(kinds) + " |", "|---" * (len(kinds) + 1) + "|"]
    for batch, rows in largest.groupby("batch"):
        cells = rows.set_index("kernel_class")
        lines.append(
            f"| {batch} | "
            + " | ".join(
                f"{cells.loc[k, 'measured_s'] * 1e3:.1f} / {cells.loc[k, 'predicted_s'] * 1e3:.1f}" for k in kinds
            )
            + " |"
        )
    return "\n".join(lines)


def warmup_table(run: pd.DataFrame) -> str:
    """ms each setting spent warming up before it was timed (the twin's warmup_s)."""
    lines = ["| batch | tree | warm-up ms |", "|---|---|---|"]
    lines += [f"| {b} | {n} | {s * 1e3:.1f} |" for b, n, s in zip(run["batch"], run["tree_size"], run[WARMUP_COLUMN])]
    return "\n".join(lines)


@dataclass(frozen=True)
class TwinResultsOptions:
    """The command's one argument (perfmodel.cli.fields)."""

    runs: tuple[Path, ...] = field(
        default=(),
        metadata=option(POSITIONAL, "twin runs, in order", nargs="+", type=Path, metavar="RUN.csv"),
    )


def build_parser() -> Parser:
    p = Parser(prog="python -m profilers.closed_loop.twin_results", description=__doc__.split("\n\n")[0])
    add_options(p, TwinResultsOptions)
    return p


def main(argv: list[str] | None = None) -> int:
    args = read_options(TwinResultsOptions, build_parser().parse_args(argv))
    text = tables(args.runs)  # says first which run file is missing
    print(text)
    for path, table in zip(args.runs, read_runs(args.runs)):
        if WARMUP_COLUMN in table:  # runs from before the column timed any warm-up inside their steps
            print(f"{path.stem}, {WARMUP_NOTE}:\n\n{warmup_table(table)}\n")
    for path in args.runs:
        classes = read_classes(path)
        if classes is None:
            print(f"{path.stem}: kernel classes not profiled in this run (no {classes_path(path).name} beside it)\n")
            continue
        what = "ms per step by kernel class with the largest tree, measured by torch.profiler / predicted"
        print(f"{path.stem}, {what}:\n")
        print(class_table(classes) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
