"""One latency source for any model on any device: measured where the device was measured,
calibrated on those measurements elsewhere, borrowed from a measured device of the same
architecture, or the datasheet roofline. Whose measurements (the software stack) is a choice:
`stack` (perfmodel.latency.gemm_grid: vidur, vllm, sglang, trtllm).

GPU latency is a staircase in the token count (tile and kernel choice), not the smooth
roofline: a 4096 x 22016 fp16 GEMM on an A100 takes ~116 us for 1-64 tokens, 150-157 us
for 88-128 and 205 us at 136. So linear ops (one GEMM against a weight) are keyed on the
GEMM's weight shape (k, n) and its token count m = batch x query length:

- **measured**: the weight shape was measured on this device: the time is interpolated
  linearly in tokens on the measured token grid (every 8 tokens in the shipped profiles),
  which keeps the steps;
- **calibrated**: a shape not measured on this device: the roofline with its three
  parameters fitted to the device's measured linear ops (perfmodel.latency.fit), times
  the staircase of the nearest measured shapes (their measured / fitted ratio at the same
  token count, weighted by closeness in log k and log n). The steps come from the data;
  nothing about tiles is hard-coded;
- **borrowed**: a device without measurements takes the calibration (fitted efficiencies
  and staircase) of a measured device of the same `architecture` (hw_specs), on its own
  datasheet roofline;
- **grid**: an engine stack's device-wide GEMM grid (aiconfigurator's tables), interpolated
  in n and k with the staircase in m kept (perfmodel.latency.gemm_grid);
- **transferred**: a device without measurements whose architecture nobody measured takes
  an engine's GEMM times from every measured device, scaled by physics (sustained tensor
  clock, memory class and its bandwidth share, SM waves: perfmodel.latency.transfer); its
  label carries the method's leave-one-device-out error;
- **datasheet**: the roofline with the public efficiency defaults (perfmodel.latency.roofline).

Attention (qk, pv, the fused sdpa) is measured where the device has an engine's attention
tables (perfmodel.latency.attention_table: decode, prefill, and the tree step mapped onto the
decode kernel), the roofline elsewhere; the label says which.

With the `vidur` stack on a device that also has a grid, a shape Vidur did not measure is the
geometric mean of the calibrated prediction and the grid's shape dependence at Vidur's level
(GemmTable.grid_predict): the two err in different places, and their mean beats each on the
leave-one-model-out check (python -m perfmodel.latency_check).

Ops the measurements do not cover (attention, the Medusa tree's own work) use the roofline
with the calibrated efficiencies where there is a calibration, else the defaults. Measured
elementwise ops (norm, act, ...) are used where the profile is of the same model shard.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from perfmodel.base.dtypes import check_dtype, default_dtype
from perfmodel.base.errors import PerfkitError
from perfmodel.hardware.efficiencies import RooflineParams
from perfmodel.hardware.specs import HardwareSpec, load_all_specs
from perfmodel.latency.attention_grid import HEAD_DIM
from perfmodel.latency.attention_table import OPS as MEASURED_ATTENTION_OPS
from perfmodel.latency.attention_table import AttentionTable, attention_op_time, attention_table
from perfmodel.latency.choice import LatencyChoice, LatencyMode, LatencySetting
from perfmodel.latency.gemm_grid import (
    AUTO_STACK,
    ENGINES,
    TORCH,
    VIDUR,
    GemmGrid,
    default_grid,
    gemm_grid,
    resolve_stack,
    stack_names,
    torch_stack,
)
from perfmodel.latency.gemm_table import (
    GemmTable,
    fit_params,
    profile_rows,
    same_shard,
    stack_calibration,
    stored_calibration,
)
from perfmodel.latency.roofline import RooflineLatency, speed_of_light
from perfmodel.latency.transfer import TransferredGemm, transferred_gemm
from perfmodel.measured.device_view import DeviceView
from perfmodel.measured.evidence import DeviceEvidence, as_evidence, device_evidence
from perfmodel.measured.store import stored_profiles
from perfmodel.models.config import ModelConfig, load_model
from perfmodel.models.operators import LINEAR_OPS, STEP_OPS, WEIGHT_OPS, Matmul, Phase, op_kernels

# ----------------------------------------------------------------------------- the source


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

    def __post_init__(self) -> None:
        self.mode = LatencyMode(self.mode)
        self.roofline = RooflineLatency(self.spec, self.model, self.dtype, self.params)

    @property
    def label(self) -> str:
        attention = self.attention_label
        return self.gemm_label + (f"; attention: {attention}" if attention else "")

    @property
    def attention_label(self) -> str | None:
        """Where attention times come from, when not the roofline the label already names."""
        if self.attention is None or self.model.head_dim != HEAD_DIM:
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
        if self.mode == LatencyMode.DATASHEET:
            p = self.params
            return (
                f"roofline latency, {p.label} (x{p.compute_efficiency:g} compute, x{p.memory_efficiency:g} bandwidth, "
                f"{p.kernel_overhead_s * 1e6:g} us per kernel)"
            )
        if self.mode == LatencyMode.BORROWED:
            return (
                f"borrowed: {self.table.spec.key}'s calibration ({self.table.origin}) on {self.spec.key}'s datasheet "
                "roofline"
            )
        if self.mode == LatencyMode.GRID:
            return (
                f"measured on {self.spec.key}: the {self.grid.label}, fitted non-decreasing in m, n and k, "
                "interpolated in n and k, staircase in m kept, none under its speed of light"
            )
        if self.mode == LatencyMode.TRANSFERRED:
            return self.grid.label
        measured = sorted(op for op in (*LINEAR_OPS, "medusa_heads") if self.linear_kind(op) == LatencyMode.MEASURED)
        beside = f"; other shapes also from the {self.grid.stack.stack} grid at this level" if self.grid else ""
        if self.mode == LatencyMode.MEASURED and measured:
            shapes = ", ".join(measured)
            return f"measured on {self.spec.key} ({self.table.origin}; {shapes}), calibrated elsewhere{beside}"
        return f"calibrated on {self.spec.key}'s measurements ({self.table.origin}){beside}"

    def linear_kind(self, op: str) -> LatencyMode:
        """How this op's GEMMs are timed: measured, calibrated, grid, transferred, borrowed or
        datasheet."""
        if op not in (*LINEAR_OPS, "medusa_heads"):
            return LatencyMode.DATASHEET
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
        kernels = op_kernels(op, phase, self.model, np.asarray(batch), np.asarray(seq_len), np.asarray(candidates))
        if (self.table is not None or self.grid is not None) and op in WEIGHT_OPS:
            return np.asarray(sum(self.gemm_time(k) for k in kernels), dtype=float)
        if self.elementwise is not None and op in STEP_OPS and op in set(self.elementwise["op"]):
            part = self.elementwise[self.elementwise["op"] == op]
            b, s, q = np.broadcast_arrays(*(np.asarray(x) for x in (batch, seq_len, candidates)))
            tokens = b * (s if phase == Phase.PREFILL else (q if phase == Phase.TREE else 1))
            return np.interp(tokens, part["seq_len"].to_numpy(dtype=float), part["time_s"].to_numpy(dtype=float))
        return self.roofline.op_time(op, phase, batch, seq_len, candidates)


def borrowable(spec: HardwareSpec) -> DeviceEvidence | None:
    """The evidence of a device of the same architecture with per-model profiles, if any."""
    if not getattr(spec, "architecture", None):
        return None
    for key, other in sorted(load_all_specs().items()):
        if key != spec.key and getattr(other, "architecture", None) == spec.architecture and stored_profiles(key):
            return device_evidence(other)
    return None


def latency_source(
    device: str | HardwareSpec | DeviceEvidence,
    model: str | ModelConfig,
    dtype: str | None = None,
    source: str | LatencyChoice = "auto",
    measurements: pd.DataFrame | None = None,
    params: RooflineParams | None = None,
    stack: str | None = None,
) -> LatencyModel:
    """The latency source for `model` on `device` (its evidence, a name, alias or HardwareSpec).

    source: auto (measured > calibrated > borrowed > datasheet, as the data allow), or one
    of measured / calibrated / datasheet to force it; forcing what the data cannot give is
    an error. measurements: data-contract rows to use instead of the stored profiles.
    params: the datasheet roofline's efficiencies (default: the public defaults). dtype: None
    for the device's default (perfmodel.base.dtypes.default_dtype). stack: whose measurements
    (vidur, vllm, sglang, trtllm, or an engine-version such as vllm-0.24.0); None: the
    device's per-model profiles (vidur) where it has them, else its first engine grid.
    """
    choice = LatencyChoice.of(source, stack)
    source, stack = choice.setting, choice.stack
    evidence = as_evidence(device)
    spec = evidence.spec
    dtype = check_dtype(dtype) if dtype else default_dtype(spec.key)
    model = model if isinstance(model, ModelConfig) else load_model(model)
    datasheet = LatencyModel(spec, model, dtype, "datasheet", params=params or RooflineParams())
    if source == LatencySetting.DATASHEET:
        return datasheet
    given = measurements is not None and len(measurements) and (measurements["dtype"] == dtype).any()
    if not given and not stack_names(evidence):
        return unmeasured_source(evidence, model, dtype, source, stack, datasheet)
    chosen = None if given else resolve_stack(evidence, stack)
    if given:
        rows, origin = profile_rows(evidence)
        # where given rows and a profile time the same shape and token count, the median of both counts
        rows = measurements if rows is None else pd.concat([measurements, rows], ignore_index=True)
        rows = rows[rows["dtype"] == dtype]
        table = GemmTable.of(rows, spec, dtype, "given measurements" + (f" + {origin}" if origin else ""))
    elif chosen is not None and chosen.split("-")[0] == TORCH:
        table = stack_calibration(evidence, chosen, dtype)
        if table is not None:
            attention = attention_table(evidence, chosen, dtype)
            mode = LatencyMode.CALIBRATED if source == LatencySetting.CALIBRATED else LatencyMode.MEASURED
            return LatencyModel(spec, model, dtype, mode, table, None, table.params, chosen, None, attention)
    elif chosen not in (None, VIDUR):
        grid = gemm_grid(evidence, chosen, dtype)
        if grid is not None:
            attention = attention_table(evidence, chosen, dtype)
            params = grid_params(grid, spec)
            return LatencyModel(spec, model, dtype, "grid", params=params, stack=chosen, grid=grid, attention=attention)
        table = None
    else:
        table = stored_calibration(evidence, dtype)
    if table is not None:
        rows = table.rows
        mode = LatencyMode.CALIBRATED if source == LatencySetting.CALIBRATED else LatencyMode.MEASURED
        grid = None if given else default_grid(evidence, dtype)
        attention = None if given else attention_table(evidence, None, dtype)
        elementwise = same_shard(rows, model)
        return LatencyModel(
            spec, model, dtype, mode, table, elementwise, table.params, chosen or "given", grid, attention
        )
    fallback = unmeasured_source(evidence, model, dtype, source, stack, datasheet)
    stacks = len(stack_names(evidence))
    fallback.unmeasured = f"no {dtype} measurements of {spec.key} (its {stacks} measured stack(s) time other dtypes)"
    return fallback


def unmeasured_source(
    evidence: DeviceEvidence, model: ModelConfig, dtype: str, source: str, stack: str | None, datasheet: LatencyModel
) -> LatencyModel:
    """A device without measurements (of this dtype): the calibration of a measured device of
    its architecture (the vidur stack) where there is one and no engine was asked for, else
    an engine's GEMMs transferred from the measured devices (vllm unless asked), else the
    datasheet."""
    spec = evidence.spec
    if source != LatencySetting.AUTO:
        raise PerfkitError(
            f"no {dtype} measurements of {spec.key} to give a {source} latency; measured devices: "
            f"{', '.join(measured_devices()) or 'none'} (or use --latency datasheet)"
        )
    lender = borrowable(spec) if stack in (None, AUTO_STACK, VIDUR) else None
    table = stored_calibration(lender, dtype) if lender else None
    if table is not None:
        return LatencyModel(spec, model, dtype, "borrowed", table, None, table.params, stack=VIDUR)
    if stack == VIDUR:
        raise PerfkitError(f"--stack vidur: no device of {spec.key}'s architecture has Vidur's profiles")
    if stack is not None and stack.split("-")[0] == TORCH:
        raise PerfkitError(
            f"--stack {stack}: {spec.key} has no GPU campaign of this project's (python -m profilers.imports campaign "
            "FOLDER keeps one as its torch stack)"
        )
    engine = ENGINES[0] if stack in (None, AUTO_STACK) else stack.split("-")[0]
    if engine not in ENGINES:
        raise PerfkitError(f"--stack {stack}: choose from {', '.join((VIDUR, *ENGINES, TORCH))} (or a stack-version)")
    transfer = evidence.derived(("transferred", engine, dtype), lambda: transferred_gemm(spec, engine, dtype))
    if transfer is None:
        return datasheet
    params = evidence.derived(
        ("transferred_params", engine, dtype), lambda: fit_params(transfer.gemms(), spec, dtype, kind="transferred")
    )
    return LatencyModel(spec, model, dtype, "transferred", params=params, stack=engine, grid=transfer)


def grid_params(grid: GemmGrid, spec: HardwareSpec) -> RooflineParams:
    """The roofline fitted to a grid, for the ops the grid does not time (elementwise work,
    attention without a measured table): over the points a decoding step meets (m up to 4096,
    n and k from 256)."""
    gemms = grid.gemms()
    gemms = gemms[(gemms["m"] <= 4096) & (gemms["n"] >= 256) & (gemms["k"] >= 256)]
    return fit_params(gemms, spec, grid.dtype)


def measured_devices() -> list[str]:
    """Every device with GEMM measurements of some stack (per-model profiles or a grid)."""
    return [key for key, spec in sorted(load_all_specs().items()) if stack_names(device_evidence(spec))]


def decoder_latency(
    view: DeviceView, model: ModelConfig, dtype: str, source: str | LatencyChoice = "auto"
) -> LatencyModel:
    """The latency of the reference decoder's own kernels (its traced step): the device's
    torch stack, this project's campaign of torch's GEMMs and masked attention, where it has
    one and neither a stack, the datasheet nor this machine's own sweep was asked for; else
    view_latency's. Engine stacks price engines, whose kernels the decoder does not run."""
    choice = LatencyChoice.of(source)
    given = view.measured is not None and len(view.measured)
    if choice.stack is None and choice.setting != LatencySetting.DATASHEET and not view.is_cpu and not given:
        choice = LatencyChoice.of(choice, torch_stack(view.evidence))
    return view_latency(view, model, dtype, choice)


def view_latency(
    view: DeviceView, model: ModelConfig, dtype: str, source: str | LatencyChoice = "auto", stack: str | None = None
) -> LatencyModel:
    """The latency source of a resolved device (perfmodel.measured.device_view): a CPU is its measured
    ceilings' roofline (its own sweep when measured or calibrated is asked for); a GPU
    goes through latency_source with the view's efficiencies as its datasheet fallback."""
    choice = LatencyChoice.of(source, stack)
    if not view.is_cpu:
        measured = view.measured if view.measured is not None and len(view.measured) else None
        return latency_source(view.evidence, model, dtype, choice, measured, view.params)
    if choice.setting in (LatencySetting.AUTO, LatencySetting.DATASHEET):
        return LatencyModel(view.spec, model, dtype, "datasheet", params=view.params)
    if view.measured is None or not len(view.measured):
        raise PerfkitError(f"{view.spec.key} has no measured sweep to give a {choice} latency")
    return latency_source(view.evidence, model, dtype, choice, view.measured, view.params)
