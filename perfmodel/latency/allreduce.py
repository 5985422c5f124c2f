"""Tensor-parallel all-reduce time: measured tables where there are some (this toolkit's
own or imported), a ring model from the spec's interconnect bandwidth elsewhere.

Imported tables (`measured_tables`, all read by perfmodel.measured.vidur.read_table), and ours:
- **nccl-<version>**: NCCL's own benchmark (nccl-tests all_reduce_perf, fp16, one node of
  2, 4 and 8 GPUs, 512 B-512 MiB) as NVIDIA's aiconfigurator-core publishes it (Apache-2.0),
  for a100-sxm, h100-sxm, h200 and l40s; shipped under
  `profilers/measurements/<device>/aiconfigurator/nccl-<version>/` (perfmodel.measured.aiconfigurator);
- **vidur**: Vidur's tables (github.com/microsoft/vidur, MIT licence), all-reduces timed
  inside PyTorch on DGX A100 / DGX H100 and on 4-GPU pairwise-NVLink nodes, shipped under
  `profilers/measurements/<device>/imported/all_reduce-*.csv` (perfmodel.measured.vidur).
- **<engine>-<version>** (vllm, sglang, trtllm): the engine's own all-reduce (vLLM's and
  SGLang's custom all-reduce kernels, TensorRT-LLM's AllReduce op), as aiconfigurator-core
  measured it inside that engine, its CUDA-graph kernel: what a decoding step of that engine
  runs for the small messages of decoding (3.6-5 us at 8192 elements on 8 H100s, where
  NCCL's all_reduce_perf takes 19 us). Shipped in the engine stack's folder
  (`<device>/aiconfigurator/<engine>-<version>/custom_all_reduce.parquet`); the step of an
  engine stack is priced with it (perfmodel.latency.tensor_parallel);
- **torch-<backend>**: this toolkit's own, `python -m profilers.allreduce` timing
  torch.distributed all_reduce (gloo on a CPU, nccl on GPUs) on the machine it runs on,
  under `<measurements>/<device>/allreduce/` (perfmodel.measured.collectives).

`all_reduce_source(device, topology, stack)` picks one: by default, for each worker count,
the device's own torch.distributed measurements where there are some (the deployment's
own stack and machine), else its NCCL tables (the newest NCCL version that measured that
count), else Vidur's DGX table; with none of these, the ring model. A CPU has no ring
model: only its own measurements time its all-reduces. Among the imported tables NCCL's
are the default because they cover every imported device with one method, and time what
a decoding step runs: back-to-back all-reduces on a stream, averaged over 100-1000 calls
and over the ranks (nccl-tests). Vidur times single eager calls after a barrier, whose
kernel time includes waiting for the other ranks: at a decoding step's message sizes
1.2-2.7x NCCL's in the median, up to 5.6x for small messages
(`python -m perfmodel.allreduce_compare` prints the ratios).

The ring model's latency and efficiency are fitted on Vidur's tables
(perfmodel.latency.allreduce_fit); `python -m perfmodel.allreduce_compare` prints the fits
and the model's error against every table.

Everything here is a pure function of its arguments and of the measured tables (the shipped
ones, NCCL tables a user imported and all-reduces measured into the measurements home).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.base.dtypes import element_bytes
from perfmodel.base.errors import PerfkitError
from perfmodel.hardware.specs import HardwareSpec, find_spec
from perfmodel.measured.aiconfigurator import ShippedStack, shipped_stacks, version_key
from perfmodel.measured.collectives import (
    BACKEND_ORDER,
    STACK_PREFIX,
    MeasuredCollective,
    collective_table,
    measured_collectives,
)
from perfmodel.measured.device_view import device_key, is_cpu_name
from perfmodel.measured.vidur import SHIPPED_TABLES, read_table, table_path
from perfmodel.models.config import ModelConfig

TOPOLOGY_TEXT = {
    "dgx": "8-GPU DGX node, NVSwitch",
    "pairwise_nvlink": "4-GPU node, NVLink within pairs, PCIe between them",
}
RING = "ring"
TOPOLOGIES = (*TOPOLOGY_TEXT, RING)
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


# Message sizes typical of decoding: batch x query tokens x hidden x 2 bytes spans about
# 8 KiB (1 token, hidden 4096) to tens of MiB (a few hundred tree tokens x batch, hidden 8192).
DECODE_BYTES = (8 * 1024, 64 * 1024**2)


@dataclass(frozen=True)
class RingConstants:
    """Fitted latency per ring step and bandwidth efficiency for one kind of link."""

    latency_s: float
    efficiency: float
    fitted_on: str


# Fitted by `python -m perfmodel.allreduce_compare --fit` (allreduce_fit: on the shipped tables,
# single-node rows, message sizes DECODE_BYTES, every row weighted by its relative error),
# rounded to 3 significant digits. tests/test_allreduce.py refits and checks them.
RING_CONSTANTS = {
    "nvlink3": RingConstants(3.37e-6, 0.476, "a100_dgx (NVSwitch), 2/4/8 GPUs, 600 GB/s"),
    "nvlink4": RingConstants(2.43e-6, 0.664, "h100_dgx (NVSwitch), 2/4/8 GPUs, 900 GB/s"),
    "pcie4": RingConstants(9.11e-6, 0.731, "a100_pairwise_nvlink, 4 GPUs, PCIe Gen4 x16 64 GB/s"),
    "pcie5": RingConstants(3.96e-6, 0.723, "h100_pairwise_nvlink, 4 GPUs, PCIe Gen5 x16 128 GB/s"),
}


# --- the two sources ------------------------------------------------------------------------


def _check_inputs(nbytes, workers) -> tuple[np.ndarray, np.ndarray]:
    """Broadcast message sizes and worker counts; bad values are a one-line error naming them."""
    try:
        b = np.asarray(nbytes, dtype=float)
    except (TypeError, ValueError):
        raise PerfkitError(f"all-reduce message size must be a number of bytes, got {nbytes!r}") from None
    bad_b = ~np.isfinite(b) | (b < 0)
    if bad_b.any():
        raise PerfkitError(f"all-reduce message size must be >= 0 bytes, got {b[bad_b].flat[0]:g}")
    w = np.asarray(workers)
    try:
        w_float = np.asarray(w, dtype=float)
    except (TypeError, ValueError):
        raise PerfkitError(f"all-reduce workers must be an integer >= 1, got {workers!r}") from None
    bad_w = ~np.isfinite(w_float) | (w_float < 1) | (w_float != np.round(w_float)) | (w.dtype == bool)
    if bad_w.any():
        raise PerfkitError(f"all-reduce workers must be an integer >= 1, got {_plain(w.flat[np.argmax(bad_w)])!r}")
    return np.broadcast_arrays(b, w_float.astype(int))


def _plain(value):
    """A numpy scalar as the Python value it holds, so messages read 2.5, not np.float64(2.5)."""
    return value.item() if isinstance(value, np.generic) else value


def _result(values: np.ndarray):
    return float(values) if values.ndim == 0 else values


def ring_all_reduce_time(nbytes, workers, link_gb_s: float, latency_s: float, efficiency: float = 1.0):
    """Seconds for a ring all-reduce of `nbytes` per GPU over `workers` GPUs (arrays allowed).

    The ring moves 2 (n-1)/n x bytes through every GPU's outgoing link (a reduce-scatter
    then an all-gather, each n-1 steps of bytes/n) and pays a latency per step:
        t = 2 (n-1)/n x bytes / (efficiency x link_gb_s / 2) + 2 (n-1) x latency_s.
    `link_gb_s` is the datasheet figure, which NVIDIA gives for both directions together
    (A100 SXM NVLink 600 GB/s = 12 links x 25 GB/s each way); a ring sends on one direction
    of each link while receiving on the other, so the rate it can use is half of it. This is
    the NCCL tests' convention: their "bus bandwidth" busbw = algbw x 2(n-1)/n (algbw =
    bytes / time) is what the ring asks of each link, compared there with the per-direction
    link speed (nccl-tests doc/PERFORMANCE.md). Hence efficiency = busbw / (link_gb_s / 2)
    in the bandwidth-bound limit. One GPU needs no communication: 0 s.
    """
    b, n = _check_inputs(nbytes, workers)
    if not (link_gb_s > 0 and latency_s >= 0 and efficiency > 0):
        raise PerfkitError(
            f"ring all-reduce needs link_gb_s > 0, latency_s >= 0, efficiency > 0; got {link_gb_s}, {latency_s}, "
            f"{efficiency}"
        )
    per_direction = efficiency * link_gb_s * 1e9 / 2
    t = 2 * (n - 1) / n * b / per_direction + 2 * (n - 1) * latency_s
    return _result(np.where((n == 1) | (b == 0), 0.0, t))


@dataclass(frozen=True)
class RingAllReduce:
    """The ring model for one device: its spec's interconnect with fitted latency/efficiency."""

    link_gb_s: float
    latency_s: float
    efficiency: float
    label: str
    kind: str = "modelled"

    @classmethod
    def for_spec(cls, spec: HardwareSpec) -> RingAllReduce:
        if spec.interconnect_gb_s is None or spec.interconnect is None:
            raise PerfkitError(
                f"{spec.key}: the spec gives no interconnect / interconnect_gb_s, so the ring all-reduce model "
                "has no bandwidth (add both fields with sources, see hw_specs/README.md)"
            )
        if spec.interconnect not in RING_CONSTANTS:
            raise PerfkitError(
                f"{spec.key}: no fitted ring constants for interconnect {spec.interconnect!r}; "
                f"known: {', '.join(RING_CONSTANTS)}"
            )
        fit = RING_CONSTANTS[spec.interconnect]
        label = (
            f"modelled: ring all-reduce over {spec.interconnect} at {spec.interconnect_gb_s:g} GB/s "
            f"(spec, both directions) / 2 per direction x efficiency {fit.efficiency:g}, "
            f"{fit.latency_s * 1e6:.3g} us per step (fitted on {fit.fitted_on})"
        )
        return cls(spec.interconnect_gb_s, fit.latency_s, fit.efficiency, label)

    def label_for(self, workers: int) -> str:
        return self.label

    def time(self, nbytes, workers):
        """Seconds per all-reduce of `nbytes` per GPU over `workers` GPUs (arrays allowed)."""
        return ring_all_reduce_time(nbytes, workers, self.link_gb_s, self.latency_s, self.efficiency)


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


