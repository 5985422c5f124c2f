"""A GPU campaign's measurements as a software stack of their own: `torch-<version>`.

The campaign (python -m profilers.campaign) times this project's operators with its own
harness and torch's kernels: cuBLAS GEMMs through torch.mm, and attention through torch's
scaled_dot_product_attention, the tree step with its mask. The reference decoder runs those
kernels, not an engine's, so its own predictions (the traced step, the closed loop, the twin)
rest on them; the engines' tables (aiconfigurator's) price engines. A stack folder holds the
campaign's rows in the engines' table format (perfmodel.measured.aiconfigurator), so one
reader serves both, plus the tree step an engine table has no table for:

- `gemm.parquet`: the GEMM stage's single GEMMs and every linear-op row of the model sweeps,
  as (m, n, k) GEMMs;
- `generation_attention.parquet`, `context_attention.parquet`: the sweeps' fused attention
  (`sdpa`) rows in decode and prefill;
- `tree_attention.parquet`: the tree step's masked sdpa, q_len candidates over kv_len tokens.

Every row keeps the timer's mode (CUDA events or a CUDA graph) and the clock-event (throttle)
reasons seen around it. `python -m profilers.imports campaign FOLDER [CHECK...]` writes the
folder under profilers/measurements/<device>/torch/torch-<version>/ with a provenance.json
naming the campaign, machine and software. A later GPU check of the same device and torch
(`--stage gpu-check`, its own folder) is folded in after the campaign: a point both timed
keeps the check's CUDA-graph timing, which holds no launch gaps.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.base.errors import PerfkitError
from perfmodel.base.outputs import replaced_atomically
from perfmodel.hardware.ceilings import Ceilings, judging_ceilings
from perfmodel.measured.aiconfigurator import TORCH_ENGINE, TORCH_FOLDER
from perfmodel.measured.contract import significant
from perfmodel.measured.store import measured_rows, read_meta
from perfmodel.models.config import load_model
from perfmodel.models.operators import LINEAR_OPS, Phase, op_kernels, query_len
from profilers.sweeper import FAR_ABOVE_FLOOR, GRAPH_BELOW_S

KERNEL_SOURCE = {"gemm": "torch.mm (cuBLAS)", "attention": "torch scaled_dot_product_attention"}
KEPT = ["mode", "throttle"]  # provenance columns kept beside each table's own


@dataclass(frozen=True)
class CampaignStack:
    """A campaign's rows as stack tables, with what they came from."""

    device: str
    torch_version: str
    tables: dict[str, pd.DataFrame]
    provenance: dict

    @property
    def name(self) -> str:
        return f"{TORCH_ENGINE}-{self.torch_version.split('+')[0]}"

    def write(self, measurements: Path) -> Path:
        """The stack's folder under `measurements` (<device>/torch/<name>/), replaced whole."""
        folder = measurements / self.device / TORCH_FOLDER / self.name
        folder.mkdir(parents=True, exist_ok=True)
        for name, frame in self.tables.items():
            with replaced_atomically(folder / f"{name}.parquet") as staged:
                frame.to_parquet(staged, index=False)
        with replaced_atomically(folder / "provenance.json") as staged:
            staged.write_text(json.dumps(self.provenance, indent=1, sort_keys=True) + "\n")
        return folder


def _sweeps(folder: Path, kind: str) -> list[Path]:
    """The campaign's model sweeps of `kind` (linear, attention), the GPU check's (check/) too."""
    return sorted(folder.glob(f"*-{kind}.csv")) + sorted(folder.glob(f"check/*-{kind}.csv"))


def _run(path: Path) -> dict:
    runs = read_meta(path)["runs"]
    if not runs:
        raise PerfkitError(f"{path}: no run metadata beside it ({path.name}.meta.json)")
    return runs[max(runs)]  # run ids sort by time


