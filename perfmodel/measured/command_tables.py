"""The CSV tables a command wrote (perfmodel.validate's closed loops, decoder.ablation's
trees), read as one table with each row's file named, and checked for the columns a reader
needs."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import pandas as pd

from perfmodel.base.errors import PerfkitError


def read_command_csvs(
    paths: Iterable[str | Path],
    columns: Iterable[str],
    command: str,
    named: str = "file",
    name: Callable[[Path], str] = lambda path: path.name,
) -> pd.DataFrame:
    """The files' rows, each with name(its path) in column `named`; one line naming the file
    and `command` (what writes such tables) where one cannot be read or lacks a column. No
    files: an empty table of those columns."""
    columns = list(columns)
    frames = []
    for path in map(Path, paths):
        try:
            table = pd.read_csv(path)
        except (OSError, ValueError) as exc:
            raise PerfkitError(f"{path}: cannot read a {command} CSV ({exc})") from None
        missing = [c for c in columns if c not in table.columns]
        if missing:
            raise PerfkitError(f"{path}: not a {command} CSV (missing {', '.join(missing)})")
        frames.append(table.assign(**{named: name(path)}))
    if not frames:
        return pd.DataFrame(columns=[*columns, named])
    return pd.concat(frames, ignore_index=True)
