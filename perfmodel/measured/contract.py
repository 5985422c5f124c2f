"""The measurement / prediction table every part of the toolkit reads and writes.

One row per (device, model, dtype, op, phase, batch, seq_len, candidates). `source` says
whether `time_s` was predicted or measured; measured rows carry their noise (IQR/median)
and a run id that links to the run's metadata.
"""

from __future__ import annotations

import csv
import io
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.base.errors import PerfkitError
from perfmodel.base.outputs import replaced_atomically

COLUMNS = [
    "device",
    "model",
    "dtype",
    "op",
    "phase",
    "batch",
    "seq_len",
    "candidates",
    "flops",
    "bytes",
    "intensity",
    "time_s",
    "tflops",
    "source",
    "noise",
    "run_id",
]
SOURCES = ("predicted", "measured")
# Digits kept of imported measured times and of the values derived from them: beyond what
# the upstream timers resolve, and what keeps shipped tables small.
SIGNIFICANT = 6
# A grid point, and a row's identity (the same point on another device is another row).
POINT_COLUMNS = ["model", "dtype", "op", "phase", "batch", "seq_len", "candidates"]
KEY_COLUMNS = ["device", *POINT_COLUMNS]
# A count of a grid point (batch, seq_len, candidates): one row's, or a column of them for many rows.
Counts = int | np.ndarray


@dataclass(frozen=True)
class ContractPoint:
    """A row's identity (KEY_COLUMNS): the device and the grid point; batch, seq_len and
    candidates may be numpy arrays, for many rows at once."""

    device: str
    model: str
    dtype: str
    op: str
    phase: str
    batch: Counts
    seq_len: Counts
    candidates: Counts = 1


def contract_fields(point: ContractPoint, cost, time_s, source: str, noise=None, run_id: str = "") -> dict:
    """The data-contract fields of a row, or of many rows when the point and cost fields
    are numpy arrays; `cost` is a perfmodel.models.operators.OpCost; time_s None means not timed."""
    return {
        **{column: getattr(point, column) for column in KEY_COLUMNS},
        "flops": cost.flops,
        "bytes": cost.bytes,
        "intensity": cost.intensity,
        "time_s": time_s,
        "tflops": None if time_s is None else cost.flops / time_s / 1e12,
        "source": source,
        "noise": noise,
        "run_id": run_id,
    }


def check_table(df: pd.DataFrame, where: str = "table") -> pd.DataFrame:
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise PerfkitError(
            f"{where}: missing column(s) {', '.join(missing)}; expected the data-contract columns {', '.join(COLUMNS)}"
        )
    bad = sorted(set(df["source"].dropna()) - set(SOURCES))
    if bad:
        raise PerfkitError(f"{where}: column 'source' has {bad[0]!r}; allowed: {', '.join(SOURCES)}")
    return df


@dataclass(frozen=True)
class Unread:
    """Lines of a CSV that are not rows: lines with another field count than the header
    (garbage, two rows run together), and a last line cut off mid-write (a killed writer)."""

    bad: tuple[int, ...] = ()  # 1-based line numbers
    cut: int | None = None

    def __len__(self) -> int:
        return len(self.bad) + (self.cut is not None)

    def reasons(self) -> list[str]:
        out = []
        if self.bad:
            shown = ", ".join(map(str, self.bad[:5])) + (", ..." if len(self.bad) > 5 else "")
            out.append(
                f"{plural(len(self.bad), 'line')} that {'is' if len(self.bad) == 1 else 'are'} not a row "
                f"(line {shown}: another field count than the header)"
            )
        if self.cut is not None:
            out.append(f"1 row cut off mid-line (line {self.cut}: a write interrupted)")
        return out


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def warn(line: str) -> None:
    """Where readers say what they left out: stderr, so a command's output stays its answer."""
    print(f"warning: {line}", file=sys.stderr)


def read_csv_lines(path: str | Path, what: str = "measurement file") -> tuple[pd.DataFrame, Unread]:
    """A CSV's rows indexed by their line number in the file, and the lines that are not
    rows (left out, never an error: the good rows of a damaged file stay usable).

    An unreadable file, a file that is not UTF-8 text, or one without a header is a
    PerfkitError naming it."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise PerfkitError(f"{what} {path} does not exist") from None
    except OSError as exc:
        raise PerfkitError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PerfkitError(f"{what} {path} is not UTF-8 text (byte {exc.start}); expected a CSV file") from None
    reader = csv.reader(io.StringIO(text))
    try:
        header = next(reader, None)
        if not header:
            raise PerfkitError(f"{what} {path} is empty; expected a header line of column names, then rows")
        kept, lines, bad, cut = io.StringIO(), [], [], None
        writer = csv.writer(kept)
        writer.writerow(header)
        start, last, torn = reader.line_num + 1, text.count("\n") + 1, not text.endswith(("\n", "\r"))
        for fields in reader:
            line, start = start, reader.line_num + 1
            if not fields:
                continue
            if len(fields) == len(header):
                writer.writerow(fields)
                lines.append(line)
            elif torn and reader.line_num == last:
                cut = line
            else:
                bad.append(line)
    except csv.Error as exc:
        raise PerfkitError(f"{what} {path}, line {reader.line_num}: not CSV ({exc})") from None
    kept.seek(0)
    df = pd.read_csv(kept) if lines else pd.DataFrame(columns=header)
    df.index = pd.Index(lines, name="line")
    return df, Unread(tuple(bad), cut)


def read_rows(path: str | Path, what: str = "measurement file") -> tuple[pd.DataFrame, Unread]:
    """A data-contract table from CSV or Parquet (by extension), its rows indexed by line
    number (a Parquet row as if it were a CSV's), and the lines of a CSV that are not rows."""
    path = Path(path)
    if path.suffix != ".parquet":
        df, unread = read_csv_lines(path, what)
        return check_table(df, str(path)), unread
    try:
        df = pd.read_parquet(path)
    except FileNotFoundError:
        raise PerfkitError(f"{what} {path} does not exist") from None
    except (OSError, ValueError, ImportError) as exc:
        raise PerfkitError(f"cannot read {what} {path}: {exc}") from None
    df.index = pd.RangeIndex(2, len(df) + 2, name="line")  # the header would be line 1
    return check_table(df, str(path)), Unread()


def read_table(path: str | Path, log=warn) -> pd.DataFrame:
    """A data-contract table from CSV or Parquet (by extension). Lines of a CSV that are
    not rows are left out, and `log` says how many and which."""
    df, unread = read_rows(path)
    if len(unread):
        log(f"{path}: left out {'; '.join(unread.reasons())}")
    return df.reset_index(drop=True)


def write_table(df: pd.DataFrame, path: str | Path) -> Path:
    """Write data-contract rows to CSV (or Parquet, by suffix), replacing the file only once
    the whole table is written: a full disk or an interruption leaves the old file whole."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    df = check_table(df)[COLUMNS + [c for c in df.columns if c not in COLUMNS]]
    with replaced_atomically(path) as temporary:
        df.to_parquet(temporary, index=False) if path.suffix == ".parquet" else df.to_csv(temporary, index=False)
    return path


def significant(values, digits: int = SIGNIFICANT):
    """Values (a Series or an array) rounded to `digits` significant digits (as text would
    write them), of the type given."""
    rounded = pd.Series(values).map(lambda x: float(f"{x:.{digits}g}"))
    return rounded if isinstance(values, pd.Series) else rounded.to_numpy()
