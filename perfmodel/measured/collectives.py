"""All-reduces measured by this toolkit (`python -m profilers.allreduce`): where their rows
are kept and how they are read. Writing them is the profiler's job; the planner reads
them (perfmodel.latency.allreduce) as the deployment's own all-reduce times.

Rows are data-contract rows, one per (backend, dtype, ranks, message size):
op `all_reduce`, phase `collective` (a step's communication, neither prefill, decode nor
tree), model empty (an all-reduce is the device's, not a model's), batch = ranks (the
worker count), seq_len = elements per rank, candidates 1, bytes = the message per rank,
flops 0 (the sum's adds are not what it costs), and a `backend` column (gloo, nccl) after
the journal's columns. Files live under `<root>/<device key>/allreduce/*.csv` of each
measurement root, the user's home first (perfmodel.measured.store.measurement_roots).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from perfmodel.base.errors import PerfkitError
from perfmodel.measured.store import measured_rows, measurement_roots, read_meta

FOLDER = "allreduce"
OP, PHASE = "all_reduce", "collective"
BACKEND_COLUMN = "backend"
# The planner's stack names (perfmodel.latency.allreduce); NCCL first, what a GPU deployment runs.
STACK_PREFIX = "torch-"
BACKEND_ORDER = ("nccl", "gloo")


def file_name(backend: str, dtype: str, ranks: int) -> str:
    """The default file of one backend, dtype and rank count: gloo-fp32-2ranks.csv."""
    return f"{backend}-{dtype}-{ranks}ranks.csv"


def stored_files(device_key: str, roots: list[Path] | None = None) -> list[Path]:
    """A device's all-reduce measurement files, the user's before the shipped."""
    roots = roots or measurement_roots()
    return [path for root in roots for path in sorted((root / device_key / FOLDER).glob("*.csv"))]


@dataclass(frozen=True)
class MeasuredCollective:
    """One curve's worth of rows: a file's all-reduces of one backend, dtype and worker count."""

    path: Path
    device: str
    backend: str
    dtype: str
    workers: int
    runs: tuple[str, ...]  # the run ids behind the rows, oldest first

    @property
    def stack(self) -> str:
        return STACK_PREFIX + self.backend

    def origin(self) -> str:
        """What a latency label says the rows are."""
        runs = ", ".join(self.runs)
        return f"torch.distributed {self.backend} all_reduce ({self.dtype}) on {self.device}, run {runs}"


def all_reduce_rows(path: Path, device_key: str) -> pd.DataFrame:
    """A file's usable all-reduce rows (measured_rows: timed, positive integer points, the
    device's own), with the bytes and backend they need; a file without a backend column is
    another kind of file, a one-line error naming it."""
    rows = measured_rows(path, device_key)
    if BACKEND_COLUMN not in rows.columns:
        raise PerfkitError(
            f"{path}: no {BACKEND_COLUMN} column, so not rows of python -m profilers.allreduce; move it out of "
            f"{path.parent}"
        )
    rows = rows[(rows["op"] == OP) & pd.to_numeric(rows["bytes"], errors="coerce").gt(0)]
    return rows.astype({"bytes": float, BACKEND_COLUMN: str, "dtype": str})


def measured_collectives(device_key: str, roots: list[Path] | None = None) -> list[MeasuredCollective]:
    """Every (file, backend, dtype, worker count) measured on a device, the user's files first."""
    out = []
    for path in stored_files(device_key, roots):
        rows = all_reduce_rows(path, device_key)
        started = {r: info.get("started", 0) for r, info in read_meta(path).get("runs", {}).items()}
        for (backend, dtype, workers), group in rows.groupby([BACKEND_COLUMN, "dtype", "batch"]):
            runs = sorted(set(group["run_id"].astype(str)), key=lambda r: (started.get(r, 0), r))
            out.append(MeasuredCollective(path, device_key, backend, dtype, int(workers), tuple(runs)))
    return out


def collective_table(collective: MeasuredCollective) -> pd.DataFrame:
    """The rows of one MeasuredCollective in the all-reduce table shape the planner's curves
    read (perfmodel.measured.vidur.TABLE_COLUMNS: num_workers, devices_per_node, bytes,
    time_s): one process per device, all of them in one node."""
    rows = all_reduce_rows(collective.path, collective.device)
    rows = rows[
        (rows[BACKEND_COLUMN] == collective.backend)
        & (rows["dtype"] == collective.dtype)
        & (rows["batch"] == collective.workers)
    ]
    return pd.DataFrame(
        {
            "num_workers": rows["batch"],
            "devices_per_node": rows["batch"],
            "bytes": rows["bytes"],
            "time_s": rows["time_s"],
        }
    )
