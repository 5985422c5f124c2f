"""Where measurements live: an append-only journal per sweep, run metadata, shipped data.

A sweep appends each finished row to a CSV at once (flushed and fsynced), so a sweep
killed at any moment keeps every finished row; on rerun the rows already there are
skipped. A kill in the middle of writing a line leaves a torn last line, which is cut
off when the journal is opened again. Parquet output is written from the journal when
the sweep completes. Run metadata (device, versions, ceilings, timer settings) sits in
FILE.meta.json, keyed by the run id every row carries.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pandas as pd

from perfmodel.contract import COLUMNS, KEY_COLUMNS, read_table
from perfmodel.errors import PerfkitError

# Beyond the data contract: how each row was measured, and the device's state around it.
EXTRA_COLUMNS = [
    "status", "reason", "mode", "reps", "threads",
    "sm_clock_mhz", "mem_clock_mhz", "power_w", "temp_c", "throttle", "cpu_mhz",
]  # fmt: skip
ROW_COLUMNS = COLUMNS + EXTRA_COLUMNS
MEASUREMENTS_DIR = Path(__file__).parent / "measurements"  # shipped with the toolkit
# Sweeps a user measures (--measure) are kept per machine under this folder, so later
# commands find them as this machine's stored measurements.
HOME_VARIABLE = "MEDUSA_PERFKIT_HOME"


def journal_path(out: Path) -> Path:
    return out if out.suffix == ".csv" else out.with_name(out.name + ".journal.csv")


def meta_path(out: Path) -> Path:
    return out.with_name(out.name + ".meta.json")


def _row_key(row) -> tuple:
    return tuple(str(row[c]) for c in KEY_COLUMNS)


class Journal:
    """The rows of one sweep output file, appendable one at a time."""

    def __init__(self, out: str | Path):
        self.out = Path(out)
        if self.out.suffix not in (".csv", ".parquet"):
            raise PerfkitError(f"--out {self.out}: use a .csv or .parquet file name")
        self.path = journal_path(self.out)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._repair()
        self.done = {_row_key(r) for r in self.rows().to_dict("records")}

    def _repair(self) -> None:
        if not self.path.exists() or self.path.stat().st_size == 0:
            self.path.write_text(",".join(ROW_COLUMNS) + "\n")
            return
        data = self.path.read_bytes()
        if not data.endswith(b"\n"):  # killed mid-line: drop the partial row
            with self.path.open("r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)
        header = data.split(b"\n", 1)[0].decode()
        if header.split(",") != ROW_COLUMNS:
            raise PerfkitError(f"{self.path} has other columns than a sweep writes ({header[:80]}...); choose another --out")

    def rows(self) -> pd.DataFrame:
        if self.path.exists():
            return pd.read_csv(self.path, keep_default_na=True)
        return pd.read_parquet(self.out) if self.out.exists() else pd.DataFrame(columns=ROW_COLUMNS)

    def has(self, key: tuple) -> bool:
        return tuple(str(k) for k in key) in self.done

    def append(self, row: dict) -> None:
        missing = [c for c in ROW_COLUMNS if c not in row]
        if missing:
            raise ValueError(f"row lacks {missing}")
        with self.path.open("a", newline="") as f:
            csv.writer(f).writerow(["" if row[c] is None else row[c] for c in ROW_COLUMNS])
            f.flush()
            os.fsync(f.fileno())
        self.done.add(_row_key(row))

    def finish(self) -> Path:
        """Write the final file (Parquet from the journal); a CSV journal is already final."""
        if self.out.suffix == ".parquet":
            self.rows().to_parquet(self.out, index=False)
        return self.out


def read_meta(out: Path) -> dict:
    path = meta_path(Path(out))
    if not path.exists():
        return {"runs": {}}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise PerfkitError(f"{path}: not valid JSON ({exc.msg})") from None


def write_meta(out: Path, meta: dict) -> None:
    path = meta_path(Path(out))
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(meta, indent=1, sort_keys=True, default=str))
    tmp.replace(path)  # atomic: a kill never leaves half a metadata file


def record_run(out: Path, run_id: str, info: dict) -> None:
    meta = read_meta(out)
    meta.setdefault("runs", {})[run_id] = info
    write_meta(out, meta)


def measured_rows(path: str | Path) -> pd.DataFrame:
    """The measured rows of a sweep file (CSV or Parquet), skipped configurations left out."""
    df = read_table(path)
    if "status" in df.columns:
        df = df[df["status"].fillna("ok") == "ok"]
    return df[(df["source"] == "measured") & df["time_s"].notna()].reset_index(drop=True)


def latest_run_with_ceilings(path: str | Path, device: str | None = None) -> dict | None:
    """The newest run in a sweep's metadata that measured ceilings (optionally for one device)."""
    runs = read_meta(Path(path)).get("runs", {})
    found = [r for _, r in sorted(runs.items()) if r.get("ceilings") and (device is None or r["device"]["key"] == device)]
    return found[-1] if found else None


def user_measurements_dir() -> Path:
    """Where --measure keeps this machine's sweeps: $MEDUSA_PERFKIT_HOME/measurements, else
    $XDG_CACHE_HOME/medusa-perfkit/measurements (~/.cache/... by default)."""
    home = os.environ.get(HOME_VARIABLE)
    if home:
        return Path(home).expanduser() / "measurements"
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "medusa-perfkit" / "measurements"


def measurement_roots() -> list[Path]:
    """The folders holding <device>/ sweeps: this user's measurements first, then the shipped ones."""
    return [user_measurements_dir(), MEASUREMENTS_DIR]


def stored_sweeps(device_key: str, roots: list[Path] | None = None) -> list[Path]:
    """Stored sweep files of a device (<root>/<device>/*.csv), the user's and the shipped."""
    return [path for root in roots or measurement_roots() for path in sorted((root / device_key).glob("*.csv"))]


def stored_devices(roots: list[Path] | None = None) -> list[str]:
    """Every device key with at least one stored sweep."""
    found = {folder.name for root in roots or measurement_roots() if root.is_dir() for folder in root.iterdir() if any(folder.glob("*.csv"))}
    return sorted(found)


def stored_closed_loops(device_key: str, roots: list[Path] | None = None) -> list[Path]:
    """Stored perfmodel.validate CSVs of a device (<root>/<device>/closed-loop/*.csv)."""
    return [path for root in roots or measurement_roots() for path in sorted((root / device_key / "closed-loop").glob("*.csv"))]
