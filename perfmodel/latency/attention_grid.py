"""One measured attention kernel's grid: each head configuration's times over (batch, kv_len)
(HeadGrid), and a phase's table of configurations with the rule that predicts the ones not
measured from their neighbours (KernelTable). perfmodel.latency.attention_table's module doc
gives the rules; AttentionTable serves a device and stack from them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from perfmodel.base.errors import PerfkitError
from perfmodel.hardware.efficiencies import RooflineParams
from perfmodel.hardware.specs import HardwareSpec
from perfmodel.latency.monotone import non_decreasing
from perfmodel.latency.roofline import kernel_time, speed_of_light
from perfmodel.models.operators import FusedAttention, Phase

HEAD_DIM = 128  # the main tables' head size (every model preset's); others in tables of their own
# Neighbour weights 1 / hypot(KV_WEIGHT x dlog2 kv_heads, dlog2 group) ** POWER (module doc).
KV_WEIGHT = 0.5
POWER = 6
# A tree step runs the model's own decode kernel: measured configurations at its group x q
# that run more than SWITCH times slower against the roofline than the model's decode are
# another kernel class (module doc) and do not set it.
SWITCH = 2.0


def _cell(axis: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lower index and fraction of x in a sorted axis; fractions outside [0, 1] extrapolate."""
    if len(axis) == 1:
        return np.zeros(x.shape, dtype=int), np.zeros(x.shape)
    i = np.clip(np.searchsorted(axis, x, side="right") - 1, 0, len(axis) - 2)
    return i, (x - axis[i]) / (axis[i + 1] - axis[i])


