"""All-reduce times from measured tables: NCCL's, Vidur's, the engines' own and this toolkit's
(perfmodel.latency.allreduce's module doc lists them), each table's curves per worker count and
the MeasuredAllReduce that interpolates them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.base.errors import PerfkitError
from perfmodel.latency.allreduce_ring import as_result, checked_inputs
from perfmodel.measured.aiconfigurator import ShippedStack, shipped_stacks, version_key
from perfmodel.measured.collectives import (
    BACKEND_ORDER,
    STACK_PREFIX,
    MeasuredCollective,
    collective_table,
    measured_collectives,
)
from perfmodel.measured.evidence import DeviceEvidence
from perfmodel.measured.vidur import SHIPPED_TABLES, read_table, table_path

TOPOLOGY_TEXT = {
    "dgx": "8-GPU DGX node, NVSwitch",
    "pairwise_nvlink": "4-GPU node, NVLink within pairs, PCIe between them",
}
NCCL, VIDUR = "nccl", "vidur"  # the stacks; nccl-<version> names one NCCL version, torch-<backend> our own
ENGINE_TABLE = "custom_all_reduce"  # an engine stack's own all-reduce, in its folder
# Each engine's all-reduce as the package timed it (vLLM and SGLang: their custom all-reduce
# kernel replayed from a CUDA graph, as decoding runs it; TensorRT-LLM: its AllReduce op).
ENGINE_NAMES = {
    "vllm": "vLLM {} custom all-reduce (CUDA-graph kernel)",
    "sglang": "SGLang {} custom all-reduce (CUDA-graph kernel)",
    "trtllm": "TensorRT-LLM {} AllReduce op",
}


def measure_command(ranks: int, device: str = "cpu") -> str:
    """The command that measures all-reduces over `ranks` processes on this machine's `device`."""
    return f"python -m profilers.allreduce --device {device} --ranks {ranks}"


def _top_octave_slope(sizes: np.ndarray, times: np.ndarray) -> float:
    """Seconds per byte beyond the table: a least-squares line over its top octave of sizes.

    Not the last two points: Vidur's largest sizes are 128 KiB apart at 64 MiB (0.2%), so
    their slope is measurement noise (it can come out negative)."""
    top = sizes >= sizes[-1] / 2
    slope = np.polyfit(sizes[top], times[top], 1)[0] if top.sum() >= 2 else 0.0
    return slope if slope > 0 else times[-1] / sizes[-1]


Curve = tuple[np.ndarray, np.ndarray, float]  # sizes (bytes), times (s), slope beyond the largest size


def table_curves(table: pd.DataFrame, what: str) -> dict[int, Curve]:
    """A table's single-node rows (devices_per_node == num_workers: tensor parallelism stays
    in a node) as one curve per worker count. Repeated rows of one size (NCCL's older
    aiconfigurator tables hold two runs) are measurements of the same thing: their median."""
    rows = table[table["devices_per_node"] == table["num_workers"]]
    if rows.empty:
        raise PerfkitError(f"{what}: no single-node rows (devices_per_node == num_workers)")
    curves = {}
    for workers, group in rows.groupby("num_workers"):
        group = group.groupby("bytes", as_index=False)["time_s"].median().sort_values("bytes")
        sizes = group["bytes"].to_numpy(dtype=float)
        times = group["time_s"].to_numpy(dtype=float)
        curves[int(workers)] = (sizes, times, _top_octave_slope(sizes, times))
    return curves


@dataclass(frozen=True)
class MeasuredTable:
    """One all-reduce table of a device: which stack measured it, and where it is."""

    stack: str  # vidur, nccl-<version>, or torch-<backend>
    topology: str  # Vidur's node (dgx, pairwise_nvlink); for NCCL the aiconfigurator system; ours: the device
    path: Path
    origin: str  # what a label says it is
    unit: str = "GPUs"  # what its workers are, as a label counts them
    collective: MeasuredCollective | None = None  # our own rows: which of the file's curves

    @classmethod
    def own(cls, collective: MeasuredCollective) -> MeasuredTable:
        unit = "GPUs" if collective.backend == NCCL else "ranks"
        return cls(collective.stack, collective.device, collective.path, collective.origin(), unit, collective)

    def curves(self) -> dict[int, Curve]:
        if self.collective is None:
            return _curves(self.path)
        # Keyed by the file's state too: a rerun of the profiler in this process adds rows.
        return _own_curves(self.collective, self.path.stat().st_mtime_ns)


Device = str | DeviceEvidence  # a device's evidence, or its key (a CPU's too: cpu-...)


def device_stacks(device: Device) -> tuple[str, list[ShippedStack]]:
    """A device's key and shipped stacks: its evidence's, or those stored under a key."""
    if isinstance(device, DeviceEvidence):
        return device.key, list(device.stacks)
    return device, shipped_stacks(device)


