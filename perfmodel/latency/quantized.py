"""The GEMMs of quantized linear weights (perfmodel.base.precision): a model whose decoder
layers store fp8, fp8-block or NVFP4 weights runs their GEMMs as W8A8 or W4A4 kernels, which
aiconfigurator measured inside each engine beside the 16-bit ones (`gemm_quantized` tables,
perfmodel.measured.aiconfigurator). Those layers are priced from that grid; the LM head, the
embeddings and the Medusa or draft heads stay 16-bit (every quantized checkpoint here keeps
them so) and are priced as before.

Which grid: the stack the step is priced on where it measured the format over a model's
weights (n and k to 4096 at least), else the device's first engine that did (ENGINES order;
the label says whose). The grid is read as measured (interpolated between its rows, not
fitted non-decreasing as the 16-bit grids are): its unevenness is the engines' kernel choice,
which the serving engine runs. vLLM 0.24.0 on the B200 times fp8 and fp8-block GEMMs at one
token 1.5-2.5x slower than at 2-16 tokens in every one of its 483 weight shapes (the kernel its
batch-1 CUDA graph runs), and at decoding sizes its fp8-block kernels sit on a plateau of about
60 us on the H200 whatever the shape, whose spread a non-decreasing fit's running maximum
turned into a lift of the whole plateau (+19% at Qwen3-30B-A3B-FP8's q/k/v). Fitted, the FP8
peer check's worst TPOT point was 29.8%; read as measured, 15.0% (docs/peer-check.md, the FP8
section). A device with no measured grid of
the format prices fp8 from its datasheet roofline at its fp8 peak (labelled so); NVFP4, which
only Blackwell's engines measured, is refused there in one line. Every time is held at or
above the format's speed of light: its weights and activations at the format's bytes, the
output in 16 bits, at the datasheet bandwidth, or its FLOPs at the format's peak.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodel.base.errors import PerfkitError
from perfmodel.base.precision import WEIGHT_PEAK, WeightFormat
from perfmodel.hardware.efficiencies import RooflineParams
from perfmodel.hardware.specs import HardwareSpec
from perfmodel.latency.gemm_grid import GemmGrid, preferred_stacks
from perfmodel.latency.roofline import kernel_time
from perfmodel.measured.aiconfigurator import QUANTIZED_GEMM
from perfmodel.measured.evidence import DeviceEvidence
from perfmodel.models.config import ModelConfig
from perfmodel.models.operators import Matmul, cost_of

COVERED = 4096  # the widest weight dimension a grid must reach to price a model's layers


def quantized_grid(evidence: DeviceEvidence, stack: str | None, fmt: WeightFormat) -> GemmGrid | None:
    """The measured grid of `fmt` on the device: `stack`'s where it measured it, else the
    first engine's (ENGINES order) that did; None where none did. Built once per evidence."""
    return evidence.derived(("quantized_grid", stack, fmt), lambda: _quantized_grid(evidence, stack, fmt))


def covers(stack, fmt: WeightFormat) -> bool:
    """Whether a stack measured the format over a model's weights: n and k to COVERED at
    least (vLLM's fp8-block rows on the RTX PRO 6000 stop at 128, a grid stretched 64-fold)."""
    rows = stack.table(QUANTIZED_GEMM)
    rows = rows[rows["dtype"] == fmt]
    return bool(len(rows)) and rows["n"].max() >= COVERED and rows["k"].max() >= COVERED


def _quantized_grid(evidence: DeviceEvidence, stack: str | None, fmt: WeightFormat) -> GemmGrid | None:
    holding = [s for s in evidence.with_table(QUANTIZED_GEMM) if not s.is_torch and covers(s, fmt)]
    if not holding:
        return None
    return GemmGrid.of(preferred_stacks(holding, stack)[0], str(fmt), table=QUANTIZED_GEMM, fitted=False)


def format_floor(matmul: Matmul, fmt: WeightFormat, spec: HardwareSpec) -> np.ndarray:
    """Seconds no kernel of the format beats: the weight and the activations read at the
    format's bytes and the 16-bit output written, at the datasheet bandwidth, or its FLOPs at
    the format's peak."""
    cost = cost_of((matmul,), "bf16", fmt)  # a W8A8 or W4A4 GEMM writes 16-bit activations
    moved, flops = np.asarray(cost.bytes, dtype=float), np.asarray(cost.flops, dtype=float)
    return np.maximum(moved / spec.bandwidth, flops / spec.peak_flops(WEIGHT_PEAK[fmt]))


@dataclass(frozen=True)
class QuantizedGemms:
    """How one model's quantized linear layers are timed on one device: a measured grid of
    the format, or (fp8 without one) the datasheet roofline at the fp8 peak."""

    fmt: WeightFormat
    spec: HardwareSpec
    grid: GemmGrid | None
    params: RooflineParams | None = None  # the datasheet roofline's, where no grid measured the format

    @classmethod
    def of(cls, evidence: DeviceEvidence, stack: str | None, model: ModelConfig, params: RooflineParams):
        fmt = model.weights
        grid = quantized_grid(evidence, stack, fmt)
        if grid is not None:
            return cls(fmt, evidence.spec, grid)
        if WEIGHT_PEAK[fmt] != "fp8":
            raise PerfkitError(
                f"weights {fmt}: no {fmt} GEMMs are measured on {evidence.key}, and its roofline has no {fmt} rate to "
                "stand for them (profilers/measurements/IMPORTED-AICONFIGURATOR.md lists the devices that have them)"
            )
        return cls(fmt, evidence.spec, None, params)

    def time(self, matmul: Matmul) -> np.ndarray:
        if self.grid is None:
            return np.asarray(kernel_time(matmul, "fp8", self.spec, self.params), dtype=float)
        return np.maximum(self.grid.time(matmul.k, matmul.n, matmul.m), format_floor(matmul, self.fmt, self.spec))

    @property
    def label(self) -> str:
        if self.grid is None:
            return f"{self.fmt} weights: their GEMMs from the datasheet roofline at the fp8 peak (none measured here)"
        return f"{self.fmt} weights: their GEMMs from the {self.fmt} {self.grid.label}, read as measured"
