"""A first latency prediction: the roofline with efficiency factors and a per-kernel overhead.

Each kernel takes max(FLOPs / (peak x compute_efficiency), bytes / (bandwidth x
memory_efficiency)) + kernel_overhead_s, and an operator is the sum of its kernels.
The defaults are public achievable fractions (docs/performance-model.md, "Latency: the
roofline defaults"); the calibrated model fits the same three parameters to measured rows,
so a device measured on a few shapes is predicted on all.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from perfmodel.base.dtypes import element_bytes
from perfmodel.base.errors import PerfkitError
from perfmodel.hardware.efficiencies import RooflineParams
from perfmodel.hardware.specs import HardwareSpec
from perfmodel.measured.contract import COLUMNS, ContractPoint, contract_fields
from perfmodel.models.config import ModelConfig
from perfmodel.models.grid import PAPER_GRID, Grid, iter_blocks
from perfmodel.models.operators import (
    ATTENTION_OPS,
    FUSED_OPS,
    MLA_OPS,
    OPS,
    PHASES,
    Kernel,
    cost_of,
    model_ops,
    op_kernels,
    stored_format,
)


def kernel_time(kernel: Kernel, dtype: str, spec: HardwareSpec, params: RooflineParams):
    """Seconds for one kernel (an array of them when the matmul's dimensions are arrays)."""
    compute = kernel.flops / (spec.peak_flops(dtype) * params.compute_efficiency)
    memory = kernel.elements * element_bytes(dtype) / (spec.bandwidth * params.memory_efficiency)
    return np.maximum(compute, memory) + params.kernel_overhead_s


def op_time(kernels: tuple[Kernel, ...], dtype: str, spec: HardwareSpec, params: RooflineParams):
    return sum(kernel_time(m, dtype, spec, params) for m in kernels)


# The datasheet's peaks themselves, with nothing lost to launches: no kernel can be faster.
SPEED_OF_LIGHT = RooflineParams(1.0, 1.0, 0.0, "speed of light: datasheet peak FLOPs and bandwidth")


def speed_of_light(kernel: Kernel, dtype: str, spec: HardwareSpec) -> np.ndarray:
    """A kernel's floor: its bytes at the datasheet bandwidth or its FLOPs at the datasheet
    peak, whichever takes longer (an array for array dimensions)."""
    return np.asarray(kernel_time(kernel, dtype, spec, SPEED_OF_LIGHT), dtype=float)


def predict_table(
    spec: HardwareSpec,
    model: ModelConfig,
    dtype: str,
    grid: Grid = PAPER_GRID,
    ops=OPS,
    phases=PHASES,
    params: RooflineParams = RooflineParams(),
    latency=None,
) -> pd.DataFrame:
    """Predicted rows in the data-contract format for every grid point of every op/phase.
    latency: a latency source (perfmodel.latency.source) to time them with instead of the
    roofline with `params`; its label goes in a `latency_model` column."""
    spec.peak_flops(dtype)  # fail early, with the device's list, if it lacks this dtype
    if latency is None and (model.precision or model.moe):
        raise PerfkitError(f"{model.title}: its formats and experts are timed by a latency source (latency=...)")
    frames = []
    for op, phase, points in iter_blocks(model, grid, model_ops(model, ops), phases):
        b, s, q = (points[:, i] for i in range(3))
        kernels = op_kernels(op, phase, model, b, s, q)
        # a quantized layer, or attention over a quantized cache, moves its format's bytes
        weights = stored_format(model, op)
        cached = model.kv_cache if op in (*ATTENTION_OPS, *FUSED_OPS, *MLA_OPS) else None
        cost = cost_of(kernels, dtype, weights, cached)
        t = op_time(kernels, dtype, spec, params) if latency is None else latency.op_time(op, phase, b, s, q)
        frames.append(
            pd.DataFrame(
                contract_fields(
                    ContractPoint(spec.key, model.name, dtype, op, phase, b, s, q), cost, t, "predicted", np.nan
                )
            )
        )
    table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)
    if latency is not None:
        table["latency_model"] = latency.label
    return table


@dataclass(frozen=True)
class RooflineLatency:
    """A latency source (perfmodel.latency.step.LatencySource) predicting from a spec's roofline."""

    spec: HardwareSpec
    model: ModelConfig
    dtype: str
    params: RooflineParams = RooflineParams()

    def __post_init__(self) -> None:
        self.spec.peak_flops(self.dtype)  # fail now, naming the dtypes the device has

    def op_time(self, op: str, phase: str, batch, seq_len, candidates) -> np.ndarray:
        kernels = op_kernels(op, phase, self.model, np.asarray(batch), np.asarray(seq_len), np.asarray(candidates))
        return np.asarray(op_time(kernels, self.dtype, self.spec, self.params), dtype=float)
