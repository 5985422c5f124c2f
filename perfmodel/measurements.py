"""Where stored measurements live and how they are read: sweeps (data-contract rows) with
their run metadata (`FILE.meta.json`: device, versions, ceilings), per device key, in this
user's folder and in the folder shipped with the toolkit. Writing them is the profilers'
job (`profilers.store`); reading them is everyone's, so it sits in the core.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

from perfmodel.contract import read_table
from perfmodel.errors import PerfkitError

# Shipped with the toolkit: the data files in the profilers package, read here as data only.
MEASUREMENTS_DIR = Path(__file__).resolve().parent.parent / "profilers" / "measurements"
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


def measured_rows(path: str | Path) -> pd.DataFrame:
    """The measured rows of a sweep file (CSV or Parquet), skipped configurations left out."""
    df = read_table(path)
    if "status" in df.columns:
        df = df[df["status"].fillna("ok") == "ok"]
    return df[(df["source"] == "measured") & df["time_s"].notna()].reset_index(drop=True)


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
        return Path(home).expanduser() / "measurements"
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "medusa-perfkit" / "measurements"


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


def stored_closed_loops(device_key: str, roots: list[Path] | None = None) -> list[Path]:
    """Stored perfmodel.validate CSVs of a device (<root>/<device>/closed-loop/*.csv)."""
    return [
        path
        for root in roots or measurement_roots()
        for path in sorted((root / device_key / "closed-loop").glob("*.csv"))
    ]