def measured_tables(device: Device) -> list[MeasuredTable]:
    """The device's shipped all-reduce tables: Vidur's (DGX first), NCCL's (oldest version
    first), then the engines' own (engine_tables)."""
    device_key, stacks = device_stacks(device)
    out = []
    for topology, name in SHIPPED_TABLES.get(device_key, {}).items():
        origin = f"Vidur {name} table ({TOPOLOGY_TEXT[topology]})"
        out.append(MeasuredTable(VIDUR, topology, table_path(device_key, topology), origin))
    nccl = sorted((s for s in stacks if s.has("all_reduce")), key=lambda s: version_key(s.version))
    for shipped in nccl:
        system = shipped.provenance.get("system", device_key)
        origin = f"NCCL {shipped.version} all_reduce_perf (nccl-tests) on {system}, from {shipped.package}"
        out.append(MeasuredTable(shipped.stack, system, shipped.folder / "all_reduce.parquet", origin))
    return out + engine_tables(device)


def engine_tables(device: Device) -> list[MeasuredTable]:
    """The engines' own all-reduce tables shipped in their stacks' folders, one per stack."""
    _, stacks = device_stacks(device)
    return [engine_table(s) for s in stacks if s.engine in ENGINE_NAMES and s.has(ENGINE_TABLE)]


def engine_table(shipped: ShippedStack) -> MeasuredTable:
    system = shipped.provenance.get("system", shipped.device)
    measured = shipped.provenance.get("tables", {}).get(ENGINE_TABLE, "").rsplit("/", 1)[-1] or shipped.version
    origin = f"{ENGINE_NAMES[shipped.engine].format(measured)} on {system}, from {shipped.package}"
    return MeasuredTable(shipped.stack, system, shipped.folder / f"{ENGINE_TABLE}.parquet", origin)


def engine_all_reduce_stack(device: Device, stack: str | None) -> str | None:
    """The all-reduce stack of an engine stack (`vllm`, `trtllm-1.3.0rc20`, ...): its own
    all-reduce table where the device has one, else None (the device's default collective)."""
    if not stack:
        return None
    names = [t.stack for t in engine_tables(device)]
    matches = [n for n in names if n == stack or n.split("-")[0] == stack]
    return matches[0] if matches else None


def stack_names(device: Device) -> list[str]:
    """The all-reduce stacks a device was measured in: our own torch-<backend> (nccl's first),
    nccl and each nccl-<version>, the engines' own (<engine>-<version>), vidur."""
    device_key, _ = device_stacks(device)
    tables = measured_tables(device)
    nccl = [t.stack for t in tables if t.stack.startswith(NCCL + "-")]
    engines = [t.stack for t in tables if t.stack.split("-")[0] in ENGINE_NAMES]
    return (
        own_stacks(device_key)
        + ([NCCL, *nccl] if nccl else [])
        + engines
        + ([VIDUR] if device_key in SHIPPED_TABLES else [])
    )


@functools.lru_cache(maxsize=None)
def _curves(path: Path) -> dict[int, Curve]:
    return table_curves(read_table(path), str(path))


@functools.lru_cache(maxsize=64)
def _own_curves(collective: MeasuredCollective, mtime_ns: int) -> dict[int, Curve]:
    return table_curves(collective_table(collective), str(collective.path))


def _backend_rank(backend: str) -> tuple[int, str]:
    return (BACKEND_ORDER.index(backend) if backend in BACKEND_ORDER else len(BACKEND_ORDER), backend)


def own_stacks(device_key: str) -> list[str]:
    """The torch-<backend> stacks of the device's own measurements, nccl's first."""
    backends = sorted({c.backend for c in measured_collectives(device_key)}, key=_backend_rank)
    return [STACK_PREFIX + b for b in backends]


def own_tables(device_key: str, stack: str | None = None, dtype: str | None = None) -> dict[int, MeasuredTable]:
    """Per worker count, the device's own measurement that times it: nccl's before gloo's,
    then rows of `dtype` (the activations') before others, then the user's before the shipped."""
    found = [c for c in measured_collectives(device_key) if stack in (None, c.stack)]
    found.sort(key=lambda c: (_backend_rank(c.backend), dtype is not None and c.dtype != dtype))
    chosen: dict[int, MeasuredTable] = {}
    for collective in found:  # a stable sort: the user's files stay before the shipped
        chosen.setdefault(collective.workers, MeasuredTable.own(collective))
    return chosen


def _size_text(nbytes: float) -> str:
    for unit, scale in (("MiB", 1024**2), ("KiB", 1024)):
        if nbytes >= scale:
            return f"{nbytes / scale:.4g} {unit}"
    return f"{nbytes:g} B"


