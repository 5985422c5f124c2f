"""A device's measured GEMMs (the imported per-model profiles: Vidur's), with the roofline
fitted to them and the measured staircase in tokens (perfmodel.latency.source says how the
two predict any shape).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.base.errors import PerfkitError
from perfmodel.base.provenance import Provenance
from perfmodel.hardware.efficiencies import RooflineParams
from perfmodel.hardware.specs import HardwareSpec
from perfmodel.latency.fit import GEMM_BOUNDS, fit_key, fit_roofline_params, remembered_fit
from perfmodel.latency.roofline import kernel_time
from perfmodel.measured.aiconfigurator import contract_rows
from perfmodel.measured.evidence import DeviceEvidence, as_evidence
from perfmodel.measured.store import user_fits_dir
from perfmodel.models.config import ModelConfig, load_model
from perfmodel.models.operators import LINEAR_OPS, STEP_OPS, Matmul, op_kernels, query_len

# Shapes closer than this (in log k, log n) lend their staircase; 2 neighbours smooth one
# shape's odd kernel choice (chosen on the leave-one-model-out test, python -m perfmodel.latency_check).
NEIGHBOURS = 2


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
    """Measured linear-op rows and single-GEMM rows (op `gemm`, with their n and k) as single
    GEMMs: k, n (the weight), m (tokens), time_s."""
    linear = rows[rows["op"].isin(LINEAR_OPS)]
    out = []
    single = rows[rows["op"] == "gemm"]
    if len(single):
        m = single["batch"].to_numpy(dtype=np.int64) * single["seq_len"].to_numpy(dtype=np.int64)
        out.append(
            pd.DataFrame(
                {
                    "k": single["k"].to_numpy(),
                    "n": single["n"].to_numpy(),
                    "m": m,
                    "time_s": single["time_s"].to_numpy(),
                }
            )
        )
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


def fit_params(gemms: pd.DataFrame, spec: HardwareSpec, dtype: str, kind: str = "measured") -> RooflineParams:
    """The roofline's efficiencies and per-kernel overhead fitted to GEMM times (`kind`:
    measured, or transferred from other devices) by perfmodel.latency.fit: least squares on
    log time."""
    k, n, m, t = (gemms[c].to_numpy(dtype=float) for c in ("k", "n", "m", "time_s"))
    label = f"fitted to {len(gemms)} {kind} GEMMs on {spec.key}"
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
    # (k, n, id(grid)) -> (grid, log of measured / grid time at the shape's measured tokens):
    # grid_predict's neighbours recur for every shape priced, at the same tokens
    grid_ratios: dict = field(default_factory=dict, repr=False, compare=False)

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
        return GemmTable(self.spec, self.gemms, self.params, self.origin, self.rows, curves, self.grid_ratios)

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
        shapes, weights = self.nearest(k, n)
        ratios = [w * self.ratio(int(sk), int(sn), m, spec, dtype) for w, (sk, sn) in zip(weights, shapes)]
        return sum(ratios) / weights.sum()

    def nearest(self, k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The NEIGHBOURS measured shapes closest to (k, n) in log k and log n, and their weights."""
        shapes = np.array(list(self.curves))
        distance = np.hypot(np.log(shapes[:, 0] / k), np.log(shapes[:, 1] / n))
        nearest = np.argsort(distance)[:NEIGHBOURS]
        return shapes[nearest], 1 / (distance[nearest] + 0.05)

    def grid_predict(self, k: int, n: int, m, grid) -> np.ndarray:
        """Seconds of a (k, n) GEMM over m tokens with the shape dependence from another
        harness's grid (perfmodel.latency.gemm_grid.GemmGrid) and the level from these rows:
        the grid's time times the measured / grid ratio of the nearest measured shapes at the
        same token count (geometric mean, weighted by closeness)."""
        m = np.asarray(m, dtype=float)
        shapes, weights = self.nearest(k, n)
        log_ratio = 0.0
        for weight, (sk, sn) in zip(weights, shapes):
            tokens, ratio = self.grid_log_ratio(int(sk), int(sn), grid)
            log_ratio = log_ratio + weight * np.interp(m, tokens, ratio)
        return grid.time(k, n, m) * np.exp(log_ratio / weights.sum())

    def grid_log_ratio(self, k: int, n: int, grid) -> tuple[np.ndarray, np.ndarray]:
        """A measured shape's token counts and the log of its measured / grid time there."""
        key = (k, n, id(grid))
        cached = self.grid_ratios.get(key)
        if cached is None or cached[0] is not grid:
            tokens, seconds = self.curves[(k, n)]
            cached = self.grid_ratios[key] = (grid, tokens, np.log(seconds / grid.time(k, n, tokens)))
        return cached[1], cached[2]

    def offset(self, grid) -> float:
        """The median of these rows' time over the grid's at the same shapes and token counts:
        how much slower (> 1) this harness measures the same GEMMs."""
        g = self.gemms
        return float(np.median(g["time_s"].to_numpy() / grid.time(g["k"], g["n"], g["m"])))


def stored_calibration(device: str | DeviceEvidence, dtype: str) -> GemmTable | None:
    """The calibration on a device's stored profiles (None without any), fitted once per
    evidence: a plan asks once per device and tensor-parallel degree."""
    evidence = as_evidence(device)
    return evidence.derived(("calibration", dtype), lambda: _calibration(evidence, dtype))


def _calibration(evidence: DeviceEvidence, dtype: str) -> GemmTable | None:
    rows, origin = profile_rows(evidence)
    if rows is None or not (rows["dtype"] == dtype).any():
        return None
    return GemmTable.of(rows[rows["dtype"] == dtype], evidence.spec, dtype, origin)


def stack_calibration(device: str | DeviceEvidence, stack: str, dtype: str) -> GemmTable | None:
    """The calibration on a torch stack's GEMMs (a campaign's, perfmodel.measured.aiconfigurator
    reads them), fitted once per evidence; None where the stack holds no GEMMs in `dtype` or
    its 16-bit twin (the same tensor-core rate)."""
    evidence = as_evidence(device)
    return evidence.derived(("stack_calibration", stack, dtype), lambda: _stack_calibration(evidence, stack, dtype))


def _stack_calibration(evidence: DeviceEvidence, stack: str, dtype: str) -> GemmTable | None:
    shipped = [s for s in evidence.with_table("gemm") if s.stack == stack]
    if not shipped:
        return None
    rows = contract_rows(shipped[0], "gemm")
    twin = {"fp16": "bf16", "bf16": "fp16"}.get(dtype)
    wanted = dtype if (rows["dtype"] == dtype).any() else twin
    if wanted is None or not (rows["dtype"] == wanted).any():
        return None
    return GemmTable.of(rows[rows["dtype"] == wanted], evidence.spec, dtype, shipped[0].describe())


def profile_rows(device: str | DeviceEvidence) -> tuple[pd.DataFrame | None, str]:
    """A device's measured profiles (imported, under profilers/measurements/<device>/imported/),
    read once per evidence."""
    evidence = as_evidence(device)
    return evidence.derived(("profiles",), lambda: _profile_rows(evidence.profiles))


def _profile_rows(paths: tuple[Path, ...]) -> tuple[pd.DataFrame | None, str]:
    if not paths:
        return None, ""
    rows = pd.concat([pd.read_csv(p) for p in paths], ignore_index=True)
    rows = rows[(rows["source"] == Provenance.MEASURED) & rows["time_s"].notna()]
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
