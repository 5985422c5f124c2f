"""Vidur's compute profiles as measured data-contract rows (python -m profilers.imports vidur).

Vidur (github.com/microsoft/vidur, MIT licence) ships per-layer operator latencies measured
on A100 and H100 GPUs: `data/profiling/compute/<device>/<model>/mlp.csv`, one row per
(model shapes, num_tokens, num_tensor_parallel_workers), times in milliseconds as
`time_stats.<op>.{min,max,mean,median,std}` over repeated runs. Each (profile row, op)
becomes one measured row of the data contract:

- point: phase prefill, batch 1, seq_len = num_tokens, candidates 1. Every op imported is
  either a GEMM against a weight or elementwise work over the token rows, so its time
  depends on the token count (batch x tokens per sequence) alone, not on how the tokens
  are split into sequences or phases; prefill with one sequence is the point that has
  exactly num_tokens tokens. (Attention is not in these files.)
- model: one tensor-parallel shard, `ModelConfig.shard(tp)` of the profile's shapes, named
  `<model>@tp<tp>` (the model itself at tp 1), with the shard's shapes as extra columns;
  flops and bytes come from perfmodel.models.operators, so imported and predicted rows are costed
  by the one operator table. num_layers is not in the profile and is set to 1: every op
  imported is per layer (or the embedding), and none of their costs depends on it.
- time_s: the median over Vidur's repeats; noise: std / median of the same repeats (the
  profile's own statistics: its runs are not kept, so the IQR / median that our sweeps
  report cannot be computed). Times (and intensity, TFLOP/s) keep 6 significant digits,
  noise 6 decimals; Vidur's timer reads whole microseconds, so the smallest ops' times
  (a few us) are coarser than that anyway.
- device: --gpu, which must be the device the file was measured on when its path says
  (the folder above the model: Vidur's `a100` is the A100 80GB SXM, `h100` the H100 80GB
  SXM). A path that names no Vidur device (a copied excerpt) is taken to be from --gpu,
  and the summary line says so.

Where what Vidur timed differs from our op: its embedding is vocabulary-parallel (each
device holds vocab/tp rows, maps the token ids outside its range to row 0 and zeroes
their output rows), while shard() keeps the embedding whole. Our `embed` counts the rows
gathered, not the table, so its flops and bytes are those of Vidur's gather, but at tp > 1
the time also holds the masking; the vocab_size column is the whole vocabulary, as in
shard(). `add` is one of a layer's two residual adds (Vidur times the one after the MLP),
so it is one `residual`. Vidur's per-shard QKV width is checked against shard()'s when
importing (checked_shard; they differ where tp exceeds the KV heads, which Vidur never
profiles); o, gate_up and down split the same way in both, or shard() refuses the tp.

Some (num_tokens, tp) points are profiled twice (Vidur's token ranges overlap at their
ends). Both are kept, told apart by the extra columns `profile_row` (the row's 0-based
index among the file's data rows) and `repeat` (0 for a point's first row, 1 for the next):
rows with repeat 0 are unique on the data-contract key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.base.errors import PerfkitError
from perfmodel.hardware.specs import find_spec
from perfmodel.measured.contract import ContractPoint, contract_fields, significant
from perfmodel.measured.vidur import (
    SHAPE_COLUMNS,
    UNGATED_OPS,
    VIDUR_COMMIT,
    VIDUR_DEVICES,
    VIDUR_OPS,
    profiled_ops,
    read_profile,
    seconds_and_noise,
)
from perfmodel.models.config import ModelConfig
from perfmodel.models.operators import cost_of, op_kernels

MODEL_COLUMNS = [c for c in SHAPE_COLUMNS if c not in ("num_tokens", "num_tensor_parallel_workers")]
# Beyond the data contract: the shard's own shapes.
SHARD_COLUMNS = ["hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "head_dim", "vocab_size", "tp"]
DTYPE = "fp16"  # Vidur profiles in half precision throughout
PHASE = "prefill"
NOISE_DECIMALS = 6


@dataclass(frozen=True)
class ProfileOrigin:
    """What a profile's path says: the model, the Vidur device folder (None when the path
    names none), and the file's path under Vidur's data/profiling/ that a run id cites."""

    model: str
    vidur_device: str | None
    cited: str


@dataclass(frozen=True)
class Imported:
    """One profile's rows, and what the summary line says about them."""

    path: Path
    rows: pd.DataFrame
    profile_rows: int
    repeated: int  # profile rows that repeat an earlier row's point
    device_from_path: bool

    def summary(self) -> str:
        rows = self.rows
        ops = " ".join(dict.fromkeys(rows["op"]))
        tps = ",".join(map(str, sorted(rows["tp"].unique())))
        where = "" if self.device_from_path else f" (its path names no device: taken to be {rows['device'].iloc[0]})"
        return (
            f"{self.path}: {len(rows)} rows from {self.profile_rows} profile rows ({self.repeated} repeated points), "
            f"ops {ops}, tokens {rows['seq_len'].min()}-{rows['seq_len'].max()}, tp {tps}{where}"
        )


