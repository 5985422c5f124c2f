"""Tensor-parallel all-reduce time: measured tables where they are shipped, a ring model
from the spec's interconnect bandwidth elsewhere.

Measured tables come from Vidur (github.com/microsoft/vidur, MIT licence), shipped converted
under `profilers/measurements/<device>/imported/all_reduce-*.csv` and read by
perfmodel.measured.vidur.
The ring model's latency and efficiency are fitted on those tables
(perfmodel.latency.allreduce_fit); the command `python -m perfmodel.allreduce_compare`
prints the fits and the model's error against every table.

Everything here is a pure function of its arguments and of the shipped data files.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import pandas as pd

from perfmodel.base.dtypes import element_bytes
from perfmodel.base.errors import PerfkitError
from perfmodel.hardware.specs import HardwareSpec, find_spec
from perfmodel.measured.vidur import SHIPPED_TABLES, read_table, table_path
from perfmodel.models.config import ModelConfig

TOPOLOGY_TEXT = {
    "dgx": "8-GPU DGX node, NVSwitch",
    "pairwise_nvlink": "4-GPU node, NVLink within pairs, PCIe between them",
}
RING = "ring"
TOPOLOGIES = (*TOPOLOGY_TEXT, RING)

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