def measured_tables(device_key: str) -> list[MeasuredTable]:
    """The device's shipped all-reduce tables: Vidur's (DGX first), NCCL's (oldest version
    first), then the engines' own (engine_tables)."""
    out = []
    for topology, name in SHIPPED_TABLES.get(device_key, {}).items():
        origin = f"Vidur {name} table ({TOPOLOGY_TEXT[topology]})"
        out.append(MeasuredTable(VIDUR, topology, table_path(device_key, topology), origin))
    nccl = sorted((s for s in shipped_stacks(device_key) if s.has("all_reduce")), key=lambda s: version_key(s.version))
    for shipped in nccl:
        system = shipped.provenance.get("system", device_key)
        origin = f"NCCL {shipped.version} all_reduce_perf (nccl-tests) on {system}, from {shipped.package}"
        out.append(MeasuredTable(shipped.stack, system, shipped.folder / "all_reduce.parquet", origin))
    return out + engine_tables(device_key)


def engine_tables(device_key: str) -> list[MeasuredTable]:
    """The engines' own all-reduce tables shipped in their stacks' folders, one per stack."""
    return [engine_table(s) for s in shipped_stacks(device_key) if s.engine in ENGINE_NAMES and s.has(ENGINE_TABLE)]


def engine_table(shipped: ShippedStack) -> MeasuredTable:
    system = shipped.provenance.get("system", shipped.device)
    measured = shipped.provenance.get("tables", {}).get(ENGINE_TABLE, "").rsplit("/", 1)[-1] or shipped.version
    origin = f"{ENGINE_NAMES[shipped.engine].format(measured)} on {system}, from {shipped.package}"
    return MeasuredTable(shipped.stack, system, shipped.folder / f"{ENGINE_TABLE}.parquet", origin)


