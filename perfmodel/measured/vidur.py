"""The one reader of Vidur's files (github.com/microsoft/vidur, MIT licence), as published
and as shipped here converted.

- compute profiles, `data/profiling/compute/<device>/<model>/mlp.csv`: per-layer operator
  times (read_profile; profilers.import_vidur turns them into data-contract rows);
- network profiles, `data/profiling/network/<topology>/all_reduce.csv`: all-reduce times
  (import_vidur_all_reduce), shipped converted as
  `profilers/measurements/<device>/imported/all_reduce-*.csv` (provenance and the
  regeneration command: profilers/measurements/IMPORTED-ALLREDUCE.md), which
  perfmodel.latency.allreduce interpolates.

Their converted format (TABLE_COLUMNS) is also that of aiconfigurator's NCCL tables
(perfmodel.measured.aiconfigurator); read_table reads either.

Vidur's times are `time_stats.<op>.<stat>` over repeated runs, in milliseconds: a time is
the median, its noise std / median of the same runs (seconds_and_noise).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.base.errors import PerfkitError
from perfmodel.measured.store import MEASUREMENTS_DIR

VIDUR_COMMIT = "7d47513363ec447a741ac5e47241580b47724fbf"
# Vidur's profiling folder names, and the hw_specs keys of the machines they name.
VIDUR_DEVICES = {"a100": "a100-sxm", "h100": "h100-sxm"}

# --- compute profiles ---------------------------------------------------------------------

# Vidur's op -> ours; None: known, not imported. post_attention_layernorm is the same RMSNorm
# kernel over the same (num_tokens, hidden) tensor as input_layernorm (the two times' ratio
# is 1 at the median over the rows of every shipped file), so a second `norm` row would
# measure the same point twice; `norm` comes from input_layernorm alone.
VIDUR_OPS: dict[str, str | None] = {
    "attn_pre_proj": "qkv",
    "attn_post_proj": "o",
    "mlp_up_proj": "gate_up",
    "mlp_down_proj": "down",
    "mlp_act": "act",
    "input_layernorm": "norm",
    "post_attention_layernorm": None,
    "attn_rope": "rope",
    "add": "residual",
    "emb": "embed",
}
# Without a gated MLP Vidur's up projection is hidden -> intermediate (our `up`) and its
# activation a GELU, which our table has no op for.
UNGATED_OPS = {**VIDUR_OPS, "mlp_up_proj": "up", "mlp_act": None}
STATS = ("min", "max", "mean", "median", "std")
SHAPE_COLUMNS = (
    "n_head",
    "n_kv_head",
    "n_embd",
    "n_expanded_embd",
    "vocab_size",
    "use_gated_mlp",
    "num_tokens",
    "num_tensor_parallel_workers",
)
STAT_COLUMN = re.compile(r"time_stats\.(?P<op>.+)\.(?P<stat>[^.]+)")

# --- network (all-reduce) profiles and the shipped tables converted from them -------------

TABLE_COLUMNS = ["topology", "num_workers", "devices_per_node", "bytes", "time_s", "noise", "run_id"]
ALL_REDUCE_COLUMNS = (
    "time_stats.all_reduce.median",
    "time_stats.all_reduce.std",
    "rank",
    "num_workers",
    "size",
    "devices_per_node",
)

# Measured tables shipped per device key: our topology name -> Vidur's network folder name.
# Vidur's "a100"/"h100" network profiles belong to its A100/H100 node types; which cards the
# pairwise node held Vidur does not say (see IMPORTED-ALLREDUCE.md).
SHIPPED_TABLES = {
    "a100-sxm": {"dgx": "a100_dgx", "pairwise_nvlink": "a100_pairwise_nvlink"},
    "h100-sxm": {"dgx": "h100_dgx", "pairwise_nvlink": "h100_pairwise_nvlink"},
}


def read_csv(path: Path, what: str) -> pd.DataFrame:
    """A CSV file; one line naming the file where it cannot be read."""
    try:
        return pd.read_csv(path)
    except pd.errors.EmptyDataError:
        raise PerfkitError(f"{what} {path} is empty") from None
    except (OSError, ValueError) as exc:
        raise PerfkitError(f"cannot read {what} {path}: {exc}") from None


def with_columns(table: pd.DataFrame, columns, path: Path, what: str) -> pd.DataFrame:
    """`table` if it holds `columns`; one line naming the file otherwise."""
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise PerfkitError(f"{path}: not a {what}, missing column(s) {', '.join(missing)}")
    return table


def read_csv_with(path: Path, columns, what: str) -> pd.DataFrame:
    """A CSV that must hold `columns`; one line naming the file otherwise."""
    return with_columns(read_csv(path, what), columns, path, what)


def seconds_and_noise(median_ms, std_ms):
    """Vidur's median and std of one op's runs (ms) as seconds and noise (std / median)."""
    return median_ms / 1e3, std_ms / median_ms


def read_profile(path: Path) -> pd.DataFrame:
    """A Vidur mlp.csv, its columns checked: every one a shape column or the statistic of
    a known op, and every shape column there. An unknown column is an error rather than
    left out, so an op Vidur adds is never silently dropped."""
    if not path.is_file():
        raise PerfkitError(f"profile {path} does not exist")
    df = read_csv(path, "profile")
    if df.empty:
        raise PerfkitError(f"profile {path} is empty (a header and no rows)")
    for column in df.columns:
        match = STAT_COLUMN.fullmatch(column)
        known = match and match["op"] in VIDUR_OPS and match["stat"] in STATS
        if not known and column not in SHAPE_COLUMNS:
            raise PerfkitError(
                f"{path}: unknown column {column!r}; known: time_stats.<op>.<{'|'.join(STATS)}> for op in "
                f"{', '.join(VIDUR_OPS)}, and {', '.join(SHAPE_COLUMNS)}"
            )
    missing = [c for c in SHAPE_COLUMNS if c not in df.columns]
    if missing:
        raise PerfkitError(
            f"{path}: missing shape column(s) {', '.join(missing)}; a profile has {', '.join(SHAPE_COLUMNS)}"
        )
    return df


def profiled_ops(df: pd.DataFrame, path: Path) -> list[str]:
    """The Vidur ops a profile times, in its column order; each needs its median and std."""
    ops = list(dict.fromkeys(m["op"] for m in map(STAT_COLUMN.fullmatch, df.columns) if m))
    for op in ops:
        for stat in ("median", "std"):
            if f"time_stats.{op}.{stat}" not in df.columns:
                raise PerfkitError(f"{path}: op {op} has no column time_stats.{op}.{stat}")
    return ops


def import_vidur_all_reduce(path: str | Path, topology: str) -> pd.DataFrame:
    """Vidur's `network/<topology>/all_reduce.csv` as a compact table (TABLE_COLUMNS).

    Vidur's `size` column is in bytes: its profiler allocates `size` fp16 elements and
    records `size * 2` ("# bytes", vidur/profiling/collectives/collectives_wrapper.py), and
    its predictor turns it into tokens as size / hidden / 2. (Read as elements, the H100
    tables would move more than NVLink's 450 GB/s per direction.) Times are the median of
    Vidur's runs in ms; noise is std / median of the same runs.

    Vidur keeps only rank 0's row (`gpu_id == 0` in vidur/profiling/collectives/main.py),
    so the shipped tables have one rank. Should a file hold several, the slowest rank is
    kept: an all-reduce ends when its slowest rank ends. Repeated rows of one rank (the
    16 MiB size appears twice, at the seam of two of Vidur's size ranges) are measurements
    of the same thing: their median is kept, with the larger noise.
    """
    path = Path(path)
    raw = read_csv_with(path, ALL_REDUCE_COLUMNS, "Vidur all-reduce table")
    if "collective" in raw.columns and set(raw["collective"]) != {"all_reduce"}:
        raise PerfkitError(f"{path}: expected only all_reduce rows, got {sorted(set(raw['collective']))}")
    median = raw["time_stats.all_reduce.median"].astype(float)
    if not (np.isfinite(median) & (median > 0)).all():
        raise PerfkitError(f"{path}: every time_stats.all_reduce.median must be a positive number of ms")
    # A std Vidur left empty (a single run) is no spread measured: noise 0.
    time_s, noise = seconds_and_noise(median, raw["time_stats.all_reduce.std"].astype(float).fillna(0.0))
    rows = pd.DataFrame(
        {
            "num_workers": raw["num_workers"].astype(int),
            "devices_per_node": raw["devices_per_node"].astype(int),
            "bytes": raw["size"].astype(int),
            "rank": raw["rank"].astype(int),
            "time_s": time_s,
            "noise": noise,
        }
    )
    keys = ["num_workers", "devices_per_node", "bytes"]
    per_rank = rows.groupby([*keys, "rank"], as_index=False).agg(time_s=("time_s", "median"), noise=("noise", "max"))
    table = per_rank.groupby(keys, as_index=False).agg(time_s=("time_s", "max"), noise=("noise", "max"))
    table.insert(0, "topology", topology)
    table["run_id"] = f"vidur@{VIDUR_COMMIT[:7]}:network/{topology}/all_reduce.csv"
    return table.sort_values(keys, ignore_index=True)[TABLE_COLUMNS]


def table_path(device_key: str, topology: str) -> Path:
    """Where the shipped table of a device and topology ('dgx', 'pairwise_nvlink') lives."""
    return MEASUREMENTS_DIR / device_key / "imported" / f"all_reduce-{SHIPPED_TABLES[device_key][topology]}.csv"


def read_table(path: str | Path) -> pd.DataFrame:
    """An all-reduce table in the shipped format (TABLE_COLUMNS): Vidur's, converted to CSV
    here, or aiconfigurator's NCCL tables, kept as parquet by perfmodel.measured.aiconfigurator
    (`<device>/aiconfigurator/nccl-<version>/all_reduce.parquet`). One reader for both, so
    both are checked alike: the columns, and positive times, sizes and GPU counts."""
    path, what = Path(path), "all-reduce table"
    if path.suffix == ".parquet":
        try:
            frame = pd.read_parquet(path)
        except (OSError, ValueError, ImportError) as exc:  # pyarrow's errors derive from these
            raise PerfkitError(f"cannot read {what} {path}: {exc}") from None
        table = with_columns(frame, TABLE_COLUMNS, path, what)
    else:
        table = read_csv_with(path, TABLE_COLUMNS, what)
    for column in ("num_workers", "devices_per_node", "bytes", "time_s"):
        values = pd.to_numeric(table[column], errors="coerce")
        if not (np.isfinite(values) & (values > 0)).all():
            raise PerfkitError(f"{path}: every {column} of an all-reduce table must be a positive number")
    return table