@dataclass(frozen=True, eq=False)
class MeasuredAllReduce:
    """Interpolation in measured tables, one curve per worker count (each from one table).

    Between measured sizes: linear in log(bytes) -> log(time), so exact at every measured
    point and monotone between neighbours. Beyond the largest size: linear in bytes from the
    last point with the top octave's slope (all-reduce time grows linearly with bytes once
    bandwidth-bound). Below the smallest size: the smallest size's time (latency-bound).
    Worker counts the tables lack are an error listing the measured ones, not a silent
    switch to the model: ask for topology='ring' to get the model (or, where only our own
    measurements time it, measure that count).
    """

    label: str
    curves: dict[int, Curve]
    tables: dict[int, MeasuredTable]  # worker count -> the table its curve comes from
    kind: str = "measured"

    @classmethod
    def of(cls, tables: dict[int, MeasuredTable]) -> MeasuredAllReduce:
        """The curve of each worker count from the table given for it; the label names every
        table, with the counts each one times."""
        tables = dict(sorted(tables.items()))
        curves = {w: t.curves()[w] for w, t in tables.items()}
        return cls(cls.describe(tables, curves), curves, tables)

    @staticmethod
    def describe(tables: dict[int, MeasuredTable], curves: dict[int, Curve]) -> str:
        by_origin: dict[tuple[str, str], list[int]] = {}
        for workers, table in tables.items():
            by_origin.setdefault((table.origin, table.unit), []).append(workers)
        tables = " and ".join(f"{o}, {'/'.join(map(str, w))} {unit}" for (o, unit), w in by_origin.items())
        low = min(c[0][0] for c in curves.values())
        high = max(c[0][-1] for c in curves.values())
        return (
            f"measured: {tables}, {_size_text(low)}-{_size_text(high)}; log-log interpolation, linear in bytes "
            "above the largest size, the smallest size's time below it"
        )

    @property
    def workers(self) -> tuple[int, ...]:
        return tuple(sorted(self.curves))

    def label_for(self, workers: int) -> str:
        """The label of the one table that times all-reduces over `workers` GPUs."""
        if workers not in self.curves:
            return self.label
        return self.describe({workers: self.tables[workers]}, {workers: self.curves[workers]})

    def time(self, nbytes, workers):
        """Seconds per all-reduce of `nbytes` per GPU over `workers` GPUs (arrays allowed)."""
        b, n = checked_inputs(nbytes, workers)
        out = np.zeros(b.shape)
        for w in np.unique(n):
            if w == 1:
                continue
            if w not in self.curves:
                own = [t.collective for t in self.tables.values() if t.collective is not None]
                hint = (
                    f"measure it: {measure_command(w, 'cuda' if own[0].backend == NCCL else 'cpu')}"
                    if len(own) == len(self.tables)
                    else "topology='ring' gives the ring model"
                )
                unit = self.tables[self.workers[0]].unit
                raise PerfkitError(
                    f"no measured all-reduce over {w} {unit} in {self.label.split(';')[0]}; measured worker counts: "
                    f"{', '.join(map(str, self.workers))} ({hint})"
                )
            mask = (n == w) & (b > 0)
            out[mask] = _interpolate(*self.curves[w], b[mask])
        return as_result(out)


def _interpolate(sizes: np.ndarray, times: np.ndarray, slope: float, b: np.ndarray) -> np.ndarray:
    i = np.clip(np.searchsorted(sizes, b, side="right") - 1, 0, len(sizes) - 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        f = (np.log(b) - np.log(sizes[i])) / (np.log(sizes[i + 1]) - np.log(sizes[i]))
        out = times[i] * (times[i + 1] / times[i]) ** f
    hit = np.searchsorted(sizes, b).clip(max=len(sizes) - 1)
    out = np.where(sizes[hit] == b, times[hit], out)  # measured points exactly
    out = np.where(b < sizes[0], times[0], out)
    return np.where(b > sizes[-1], times[-1] + slope * (b - sizes[-1]), out)


def vidur_tables(device: Device, topology: str = "dgx") -> dict[int, MeasuredTable]:
    device_key, _ = device_stacks(device)
    table = next((t for t in measured_tables(device) if t.stack == VIDUR and t.topology == topology), None)
    if table is None:
        raise PerfkitError(f"no Vidur {topology} all-reduce table for {device_key}")
    return dict.fromkeys(_curves(table.path), table)


def nccl_tables(device: Device, stack: str = NCCL) -> dict[int, MeasuredTable]:
    device_key, _ = device_stacks(device)
    chosen: dict[int, MeasuredTable] = {}
    for table in measured_tables(device):  # oldest first: a newer version overwrites
        if table.stack.startswith(NCCL + "-") and stack in (NCCL, table.stack):
            chosen.update(dict.fromkeys(_curves(table.path), table))
    if not chosen:
        raise PerfkitError(f"no {stack} all-reduce table for {device_key}")
    return chosen


def measured_source(device: Device, topology: str = "dgx") -> MeasuredAllReduce:
    """Vidur's shipped table of a device and topology, ready to interpolate."""
    return MeasuredAllReduce.of(vidur_tables(device, topology))


def nccl_source(device: Device, stack: str = NCCL) -> MeasuredAllReduce:
    """The device's NCCL tables: `nccl-<version>` that version's; `nccl` for each worker count
    the newest version that measured it (a later NCCL release is what a deployment runs)."""
    return MeasuredAllReduce.of(nccl_tables(device, stack))
