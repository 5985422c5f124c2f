"""The paper's Appendix G rooflines as data: a device's roofline lines (datasheet, measured,
the latency model's derating), the Medusa variation studies over a grid (Figs 18-20), and
predicted-vs-measured operator errors. Drawn by reports.roofline_figures; the command
line is `python -m perfmodel.roofline`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from perfmodel.base.precision import WEIGHT_PEAK
from perfmodel.base.provenance import Provenance
from perfmodel.hardware import specs as hardware
from perfmodel.hardware.ceilings import gemv_bandwidth_gb_s
from perfmodel.hardware.specs import HardwareSpec
from perfmodel.measured.contract import COLUMNS, KEY_COLUMNS
from perfmodel.measured.device_view import DeviceView
from perfmodel.models.config import ModelConfig
from perfmodel.models.grid import Grid
from perfmodel.models.operators import OP_GROUPS, op_groups

DEFAULT_MODELS = ("llama-7b", "llama-13b", "llama-33b")
VARIATION_BATCH = 16  # paper Fig 18: attention at b=16 over (s, q)
VARIATION_SEQ = 1024  # paper Fig 19: attention at s=1024 over (b, q)
MAIN_PHASES = ("prefill", "decode")


@dataclass(frozen=True)
class Ceiling:
    """One roofline: min(peak, bandwidth x intensity)."""

    label: str
    peak_flops: float  # FLOP/s
    bandwidth: float  # bytes/s
    style: str = "-"
    color: str = "black"

    @property
    def ridge(self) -> float:
        return hardware.ridge(self.peak_flops, self.bandwidth)


def format_ceiling(spec, weights) -> Ceiling:
    """The datasheet's roofline at a quantized weight format's peak (fp8's, NVFP4's fp4): where a
    quantized checkpoint's linear layers meet their compute bound."""
    peak = WEIGHT_PEAK[weights]
    rates = f"{spec.peak_tflops[peak]:g} TFLOP/s, {spec.memory_bandwidth_gb_s:g} GB/s"
    return Ceiling(
        f"datasheet {peak} ({weights} weights): {rates}",
        spec.peak_flops(peak),
        spec.bandwidth,
        style=":",
        color="#b8860b",
    )


def ceilings(view: DeviceView, dtype: str):
    """The lines to draw: datasheet (GPUs), measured (when known), the latency model's derating."""
    spec, params, lines = view.spec, view.params, []
    if not view.is_cpu:
        lines.append(
            Ceiling(
                f"datasheet: {spec.peak_tflops[dtype]:g} TFLOP/s, {spec.memory_bandwidth_gb_s:g} GB/s",
                spec.peak_flops(dtype),
                spec.bandwidth,
            )
        )
    measured = view.ceilings or {}
    if dtype in measured.get("peak_tflops", {}):
        peak, bandwidth = measured["peak_tflops"][dtype], gemv_bandwidth_gb_s(measured)
        lines.append(
            Ceiling(
                f"measured: {peak:.3g} TFLOP/s, {bandwidth:.3g} GB/s", peak * 1e12, bandwidth * 1e9, color="#1e7d32"
            )
        )
    if (params.compute_efficiency, params.memory_efficiency) != (1.0, 1.0):
        lines.append(
            Ceiling(
                f"model: x{params.compute_efficiency:g} compute, x{params.memory_efficiency:g} bandwidth",
                spec.peak_flops(dtype) * params.compute_efficiency,
                spec.bandwidth * params.memory_efficiency,
                style="--",
                color="#888888",
            )
        )
    return lines


def closest(values, target: int) -> int:
    """The grid value nearest `target` on a log scale (the paper's setting when present)."""
    return min(values, key=lambda v: (abs(math.log(v / target)), v))


def variation_studies(grid: Grid, model: ModelConfig) -> list[dict]:
    """The three Medusa variation studies over the (possibly narrowed) grid, each pinned to
    the paper's batch or sequence length, or the grid's closest value to it; titled by what
    `model` runs (a latent-attention module, an MoE model's router and experts)."""
    b, s = closest(grid.batches, VARIATION_BATCH), closest(grid.seq_lens, VARIATION_SEQ)
    attention = "latent attention (its module)" if model.mla is not None else "attention (QK^T, PV)"
    mlp = list(op_groups(model))[-1]
    return [
        dict(
            name=f"medusa-attention-b{b}",
            ops=OP_GROUPS["qk/pv"],
            grid=Grid((b,), grid.seq_lens, grid.candidates),
            line_by="seq_len",
            what=f"{attention} at batch {b} over sequence length and candidates (paper Fig 18)",
        ),
        dict(
            name=f"medusa-attention-s{s}",
            ops=OP_GROUPS["qk/pv"],
            grid=Grid(grid.batches, (s,), grid.candidates),
            line_by="batch",
            what=f"{attention} at sequence length {s} over batch and candidates (paper Fig 19)",
        ),
        dict(
            name="medusa-up-gate-down",
            ops=OP_GROUPS["up/gate/down"],
            grid=Grid(grid.batches, (s,), grid.candidates),
            line_by="batch",
            what=f"{mlp} projections over batch and candidates (paper Fig 20)",
        ),
    ]


def matching_measurements(
    measured: pd.DataFrame | None, spec: HardwareSpec, model: ModelConfig, dtype: str
) -> pd.DataFrame:
    if measured is None:
        return pd.DataFrame(columns=COLUMNS)
    rows = measured[
        (measured["source"] == Provenance.MEASURED) & (measured["model"] == model.name) & (measured["dtype"] == dtype)
    ]
    return rows[rows["device"] == spec.key] if spec.key in set(rows["device"]) else rows


def prediction_error(predicted: pd.DataFrame, measured: pd.DataFrame) -> pd.DataFrame:
    """Measured vs predicted time per row of the same device and point; error = (predicted - measured) / measured."""
    if measured.empty:
        return measured
    both = measured.merge(predicted[KEY_COLUMNS + ["time_s"]], on=KEY_COLUMNS, suffixes=("_measured", "_predicted"))
    both["error"] = (both["time_s_predicted"] - both["time_s_measured"]) / both["time_s_measured"]
    return both