def profile_origin(path: Path) -> ProfileOrigin:
    """Model and device from the path: Vidur's own layout `<device>/<model>/mlp.csv`, or
    the flattened `<device>/<model>.mlp.csv`. Either way a run id cites the file where it
    is in Vidur's repository (under data/profiling/), so the commit and the path find it;
    a file whose path names no Vidur device is cited by its name."""
    upstream = path.name == "mlp.csv"
    model_dir = path.parent if upstream else path
    model = model_dir.name if upstream else path.name.removesuffix(".csv").removesuffix(".mlp")
    device = model_dir.parent.name if model_dir.parent.name in VIDUR_DEVICES else None
    cited = f"compute/{device}/{model}/mlp.csv" if device else path.name
    return ProfileOrigin(model, device, cited)


def device_key(name: str) -> str:
    """The hw_specs key of --gpu (a name or alias resolves to its key)."""
    return find_spec(name).key


def check_device(origin: ProfileOrigin, key: str, path: Path) -> None:
    if origin.vidur_device is not None and VIDUR_DEVICES[origin.vidur_device] != key:
        raise PerfkitError(
            f"{path} is a profile of Vidur's {origin.vidur_device!r} device ({VIDUR_DEVICES[origin.vidur_device]}), "
            f"not of --gpu {key}"
        )


def run_id_of(origin: ProfileOrigin, commit: str = VIDUR_COMMIT) -> str:
    return f"vidur@{commit[:7]}:{origin.cited}"