def _trusted(rows: pd.DataFrame, path: Path, dropped: list[int]) -> pd.DataFrame:
    """The rows a fit may rest on: those timed in a CUDA graph, and CUDA-event timings over
    50 us and within FAR_ABOVE_FLOOR of their floor at the run's measured ceilings (the
    datasheet's where the run measured none). The others
    hold launch gaps between an op's kernels, not its work (profilers.sweeper re-times such
    rows in a graph now; older campaigns did so under 50 us only): they are left out and
    counted in `dropped`, for the GPU check to measure again."""
    run = _run(path)
    judged_by = judging_ceilings(run.get("ceilings"), run.get("device", {}).get("spec_key"))  # the sweeper's rule
    if not judged_by or "mode" not in rows:
        return rows
    limits = Ceilings.from_dict(judged_by)
    flops, moved = rows["flops"].to_numpy(dtype=float), rows["bytes"].to_numpy(dtype=float)
    floor = np.empty(len(rows))
    for dtype, where in rows.groupby("dtype").indices.items():
        floor[where] = limits.floor_seconds(flops[where], moved[where], str(dtype))
    seconds = rows["time_s"].to_numpy(dtype=float)
    suspect = (rows["mode"] == "cuda-events").to_numpy() & (
        (seconds < GRAPH_BELOW_S) | (seconds > FAR_ABOVE_FLOOR * floor)
    )
    dropped.append(int(suspect.sum()))
    return rows[~suspect]


def _linear_gemms(rows: pd.DataFrame) -> pd.DataFrame:
    """A model sweep's linear-op rows as (m, n, k) GEMMs."""
    model = load_model(str(rows["model"].iloc[0]))
    out = []
    for (op, phase), part in rows[rows["op"].isin(LINEAR_OPS)].groupby(["op", "phase"]):
        (matmul,) = op_kernels(op, phase, model, 1, 1, 1)
        tokens = part["batch"].to_numpy() * np.array(
            [query_len(phase, s, q) for s, q in zip(part["seq_len"], part["candidates"])]
        )
        out.append(part.assign(m=tokens, n=matmul.n, k=matmul.k))
    return pd.concat(out, ignore_index=True) if out else rows.iloc[:0].assign(m=[], n=[], k=[])


def _gemm_table(folders: list[Path], device: str, dropped: list[int]) -> pd.DataFrame:
    frames = []
    for folder in folders:
        for path in _sweeps(folder, "linear"):
            frames.append(_linear_gemms(_trusted(measured_rows(path, device), path, dropped)))
        for path in sorted((folder / "gemm").glob("gemm-*.csv")):
            rows = _trusted(measured_rows(path, device), path, dropped)
            frames.append(rows.assign(m=rows["batch"] * rows["seq_len"]))
    if not frames:
        raise PerfkitError(f"{folders[0]}: no linear sweeps (*-linear.csv) or GEMM grid (gemm/gemm-*.csv) to import")
    rows = pd.concat(frames, ignore_index=True)
    return _table(rows, ["m", "n", "k"], "gemm")


def _table(rows: pd.DataFrame, shape: list[str], kind: str) -> pd.DataFrame:
    """Rows as one stack table: its shape columns (integers), dtype, kernel source and time,
    and the provenance columns (KEPT)."""
    frame = rows.assign(kernel_source=KERNEL_SOURCE[kind], time_s=significant(rows["time_s"].to_numpy(dtype=float)))
    for column in KEPT:
        frame[column] = frame[column].astype("string").fillna("").astype(str) if column in frame else ""
    frame = frame[[*shape, "dtype", "kernel_source", "time_s", *KEPT]].astype(dict.fromkeys(shape, np.int64))
    # A point timed twice (a campaign and a later GPU check): the CUDA graph's timing, which
    # holds no launch gaps, else the later one.
    frame = frame.assign(_graph=frame["mode"] == "cuda-graph").iloc[::-1]
    frame = frame.sort_values("_graph", ascending=False, kind="stable").drop_duplicates([*shape, "dtype"])
    return frame.drop(columns="_graph").sort_index().reset_index(drop=True)


