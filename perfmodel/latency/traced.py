"""A decoding step as it really runs: a traced kernel inventory, every kernel priced.

A trace table (TRACE_COLUMNS, one row per kernel the step launches) is data: the decoder's
tracer (decoder.trace) writes it by running the reference decoder's step on PyTorch's meta
device, and this module prices it without knowing where it came from. Each kernel is priced
by what bounds it:

- `gemm`: through the latency source (measured, grid, calibrated, transferred or datasheet,
  as its label says); a batched matmul of activations (no weight) by the roofline;
- `attention`: the device's measured attention tables where it has them (decode kernel for
  one query token, the tree mapping for several; perfmodel.latency.attention_table), else
  the roofline of one fused kernel;
- `elementwise`, `reduction`, `indexing`, `copy`: memory bound, their bytes over the
  device's bandwidth at its memory efficiency, never less than the per-kernel overhead (the
  floor a tiny transfer pays);
- `host_sync`: a device-to-host read the step waits for (an `int()` or `.tolist()` in the
  acceptance check), priced as one per-kernel overhead: the device is idle while the host
  reads.

Every kernel carries the source's per-kernel overhead (RooflineParams.kernel_overhead_s: the
datasheet default on a GPU, the measured per-op overhead on a CPU), as an eager step that
launches kernels one by one pays it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from perfmodel.base.errors import PerfkitError
from perfmodel.hardware.efficiencies import RooflineParams
from perfmodel.latency.roofline import kernel_time
from perfmodel.models.config import ModelConfig
from perfmodel.models.operators import FusedAttention, Matmul

TRACE_COLUMNS = (
    "step",
    "index",
    "part",
    "aten",
    "kind",
    "dtype",
    "batch",
    "m",
    "n",
    "k",
    "heads",
    "kv_heads",
    "q_len",
    "kv_len",
    "head_dim",
    "flops",
    "bytes",
    "shapes",
)
KINDS = ("gemm", "attention", "elementwise", "reduction", "indexing", "copy", "host_sync")
MEMORY_KINDS = ("elementwise", "reduction", "indexing", "copy")
# Tracer: (model, batch, context, candidates, dtype) -> trace table of one step.
Tracer = Callable[[ModelConfig, int, int, int, str], pd.DataFrame]


def check_trace(trace: pd.DataFrame) -> None:
    """Refuse a table that is not a trace: missing columns or unknown kinds."""
    missing = [c for c in TRACE_COLUMNS if c not in trace.columns]
    if missing:
        raise PerfkitError(f"not a trace table: missing columns {', '.join(missing)}")
    unknown = sorted(set(trace["kind"]) - set(KINDS))
    if unknown:
        raise PerfkitError(f"trace has unknown kernel kinds {', '.join(unknown)}; known: {', '.join(KINDS)}")


def _params(latency) -> RooflineParams:
    return getattr(latency, "params", None) or RooflineParams()


def _gemm_times(rows: pd.DataFrame, latency, spec, dtype: str, params: RooflineParams) -> np.ndarray:
    measured = getattr(latency, "table", None) is not None or getattr(latency, "grid", None) is not None
    out = np.empty(len(rows))
    for i, r in enumerate(rows.itertuples()):
        weight = int(r.batch) == 1
        matmul = Matmul(int(r.batch), int(r.m), int(r.k), int(r.n), weight=weight)
        if weight and measured:
            out[i] = float(np.asarray(latency.gemm_time(matmul)).ravel()[0])
        else:
            out[i] = float(kernel_time(matmul, dtype, spec, params))
    return out


def _attention_times(rows: pd.DataFrame, latency, spec, dtype: str, params: RooflineParams) -> np.ndarray:
    table = getattr(latency, "attention", None)
    out = np.empty(len(rows))
    for i, r in enumerate(rows.itertuples()):
        b, h, kvh, q, s, d = (int(v) for v in (r.batch, r.heads, r.kv_heads, r.q_len, r.kv_len, r.head_dim))
        timed = None
        if table is not None and d == 128:
            if q == 1:
                timed = table.decode_time(b, s, h, kvh)
            else:
                timed = table.tree_time(b, q, s, h, kvh)
        if timed is None:
            timed = kernel_time(FusedAttention(b, h, kvh, q, s, d), dtype, spec, params)
        out[i] = float(np.asarray(timed).ravel()[0])
    return out


def _memory_times(rows: pd.DataFrame, spec, params: RooflineParams) -> np.ndarray:
    moved = rows["bytes"].to_numpy(dtype=float) / (spec.bandwidth * params.memory_efficiency)
    return moved + params.kernel_overhead_s


def price_trace(trace: pd.DataFrame, latency, dtype: str) -> pd.DataFrame:
    """The trace with `time_s` per kernel (see the module doc) and the `source` of each."""
    check_trace(trace)
    spec, params = latency.spec, _params(latency)
    priced = trace.copy()
    priced["time_s"] = 0.0
    priced["source"] = ""
    for kind in KINDS:
        where = priced["kind"] == kind
        if not where.any():
            continue
        rows = priced[where]
        if kind == "gemm":
            times, source = _gemm_times(rows, latency, spec, dtype, params), "latency source"
        elif kind == "attention":
            times = _attention_times(rows, latency, spec, dtype, params)
            source = "measured attention" if getattr(latency, "attention", None) is not None else "roofline"
        elif kind == "host_sync":
            times, source = np.full(len(rows), params.kernel_overhead_s), "per-kernel overhead"
        else:
            times, source = _memory_times(rows, spec, params), "bytes / bandwidth + overhead"
        priced.loc[where, "time_s"] = times
        priced.loc[where, "source"] = source
    return priced


def kind_shares(priced: pd.DataFrame) -> pd.DataFrame:
    """Per kernel kind: kernels launched, seconds and share of the step time."""
    grouped = priced.groupby("kind")["time_s"].agg(kernels="size", time_s="sum")
    grouped = grouped.reindex([k for k in KINDS if k in grouped.index])
    grouped["share"] = grouped["time_s"] / grouped["time_s"].sum()
    return grouped.reset_index()


@dataclass
class TracedStep:
    """Step latency of a model from traces of its steps, priced by a latency source.

    Speaks StepModel's interface (step_time, overhead), so the speedup commands take it as
    a step flavour. The tracer is handed in by the command (decoder.trace.trace_step): the
    analytic core never imports the decoder."""

    model: ModelConfig
    latency: object
    dtype: str
    tracer: Tracer
    flavor: str = "traced"
    _cache: dict = field(default_factory=dict, repr=False)

    def priced(self, batch: int, seq_len: int, candidates: int = 1) -> pd.DataFrame:
        key = (int(batch), int(seq_len), int(candidates))
        if key not in self._cache:
            trace = self.tracer(self.model, *key, self.dtype)
            self._cache[key] = price_trace(trace, self.latency, self.dtype)
        return self._cache[key]

    def step_time(self, batch, seq_len, candidates=1) -> np.ndarray:
        """Seconds per step, broadcast over the points given (one trace per distinct point)."""
        b, s, q = np.broadcast_arrays(*(np.asarray(x, dtype=np.int64) for x in (batch, seq_len, candidates)))
        out = np.array([self.priced(*p)["time_s"].sum() for p in zip(b.ravel(), s.ravel(), q.ravel())])
        return out.reshape(b.shape)

    def overhead(self, batch, seq_len, candidates) -> np.ndarray:
        return self.step_time(batch, seq_len, candidates) / self.step_time(batch, seq_len, 1)
