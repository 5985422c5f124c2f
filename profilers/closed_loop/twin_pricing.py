"""How the twin prices a kernel its replay could not time: GEMMs timed here at the exact
shapes asked, attention as an SDPA call of its shape, memory-bound kernels at this machine's
measured bandwidth and per-op overhead (profilers.closed_loop.twin uses it)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from perfmodel.hardware.efficiencies import RooflineParams
from perfmodel.latency.traced import price_trace
from perfmodel.models.operators import Matmul
from profilers.ceilings import measure_bandwidth, measure_kernel_overhead
from profilers.device import DeviceInfo
from profilers.timer import TimerConfig, time_cuda_events, time_wall


class TimedShapes:
    """A latency source for perfmodel.latency.traced.price_trace whose GEMMs are timed on
    this machine at the exact shapes asked (weights cold), and whose memory-bound kernels
    run at the measured bandwidth plus the per-kernel overhead: the twin's price of a kernel
    whose call could not be replayed."""

    def __init__(self, spec, params: RooflineParams, dtype: torch.dtype, timer: TimerConfig, info: DeviceInfo):
        self.spec, self.params, self.torch_dtype, self.timer = spec, params, dtype, timer
        self.device, self.cache_bytes = info.kind, info.cache_bytes
        self.table = self  # priced as measured, not by the roofline
        self.attention = None  # timed apart (attention_times), head_dim need not be 128
        self.gemms: dict[tuple[int, int, int], float] = {}
        self._pool: torch.Tensor | None = None

    def gemm_time(self, matmul: Matmul) -> float:
        key = (int(matmul.m), int(matmul.n), int(matmul.k))
        if key not in self.gemms:
            self.gemms[key] = self._time_gemm(*key)
        return self.gemms[key]

    def _time_gemm(self, m: int, n: int, k: int) -> float:
        if self._pool is None:  # weights for every shape: views into one buffer of twice the cache
            elements = max(2 * self.cache_bytes * 8 // torch.finfo(self.torch_dtype).bits, 1 << 20)
            self._pool = torch.empty(elements, dtype=self.torch_dtype, device=self.device).uniform_(-1, 1)
        copies = max(1, self._pool.numel() // (n * k))
        if copies == 1 and self._pool.numel() < n * k:
            self._pool = torch.empty(n * k, dtype=self.torch_dtype, device=self.device).uniform_(-1, 1)
        weights = self._pool[: copies * n * k].view(copies, n, k)
        x = torch.randn(m, k, dtype=self.torch_dtype, device=self.device)
        turn = iter(range(1 << 62))
        call = lambda: F.linear(x, weights[next(turn) % copies])  # noqa: E731
        return timed(call, self.timer, self.device)


def timed(call, timer: TimerConfig, device: str) -> float:
    """Median seconds of `call`: wall clock on a CPU, CUDA events on a GPU."""
    return (time_cuda_events if device == "cuda" else time_wall)(call, timer).median_s


def attention_times(rows: pd.DataFrame, dtype: torch.dtype, timer: TimerConfig, device: str) -> np.ndarray:
    """Each attention row timed as the decoder runs it: queries of the tree, the cache's keys
    and values up to kv_len, a boolean mask, grouped-query heads."""
    out, cache = np.empty(len(rows)), {}
    for i, r in enumerate(rows.itertuples()):
        key = tuple(int(v) for v in (r.batch, r.heads, r.kv_heads, r.q_len, r.kv_len, r.head_dim))
        if key not in cache:
            b, h, kvh, q, s, d = key
            query = torch.randn(b, h, q, d, dtype=dtype, device=device)
            keys, values = (torch.randn(b, kvh, s, d, dtype=dtype, device=device) for _ in range(2))
            mask = torch.ones(b, 1, q, s, dtype=torch.bool, device=device)
            call = functools.partial(
                F.scaled_dot_product_attention, query, keys, values, attn_mask=mask, enable_gqa=h != kvh
            )
            cache[key] = timed(call, timer, device)
        out[i] = cache[key]
    return out


def priced_step(trace: pd.DataFrame, source: TimedShapes, dtype: str, replayed: dict[str, float]) -> pd.DataFrame:
    """The trace priced by perfmodel.latency.traced: each kernel at its replayed time
    (profilers.kernel_replay), a kernel that could not be replayed by the shape-level
    model (its attention timed here as an SDPA call of its shape)."""
    attention = (trace["kind"] == "attention") & ~trace["call"].isin(list(replayed))
    priced = price_trace(trace[~attention], source, dtype, measured=replayed)
    by_shape = trace[attention].assign(source="timed here")
    by_shape["time_s"] = attention_times(by_shape, source.torch_dtype, source.timer, source.device)
    return pd.concat([priced, by_shape]).sort_index()


def this_machine(info: DeviceInfo, dtype: torch.dtype, budget_s: float, measure: bool) -> TimedShapes:
    """The latency source of this device for the kernels no replay timed: its copy bandwidth
    and per-op overhead measured now (`measure`; a minute on a CPU of a large cache), else
    left unknown (nan), as no kernel needs them."""
    bandwidth = overhead = float("nan")
    if measure:
        moved, timing = measure_bandwidth(info)["copy"]
        bandwidth, overhead = moved / timing.median_s, measure_kernel_overhead(info).median_s
    spec = _MachineSpec(info.name, bandwidth)
    params = RooflineParams(memory_efficiency=1.0, kernel_overhead_s=overhead)
    return TimedShapes(spec, params, dtype, TimerConfig(budget_s=budget_s, flush_cache=False), info)


@dataclass(frozen=True)
class _MachineSpec:
    """What price_trace reads of a spec for memory-bound kernels: the bandwidth (bytes/s)."""

    name: str
    bandwidth: float