@dataclass(frozen=True)
class HeadGrid:
    """One measured (heads, KV heads) configuration: ln(seconds) on (log2 batch, log2 kv_len)."""

    log_batch: np.ndarray
    log_len: np.ndarray
    log_time: np.ndarray  # holes filled (see the module doc)
    measured: np.ndarray  # bool, where log_time is a measurement
    # How time grows with kv_len past the grid: decode streams the cache (1), causal prefill's
    # work grows with the square of its tokens (2).
    length_exponent: float = 1.0

    @classmethod
    def of(cls, points: pd.DataFrame, length_exponent: float = 1.0) -> HeadGrid:
        """From points with one time per (batch, kv_len) (KernelTable.of's medians)."""
        batches, row = np.unique(points["batch"].to_numpy(dtype=float), return_inverse=True)
        lengths, column = np.unique(points["kv_len"].to_numpy(dtype=float), return_inverse=True)
        seconds = np.full((len(batches), len(lengths)), np.nan)
        seconds[row, column] = points["time_s"].to_numpy(dtype=float)
        log_len = np.log2(lengths)
        values = np.log(seconds)
        measured = ~np.isnan(values)
        for row, ok in zip(values, measured):
            x, y = log_len[ok], row[ok]
            row[:] = np.interp(log_len, x, y)  # holes between measured lengths; flat before the first
            if len(x) > 1:
                exponent = np.clip((y[-1] - y[-2]) / (x[-1] - x[-2]) / np.log(2), 0.0, 1.0)
            else:
                exponent = 1.0  # one point: take the cache-streaming limit, time proportional to kv_len
            after = log_len > x[-1]
            row[after] = y[-1] + exponent * np.log(2) * (log_len[after] - x[-1])
        return cls(np.log2(batches), log_len, non_decreasing(values), measured, length_exponent)

    def at(self, batch: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """ln(seconds) at (batch, kv_len) arrays, and whether each lies in the measured region
        (inside the grid, with every interpolation corner it uses measured). Past the grid's
        last batch or length the time grows as batch^1 and kv_len^length_exponent, the same
        for every row and column, so the order the grid has is kept; before its first, the
        first's time."""
        xb, xs = np.log2(batch), np.log2(length)
        cb = np.clip(xb, self.log_batch[0], self.log_batch[-1])
        cs = np.clip(xs, self.log_len[0], self.log_len[-1])
        i, u = _cell(self.log_batch, cb)
        j, v = _cell(self.log_len, cs)
        i1, j1 = np.minimum(i + 1, len(self.log_batch) - 1), np.minimum(j + 1, len(self.log_len) - 1)
        corners = ((i, j, (1 - u) * (1 - v)), (i1, j, u * (1 - v)), (i, j1, (1 - u) * v), (i1, j1, u * v))
        value = sum(w * self.log_time[a, b] for a, b, w in corners)
        beyond = np.maximum(xb - self.log_batch[-1], 0) + self.length_exponent * np.maximum(xs - self.log_len[-1], 0)
        value = value + np.log(2) * beyond
        inside = (xb >= self.log_batch[0] - 1e-9) & (xb <= self.log_batch[-1] + 1e-9)
        inside &= (xs >= self.log_len[0] - 1e-9) & (xs <= self.log_len[-1] + 1e-9)
        for a, b, w in corners:
            inside &= self.measured[a, b] | (np.abs(w) < 1e-12)
        return value, inside

    def points(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The measured (batch, kv_len, seconds)."""
        rows, cols = np.nonzero(self.measured)
        return (
            np.rint(2.0 ** self.log_batch[rows]).astype(np.int64),
            np.rint(2.0 ** self.log_len[cols]).astype(np.int64),
            np.exp(self.log_time[rows, cols]),
        )


@dataclass(frozen=True)
class KernelTable:
    """One phase's measured kernel (decode or prefill) of one stack, by head configuration."""

    phase: str  # decode, prefill, or tree (a torch stack's measured tree step)
    spec: HardwareSpec
    dtype: str
    grids: dict[tuple[int, int], HeadGrid] = field(repr=False)
    clamped: int = 0  # measured points under their speed-of-light floor, raised to it
    points: int = 0  # measured points
    q_len: int = 1  # query tokens per sequence outside prefill: 1 in decode, the tree's size in a tree table
    head_dim: int = HEAD_DIM

    @classmethod
    def of(
        cls, frame: pd.DataFrame, phase: str, spec: HardwareSpec, dtype: str, q_len: int = 1, head_dim: int = HEAD_DIM
    ) -> KernelTable:
        keys = ["num_heads", "num_kv_heads", "batch", "kv_len"]
        # Repeats of a point: their median; two kernel sources for one point: the faster.
        per_source = frame.groupby([*keys, "kernel_source"], as_index=False)["time_s"].median()
        best = per_source.groupby(keys, as_index=False)["time_s"].min()
        columns = (best[c].to_numpy(dtype=np.int64) for c in keys)
        floor = attention_floor(attention_kernel(phase, *columns, q_len, head_dim), spec, dtype)
        clamped = int((best["time_s"].to_numpy() < floor).sum())
        best = best.assign(time_s=np.maximum(best["time_s"].to_numpy(), floor))
        exponent = 2.0 if phase == Phase.PREFILL else 1.0
        grids = {(int(h), int(kv)): HeadGrid.of(part, exponent) for (h, kv), part in best.groupby(keys[:2])}
        return cls(phase, spec, dtype, grids, clamped, len(best), q_len, head_dim)

    @property
    def bounds(self) -> tuple[HardwareSpec, str]:
        """The device and dtype its speed-of-light floor is at."""
        return self.spec, self.dtype

    def without(self, heads: int, kv_heads: int) -> KernelTable:
        """This table less one head configuration (to predict it from the others)."""
        return replace(self, grids={k: g for k, g in self.grids.items() if k != (heads, kv_heads)})

    def roofline(self, batch, length, heads, kv_heads) -> np.ndarray:
        kernel = attention_kernel(self.phase, heads, kv_heads, batch, length, self.q_len, self.head_dim)
        return np.asarray(kernel_time(kernel, self.dtype, self.spec, RooflineParams()), dtype=float)

    def predict(self, batch, length, heads, kv_heads, ceiling=None) -> tuple[np.ndarray, np.ndarray]:
        """Seconds and the outside mask at broadcast arrays of points (see the module doc).
        ceiling: seconds above which a measured configuration's time counts as another
        kernel class's and is not used (a tree step's guard); where no measured
        configuration is under it, ceiling / SWITCH, flagged outside."""
        arrays = np.broadcast_arrays(batch, length, heads, kv_heads, np.inf if ceiling is None else ceiling)
        b, s, h, kv, top = (np.asarray(a, dtype=float) for a in arrays)
        seconds, outside = np.empty(b.shape), np.empty(b.shape, dtype=bool)
        pending, switched = np.ones(b.shape, dtype=bool), np.zeros(b.shape, dtype=bool)
        for hi, kvi in {(int(x), int(y)) for x, y in zip(h.flat, kv.flat)} & set(self.grids):
            sel = (h == hi) & (kv == kvi)
            value, inside = self.grids[(hi, kvi)].at(b[sel], s[sel])
            seconds[sel], outside[sel] = np.exp(value), ~inside
            pending[sel] = switched[sel] = np.exp(value) > top[sel]
        if pending.any():
            seconds[pending], outside[pending] = self._from_neighbours(
                b[pending], s[pending], h[pending], kv[pending], top[pending]
            )
        return seconds, outside | switched

    def _from_neighbours(self, b, s, heads, kv_heads, top) -> tuple[np.ndarray, np.ndarray]:
        """Points of head configurations not measured (or over the ceiling `top`), from the
        other measured ones (1-d arrays)."""
        if not self.grids:
            raise PerfkitError(f"no measured {self.phase} attention configurations to predict from")
        configs = list(self.grids)
        group = np.log2(heads / kv_heads)
        groups = np.array([np.log2(hc / kvc) for hc, kvc in configs])
        own_roofline = np.log(self.roofline(b, s, heads, kv_heads))
        estimates, weights = np.empty((len(configs), b.size)), np.zeros((len(configs), b.size))
        inside = np.empty((len(configs), b.size), dtype=bool)
        for n, (hc, kvc) in enumerate(configs):
            equivalent = b * kv_heads / kvc  # the same number of (sequence, KV head) pairs
            value, inside[n] = self.grids[(hc, kvc)].at(equivalent, s)
            estimates[n] = value + own_roofline - np.log(self.roofline(equivalent, s, hc, kvc))
            distance = np.hypot(KV_WEIGHT * np.log2(kv_heads / kvc), group - groups[n])
            usable = (distance > 0) & (estimates[n] <= np.log(top))  # not the point's own, same class
            weights[n, usable] = distance[usable] ** -POWER
        inside &= weights > 0
        covered = inside.any(axis=0)
        # Where no configuration has the point in its measured region, all extrapolate and all count.
        weights *= inside | ~covered
        total = weights.sum(axis=0)
        none = total == 0  # nothing under the ceiling: the ceiling's own estimate
        log_time = np.where(none, np.log(top / SWITCH), (estimates * weights).sum(axis=0) / np.where(none, 1, total))
        beyond = (group < groups.min() - 1e-9) | (group > groups.max() + 1e-9)
        return np.exp(log_time), ~covered | beyond | none


def attention_kernel(phase: str, heads, kv_heads, batch, kv_len, q_len=1, head_dim: int = HEAD_DIM):
    """The fused attention kernel of `phase` (decode: one query token; a tree step: q_len;
    prefill: kv_len queries, causal) at these shapes (arrays broadcast)."""
    q = kv_len if phase == Phase.PREFILL else q_len
    return FusedAttention(batch, heads, kv_heads, q, kv_len, head_dim, causal=phase == Phase.PREFILL)


def attention_floor(kernel: FusedAttention, spec: HardwareSpec, dtype: str):
    """Seconds no attention kernel can beat: its Q, K and V read and output written at the
    datasheet bandwidth, or its FLOPs at the peak."""
    return speed_of_light(kernel, dtype, spec)