def check_commit(commit: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{7,40}", commit):
        raise PerfkitError(f"--commit must be a git commit (7 to 40 hex digits), got {commit!r}")
    return commit


def base_model(name: str, shapes: dict) -> ModelConfig:
    """The whole model a profile row describes (one layer: see the module docstring)."""
    hidden, heads = int(shapes["n_embd"]), int(shapes["n_head"])
    if heads < 1 or hidden % heads:
        raise PerfkitError(f"{name}: n_embd ({hidden}) is not a multiple of n_head ({heads})")
    return ModelConfig(
        name=name,
        hidden_size=hidden,
        intermediate_size=int(shapes["n_expanded_embd"]),
        num_heads=heads,
        num_kv_heads=int(shapes["n_kv_head"]),
        num_layers=1,
        vocab_size=int(shapes["vocab_size"]),
        head_dim=hidden // heads,
    )


def vidur_qkv_width(model: ModelConfig, tp: int) -> int:
    """Vidur's per-shard QKV width: a ColumnParallelLinear of (n + 2 n_kv) x head_dim outputs
    split tp ways (it asserts that tp divides the KV heads, so it never replicates them)."""
    return (model.num_heads + 2 * model.num_kv_heads) * model.head_dim // tp


def checked_shard(model: ModelConfig, tp: int) -> ModelConfig:
    """model.shard(tp), checked against the shapes Vidur measured: a difference is an error,
    since the row's costs would describe another GEMM than the one timed."""
    shard = model.shard(tp)
    ours = (shard.num_heads + 2 * shard.num_kv_heads) * shard.head_dim
    if ours != vidur_qkv_width(model, tp) or model.num_kv_heads % tp:
        raise PerfkitError(
            f"{model.name} at tp={tp}: our shard's QKV width is {ours}, Vidur's {vidur_qkv_width(model, tp)} "
            f"({model.num_kv_heads} KV heads over {tp} devices)"
        )
    return shard


def op_rows(
    df: pd.DataFrame, vidur_op: str, op: str, shard: ModelConfig, device: str, run_id: str, path: Path
) -> pd.DataFrame:
    """The rows of one op over the profile rows `df`, all of one shard."""
    median = df[f"time_stats.{vidur_op}.median"].to_numpy(dtype=float)
    bad = ~(median > 0)
    if bad.any():
        row = df.index[bad][0]
        raise PerfkitError(f"{path}: time_stats.{vidur_op}.median is {median[bad][0]} in data row {row}; need > 0")
    tokens = df["num_tokens"].to_numpy(dtype=np.int64)
    cost = cost_of(op_kernels(op, PHASE, shard, 1, tokens, 1), DTYPE)
    time_s, noise = seconds_and_noise(median, df[f"time_stats.{vidur_op}.std"].to_numpy(dtype=float))
    point = ContractPoint(device, shard.name, DTYPE, op, PHASE, 1, tokens)
    fields = contract_fields(point, cost, time_s, "measured", noise, run_id)
    rows = pd.DataFrame(fields, index=df.index)
    for column in ("intensity", "time_s", "tflops"):
        rows[column] = significant(rows[column])
    # Repeats that all read the same time have a std of float rounding error (1e-16 or so): 0.
    rows["noise"] = rows["noise"].round(NOISE_DECIMALS)
    return rows


def shard_columns(shard: ModelConfig, tp: int) -> dict:
    return {
        "hidden_size": shard.hidden_size,
        "intermediate_size": shard.intermediate_size,
        "num_heads": shard.num_heads,
        "num_kv_heads": shard.num_kv_heads,
        "head_dim": shard.head_dim,
        "vocab_size": shard.vocab_size,
        "tp": tp,
    }


def import_vidur(path: str | Path, device: str, run_id: str | None = None, commit: str = VIDUR_COMMIT) -> Imported:
    """The data-contract rows of one Vidur mlp.csv measured on `device` (a hw_specs key)."""
    path = Path(path)
    key = device_key(device)
    origin = profile_origin(path)
    check_device(origin, key, path)
    df = read_profile(path)
    ops = profiled_ops(df, path)
    df = df.assign(profile_row=np.arange(len(df)))
    df["repeat"] = df.groupby([*MODEL_COLUMNS, "num_tokens", "num_tensor_parallel_workers"]).cumcount()
    run_id = run_id or run_id_of(origin, check_commit(commit))
    parts = []
    for (*values, tp), group in df.groupby([*MODEL_COLUMNS, "num_tensor_parallel_workers"], sort=True):
        shapes = dict(zip(MODEL_COLUMNS, values))
        shard = checked_shard(base_model(origin.model, shapes), int(tp))
        names = VIDUR_OPS if bool(shapes["use_gated_mlp"]) else UNGATED_OPS
        group = group.sort_values(["num_tokens", "repeat"], kind="stable")
        for vidur_op in ops:
            if names[vidur_op] is not None:
                rows = op_rows(group, vidur_op, names[vidur_op], shard, key, run_id, path)
                extra = shard_columns(shard, int(tp))
                parts.append(rows.assign(**extra, profile_row=group["profile_row"], repeat=group["repeat"]))
    rows = pd.concat(parts, ignore_index=True)
    return Imported(path, rows, len(df), int((df["repeat"] > 0).sum()), origin.vidur_device is not None)
