"""Tensor-parallel all-reduce time: measured tables where they are shipped, a ring model
from the spec's interconnect bandwidth elsewhere.

Measured tables come from Vidur (github.com/microsoft/vidur, MIT licence), converted by
`import_vidur_all_reduce` into `profilers/measurements/<device>/imported/all_reduce-*.csv`
(provenance and the regeneration command: profilers/measurements/IMPORTED-ALLREDUCE.md).
The ring model's latency and efficiency are fitted on those tables (`fit_ring`); the
command `python -m perfmodel.allreduce_compare` prints the fits and the model's error
against every table.

Everything here is a pure function of its arguments and of the shipped data files.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.base.dtypes import element_bytes
from perfmodel.base.errors import PerfkitError
from perfmodel.hardware.specs import HardwareSpec, find_spec
from perfmodel.measured.store import MEASUREMENTS_DIR
from perfmodel.models.config import ModelConfig

VIDUR_COMMIT = "7d47513363ec447a741ac5e47241580b47724fbf"
TABLE_COLUMNS = ["topology", "num_workers", "devices_per_node", "bytes", "time_s", "noise", "run_id"]
VIDUR_COLUMNS = (
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
TOPOLOGY_TEXT = {
    "dgx": "8-GPU DGX node, NVSwitch",
    "pairwise_nvlink": "4-GPU node, NVLink within pairs, PCIe between them",
}
RING = "ring"
TOPOLOGIES = (*TOPOLOGY_TEXT, RING)

# Message sizes typical of decoding: batch x query tokens x hidden x 2 bytes spans about
# 8 KiB (1 token, hidden 4096) to tens of MiB (a few hundred tree tokens x batch, hidden 8192).
DECODE_BYTES = (8 * 1024, 64 * 1024**2)
SPLIT_BYTES = 1024**2  # errors are also reported below / from 1 MiB


@dataclass(frozen=True)
class RingConstants:
    """Fitted latency per ring step and bandwidth efficiency for one kind of link."""

    latency_s: float
    efficiency: float
    fitted_on: str


# Fitted by `python -m perfmodel.allreduce_compare --fit` (fit_ring on the shipped tables,
# single-node rows, message sizes DECODE_BYTES, every row weighted by its relative error),
# rounded to 3 significant digits. tests/test_allreduce.py refits and checks them.
RING_FIT_PLAN = {
    # interconnect: (device, topology, link GB/s both directions as the datasheet gives it, workers)
    "nvlink3": ("a100-sxm", "dgx", 600.0, (2, 4, 8)),
    "nvlink4": ("h100-sxm", "dgx", 900.0, (2, 4, 8)),
    # The pairwise node's 4-GPU ring crosses PCIe between its NVLink pairs, so its slowest hop
    # is a PCIe x16 link: its rows time a PCIe ring (Gen4 for A100; Gen5 assumed for H100).
    "pcie4": ("a100-sxm", "pairwise_nvlink", 64.0, (4,)),
    "pcie5": ("h100-sxm", "pairwise_nvlink", 128.0, (4,)),
}
RING_CONSTANTS = {
    "nvlink3": RingConstants(3.37e-6, 0.476, "a100_dgx (NVSwitch), 2/4/8 GPUs, 600 GB/s"),
    "nvlink4": RingConstants(2.43e-6, 0.664, "h100_dgx (NVSwitch), 2/4/8 GPUs, 900 GB/s"),
    "pcie4": RingConstants(9.11e-6, 0.731, "a100_pairwise_nvlink, 4 GPUs, PCIe Gen4 x16 64 GB/s"),
    "pcie5": RingConstants(3.96e-6, 0.723, "h100_pairwise_nvlink, 4 GPUs, PCIe Gen5 x16 128 GB/s"),
}


# --- importing Vidur's tables -------------------------------------------------------------


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
    raw = read_csv_with(path, VIDUR_COLUMNS, "Vidur all-reduce table")
    if "collective" in raw.columns and set(raw["collective"]) != {"all_reduce"}:
        raise PerfkitError(f"{path}: expected only all_reduce rows, got {sorted(set(raw['collective']))}")
    median = raw["time_stats.all_reduce.median"].astype(float)
    if not (np.isfinite(median) & (median > 0)).all():
        raise PerfkitError(f"{path}: every time_stats.all_reduce.median must be a positive number of ms")
    rows = pd.DataFrame(
        {
            "num_workers": raw["num_workers"].astype(int),
            "devices_per_node": raw["devices_per_node"].astype(int),
            "bytes": raw["size"].astype(int),
            "rank": raw["rank"].astype(int),
            "time_s": median / 1e3,
            "noise": raw["time_stats.all_reduce.std"].astype(float).fillna(0.0) / median,
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
    """A shipped (converted) all-reduce table."""
    return read_csv_with(Path(path), TABLE_COLUMNS, "all-reduce table")


def read_csv_with(path: Path, columns, what: str) -> pd.DataFrame:
    """A CSV that must hold `columns`; one line naming the file otherwise."""
    try:
        table = pd.read_csv(path)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise PerfkitError(f"cannot read {what} {path}: {exc}") from None
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise PerfkitError(f"{path}: not a {what}, missing column(s) {', '.join(missing)}")
    return table


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


@dataclass(frozen=True, eq=False)
class MeasuredAllReduce:
    """Interpolation in a measured table, one curve per worker count.

    Between measured sizes: linear in log(bytes) -> log(time), so exact at every measured
    point and monotone between neighbours. Beyond the largest size: linear in bytes from the
    last point with the top octave's slope (all-reduce time grows linearly with bytes once
    bandwidth-bound). Below the smallest size: the smallest size's time (latency-bound).
    Worker counts the table lacks are an error listing the measured ones, not a silent
    switch to the model: ask for topology='ring' to get the model.
    """

    label: str
    curves: dict[int, tuple[np.ndarray, np.ndarray, float]]
    kind: str = "measured"

    @classmethod
    def from_table(cls, table: pd.DataFrame, label: str) -> MeasuredAllReduce:
        """Single-node rows (devices_per_node == num_workers): tensor parallelism stays in a node."""
        rows = table[table["devices_per_node"] == table["num_workers"]]
        if rows.empty:
            raise PerfkitError(f"{label}: no single-node rows (devices_per_node == num_workers)")
        curves = {}
        for workers, group in rows.groupby("num_workers"):
            group = group.groupby("bytes", as_index=False)["time_s"].max().sort_values("bytes")
            sizes = group["bytes"].to_numpy(dtype=float)
            times = group["time_s"].to_numpy(dtype=float)
            curves[int(workers)] = (sizes, times, _top_octave_slope(sizes, times))
        return cls(label, curves)

    @property
    def workers(self) -> tuple[int, ...]:
        return tuple(sorted(self.curves))

    def time(self, nbytes, workers):
        """Seconds per all-reduce of `nbytes` per GPU over `workers` GPUs (arrays allowed)."""
        b, n = _check_inputs(nbytes, workers)
        out = np.zeros(b.shape)
        for w in np.unique(n):
            if w == 1:
                continue
            if w not in self.curves:
                raise PerfkitError(
                    f"no measured all-reduce over {w} GPUs in {self.label.split(';')[0]}; measured worker counts: "
                    f"{', '.join(map(str, self.workers))} (topology='ring' gives the ring model)"
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


@functools.lru_cache(maxsize=None)
def measured_source(device_key: str, topology: str = "dgx") -> MeasuredAllReduce:
    """The shipped table of a device and topology, ready to interpolate (read once)."""
    path = table_path(device_key, topology)
    table = read_table(path)
    vidur = SHIPPED_TABLES[device_key][topology]
    kib = table["bytes"].min() / 1024
    mib = table["bytes"].max() / 1024**2
    label = (
        f"measured: Vidur {vidur} table ({TOPOLOGY_TEXT[topology]}), {kib:g} KiB-{mib:.4g} MiB; "
        "log-log interpolation, linear in bytes above the largest size, the smallest size's time below it"
    )
    return MeasuredAllReduce.from_table(table, label)


def all_reduce_source(device: str | HardwareSpec, topology: str | None = None) -> MeasuredAllReduce | RingAllReduce:
    """How to time all-reduces on `device` (a name, key or spec).

    topology None: the measured DGX (NVSwitch) table where one is shipped (a100-sxm,
    h100-sxm), else the ring model from the spec's interconnect. 'dgx' / 'pairwise_nvlink':
    that measured table (an error for a device without it). 'ring': the model, always.
    The result has `time(bytes, workers)` and a `label` saying which it is.
    """
    if topology is not None and topology not in TOPOLOGIES:
        raise PerfkitError(f"unknown all-reduce topology {topology!r}; choose one of: {', '.join(TOPOLOGIES)}")
    spec = device if isinstance(device, HardwareSpec) else find_spec(device)
    tables = SHIPPED_TABLES.get(spec.key, {})
    if topology == RING or (topology is None and not tables):
        return RingAllReduce.for_spec(spec)
    topology = topology or "dgx"
    if topology not in tables:
        shipped = "; ".join(f"{key} ({', '.join(t)})" for key, t in SHIPPED_TABLES.items())
        raise PerfkitError(
            f"no measured {topology} all-reduce table for {spec.key}; measured: {shipped}; "
            "topology='ring' models it from the spec's interconnect"
        )
    return measured_source(spec.key, topology)


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


# --- fitting and comparing the ring model against the tables ------------------------------------


def _decode_rows(table: pd.DataFrame, workers=None, sizes: tuple[float, float] = DECODE_BYTES) -> pd.DataFrame:
    rows = table[(table["devices_per_node"] == table["num_workers"]) & table["bytes"].between(*sizes)]
    return rows if workers is None else rows[rows["num_workers"].isin(workers)]


def fit_ring(
    table: pd.DataFrame, link_gb_s: float, workers=None, sizes: tuple[float, float] = DECODE_BYTES
) -> RingConstants:
    """Latency per step and efficiency of the ring model that best fits a table's single-node
    rows in `sizes` (bytes), by least squares on relative error: t = a x 2(n-1) + b x
    2(n-1)/n x bytes / (link_gb_s / 2), efficiency = 1 / b. A negative latency is refitted at 0."""
    rows = _decode_rows(table, workers, sizes)
    if rows.empty:
        raise PerfkitError("no single-node table rows in the size range to fit the ring model on")
    n = rows["num_workers"].to_numpy(dtype=float)
    t = rows["time_s"].to_numpy(dtype=float)
    steps = 2 * (n - 1)
    transfer = 2 * (n - 1) / n * rows["bytes"].to_numpy(dtype=float) / (link_gb_s * 1e9 / 2)
    (latency, inverse_eff), *_ = np.linalg.lstsq(np.c_[steps / t, transfer / t], np.ones_like(t), rcond=None)
    if latency < 0:
        latency, inverse_eff = 0.0, float(np.sum(transfer / t) / np.sum((transfer / t) ** 2))
    topologies = ", ".join(sorted(set(rows["topology"])))
    counts = "/".join(map(str, sorted(set(rows["num_workers"]))))
    return RingConstants(float(latency), float(1 / inverse_eff), f"{topologies}, {counts} GPUs, {link_gb_s:g} GB/s")


def model_errors(table: pd.DataFrame, source, sizes: tuple[float, float] = DECODE_BYTES) -> pd.DataFrame:
    """Per worker count: the relative error of `source` (model / measured - 1) over a table's
    single-node rows in `sizes`: rows, median and p90 of |error|, median signed error, and
    the median signed error below and from SPLIT_BYTES (the table has far more rows above:
    Vidur's sizes are evenly spaced in bytes, while most decoding messages are below)."""
    out = []
    for workers, rows in _decode_rows(table, sizes=sizes).groupby("num_workers"):
        err = np.asarray(source.time(rows["bytes"].to_numpy(), int(workers))) / rows["time_s"].to_numpy() - 1
        small = rows["bytes"].to_numpy() < SPLIT_BYTES
        out.append(
            {
                "workers": int(workers),
                "rows": len(rows),
                "median_abs_err": float(np.median(np.abs(err))),
                "p90_abs_err": float(np.quantile(np.abs(err), 0.9)),
                "median_err": float(np.median(err)),
                "median_err_small": float(np.median(err[small])) if small.any() else np.nan,
                "median_err_large": float(np.median(err[~small])) if (~small).any() else np.nan,
            }
        )
    return pd.DataFrame(out)


def compare_tables(sizes: tuple[float, float] = DECODE_BYTES) -> pd.DataFrame:
    """The ring model of each shipped device (its spec, fitted constants) against each of its
    tables, per worker count; and each PCIe fit against the rows it was fitted on."""
    out = []
    for device, tables in SHIPPED_TABLES.items():
        model = RingAllReduce.for_spec(find_spec(device))
        for topology, vidur in tables.items():
            errors = model_errors(read_table(table_path(device, topology)), model, sizes)
            errors.insert(0, "model", f"{find_spec(device).interconnect} {model.link_gb_s:g} GB/s")
            errors.insert(0, "table", vidur)
            out.append(errors)
    for interconnect, (device, topology, link, workers) in RING_FIT_PLAN.items():
        if not interconnect.startswith("pcie"):
            continue
        fit = RING_CONSTANTS[interconnect]
        model = RingAllReduce(link, fit.latency_s, fit.efficiency, interconnect)
        table = read_table(table_path(device, topology))
        errors = model_errors(table[table["num_workers"].isin(workers)], model, sizes)
        errors.insert(0, "model", f"{interconnect} {link:g} GB/s")
        errors.insert(0, "table", SHIPPED_TABLES[device][topology])
        out.append(errors)
    return pd.concat(out, ignore_index=True)


def fit_all(sizes: tuple[float, float] = DECODE_BYTES) -> dict[str, RingConstants]:
    """fit_ring for every interconnect of RING_FIT_PLAN on the shipped tables."""
    fits = {}
    for interconnect, (device, topology, link, workers) in RING_FIT_PLAN.items():
        fits[interconnect] = fit_ring(read_table(table_path(device, topology)), link, workers, sizes)
    return fits


def significant(x: float, digits: int = 3) -> float:
    """`x` rounded to `digits` significant digits (how the fitted constants are stored)."""
    return 0.0 if x == 0 else round(x, digits - 1 - math.floor(math.log10(abs(x))))
