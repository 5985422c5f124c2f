"""One latency source for any model on any device: measured where the device was measured,
calibrated on those measurements elsewhere, borrowed from a measured device of the same
architecture, or the datasheet roofline.

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
- **datasheet**: the roofline with the public efficiency defaults (perfmodel.latency.roofline).

Ops the measurements do not cover (attention, the Medusa tree's own work) use the roofline
with the calibrated efficiencies where there is a calibration, else the defaults. Measured
elementwise ops (norm, act, ...) are used where the profile is of the same model shard.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from perfmodel.base.dtypes import check_dtype, default_dtype
from perfmodel.base.errors import PerfkitError
from perfmodel.hardware.efficiencies import RooflineParams
from perfmodel.hardware.specs import HardwareSpec, load_all_specs, resolve_spec
from perfmodel.latency.fit import GEMM_BOUNDS, fit_key, fit_roofline_params, remembered_fit
from perfmodel.latency.roofline import RooflineLatency, kernel_time
from perfmodel.measured.device_view import DeviceView
from perfmodel.measured.store import stored_profiles, user_fits_dir
from perfmodel.models.config import ModelConfig, load_model
from perfmodel.models.operators import LINEAR_OPS, STEP_OPS, Matmul, op_kernels, query_len

LATENCY_CHOICES = ("auto", "measured", "calibrated", "datasheet")
# Shapes closer than this (in log k, log n) lend their staircase; 2 neighbours smooth one
# shape's odd kernel choice (chosen on the leave-one-model-out test, python -m perfmodel.latency_check).
NEIGHBOURS = 2


# ----------------------------------------------------------------------------- measured GEMMs


def row_model(row: pd.Series) -> ModelConfig:
    """The model shard a measured row is of: its own shape columns (imported profiles), or
    the named model (the toolkit's own sweeps)."""
    if "hidden_size" in row and pd.notna(row.get("hidden_size")):
        return ModelConfig(
            str(row["model"]),
            int(row["hidden_size"]),
            int(row["intermediate_size"]),
            int(row["num_heads"]),
            int(row["num_kv_heads"]),
            1,
            int(row["vocab_size"]),
            int(row["head_dim"]),
        )
    return load_model(str(row["model"]))


def gemm_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """Measured linear-op rows as single GEMMs: k, n (the weight), m (tokens), time_s."""
    linear = rows[rows["op"].isin(LINEAR_OPS)]
    out = []
    for _, group in linear.groupby("model", sort=False):
        model = row_model(group.iloc[0])
        for (op, phase), part in group.groupby(["op", "phase"]):
            b, s, q = (part[c].to_numpy(dtype=np.int64) for c in ("batch", "seq_len", "candidates"))
            (matmul,) = op_kernels(op, phase, model, 1, 1, 1)
            tokens = b * np.array([query_len(phase, si, qi) for si, qi in zip(s, q)])
            out.append(pd.DataFrame({"k": matmul.k, "n": matmul.n, "m": tokens, "time_s": part["time_s"].to_numpy()}))
    if not out:
        return pd.DataFrame(columns=["k", "n", "m", "time_s"])
    return pd.concat(out, ignore_index=True).groupby(["k", "n", "m"], as_index=False)["time_s"].median()


def roofline_gemm(k, n, m, spec: HardwareSpec, dtype: str, params: RooflineParams) -> np.ndarray:
    return np.asarray(kernel_time(Matmul(1, m, k, n, weight=True), dtype, spec, params), dtype=float)


def fit_params(gemms: pd.DataFrame, spec: HardwareSpec, dtype: str) -> RooflineParams:
    """The roofline's efficiencies and per-kernel overhead fitted to measured GEMMs
    (perfmodel.latency.fit: least squares on log time)."""
    k, n, m, t = (gemms[c].to_numpy(dtype=float) for c in ("k", "n", "m", "time_s"))
    label = f"fitted to {len(gemms)} measured GEMMs on {spec.key}"
    key = fit_key("gemm", k, n, m, t, spec.peak_flops(dtype), spec.bandwidth, dtype, GEMM_BOUNDS, label)
    return remembered_fit(
        key,
        lambda: fit_roofline_params(
            lambda params: roofline_gemm(k, n, m, spec, dtype, params), np.log(t), GEMM_BOUNDS, label
        ),
        user_fits_dir(),
    )


@dataclass
class GemmTable:
    """The measured GEMMs of one device, with the roofline fitted to them."""

    spec: HardwareSpec  # the measured device
    gemms: pd.DataFrame
    params: RooflineParams
    origin: str  # where the rows came from, for labels
    rows: pd.DataFrame = field(repr=False, default=None)  # the measured rows behind it
    curves: dict = field(default_factory=dict, repr=False)  # (k, n) -> (tokens, seconds)

    @classmethod
    def of(cls, rows: pd.DataFrame, spec: HardwareSpec, dtype: str, origin: str) -> GemmTable:
        gemms = gemm_rows(rows)
        if not len(gemms):
            raise PerfkitError(f"{spec.key}: the measurements hold no linear-op rows to calibrate on")
        table = cls(spec, gemms, fit_params(gemms, spec, dtype), origin, rows=rows)
        for (k, n), part in gemms.groupby(["k", "n"]):
            table.curves[(k, n)] = (part["m"].to_numpy(dtype=float), part["time_s"].to_numpy(dtype=float))
        return table

    def measured(self, k: int, n: int) -> bool:
        return (k, n) in self.curves

    def without(self, k: int, n: int) -> GemmTable:
        """The table less one shape (the same fitted roofline)."""
        if not self.measured(k, n) or len(self.curves) == 1:
            return self
        curves = {shape: curve for shape, curve in self.curves.items() if shape != (k, n)}
        return GemmTable(self.spec, self.gemms, self.params, self.origin, self.rows, curves)

    def ratio(self, k: int, n: int, m, spec: HardwareSpec, dtype: str) -> np.ndarray:
        """Measured / fitted-roofline time of one measured shape at m tokens: linear between
        its measured token counts (fine enough to keep the steps), the end value beyond them."""
        tokens, seconds = self.curves[(k, n)]
        return np.interp(m, tokens, seconds / roofline_gemm(k, n, tokens, spec, dtype, self.params))

    def predict(self, k: int, n: int, m, spec: HardwareSpec, dtype: str) -> np.ndarray:
        """Seconds of a (k, n) GEMM over m tokens on `spec`: its roofline with the fitted
        efficiencies, times the measured staircase (exact at measured points)."""
        return roofline_gemm(k, n, m, spec, dtype, self.params) * self.staircase(k, n, m, self.spec, dtype)

    def staircase(self, k: int, n: int, m, spec: HardwareSpec, dtype: str) -> np.ndarray:
        """The measured / fitted ratio at m tokens: the shape's own where it was measured
        (so measured points come back exactly), else that of the nearest measured shapes
        (by log k and log n)."""
        if self.measured(k, n):
            return self.ratio(k, n, m, spec, dtype)
        shapes = np.array(list(self.curves))
        distance = np.hypot(np.log(shapes[:, 0] / k), np.log(shapes[:, 1] / n))
        nearest = np.argsort(distance)[:NEIGHBOURS]
        weights = 1 / (distance[nearest] + 0.05)
        ratios = [w * self.ratio(int(sk), int(sn), m, spec, dtype) for w, (sk, sn) in zip(weights, shapes[nearest])]
        return sum(ratios) / weights.sum()


# ----------------------------------------------------------------------------- the source


@dataclass
class LatencyModel:
    """A latency source (perfmodel.latency.step.LatencySource) that says where its numbers come from.

    mode: measured | calibrated | borrowed | datasheet (what `auto` resolved to, or what was
    forced). label: one line for figures, tables and CSVs."""

    spec: HardwareSpec
    model: ModelConfig
    dtype: str
    mode: str
    table: GemmTable | None = None
    elementwise: pd.DataFrame | None = None  # measured step-op rows of this very model shard
    params: RooflineParams = field(default_factory=RooflineParams)

    def __post_init__(self) -> None:
        self.roofline = RooflineLatency(self.spec, self.model, self.dtype, self.params)

    @property
    def label(self) -> str:
        if self.mode == "datasheet":
            p = self.params
            return (
                f"roofline latency, {p.label} (x{p.compute_efficiency:g} compute, x{p.memory_efficiency:g} bandwidth, "
                f"{p.kernel_overhead_s * 1e6:g} us per kernel)"
            )
        if self.mode == "borrowed":
            return (
                f"borrowed: {self.table.spec.key}'s calibration ({self.table.origin}) on {self.spec.key}'s datasheet "
                "roofline"
            )
        measured = sorted(op for op in (*LINEAR_OPS, "medusa_heads") if self.linear_kind(op) == "measured")
        if self.mode == "measured" and measured:
            return f"measured on {self.spec.key} ({self.table.origin}; {', '.join(measured)}), calibrated elsewhere"
        return f"calibrated on {self.spec.key}'s measurements ({self.table.origin})"

    def linear_kind(self, op: str) -> str:
        """How this op's GEMMs are timed: measured, calibrated, borrowed or datasheet."""
        if self.table is None or op not in (*LINEAR_OPS, "medusa_heads"):
            return "datasheet"
        if self.mode == "borrowed":
            return "borrowed"
        kernels = op_kernels(op, "decode", self.model, 1, 1, 1)
        every = all(self.table.measured(m.k, m.n) for m in kernels)
        return "measured" if self.mode == "measured" and every else "calibrated"

    def gemm_time(self, matmul: Matmul) -> np.ndarray:
        """Fitted roofline x the measured staircase. In `calibrated` mode a measured shape is
        predicted from its neighbours only, as an unmeasured one would be."""
        m = np.asarray(matmul.m, dtype=float)
        k, n = int(matmul.k), int(matmul.n)
        table = self.table if self.mode != "calibrated" else self.table.without(k, n)
        return table.predict(k, n, m, self.spec, self.dtype)

    def op_time(self, op: str, phase: str, batch, seq_len, candidates) -> np.ndarray:
        kernels = op_kernels(op, phase, self.model, np.asarray(batch), np.asarray(seq_len), np.asarray(candidates))
        if self.table is not None and (op in LINEAR_OPS or op == "medusa_heads"):
            return np.asarray(sum(self.gemm_time(k) for k in kernels), dtype=float)
        if self.elementwise is not None and op in STEP_OPS and op in set(self.elementwise["op"]):
            part = self.elementwise[self.elementwise["op"] == op]
            b, s, q = np.broadcast_arrays(*(np.asarray(x) for x in (batch, seq_len, candidates)))
            tokens = b * (s if phase == "prefill" else (q if phase == "tree" else 1))
            return np.interp(tokens, part["seq_len"].to_numpy(dtype=float), part["time_s"].to_numpy(dtype=float))
        return self.roofline.op_time(op, phase, batch, seq_len, candidates)


def stored_calibration(spec: HardwareSpec, dtype: str) -> GemmTable | None:
    """The calibration on a device's stored profiles (None without any)."""
    return calibration_of(spec.key, dtype) if stored_profiles(spec.key) else None


@functools.lru_cache(maxsize=16)
def calibration_of(device_key: str, dtype: str) -> GemmTable | None:
    """Fitted once per process and device: the stored files do not change while it runs, and
    a plan asks once per device and tensor-parallel degree."""
    rows, origin = profile_rows(device_key)
    if rows is None or not (rows["dtype"] == dtype).any():
        return None
    return GemmTable.of(rows[rows["dtype"] == dtype], resolve_spec(device_key, None), dtype, origin)


def profile_rows(device_key: str) -> tuple[pd.DataFrame | None, str]:
    """A device's measured profiles (imported, under profilers/measurements/<device>/imported/)."""
    paths = stored_profiles(device_key)
    if not paths:
        return None, ""
    rows = pd.concat([pd.read_csv(p) for p in paths], ignore_index=True)
    rows = rows[(rows["source"] == "measured") & rows["time_s"].notna()]
    return rows, f"{len(paths)} imported profile(s): {', '.join(p.stem for p in paths)}"


def same_shard(rows: pd.DataFrame, model: ModelConfig) -> pd.DataFrame | None:
    """Measured step-op rows of a profile whose shapes are this model's (a shard included)."""
    if "hidden_size" not in rows:
        return None
    match = (
        (rows["hidden_size"] == model.hidden_size)
        & (rows["intermediate_size"] == model.intermediate_size)
        & (rows["num_heads"] == model.num_heads)
        & (rows["num_kv_heads"] == model.num_kv_heads)
        & rows["op"].isin(STEP_OPS)
    )
    part = rows[match].sort_values("seq_len")
    return part.groupby(["op", "seq_len"], as_index=False)["time_s"].median() if len(part) else None


def borrowable(spec: HardwareSpec) -> str | None:
    """A measured device of the same architecture (its key), if any."""
    if not getattr(spec, "architecture", None):
        return None
    for key, other in sorted(load_all_specs().items()):
        if key != spec.key and getattr(other, "architecture", None) == spec.architecture and stored_profiles(key):
            return key
    return None


def latency_source(
    device: str | HardwareSpec,
    model: str | ModelConfig,
    dtype: str | None = None,
    source: str = "auto",
    measurements: pd.DataFrame | None = None,
    params: RooflineParams | None = None,
) -> LatencyModel:
    """The latency source for `model` on `device` (a name, alias or HardwareSpec).

    source: auto (measured > calibrated > borrowed > datasheet, as the data allow), or one
    of measured / calibrated / datasheet to force it; forcing what the data cannot give is
    an error. measurements: data-contract rows to use instead of the stored profiles.
    params: the datasheet roofline's efficiencies (default: the public defaults). dtype: None
    for the device's default (perfmodel.base.dtypes.default_dtype).
    """
    if source not in LATENCY_CHOICES:
        raise PerfkitError(f"unknown latency source {source!r}; choose from: {', '.join(LATENCY_CHOICES)}")
    spec = device if isinstance(device, HardwareSpec) else resolve_spec(device, None)
    dtype = check_dtype(dtype) if dtype else default_dtype(spec.key)
    model = model if isinstance(model, ModelConfig) else load_model(model)
    datasheet = LatencyModel(spec, model, dtype, "datasheet", params=params or RooflineParams())
    if source == "datasheet":
        return datasheet
    given = measurements is not None and len(measurements) and (measurements["dtype"] == dtype).any()
    if given:
        rows, origin = profile_rows(spec.key)
        # where given rows and a profile time the same shape and token count, the median of both counts
        rows = measurements if rows is None else pd.concat([measurements, rows], ignore_index=True)
        rows = rows[rows["dtype"] == dtype]
        table = GemmTable.of(rows, spec, dtype, "given measurements" + (f" + {origin}" if origin else ""))
    else:
        table = stored_calibration(spec, dtype)
    if table is not None:
        rows = table.rows
        mode = "calibrated" if source == "calibrated" else "measured"
        return LatencyModel(spec, model, dtype, mode, table, same_shard(rows, model), table.params)
    if source != "auto":
        raise PerfkitError(
            f"no {dtype} measurements of {spec.key} to give a {source} latency; measured devices: "
            f"{', '.join(measured_devices()) or 'none'} (or use --latency datasheet)"
        )
    lender = borrowable(spec)
    if lender is None:
        return datasheet
    table = stored_calibration(resolve_spec(lender, None), dtype)
    if table is None:
        return datasheet
    return LatencyModel(spec, model, dtype, "borrowed", table, None, table.params)


def measured_devices() -> list[str]:
    return [key for key in sorted(load_all_specs()) if stored_profiles(key)]


def view_latency(view: DeviceView, model: ModelConfig, dtype: str, source: str = "auto") -> LatencyModel:
    """The latency source of a resolved device (perfmodel.measured.device_view): a CPU is its measured
    ceilings' roofline (its own sweep when measured or calibrated is asked for); a GPU
    goes through latency_source with the view's efficiencies as its datasheet fallback."""
    if source not in LATENCY_CHOICES:
        raise PerfkitError(f"unknown latency source {source!r}; choose from: {', '.join(LATENCY_CHOICES)}")
    if not view.is_cpu:
        measured = view.measured if view.measured is not None and len(view.measured) else None
        return latency_source(view.spec, model, dtype, source, measured, view.params)
    if source in ("auto", "datasheet"):
        return LatencyModel(view.spec, model, dtype, "datasheet", params=view.params)
    if view.measured is None or not len(view.measured):
        raise PerfkitError(f"{view.spec.key} has no measured sweep to give a {source} latency")
    return latency_source(view.spec, model, dtype, source, view.measured, view.params)
