"""A device's measured ceilings as data: what `profilers.ceilings` measured (bandwidth per
stream, peak FLOP/s per dtype, per-kernel overhead), as stored with a sweep, and the
device spec they make for a machine without a datasheet (a CPU).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from perfmodel.base.dtypes import DTYPES
from perfmodel.hardware.specs import HardwareSpec, find_spec


def gemv_bandwidth_gb_s(ceilings: dict) -> float:
    """What decode-time linears (matrix-vector products) stream at: the measured read
    stream where there is one, else the best measured bandwidth."""
    measured = ceilings["bandwidth_gb_s"]
    return measured.get("read") or max(measured.values())


@dataclass(frozen=True)
class Ceilings:
    device: str
    bandwidth_gb_s: dict[str, float]  # "copy", "triad"
    peak_tflops: dict[str, float]  # dtype -> TFLOP/s (TOPS for int8)
    noise: dict[str, float] = field(default_factory=dict)  # measurement -> IQR/median
    skipped: dict[str, str] = field(default_factory=dict)  # dtype -> why it was not measured
    measured_at: str = ""
    kernel_overhead_us: float | None = None  # one tiny op call, dispatch to result (None: not measured, older runs)

    @property
    def bandwidth(self) -> float:
        """The best sustained bandwidth measured, bytes/s."""
        return max(self.bandwidth_gb_s.values()) * 1e9

    def floor_seconds(self, flops, nbytes, dtype: str):
        """The least time work of `flops` and `nbytes` can take at these ceilings: its bytes at
        the best measured bandwidth, or its FLOPs at the dtype's measured peak, whichever is
        longer (the bytes alone where the dtype's peak was not measured). Arrays broadcast."""
        floor = np.asarray(nbytes, dtype=float) / self.bandwidth
        peak = self.peak_tflops.get(dtype)
        return np.maximum(floor, np.asarray(flops, dtype=float) / (peak * 1e12)) if peak else floor

    @property
    def gemv_bandwidth_gb_s(self) -> float:
        return gemv_bandwidth_gb_s(self.as_dict())

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Ceilings:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def datasheet_ceilings(spec: HardwareSpec) -> Ceilings:
    """A datasheet's bandwidth and dense peaks as Ceilings. No device sustains them, so a floor
    at them is below any measured floor: work timed far above it holds launch gaps for sure."""
    return Ceilings(
        device=spec.key,
        bandwidth_gb_s={"datasheet": spec.memory_bandwidth_gb_s},
        peak_tflops={dtype: peak for dtype, peak in spec.peak_tflops.items() if dtype in DTYPES},
    )


def judging_ceilings(measured: dict | None, spec_key: str | None) -> dict | None:
    """The ceilings (a Ceilings dict) an event timing's roofline floor is judged by: the
    measured ones, else the datasheet's of the device's spec (a GPU check measures none),
    else None (no floor: only the 50 us rule)."""
    if measured or not spec_key:
        return measured or None
    return datasheet_ceilings(find_spec(spec_key)).as_dict()


def ceilings_spec(ceilings: Ceilings, name: str, memory_bytes: int) -> HardwareSpec:
    """A device spec whose ceilings are the measured ones (for devices without a datasheet)."""
    where = f"measured by profilers.ceilings on {ceilings.measured_at}"
    return HardwareSpec(
        key=ceilings.device,
        name=name,
        memory_gb=memory_bytes / 1e9,
        memory_bandwidth_gb_s=ceilings.gemv_bandwidth_gb_s,
        peak_tflops=dict(ceilings.peak_tflops),
        sources={
            "memory_gb": "/proc/meminfo MemTotal",
            "memory_bandwidth_gb_s": f"{where} (the read-only matrix-vector stream: decode-time linears read their "
            "weights once)",
            "peak_tflops": f"{where} (square matmul per dtype)",
        },
        notes="No datasheet: every ceiling here is measured on this machine.",
    )
