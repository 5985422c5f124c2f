"""The ring all-reduce model: time from an interconnect's bandwidth and a fitted latency per
ring step and bandwidth efficiency per kind of link (perfmodel.latency.allreduce says when it is
used, perfmodel.latency.allreduce_fit fits its constants).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodel.base.errors import PerfkitError
from perfmodel.hardware.specs import HardwareSpec


@dataclass(frozen=True)
class RingConstants:
    """Fitted latency per ring step and bandwidth efficiency for one kind of link."""

    latency_s: float
    efficiency: float
    fitted_on: str
    largest_workers: int  # the largest ring of the rows fitted on: past it the model is a guess


# Fitted by `python -m perfmodel.allreduce_compare --fit` (allreduce_fit: on the shipped tables,
# single-node rows, message sizes DECODE_BYTES, every row weighted by its relative error),
# rounded to 3 significant digits. tests/test_allreduce.py refits and checks them.
RING_CONSTANTS = {
    "nvlink3": RingConstants(3.37e-6, 0.476, "a100_dgx (NVSwitch), 2/4/8 GPUs, 600 GB/s", 8),
    "nvlink4": RingConstants(2.43e-6, 0.664, "h100_dgx (NVSwitch), 2/4/8 GPUs, 900 GB/s", 8),
    "nvlink5": RingConstants(2.43e-6, 0.46, "b200 nccl-2.29.2 (NVSwitch), 2/4/8 GPUs, 1800 GB/s", 8),
    "pcie4": RingConstants(9.11e-6, 0.731, "a100_pairwise_nvlink, 4 GPUs, PCIe Gen4 x16 64 GB/s", 4),
    "pcie5": RingConstants(3.96e-6, 0.723, "h100_pairwise_nvlink, 4 GPUs, PCIe Gen5 x16 128 GB/s", 4),
}


def checked_inputs(nbytes, workers) -> tuple[np.ndarray, np.ndarray]:
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


def as_result(values: np.ndarray):
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
    b, n = checked_inputs(nbytes, workers)
    if not (link_gb_s > 0 and latency_s >= 0 and efficiency > 0):
        raise PerfkitError(
            f"ring all-reduce needs link_gb_s > 0, latency_s >= 0, efficiency > 0; got {link_gb_s}, {latency_s}, "
            f"{efficiency}"
        )
    per_direction = efficiency * link_gb_s * 1e9 / 2
    t = 2 * (n - 1) / n * b / per_direction + 2 * (n - 1) * latency_s
    return as_result(np.where((n == 1) | (b == 0), 0.0, t))


@dataclass(frozen=True)
class RingAllReduce:
    """The ring model for one device: its spec's interconnect with fitted latency/efficiency."""

    link_gb_s: float
    latency_s: float
    efficiency: float
    label: str
    kind: str = "modelled"
    # The most devices it prices a ring over, and why no more (None: any number, as the fits'
    # own checks against tables use it); refused past it, as a measured table refuses a count
    # it lacks, so that tensor_parallel.usable_degrees holds one rule for every device.
    max_workers: int | None = None
    reach: str = ""

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
        joined = spec.interconnect_devices
        if joined is not None and joined <= fit.largest_workers:
            largest = int(joined)
            reach = f"its {spec.interconnect} link joins {largest} devices (spec: interconnect_devices)"
        else:
            largest = fit.largest_workers
            reach = f"the {spec.interconnect} ring model is fitted on rings of at most {largest} GPUs"
        label = (
            f"modelled: ring all-reduce over {spec.interconnect} at {spec.interconnect_gb_s:g} GB/s "
            f"(spec, both directions) / 2 per direction x efficiency {fit.efficiency:g}, "
            f"{fit.latency_s * 1e6:.3g} us per step (fitted on {fit.fitted_on})"
        )
        return cls(spec.interconnect_gb_s, fit.latency_s, fit.efficiency, label, max_workers=largest, reach=reach)

    def label_for(self, workers: int) -> str:
        return self.label

    def time(self, nbytes, workers):
        """Seconds per all-reduce of `nbytes` per GPU over `workers` GPUs (arrays allowed);
        a count past max_workers is refused."""
        _, counts = checked_inputs(nbytes, workers)
        if self.max_workers is not None and (counts > self.max_workers).any():
            raise PerfkitError(f"no all-reduce over {counts.max()} GPUs: none was measured, and {self.reach}")
        return ring_all_reduce_time(nbytes, workers, self.link_gb_s, self.latency_s, self.efficiency)