def _attention_tables(folders: list[Path], device: str, dropped: list[int]) -> dict[str, pd.DataFrame]:
    frames = []
    for path in (p for folder in folders for p in _sweeps(folder, "attention")):
        rows = measured_rows(path, device)
        rows = _trusted(rows[rows["op"] == "sdpa"], path, dropped)
        if not len(rows):
            continue
        model = load_model(str(rows["model"].iloc[0]))
        frames.append(
            rows.assign(
                kv_len=rows["seq_len"],
                q_len=[query_len(p, s, q) for p, s, q in zip(rows["phase"], rows["seq_len"], rows["candidates"])],
                num_heads=model.num_heads,
                num_kv_heads=model.num_kv_heads,
                head_dim=model.head_dim,
            )
        )
    if not frames:
        raise PerfkitError(f"{folders[0]}: no attention sweeps (*-attention.csv) with sdpa rows to import")
    rows = pd.concat(frames, ignore_index=True)
    shape = ["batch", "kv_len", "num_heads", "num_kv_heads", "head_dim"]
    tree = rows[(rows["phase"] == Phase.TREE) & (rows["q_len"] > 1)]
    return {
        "generation_attention": _table(rows[rows["phase"] == Phase.DECODE], shape, "attention"),
        "context_attention": _table(rows[rows["phase"] == Phase.PREFILL], shape, "attention"),
        "tree_attention": _table(tree, ["q_len", *shape], "attention"),
    }


def _campaign_run(folder: Path) -> dict:
    """A campaign folder's run metadata (of its first sweep), refused where it is no GPU campaign."""
    if not (folder / "campaign.json").is_file():
        raise PerfkitError(
            f"{folder}: not a campaign folder (no campaign.json); give python -m profilers.campaign's --out"
        )
    sweeps = _sweeps(folder, "attention") + _sweeps(folder, "linear")
    if not sweeps:
        raise PerfkitError(f"{folder}: no model sweeps (*-linear.csv, *-attention.csv) in it")
    run = _run(sweeps[0])
    if run["device"].get("kind") != "cuda":
        raise PerfkitError(f"{folder}: measured on {run['device'].get('kind')!r}; a torch stack is of a GPU's kernels")
    return run


MACHINE_KEYS = ("name", "driver", "cuda", "python", "torch", "power_limit_w", "uuid")


def campaign_stack(folder: str | Path, *checks: str | Path) -> CampaignStack:
    """The torch stack of one campaign folder (its model sweeps, GEMM grid and run metadata),
    with the sweeps of later GPU checks of the same device and torch (`checks`) folded in."""
    folders = [Path(folder), *map(Path, checks)]
    runs = [_campaign_run(f) for f in folders]
    run, infos = runs[0], [r["device"] for r in runs]
    info = infos[0]
    device = info["key"]
    for other, seen in zip(folders[1:], infos[1:]):
        if (seen["key"], seen["torch"]) != (device, info["torch"]):
            raise PerfkitError(
                f"{other}: measured on {seen['key']} with torch {seen['torch']}, the campaign {folders[0]} on {device} "
                f"with torch {info['torch']}; a stack is one device's kernels under one torch"
            )
    gemm_dropped, attention_dropped = [], []
    tables = {
        "gemm": _gemm_table(folders, device, gemm_dropped),
        **_attention_tables(folders, device, attention_dropped),
    }

    def named(f: Path, paths) -> list[str]:
        return [str(p.relative_to(f)) if f is folders[0] else f"{f.name}/{p.relative_to(f)}" for p in paths]

    provenance = {
        "engine": TORCH_ENGINE,
        "version": info["torch"],
        "package": "medusa-perfkit " + ", ".join(f.name for f in folders),
        "system": device,
        "licence": "this project's own measurements (the repository's licence)",
        "machine": {k: info.get(k) for k in MACHINE_KEYS},
        "timer_mode": run.get("timer_mode", ""),
        "tables": {
            "gemm": [p for f in folders for p in named(f, [*_sweeps(f, "linear"), *(f / "gemm").glob("*.csv")])],
            "attention": [p for f in folders for p in named(f, _sweeps(f, "attention"))],
        },
        "rows": {name: len(frame) for name, frame in tables.items()},
        "left_out": {
            "gemm": sum(gemm_dropped),
            "attention": sum(attention_dropped),
            "why": f"timed with CUDA events at under {GRAPH_BELOW_S * 1e6:.0f} us or over {FAR_ABOVE_FLOOR:g}x their "
            "floor at the run's measured ceilings (the datasheet's where it measured none): launch gaps, not work; "
            "the GPU check re-times them in CUDA graphs",
        },
    }
    if checks:
        provenance["checks"] = {f.name: {k: i.get(k) for k in MACHINE_KEYS} for f, i in zip(folders[1:], infos[1:])}
    return CampaignStack(device, info["torch"], tables, provenance)
