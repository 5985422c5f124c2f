"""Where stored measurements live and how they are read: sweeps (data-contract rows) with
their run metadata (`FILE.meta.json`: device, versions, ceilings), per device key, in this
user's folder and in the folder shipped with the toolkit. Writing them is the profilers'
job (`profilers.store`); reading them is everyone's, so it sits in the core.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.base.errors import PerfkitError
from perfmodel.base.paths import TOOLKIT_ROOT
from perfmodel.base.provenance import Provenance
from perfmodel.hardware.specs import load_all_specs, name_index, normalize_name
from perfmodel.measured.contract import KEY_COLUMNS, plural, read_rows, warn

# Shipped with the toolkit: the data files in the profilers package, read here as data only.
MEASUREMENTS_DIR = TOOLKIT_ROOT / "profilers" / "measurements"
# Sweeps a user measures (--measure) are kept per machine under this folder, so later
# commands find them as this machine's stored measurements.
HOME_VARIABLE = "MEDUSA_PERFKIT_HOME"


def meta_path(out: Path) -> Path:
    return out.with_name(out.name + ".meta.json")


def read_meta(out: Path) -> dict:
    path = meta_path(Path(out))
    if not path.exists():
        return {"runs": {}}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise PerfkitError(f"{path}: not valid JSON ({exc.msg})") from None


# Columns that tell two rows of one point apart: imported profiles hold a model at several
# tensor-parallel shards, and repeated timings of a point (numbered by `repeat`).
IDENTITY_EXTRA = (
    "hidden_size",
    "intermediate_size",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "vocab_size",
    "tp",
    "repeat",
    "n",  # a GEMM row's weight shape (aiconfigurator's grid, the campaign's gemm stage)
    "k",
)
POINT_AXES = ("batch", "seq_len", "candidates")


def measured_rows(path: str | Path, device: str | None = None, log=warn) -> pd.DataFrame:
    """The usable measured rows of a sweep file (CSV or Parquet), one per point.

    Left out, and counted on `log` with the reason and line numbers: lines that are not
    rows, a row cut off mid-line, rows with no time, a time that is not a positive number,
    or a grid point that is not positive integers; and rows that repeat a point (two sweeps
    into one file), of which the last is kept. Skipped configurations (status skipped) are
    left out silently: they are recorded as skipped, not damaged.

    device: the device key the rows must be of (aliases of it accepted); rows of another
    device are a PerfkitError naming both. A time column without a single number is a
    PerfkitError too: that is another kind of file, not damaged rows."""
    path = Path(path)
    df, unread = read_rows(path)
    if "status" in df.columns:
        df = df[df["status"].fillna("ok") == "ok"]
    df = df[df["source"] == Provenance.MEASURED]
    if device is not None:
        check_device(df, device, path)
    df, dropped = valid_values(df, path)
    if dropped or len(unread):
        log(f"{path}: left out {'; '.join(unread.reasons() + dropped)}")
    identity = KEY_COLUMNS + [c for c in IDENTITY_EXTRA if c in df.columns]
    repeated = df.duplicated(identity, keep="last")
    if repeated.any():
        log(
            f"{path}: {plural(int(repeated.sum()), 'row')} repeat an earlier row's point ({', '.join(KEY_COLUMNS)}), "
            f"e.g. line {df.index[repeated][0]}: kept the last row of each point (were two sweeps written into one "
            "file?)"
        )
        df = df[~repeated]
    return df.reset_index(drop=True)


def same_device(name: str, device: str) -> bool:
    """Whether a row's device names `device`: its key, or a name or alias of its spec."""
    if normalize_name(name) == normalize_name(device):
        return True
    return name_index(load_all_specs()).get(normalize_name(name)) == device


def check_device(rows: pd.DataFrame, device: str, path: Path) -> None:
    names = [str(d) for d in rows["device"].dropna().unique()]
    other = [d for d in names if not same_device(d, device)]
    if other:
        count = int(rows["device"].astype(str).isin(other).sum())
        raise PerfkitError(
            f"{path}: {plural(count, 'row')} {'was' if count == 1 else 'were'} measured on {other[0]}"
            f"{' (and ' + ', '.join(other[1:]) + ')' if len(other) > 1 else ''}, not {device}: another device's "
            f"times cannot stand for {device}'s; give {device}'s measurements, or --gpu {other[0]} to show these"
        )