def engine_all_reduce_stack(device_key: str, stack: str | None) -> str | None:
    """The all-reduce stack of an engine stack (`vllm`, `trtllm-1.3.0rc20`, ...): its own
    all-reduce table where the device has one, else None (the device's default collective)."""
    if not stack:
        return None
    names = [t.stack for t in engine_tables(device_key)]
    matches = [n for n in names if n == stack or n.split("-")[0] == stack]
    return matches[0] if matches else None


def stack_names(device_key: str) -> list[str]:
    """The all-reduce stacks a device was measured in: our own torch-<backend> (nccl's first),
    nccl and each nccl-<version>, the engines' own (<engine>-<version>), vidur."""
    tables = measured_tables(device_key)
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
        b, n = _check_inputs(nbytes, workers)
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
        return _result(out)


def _interpolate(sizes: np.ndarray, times: np.ndarray, slope: float, b: np.ndarray) -> np.ndarray:
    i = np.clip(np.searchsorted(sizes, b, side="right") - 1, 0, len(sizes) - 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        f = (np.log(b) - np.log(sizes[i])) / (np.log(sizes[i + 1]) - np.log(sizes[i]))
        out = times[i] * (times[i + 1] / times[i]) ** f
    hit = np.searchsorted(sizes, b).clip(max=len(sizes) - 1)
    out = np.where(sizes[hit] == b, times[hit], out)  # measured points exactly
    out = np.where(b < sizes[0], times[0], out)
    return np.where(b > sizes[-1], times[-1] + slope * (b - sizes[-1]), out)


def _vidur_tables(device_key: str, topology: str = "dgx") -> dict[int, MeasuredTable]:
    table = next((t for t in measured_tables(device_key) if t.stack == VIDUR and t.topology == topology), None)
    if table is None:
        raise PerfkitError(f"no Vidur {topology} all-reduce table for {device_key}")
    return dict.fromkeys(_curves(table.path), table)


def _nccl_tables(device_key: str, stack: str = NCCL) -> dict[int, MeasuredTable]:
    chosen: dict[int, MeasuredTable] = {}
    for table in measured_tables(device_key):  # oldest first: a newer version overwrites
        if table.stack.startswith(NCCL + "-") and stack in (NCCL, table.stack):
            chosen.update(dict.fromkeys(_curves(table.path), table))
    if not chosen:
        raise PerfkitError(f"no {stack} all-reduce table for {device_key}")
    return chosen


def measured_source(device_key: str, topology: str = "dgx") -> MeasuredAllReduce:
    """Vidur's shipped table of a device and topology, ready to interpolate."""
    return MeasuredAllReduce.of(_vidur_tables(device_key, topology))


def nccl_source(device_key: str, stack: str = NCCL) -> MeasuredAllReduce:
    """The device's NCCL tables: `nccl-<version>` that version's; `nccl` for each worker count
    the newest version that measured it (a later NCCL release is what a deployment runs)."""
    return MeasuredAllReduce.of(_nccl_tables(device_key, stack))


def _device(device: str | HardwareSpec) -> tuple[str, HardwareSpec | None]:
    """The device's key and spec; a CPU named `cpu` or `cpu-...` has no spec to find."""
    if isinstance(device, HardwareSpec):
        return device.key, device
    if is_cpu_name(str(device)):
        return device_key(str(device), None), None
    spec = find_spec(device)
    return spec.key, spec


def _ring(key: str, spec: HardwareSpec | None) -> RingAllReduce:
    if spec is None or is_cpu_name(key):
        raise PerfkitError(
            f"{key}: no all-reduce measurements are stored, and a CPU has no interconnect for the ring model; "
            f"measure them (a minute): {measure_command(2)} (--ranks: the tensor-parallel degree)"
        )
    return RingAllReduce.for_spec(spec)


def default_source(key: str, spec: HardwareSpec | None, dtype: str | None = None) -> MeasuredAllReduce | RingAllReduce:
    """For each worker count the device's own measurements where there are some, else the
    tables of its first imported stack (nccl, else vidur); the ring model where it has none.

    Own rows come first: they time the stack and machine the deployment runs. The ring model
    does not fill in worker counts a measurement lacks (a label names one source per count)."""
    imported = [n for n in stack_names(key) if not n.startswith(STACK_PREFIX)]
    base = {} if not imported else _vidur_tables(key) if imported[0] == VIDUR else _nccl_tables(key)
    tables = {**base, **own_tables(key, dtype=dtype)}
    return MeasuredAllReduce.of(tables) if tables else _ring(key, spec)


def all_reduce_source(
    device: str | HardwareSpec, topology: str | None = None, stack: str | None = None, dtype: str | None = None
) -> MeasuredAllReduce | RingAllReduce:
    """How to time all-reduces on `device` (a name, key or spec; `cpu` is this machine's CPU).

    stack None (the default): per worker count, the device's own torch.distributed
    measurements (python -m profilers.allreduce) where stored, else its NCCL tables where
    shipped (a100-sxm, h100-sxm, h200, l40s; per GPU count the newest NCCL version measuring
    it), else Vidur's DGX table; with none of them the ring model from the spec's
    interconnect (a CPU has none: an error saying how to measure). stack 'torch-gloo' /
    'torch-nccl': our own measurements of that backend; 'nccl' / 'nccl-<version>': those
    NCCL tables; 'vllm' / 'sglang' / 'trtllm' (or with their version): that engine's own
    all-reduce; 'vidur': Vidur's table of `topology` ('dgx' unless given). topology
    'dgx' / 'pairwise_nvlink': Vidur's table of that node; 'ring': the model, always (no
    stack). A stack or topology the device was not measured in is an error naming those it
    was. dtype: the activations' dtype, whose own rows are preferred where a worker count was
    measured in several. The result has `time(bytes, workers)` and a `label` saying which it is.
    """
    if topology is not None and topology not in TOPOLOGIES:
        raise PerfkitError(f"unknown all-reduce topology {topology!r}; choose one of: {', '.join(TOPOLOGIES)}")
    key, spec = _device(device)
    if topology == RING:
        if stack is not None:
            raise PerfkitError(f"topology='ring' is the ring model, from the spec: it takes no stack, got {stack!r}")
        return _ring(key, spec)
    if topology is not None:  # one of Vidur's nodes
        if stack not in (None, VIDUR):
            raise PerfkitError(f"topology {topology!r} is a Vidur node; stack {stack!r} has none (stack 'vidur' has)")
        if topology not in SHIPPED_TABLES.get(key, {}):
            shipped = "; ".join(f"{k} ({', '.join(t)})" for k, t in SHIPPED_TABLES.items())
            raise PerfkitError(
                f"no measured {topology} all-reduce table for {key}; measured: {shipped}; "
                "topology='ring' models it from the spec's interconnect"
            )
        return measured_source(key, topology)
    if stack is None:
        return default_source(key, spec, dtype)
    names = stack_names(key)
    stack = engine_all_reduce_stack(key, stack) or stack  # an engine's name: its stack here
    if stack not in names:
        raise PerfkitError(_unknown_stack(key, stack, names))
    if stack.startswith(STACK_PREFIX):
        return MeasuredAllReduce.of(own_tables(key, stack, dtype))
    if stack.split("-")[0] in ENGINE_NAMES:
        table = next(t for t in engine_tables(key) if t.stack == stack)
        return MeasuredAllReduce.of(dict.fromkeys(table.curves(), table))
    return measured_source(key) if stack == VIDUR else nccl_source(key, stack)


def _unknown_stack(device_key: str, stack, names: list[str]) -> str:
    if not names:
        default = "measure them" if is_cpu_name(device_key) else "None: the ring model"
        return f"all-reduce stack {stack!r}: {device_key} has no measured all-reduce tables ({default})"
    return f"no all-reduce stack {stack!r} on {device_key}; choose one of: {', '.join(names)} (None: {names[0]})"


def tp_comm_time_per_step(model: ModelConfig, tp: int, tokens, dtype: str, source) -> float | np.ndarray:
    """Seconds of tensor-parallel all-reduce per decoding step (tokens may be an array).

    Megatron-style tensor parallelism all-reduces each layer's output twice: after
    attention's output projection and after the MLP's down projection, each a
    tokens x hidden activation of `dtype` (tokens = batch x query length, the tree's tokens
    for a Medusa step). Per step: 2 x num_layers x source.time(tokens x hidden x element
    bytes, tp). Not counted: gathering the LM head's and Medusa heads' logits, the
    embedding's all-reduce. `dtype` is that of the activations reduced: a model with fp8 or
    int8 weights usually reduces fp16/bf16 activations, so pass that.
    """
    t = np.asarray(tokens, dtype=float)
    bad = ~np.isfinite(t) | (t < 0)
    if bad.any():
        raise PerfkitError(f"tokens per step must be >= 0, got {t[bad].flat[0]:g}")
    nbytes = t * model.hidden_size * element_bytes(dtype)
    return _result(2 * model.num_layers * np.asarray(source.time(nbytes, tp)))
