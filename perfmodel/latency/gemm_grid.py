"""GEMM latency for any (m, n, k) from a device-wide measured grid (aiconfigurator's GEMM
tables, perfmodel.measured.aiconfigurator), one software stack at a time.

The grid measures m (token rows) = 1-17, then both sides of each tile edge (32/33, 48/49,
..., 256/257) and coarser beyond; n and k on 22 values from 32 to 65536. A time is

- non-decreasing in m, n and k: the measured grid is fitted by the least-squares
  non-decreasing grid along each axis (perfmodel.latency.monotone: a dip between measured
  neighbours, noise or another kernel picked at one size, is averaged with them; steps
  stay), so no interpolation falls as a GEMM grows (a quantized format's grid is read as
  measured: perfmodel.latency.quantized says why);
- linear in m between neighbouring grid rows: the grid samples both sides of every tile edge
  it knows, so a step stays a step (no smoothing across an edge), and within a tile the time
  of a compute-bound GEMM grows linearly with its rows;
- bilinear in log n and log k of log time: between grid columns a GEMM's time scales as a
  power of its weight's dimensions (bytes and FLOPs both grow linearly in n and k);
- beyond the grid, in proportion to m past its last row (32768: compute-bound), and in
  proportion to n and k past their last columns (65536: Llama-3's 128256-token LM head is
  twice the last column's weight, so twice its bytes and FLOPs); before their first column
  (32), the first column's time. The `outside` mask says where. The latency source puts no
  time under its speed-of-light floor (perfmodel.latency.source).

A stack is named by its engine (`vllm`, `sglang`, `trtllm`) or engine and version
(`vllm-0.24.0`); `vidur` names the per-model profiles (perfmodel.latency.gemm_table), which are
another harness, and `torch` (`torch-2.11.0`) this project's own GPU campaigns
(profilers.campaign_stack), whose GEMMs are priced as per-model profiles are, not as a grid.
Which harness measured a number is part of what it means: the same GEMM differs between them
by 10-30% (python -m perfmodel.latency_check prints the offsets).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from perfmodel.base.errors import PerfkitError
from perfmodel.base.precision import SIXTEEN_BIT
from perfmodel.base.stacks import SERVING_ENGINES, Engine
from perfmodel.latency.calibration import fill_holes
from perfmodel.latency.monotone import non_decreasing
from perfmodel.measured.aiconfigurator import ShippedStack
from perfmodel.measured.evidence import DeviceEvidence, as_evidence

AUTO_STACK = "auto"  # --stack auto: the device's default stack

ENGINES = SERVING_ENGINES  # the engines' grids, in the order `auto` prefers them
VIDUR = Engine.VIDUR
TORCH = Engine.TORCH  # this project's own campaigns (perfmodel.measured.aiconfigurator.TORCH_ENGINE)


@dataclass
class GemmGrid:
    """The measured GEMM grid of one device and stack, in one dtype."""

    device: str
    stack: ShippedStack
    dtype: str
    ms: np.ndarray  # token rows measured
    log_ns: np.ndarray
    log_ks: np.ndarray
    log_time: np.ndarray = field(repr=False)  # (m, n, k) -> log seconds
    filled: int = 0  # grid points not measured, filled from their neighbours

    @classmethod
    def of(cls, stack: ShippedStack, dtype: str, table: str = "gemm", fitted: bool = True) -> GemmGrid:
        """The grid of `dtype`'s rows in the stack's `table` (gemm; gemm_quantized for a
        quantized weight format's), all its rows where it holds none of that dtype; fitted
        non-decreasing in m, n and k, or (`fitted` false) read as measured (perfmodel.latency.quantized)."""
        table = stack.table(table)
        table = table[table["dtype"] == dtype] if (table["dtype"] == dtype).any() else table
        if not len(table):
            raise PerfkitError(f"{stack.folder}: no GEMM rows")
        # Where a stack timed two kernels for one point, the engine runs the faster.
        times = table.groupby(["m", "n", "k"])["time_s"].min()
        ms, ns, ks = (np.sort(times.index.unique(level=a).to_numpy()) for a in ("m", "n", "k"))
        full = times.reindex(pd.MultiIndex.from_product([ms, ns, ks])).to_numpy()
        log_time = np.log(full.reshape(len(ms), len(ns), len(ks)))
        missing = int(np.isnan(log_time).sum())
        if missing:
            log_time = fill_holes(log_time)
        log_time = non_decreasing(log_time) if fitted else log_time
        return cls(stack.device, stack, dtype, ms.astype(float), np.log(ns), np.log(ks), log_time, missing)

    @functools.cached_property
    def _interpolator(self):
        from scipy.interpolate import RegularGridInterpolator

        return RegularGridInterpolator(
            (self.ms, self.log_ns, self.log_ks), self.log_time, bounds_error=False, fill_value=None
        )

    def time(self, k, n, m) -> np.ndarray:
        """Seconds of an (m x k) @ (k x n) GEMM, by the grid."""
        m, n, k = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (m, n, k)))
        # Past the grid's last row, column or depth the time grows in proportion to the
        # dimension (bytes and FLOPs both do); extrapolating log time linearly would follow
        # the edge cells' slopes, which can fall. Before the first, the first's time.
        rows = np.clip(m, self.ms[0], self.ms[-1])
        cols = np.clip(np.log(n), self.log_ns[0], self.log_ns[-1])
        depth = np.clip(np.log(k), self.log_ks[0], self.log_ks[-1])
        scale = np.maximum(m / rows, 1.0) * np.maximum(n / np.exp(cols), 1.0) * np.maximum(k / np.exp(depth), 1.0)
        points = np.column_stack([rows.ravel(), cols.ravel(), depth.ravel()])
        return (np.exp(self._interpolator(points)) * scale.ravel()).reshape(m.shape)

    def outside(self, k, n, m) -> np.ndarray:
        """True where a point lies beyond the measured grid (an extrapolation)."""
        m, n, k = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (m, n, k)))
        out = (m < self.ms[0]) | (m > self.ms[-1])
        for values, axis in ((np.log(n), self.log_ns), (np.log(k), self.log_ks)):
            out |= (values < axis[0] - 1e-9) | (values > axis[-1] + 1e-9)
        return out

    def gemms(self) -> pd.DataFrame:
        """The grid's points as single GEMMs (k, n, m, time_s), the columns the roofline fit takes."""
        m, n, k = np.meshgrid(self.ms, np.exp(self.log_ns), np.exp(self.log_ks), indexing="ij")
        return pd.DataFrame(
            {"k": k.ravel().round(), "n": n.ravel().round(), "m": m.ravel(), "time_s": np.exp(self.log_time).ravel()}
        )

    @property
    def label(self) -> str:
        return f"GEMM grid of the {self.stack.describe()}"


def preferred_stacks(stacks, stack: str | None) -> list:
    """Engine stacks (ShippedStack) in the order a table is taken from them: `stack` first, then
    the engines in ENGINES order (a device's other engine stands in where the step's lacks it)."""
    rank = {engine: i for i, engine in enumerate(ENGINES)}
    return sorted(stacks, key=lambda s: (s.stack != stack, rank.get(s.engine, len(rank)), s.stack))


def stack_names(device: str | DeviceEvidence) -> list[str]:
    """The stacks with GEMM measurements of a device: vidur (per-model profiles) first, then
    the engines' grids in ENGINES order, then this project's own (torch-<version>)."""
    evidence = as_evidence(device)
    names = [VIDUR] if evidence.profiles else []
    grids = [s.stack for s in evidence.with_table("gemm")]
    return names + sorted(grids, key=lambda s: (ENGINES.index(s.split("-")[0]) if s.split("-")[0] in ENGINES else 9, s))


def torch_stack(device: str | DeviceEvidence) -> str | None:
    """The device's newest torch stack (this project's own campaign: the reference decoder's
    kernels), None without one."""
    own = [n for n in stack_names(device) if n.split("-")[0] == TORCH]
    return own[-1] if own else None


def resolve_stack(device: str | DeviceEvidence, stack: str | None) -> str | None:
    """The stack a latency rests on: the one asked for (an engine or engine-version), or by
    default the device's per-model profiles (vidur), else its first engine grid; None where
    the device has no GEMM measurements (and none was asked for)."""
    evidence = as_evidence(device)
    names = stack_names(evidence)
    if stack in (None, AUTO_STACK):
        return names[0] if names else None
    matches = [n for n in names if n == stack or n.split("-")[0] == stack]
    if not matches:
        have = ", ".join(names) if names else "none"
        raise PerfkitError(f"--stack {stack}: {evidence.key} has no GEMM measurements of that stack; it has: {have}")
    return matches[0]


def gemm_grid(device: str | DeviceEvidence, stack: str, dtype: str) -> GemmGrid | None:
    """The grid of a device and engine stack (e.g. vllm-0.24.0) for a 16-bit dtype, built once
    per evidence; None for another dtype."""
    if dtype not in SIXTEEN_BIT:
        return None
    evidence = as_evidence(device)
    return evidence.derived(("gemm_grid", stack, dtype), lambda: _grid(evidence, stack, dtype))


def _grid(evidence: DeviceEvidence, stack: str, dtype: str) -> GemmGrid | None:
    for shipped in evidence.with_table("gemm"):
        # a torch stack holds the GEMMs a campaign timed, not a grid (its latency is a GemmTable)
        if shipped.stack == stack and not shipped.is_torch:
            table = shipped.table("gemm")
            wanted = dtype if (table["dtype"] == dtype).any() else "bf16"
            return GemmGrid.of(shipped, wanted)
    return None


def default_grid(device: str | DeviceEvidence, dtype: str) -> GemmGrid | None:
    """The device's first engine grid (ENGINES order), for combining with per-model profiles."""
    evidence = as_evidence(device)
    engines = [n for n in stack_names(evidence) if n.split("-")[0] in ENGINES]
    return gemm_grid(evidence, engines[0], dtype) if engines else None