def valid_values(rows: pd.DataFrame, path: Path) -> tuple[pd.DataFrame, list[str]]:
    """Rows whose time is a positive finite number of seconds and whose grid point is
    positive integers (those columns made numeric), and why the others were left out."""
    raw = rows["time_s"]
    times = pd.to_numeric(raw, errors="coerce")
    text = raw.notna() & times.isna()
    if text.any() and times.notna().sum() == 0:
        line = rows.index[text][0]
        raise PerfkitError(
            f"{path}: column time_s holds no numbers (line {line}: {raw[text].iloc[0]!r}); it is seconds, e.g. 0.0012"
        )
    problems = [
        ("with a time that is not a number", "time_s", text),
        ("with no time (empty or NaN)", "time_s", raw.isna()),
        ("with a time <= 0 or infinite", "time_s", times.notna() & ((times <= 0) | ~np.isfinite(times))),
    ]
    points = {}
    for axis in POINT_AXES:
        values = pd.to_numeric(rows[axis], errors="coerce")
        points[axis] = values
        bad = values.isna() | ~np.isfinite(values) | (values < 1) | (values != values.round())
        problems.append((f"with a {axis} that is not a positive integer", axis, bad))
    reasons, drop = [], pd.Series(False, index=rows.index)
    for reason, column, mask in problems:
        mask = mask & ~drop  # each row counted once, under its first reason
        if mask.any():
            lines = rows.index[mask][:3]
            shown = ", ".join(f"{line}: {value_text(rows.at[line, column])}" for line in lines)
            reasons.append(
                f"{plural(int(mask.sum()), 'row')} {reason} (line {shown}{', ...' if mask.sum() > 3 else ''})"
            )
            drop |= mask
    kept = rows[~drop].copy()
    kept["time_s"] = times[~drop].astype(float)
    for axis in POINT_AXES:
        kept[axis] = points[axis][~drop].astype(np.int64)
    return kept, reasons


def value_text(value) -> str:
    """A cell as the file had it: text quoted, a number plain, an empty cell as nan."""
    return repr(value) if isinstance(value, str) else f"{float(value):g}"


def latest_run_with_ceilings(path: str | Path, device: str | None = None) -> dict | None:
    """The newest run in a sweep's metadata that measured ceilings (optionally for one device)."""
    runs = read_meta(Path(path)).get("runs", {})
    found = [
        r for _, r in sorted(runs.items()) if r.get("ceilings") and (device is None or r["device"]["key"] == device)
    ]
    return found[-1] if found else None


def user_measurements_dir() -> Path:
    """Where --measure keeps this machine's sweeps: $MEDUSA_PERFKIT_HOME/measurements, else
    $XDG_CACHE_HOME/medusa-perfkit/measurements (~/.cache/... by default)."""
    home = os.environ.get(HOME_VARIABLE)
    if home:
        if Path(home).expanduser().exists() and not Path(home).expanduser().is_dir():
            raise PerfkitError(f"{HOME_VARIABLE}={home} is a file, not a folder: point it at a folder, or unset it")
        return Path(home).expanduser() / "measurements"
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "medusa-perfkit" / "measurements"


def user_fits_dir() -> Path:
    """Where fitted latency parameters are remembered between runs: beside the measurements."""
    return user_measurements_dir().parent / "fits"


def measurement_roots() -> list[Path]:
    """The folders holding <device>/ sweeps: this user's measurements first, then the shipped ones."""
    return [user_measurements_dir(), MEASUREMENTS_DIR]


def stored_sweeps(device_key: str, roots: list[Path] | None = None) -> list[Path]:
    """Stored sweep files of a device (<root>/<device>/*.csv), the user's and the shipped."""
    return [path for root in roots or measurement_roots() for path in sorted((root / device_key).glob("*.csv"))]


def stored_profiles(device_key: str, roots: list[Path] | None = None) -> list[Path]:
    """Measured operator profiles imported from public sources for a device
    (<root>/<device>/imported/*.csv, all-reduce tables excepted), the user's and the shipped."""
    return [
        path
        for root in roots or measurement_roots()
        for path in sorted((root / device_key / "imported").glob("*.csv"))
        if not path.name.startswith("all_reduce")
    ]


def stored_devices(roots: list[Path] | None = None) -> list[str]:
    """Every device key with at least one stored sweep."""
    found = {
        folder.name
        for root in roots or measurement_roots()
        if root.is_dir()
        for folder in root.iterdir()
        if any(folder.glob("*.csv"))
    }
    return sorted(found)


def stored_tree_ablations(roots: list[Path] | None = None) -> list[Path]:
    """Stored decoder.ablation CSVs of every device (<root>/<device>/tree-ablation/*.csv)."""
    return [path for root in roots or measurement_roots() for path in sorted(root.glob("*/tree-ablation/*.csv"))]


# Where a device's closed loops are stored, by who drafted their trees.
CLOSED_LOOP_FOLDERS = {"medusa": "closed-loop", "eagle": "closed-loop-eagle"}


def stored_closed_loops(device_key: str, roots: list[Path] | None = None, drafter: str = "medusa") -> list[Path]:
    """Stored perfmodel.validate CSVs of a device (<root>/<device>/closed-loop/*.csv; with
    drafter="eagle", closed-loop-eagle/)."""
    if drafter not in CLOSED_LOOP_FOLDERS:
        raise PerfkitError(f"closed loops are stored for drafters {', '.join(CLOSED_LOOP_FOLDERS)}, not {drafter!r}")
    return [
        path
        for root in roots or measurement_roots()
        for path in sorted((root / device_key / CLOSED_LOOP_FOLDERS[drafter]).glob("*.csv"))
    ]
