"""How much of a device's datasheet peaks a kernel reaches: the roofline's efficiency factors
and per-kernel overhead, by default public figures, or fitted to a device's measurements."""

from __future__ import annotations

from dataclasses import dataclass

from perfmodel.base.errors import PerfkitError


@dataclass(frozen=True)
class RooflineParams:
    # bf16 GEMMs reach about 81-87% of the 312 TFLOP/s datasheet peak on A100 and about
    # 80% of 989 on H100 in public measurements: 0.84 is the A100 midpoint.
    compute_efficiency: float = 0.84
    # Streaming HBM reads reach about 88% of datasheet bandwidth on A100 SXM.
    memory_efficiency: float = 0.88
    # A few microseconds per kernel: NVIDIA's CUDA Graphs blog times a 2.9 us kernel at
    # 3.8 us per launch back to back (3.4 us inside a graph), and a lone kernel timed by
    # CUDA events cannot finish faster than its launch; 3 us sits between those floors.
    kernel_overhead_s: float = 3e-6
    label: str = "datasheet x public efficiency defaults"

    def __post_init__(self) -> None:
        for name in ("compute_efficiency", "memory_efficiency"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise PerfkitError(f"{name} must be in (0, 1], got {value!r}")
        if self.kernel_overhead_s < 0:
            raise PerfkitError(f"kernel_overhead_s must be >= 0, got {self.kernel_overhead_s!r}")
