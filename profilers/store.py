"""Writing measurements: an append-only journal per sweep, and its run metadata. Where
stored measurements live and how they are read is `perfmodel.measured.store`.

A sweep appends each finished row to a CSV at once (flushed and fsynced), so a sweep
killed at any moment keeps every finished row; on rerun the rows already there are
skipped. A kill in the middle of writing a line leaves a torn last line, which is cut
off when the journal is opened again; a damaged line elsewhere is left in the file but
out of the rows, and said so. One sweep at a time writes a file: a second one into the
same file stops at once (`output_lock`), instead of measuring every point again beside
the first. Parquet output is written from the journal when the sweep completes. Run
metadata (device, versions, ceilings, timer settings) sits in FILE.meta.json, keyed by
the run id every row carries.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd

from perfmodel.base import output_locks
from perfmodel.base.errors import PerfkitError
from perfmodel.measured.contract import COLUMNS, KEY_COLUMNS, plural, read_csv_lines, warn
from perfmodel.measured.store import meta_path, read_meta

# Beyond the data contract: how each row was measured, and the device's state around it.
EXTRA_COLUMNS = [
    "status",
    "reason",
    "mode",
    "reps",
    "threads",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "power_w",
    "temp_c",
    "throttle",
    "cpu_mhz",
]
ROW_COLUMNS = COLUMNS + EXTRA_COLUMNS


def journal_path(out: Path) -> Path:
    return out if out.suffix == ".csv" else out.with_name(out.name + ".journal.csv")


def _row_key(row, columns=KEY_COLUMNS) -> tuple:
    return tuple(str(row[c]) for c in columns)


@contextmanager
def output_lock(out: str | Path) -> Iterator[Path]:
    """Hold `out`'s lock (FILE.lock beside it, perfmodel.base.output_locks.output_lock) for a whole
    sweep: a second sweep into the same file is refused at once rather than left waiting
    behind a sweep of hours."""
    with output_locks.output_lock(out, "sweep") as path:
        yield path


class Journal:
    """The rows of one sweep output file, appendable one at a time. `log` hears what was
    left out when the file was opened (a torn last row, damaged lines, repeated points).
    `extra_columns`: columns after ROW_COLUMNS that are part of a row's identity, for rows
    whose point is more than the contract's (a GEMM grid's n and k)."""

    def __init__(self, out: str | Path, log=warn, extra_columns: tuple[str, ...] = ()):
        self.out = Path(out)
        self.columns = ROW_COLUMNS + list(extra_columns)
        self.key_columns = KEY_COLUMNS + list(extra_columns)
        if self.out.suffix not in (".csv", ".parquet"):
            raise PerfkitError(f"--out {self.out}: use a .csv or .parquet file name")
        self.path = journal_path(self.out)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._repair(log)
        rows, notes = self._read()
        for note in notes:
            log(note)
        self.done = {_row_key(r, self.key_columns) for r in rows.to_dict("records")}

    def _repair(self, log) -> None:
        if not self.path.exists() or self.path.stat().st_size == 0:
            self.path.write_text(",".join(self.columns) + "\n")
            return
        data = self.path.read_bytes()
        if not data.endswith(b"\n"):  # killed mid-line: drop the partial row
            with self.path.open("r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)
            line = data.count(b"\n") + 1
            log(
                f"{self.path}: cut off its last line {line}, a row left half-written (a killed "
                "sweep); that point is measured again"
            )
        header = data.split(b"\n", 1)[0].decode(errors="replace").rstrip("\r")
        if header.split(",") != self.columns:
            raise PerfkitError(
                f"{self.path} has other columns than a sweep writes ({header[:80]}...); choose another --out"
            )

    def _read(self) -> tuple[pd.DataFrame, list[str]]:
        """The journal's rows, one per point (the last where a point repeats), and what was
        left out of them."""
        rows, unread = read_csv_lines(self.path, "sweep journal")
        notes = (
            [f"{self.path}: left out {'; '.join(unread.reasons())}; those points are measured again"]
            if len(unread)
            else []
        )
        repeated = rows.duplicated(self.key_columns, keep="last") if len(rows) else pd.Series(dtype=bool)
        if repeated.any():
            notes.append(
                f"{self.path}: {plural(int(repeated.sum()), 'row')} repeat an earlier row's point (line "
                f"{rows.index[repeated][0]}, ...): the last row of each point counts"
            )
            rows = rows[~repeated.to_numpy()]
        return rows.reset_index(drop=True), notes

    def rows(self) -> pd.DataFrame:
        if self.path.exists():
            return self._read()[0]
        return pd.read_parquet(self.out) if self.out.exists() else pd.DataFrame(columns=self.columns)

    def has(self, key: tuple) -> bool:
        return tuple(str(k) for k in key) in self.done

    def append(self, row: dict) -> None:
        missing = [c for c in self.columns if c not in row]
        if missing:
            raise ValueError(f"row lacks {missing}")
        with self.path.open("a", newline="") as f:
            csv.writer(f).writerow(["" if row[c] is None else row[c] for c in self.columns])
            f.flush()
            os.fsync(f.fileno())
        self.done.add(_row_key(row, self.key_columns))

    def finish(self) -> Path:
        """Write the final file (Parquet from the journal); a CSV journal is already final."""
        if self.out.suffix == ".parquet":
            self.rows().to_parquet(self.out, index=False)
        return self.out


def write_meta(out: Path, meta: dict) -> None:
    path = meta_path(Path(out))
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(meta, indent=1, sort_keys=True, default=str))
    tmp.replace(path)  # atomic: a kill never leaves half a metadata file


def record_run(out: Path, run_id: str, info: dict) -> None:
    meta = read_meta(out)
    meta.setdefault("runs", {})[run_id] = info
    write_meta(out, meta)
