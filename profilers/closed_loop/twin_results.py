"""The twin closed loop's runs as the Markdown tables of its results page: the speedup
tables of profilers.closed_loop.results, then where each step's time goes by kernel class.

    python -m profilers.closed_loop.twin_results RUN1.csv RUN2.csv > tables.md

Each RUN.csv is what `python -m perfmodel.validate --weights dummy --csv RUN.csv` wrote; its
per-class table is read from beside it (classes_path).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from perfmodel.base.errors import PerfkitError
from perfmodel.cli import Parser, run
from profilers.closed_loop.results import tables
from profilers.closed_loop.twin_print import classes_path


def read_classes(paths: list[Path]) -> list[pd.DataFrame]:
    for path in paths:
        if not classes_path(path).is_file():
            raise PerfkitError(f"{classes_path(path)}: no such file (a twin run's -classes.csv, beside its --csv)")
    return [pd.read_csv(classes_path(p)) for p in paths]


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


def build_parser() -> Parser:
    p = Parser(prog="python -m profilers.closed_loop.twin_results", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, metavar="RUN.csv", help="twin runs, in order")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    text = tables(args.runs)  # says first which run file is missing
    classes = read_classes(args.runs)
    print(text)
    for name, table in zip((p.stem for p in args.runs), classes):
        print(f"{name}, ms per step by kernel class with the largest tree, measured by torch.profiler / predicted:\n")
        print(class_table(table) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
