"""The twin closed loop's runs as the Markdown tables of its results page: measured first,
then predicted, then the error, each cell run by run.

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
from profilers.closed_loop.twin import classes_path

KEYS = ["batch", "tree_size"]


def read_runs(paths: list[Path]) -> tuple[list[pd.DataFrame], list[pd.DataFrame]]:
    for path in paths:
        for needed in (path, classes_path(path)):
            if not needed.is_file():
                raise PerfkitError(f"{needed}: no such file (a twin run's --csv and its -classes.csv beside it)")
    return [pd.read_csv(p) for p in paths], [pd.read_csv(classes_path(p)) for p in paths]


def joined(values, fmt: str) -> str:
    return " / ".join(format(v, fmt) for v in values)


def speedup_table(runs: list[pd.DataFrame]) -> str:
    """Per batch and tree: steps, step ms, overhead and speedup measured then predicted, error."""
    first = runs[0].set_index(KEYS)
    others = [r.set_index(KEYS).reindex(first.index) for r in runs]
    lines = [
        "| batch | tree | tokens/step | step ms measured | predicted | speedup measured | predicted | error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key in first.index:
        rows = [r.loc[key] for r in others]
        lines.append(
            f"| {key[0]} | {key[1]} | {rows[0]['tokens_per_step']:.3f} "
            f"| {joined([r['measured_step_s'] * 1e3 for r in rows], '.1f')} "
            f"| {joined([r['predicted_step_s'] * 1e3 for r in rows], '.1f')} "
            f"| {joined([r['measured_speedup'] for r in rows], '.3f')} "
            f"| {joined([r['predicted_speedup'] for r in rows], '.3f')} "
            f"| {joined([r['error'] * 100 for r in rows], '+.1f')}% |"
        )
    return "\n".join(lines)


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


def worst(runs: list[pd.DataFrame], names: list[str]) -> str:
    parts = []
    for name, table in zip(names, runs):
        trees = table[table["tree_size"] > 1]
        row = trees.loc[trees["error"].abs().idxmax()]
        parts.append(f"{name}: {abs(row['error']) * 100:.1f}% (batch {row['batch']}, tree {row['tree_size']})")
    return "largest |error| " + "; ".join(parts)


def build_parser() -> Parser:
    p = Parser(prog="python -m profilers.closed_loop.twin_results", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, metavar="RUN.csv", help="twin runs, in order")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    runs, classes = read_runs(args.runs)
    names = [p.stem for p in args.runs]
    print(f"Each cell is run by run: {' / '.join(names)}.\n")
    print(speedup_table(runs) + "\n")
    print(worst(runs, names) + "\n")
    for name, table in zip(names, classes):
        print(f"{name}, ms per step by kernel class with the largest tree, measured by torch.profiler / predicted:\n")
        print(class_table(table) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
