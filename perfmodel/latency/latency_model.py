"""A latency source that says where its numbers come from (LatencyModel): GEMMs from a
device's measured tables, grid or transferred grid, or the roofline; attention from measured
tables where the device has them; what each mode rests on says its label, one label function
per mode (SOURCE_LABELS). perfmodel.latency.source resolves which one a device and choice get.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from perfmodel.hardware.efficiencies import RooflineParams
from perfmodel.hardware.specs import HardwareSpec
from perfmodel.latency.attention_table import OPS as MEASURED_ATTENTION_OPS
from perfmodel.latency.attention_table import AttentionTable, attention_op_time
from perfmodel.latency.choice import LatencyMode
from perfmodel.latency.gemm_grid import GemmGrid
from perfmodel.latency.gemm_table import GemmTable
from perfmodel.latency.mla_table import MlaTimes
from perfmodel.latency.moe_table import MoeTimes
from perfmodel.latency.quantized import QuantizedGemms
from perfmodel.latency.roofline import RooflineLatency, speed_of_light
from perfmodel.latency.transfer import TransferredGemm
from perfmodel.models.config import ModelConfig
from perfmodel.models.operators import LINEAR_OPS, QUANTIZED_OPS, STEP_OPS, WEIGHT_OPS, Matmul, Phase, op_kernels


@dataclass
class LatencyModel:
    """A latency source (perfmodel.latency.step.LatencySource) that says where its numbers come from.

    mode: measured | calibrated | grid | borrowed | datasheet (what `auto` resolved to, or
    what was forced). label: one line for figures, tables and CSVs. stack: whose measurements
    (perfmodel.latency.gemm_grid), None for the datasheet."""

    spec: HardwareSpec
    model: ModelConfig
    dtype: str
    mode: LatencyMode
    table: GemmTable | None = None
    elementwise: pd.DataFrame | None = None  # measured step-op rows of this very model shard
    params: RooflineParams = field(default_factory=RooflineParams)
    stack: str | None = None
    grid: GemmGrid | TransferredGemm | None = None  # grid/transferred GEMMs, or the shape dependence beside Vidur's
    attention: AttentionTable | None = None  # measured attention of this device, where it has tables
    # Why a measured device is priced without its measurements (none in this dtype): the label
    # says so first, so an fp8 answer on an H100 is not read as resting on its bf16 tables.
    unmeasured: str | None = None
    # The decoder layers' GEMMs of a model with quantized weights (perfmodel.latency.quantized)
    quantized: QuantizedGemms | None = None
    # An MoE model's fused experts, measured (perfmodel.latency.moe_table); None: the roofline's
    experts: MoeTimes | None = None
    # A latent-attention model's attention module, measured (perfmodel.latency.mla_table); None: the roofline's
    latent: MlaTimes | None = None

    def __post_init__(self) -> None:
        self.mode = LatencyMode(self.mode)
        self.roofline = RooflineLatency(self.spec, self.model, self.dtype, self.params)

    @property
    def label(self) -> str:
        attention = self.attention_label
        quantized = f"; {self.quantized.label}" if self.quantized else ""
        experts = f"; {self.experts.label}" if self.experts else "; experts: roofline" if self.model.moe else ""
        if self.model.mla is not None:
            latent = f"; {self.latent.label}" if self.latent else "; latent attention: roofline"
            return self.gemm_label + quantized + experts + latent
        return self.gemm_label + quantized + experts + (f"; attention: {attention}" if attention else "")

    @property
    def attention_label(self) -> str | None:
        """Where attention times come from, when not the roofline the label already names."""
        if self.attention is None or self.model.head_dim != self.attention.head_dim:
            return (
                "roofline"
                if self.mode
                in (LatencyMode.GRID, LatencyMode.MEASURED, LatencyMode.CALIBRATED, LatencyMode.TRANSFERRED)
                else None
            )
        return self.attention.label

    @property
    def gemm_label(self) -> str:
        label = self.source_label
        return f"{self.unmeasured}: {label}" if self.unmeasured else label

    @property
    def source_label(self) -> str:
        return SOURCE_LABELS[self.mode](self)

    def prices_quantized(self, op: str) -> bool:
        """Whether `op` is a quantized layer of this source's model: a drafter's head priced
        beside a quantized target (perfmodel.latency.draft_weights.latency_for) keeps 16 bits."""
        return self.quantized is not None and self.model.weights is not None and op in QUANTIZED_OPS

    def linear_kind(self, op: str) -> LatencyMode:
        """How this op's GEMMs are timed: measured, calibrated, grid, transferred, borrowed or
        datasheet."""
        if op not in (*LINEAR_OPS, "medusa_heads"):
            return LatencyMode.DATASHEET
        if self.prices_quantized(op):  # the format's own grid (its label says whose)
            return LatencyMode.GRID if self.quantized.grid is not None else LatencyMode.DATASHEET
        if self.mode in (LatencyMode.GRID, LatencyMode.TRANSFERRED):
            return self.mode
        if self.table is None:
            return LatencyMode.DATASHEET
        if self.mode == LatencyMode.BORROWED:
            return LatencyMode.BORROWED
        kernels = op_kernels(op, "decode", self.model, 1, 1, 1)
        every = all(self.table.measured(m.k, m.n) for m in kernels)
        return LatencyMode.MEASURED if self.mode == LatencyMode.MEASURED and every else LatencyMode.CALIBRATED

    def gemm_time(self, matmul: Matmul) -> np.ndarray:
        """The grid's time (grid mode), else the fitted roofline x the measured staircase. In
        `calibrated` mode a measured shape is predicted from its neighbours only, as an
        unmeasured one would be; with a grid beside the rows, an unmeasured shape also takes
        the grid's shape dependence (the geometric mean of the two). Never under the GEMM's
        speed-of-light floor (its bytes at the datasheet bandwidth, its FLOPs at the peak)."""
        return np.maximum(self._gemm_time(matmul), speed_of_light(matmul, self.dtype, self.spec))

    def _gemm_time(self, matmul: Matmul) -> np.ndarray:
        m = np.asarray(matmul.m, dtype=float)
        k, n = int(matmul.k), int(matmul.n)
        if self.mode in (LatencyMode.GRID, LatencyMode.TRANSFERRED):
            return self.grid.time(k, n, m)
        table = self.table if self.mode != LatencyMode.CALIBRATED else self.table.without(k, n)
        calibrated = table.predict(k, n, m, self.spec, self.dtype)
        if self.grid is None or table.measured(k, n) or self.mode == LatencyMode.BORROWED:
            return calibrated
        return np.sqrt(calibrated * table.grid_predict(k, n, m, self.grid))

    def op_time(self, op: str, phase: str, batch, seq_len, candidates) -> np.ndarray:
        if self.attention is not None and op in MEASURED_ATTENTION_OPS:
            measured = attention_op_time(self.attention, op, phase, self.model, batch, seq_len, candidates)
            if measured is not None:
                return measured
        if op == "mla" and self.latent is not None:
            q_len = np.asarray(candidates) if phase == Phase.TREE else 1
            return self.latent.time(phase, batch, seq_len, q_len)
        kernels = op_kernels(op, phase, self.model, np.asarray(batch), np.asarray(seq_len), np.asarray(candidates))
        if op == "moe":
            if self.experts is not None:
                return self.experts.time(kernels[0].tokens, phase)
            return self.roofline.op_time(op, phase, batch, seq_len, candidates)
        if self.prices_quantized(op):
            return np.asarray(sum(self.quantized.time(k) for k in kernels), dtype=float)
        if (self.table is not None or self.grid is not None) and op in WEIGHT_OPS:
            return np.asarray(sum(self.gemm_time(k) for k in kernels), dtype=float)
        if self.elementwise is not None and op in STEP_OPS and op in set(self.elementwise["op"]):
            part = self.elementwise[self.elementwise["op"] == op]
            b, s, q = np.broadcast_arrays(*(np.asarray(x) for x in (batch, seq_len, candidates)))
            tokens = b * (s if phase == Phase.PREFILL else (q if phase == Phase.TREE else 1))
            return np.interp(tokens, part["seq_len"].to_numpy(dtype=float), part["time_s"].to_numpy(dtype=float))
        return self.roofline.op_time(op, phase, batch, seq_len, candidates)


def datasheet_label(source: LatencyModel) -> str:
    p = source.params
    return (
        f"roofline latency, {p.label} (x{p.compute_efficiency:g} compute, x{p.memory_efficiency:g} bandwidth, "
        f"{p.kernel_overhead_s * 1e6:g} us per kernel)"
    )


def borrowed_label(source: LatencyModel) -> str:
    return (
        f"borrowed: {source.table.spec.key}'s calibration ({source.table.origin}) on {source.spec.key}'s datasheet "
        "roofline"
    )


def grid_label(source: LatencyModel) -> str:
    return (
        f"measured on {source.spec.key}: the {source.grid.label}, fitted non-decreasing in m, n and k, "
        "interpolated in n and k, staircase in m kept, none under its speed of light"
    )


def profiles_label(source: LatencyModel) -> str:
    """Measured or calibrated on the device's own GEMM rows (profiles, a campaign, given rows)."""
    measured = sorted(op for op in (*LINEAR_OPS, "medusa_heads") if source.linear_kind(op) == LatencyMode.MEASURED)
    beside = f"; other shapes also from the {source.grid.stack.stack} grid at this level" if source.grid else ""
    if source.mode == LatencyMode.MEASURED and measured:
        shapes = ", ".join(measured)
        return f"measured on {source.spec.key} ({source.table.origin}; {shapes}), calibrated elsewhere{beside}"
    return f"calibrated on {source.spec.key}'s measurements ({source.table.origin}){beside}"


# What each mode's GEMM times rest on, in words: a new mode is one entry here.
SOURCE_LABELS: dict[LatencyMode, Callable[[LatencyModel], str]] = {
    LatencyMode.DATASHEET: datasheet_label,
    LatencyMode.BORROWED: borrowed_label,
    LatencyMode.GRID: grid_label,
    LatencyMode.TRANSFERRED: lambda source: source.grid.label,
    LatencyMode.MEASURED: profiles_label,
    LatencyMode.CALIBRATED: profiles_label,
}
