"""Latency sources built from measurements (the data-contract rows of a sweep).

- `MeasuredLatency`: interpolation in a measured sweep. Per (op, phase), log(time) is
  interpolated linearly over log2 of batch, sequence length and candidates on the sweep's
  grid; outside the grid it extrapolates from the nearest cells (and says so through
  `outside`). Exact at measured points.
- `FittedRoofline`: the roofline's three parameters (compute efficiency, memory
  efficiency, per-kernel overhead) fitted by least squares on log(time) to measured rows,
  so a device measured on a few shapes is predicted on all. `fit_roofline` holds out a
  share of the rows and reports the error on them.

Both have the `op_time(op, phase, batch, seq_len, candidates)` of perfmodel.latency.step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from perfmodel.base.errors import PerfkitError
from perfmodel.base.provenance import Provenance
from perfmodel.hardware.efficiencies import RooflineParams
from perfmodel.hardware.specs import HardwareSpec
from perfmodel.latency.fit import ROWS_BOUNDS, fit_roofline_params
from perfmodel.latency.roofline import RooflineLatency
from perfmodel.models.config import ModelConfig

AXES = ("batch", "seq_len", "candidates")


def usable_rows(rows: pd.DataFrame, model: str | None = None, dtype: str | None = None) -> pd.DataFrame:
    """Measured rows with a time, of one model and dtype when given."""
    if rows is None or not len(rows):
        raise PerfkitError("no measured rows to calibrate from")
    keep = (rows["source"] == Provenance.MEASURED) & rows["time_s"].notna() & (rows["time_s"] > 0)
    for column, value in (("model", model), ("dtype", dtype)):
        if value is not None:
            keep &= rows[column] == value
    kept = rows[keep]
    if not len(kept):
        have = sorted(set(zip(rows["model"], rows["dtype"])))
        raise PerfkitError(f"no measured rows for model {model!r} dtype {dtype!r}; the measurements have {have[:6]}")
    return kept


@dataclass
class _Table:
    """log(time) of one (op, phase) on a regular grid of log2 axes."""

    axes: list[np.ndarray]  # log2 values per varying axis
    names: list[str]
    values: np.ndarray

    def __call__(self, points: dict[str, np.ndarray]) -> np.ndarray:
        from scipy.interpolate import RegularGridInterpolator

        if not self.names:
            return np.full(len(next(iter(points.values()))), self.values.item())
        x = np.column_stack([np.log2(points[n].astype(float)) for n in self.names])
        if len(self.names) == 1 and len(self.axes[0]) == 1:
            return np.full(len(x), self.values.item())
        # Axes with one measured value carry no slope; interpolate over the others.
        keep = [i for i, a in enumerate(self.axes) if len(a) > 1]
        values = self.values.reshape([len(a) for a in self.axes])
        values = values[tuple(slice(None) if i in keep else 0 for i in range(len(self.axes)))]
        if not keep:
            return np.full(len(x), values.item())
        interp = RegularGridInterpolator([self.axes[i] for i in keep], values, bounds_error=False, fill_value=None)
        return interp(x[:, keep])


@dataclass
class MeasuredLatency:
    """Interpolation in measured rows (one device, model and dtype)."""

    rows: pd.DataFrame
    model: str | None = None
    dtype: str | None = None
    tables: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.rows = usable_rows(self.rows, self.model, self.dtype)
        for (op, phase), group in self.rows.groupby(["op", "phase"]):
            grouped = group.groupby(list(AXES))["time_s"].median()
            axes = [np.log2(np.sort(grouped.index.unique(level=a).to_numpy(dtype=float))) for a in AXES]
            full = pd.MultiIndex.from_product([grouped.index.unique(level=a).sort_values() for a in AXES])
            values = grouped.reindex(full).to_numpy()
            if np.isnan(values).any():
                # A skipped point leaves a hole; fill it from its measured neighbours in log space.
                values = fill_holes(np.log(values.reshape([len(a) for a in axes])))
            else:
                values = np.log(values.reshape([len(a) for a in axes]))
            self.tables[(op, phase)] = _Table(axes, list(AXES), values)

    def op_time(self, op: str, phase: str, batch, seq_len, candidates) -> np.ndarray:
        if (op, phase) not in self.tables:
            have = sorted({f"{o}/{p}" for o, p in self.tables})
            raise PerfkitError(f"the measurements have no {op}/{phase} rows; measured: {', '.join(have)}")
        b, s, q = np.broadcast_arrays(*(np.atleast_1d(np.asarray(v)) for v in (batch, seq_len, candidates)))
        return np.exp(
            self.tables[(op, phase)]({"batch": b.ravel(), "seq_len": s.ravel(), "candidates": q.ravel()})
        ).reshape(b.shape)

    def outside(self, op: str, phase: str, batch, seq_len, candidates) -> np.ndarray:
        """True where a point lies outside the measured grid (an extrapolation)."""
        table = self.tables[(op, phase)]
        out = np.zeros(np.broadcast(batch, seq_len, candidates).shape, dtype=bool)
        for _name, values, axis in zip(AXES, np.broadcast_arrays(batch, seq_len, candidates), table.axes):
            lv = np.log2(np.asarray(values, dtype=float))
            out |= (lv < axis.min() - 1e-9) | (lv > axis.max() + 1e-9)
        return out


def fill_holes(values: np.ndarray) -> np.ndarray:
    """Fill NaN cells by repeatedly averaging measured neighbours along each axis."""
    values = values.copy()
    for _ in range(sum(values.shape)):
        holes = np.isnan(values)
        if not holes.any():
            return values
        total, count = np.zeros_like(values), np.zeros_like(values)
        for axis in range(values.ndim):
            for shift in (1, -1):
                moved = np.roll(values, shift, axis=axis)
                edge = [slice(None)] * values.ndim
                edge[axis] = 0 if shift == 1 else -1
                moved[tuple(edge)] = np.nan
                ok = ~np.isnan(moved)
                total[ok] += moved[ok]
                count[ok] += 1
        fill = holes & (count > 0)
        values[fill] = total[fill] / count[fill]
    if np.isnan(values).all():
        raise PerfkitError("an op's measured rows are all skipped; nothing to interpolate")
    return values


@dataclass(frozen=True)
class FitReport:
    params: RooflineParams
    train_rows: int
    heldout_rows: int
    heldout_median_abs_pct: float
    heldout_mean_abs_pct: float
    heldout_p90_abs_pct: float

    def __str__(self) -> str:
        p = self.params
        return (
            f"fitted roofline: compute efficiency {p.compute_efficiency:.3f}, memory efficiency "
            f"{p.memory_efficiency:.3f}, "
            f"overhead {p.kernel_overhead_s * 1e6:.1f} us per kernel; on {self.heldout_rows} held-out rows "
            f"(fit on {self.train_rows}): median error {self.heldout_median_abs_pct:.1f}%, mean "
            f"{self.heldout_mean_abs_pct:.1f}%, "
            f"p90 {self.heldout_p90_abs_pct:.1f}%"
        )


def predict_rows(rows: pd.DataFrame, latency) -> np.ndarray:
    """Predicted seconds for each measured row (its op, phase and point)."""
    out = np.empty(len(rows))
    for (op, phase), group in rows.groupby(["op", "phase"]):
        idx = rows.index.get_indexer(group.index)
        out[idx] = latency.op_time(
            op, phase, group["batch"].to_numpy(), group["seq_len"].to_numpy(), group["candidates"].to_numpy()
        )
    return out


def fit_roofline(
    rows: pd.DataFrame, spec: HardwareSpec, model: ModelConfig, dtype: str, holdout: float = 0.25, seed: int = 0
) -> tuple[RooflineLatency, FitReport]:
    """A RooflineLatency whose parameters best fit `rows` in log time (perfmodel.latency.fit),
    and its error on a random `holdout` share of the rows it was not fitted to."""
    rows = usable_rows(rows, model.name, dtype).reset_index(drop=True)
    if not 0 <= holdout < 1:
        raise PerfkitError(f"holdout must be in [0, 1), got {holdout}")
    if len(rows) < 4:
        raise PerfkitError(f"fitting the roofline needs at least 4 measured rows, got {len(rows)}")
    order = np.random.default_rng(seed).permutation(len(rows))
    n_held = int(round(holdout * len(rows))) if holdout else 0
    held, train = rows.iloc[order[:n_held]], rows.iloc[order[n_held:]]
    train_rows = train.reset_index(drop=True)
    params = fit_roofline_params(
        lambda p: predict_rows(train_rows, RooflineLatency(spec, model, dtype, p)),
        np.log(train["time_s"].to_numpy()),
        ROWS_BOUNDS,
        "fitted to measurements",
    )
    fitted = RooflineLatency(spec, model, dtype, params)
    check = held if len(held) else train
    err = np.abs(predict_rows(check.reset_index(drop=True), fitted) / check["time_s"].to_numpy() - 1) * 100
    report = FitReport(
        fitted.params, len(train), len(held), float(np.median(err)), float(err.mean()), float(np.percentile(err, 90))
    )
    return fitted, report
