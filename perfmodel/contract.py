"""The measurement / prediction table every part of the toolkit reads and writes.

One row per (device, model, dtype, op, phase, batch, seq_len, candidates). `source` says
whether `time_s` was predicted or measured; measured rows carry their noise (IQR/median)
and a run id that links to the run's metadata.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from perfmodel.errors import PerfkitError

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
# A grid point, and a row's identity (the same point on another device is another row).
POINT_COLUMNS = ["model", "dtype", "op", "phase", "batch", "seq_len", "candidates"]
KEY_COLUMNS = ["device", *POINT_COLUMNS]


def contract_fields(
    device: str,
    model: str,
    dtype: str,
    op: str,
    phase: str,
    batch,
    seq_len,
    candidates,
    cost,
    time_s,
    source: str,
    noise=None,
    run_id: str = "",
) -> dict:
    """The data-contract fields of a row, or of many rows when the point and cost fields
    are numpy arrays; `cost` is a perfmodel.operators.OpCost; time_s None means not timed."""
    return {
        "device": device,
        "model": model,
        "dtype": dtype,
        "op": op,
        "phase": phase,
        "batch": batch,
        "seq_len": seq_len,
        "candidates": candidates,
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


def read_table(path: str | Path) -> pd.DataFrame:
    """A data-contract table from CSV or Parquet (by extension)."""
    path = Path(path)
    try:
        df = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    except FileNotFoundError:
        raise PerfkitError(f"measurement file {path} does not exist") from None
    except (OSError, ValueError, ImportError) as exc:
        raise PerfkitError(f"cannot read measurement file {path}: {exc}") from None
    return check_table(df, str(path))


def write_table(df: pd.DataFrame, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    df = check_table(df)[COLUMNS + [c for c in df.columns if c not in COLUMNS]]
    df.to_parquet(path, index=False) if path.suffix == ".parquet" else df.to_csv(path, index=False)
    return path
