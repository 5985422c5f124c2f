"""A decoding step as it really runs: a traced kernel inventory, every kernel priced.

A trace table (TRACE_COLUMNS, one row per kernel the step launches) is data: the decoder's
tracer (decoder.trace) writes it by running the reference decoder's step on PyTorch's meta
device, and this module prices it without knowing where it came from (a model's steps priced
this way, one trace per point, are perfmodel.latency.traced_step.TracedStep). Each kernel is
priced by what bounds it:

- `gemm`: through the latency source (measured, grid, calibrated, transferred or datasheet,
  as its label says); a batched matmul of activations (no weight) by the roofline;
- `attention`: the device's measured attention tables where it has them (decode kernel for
  one query token, the tree mapping for several; perfmodel.latency.attention_table), else
  the roofline of one fused kernel;
- `elementwise`, `reduction`, `indexing`, `copy`: memory bound, their bytes over the
  device's bandwidth at its memory efficiency, plus the per-kernel launch cost (the floor a
  tiny transfer pays);
- `host_sync`: a device-to-host read the step waits for (an `int()` or `.tolist()` in the
  acceptance check), priced as one eager launch: the device is idle while the host reads
  and launches again;
- `view`, `module` (host-only: perfmodel.latency.kinds): no kernel, no time in a kernels'
  sum; the host pipeline charges the host for each (an eager or static regime).

Measured kernel times take precedence: `price_trace(..., measured=...)` maps each row's
`call` (the operator call the tracer recorded) to seconds timed by replaying that call on
the device (profilers.kernel_replay); those rows are priced as measured, the rest as above.

The per-kernel launch cost (`launch_costs`) that memory-bound kernels and host syncs pay is,
on a GPU, its spec's sourced `kernel_launch_us` (hw_specs/README.md): what one more small
kernel adds to a step launched eagerly, one kernel at a time, as the reference decoder runs.
On a CPU, or a spec file without the field, it is the latency source's per-kernel overhead
(RooflineParams.kernel_overhead_s: the CPU's measured per-op overhead). GEMMs and attention
keep the latency source's own times, which carry their own floor (measured kernels, or the
roofline's overhead), so the spec's cost enters here only and the paper and full steps, and
every calibration fit, are untouched.

CUDA-graph mode (`cuda_graph=True`): the engines (vLLM, SGLang, TensorRT-LLM) capture the
decode forward in a CUDA graph and replay it, so each of its kernels costs a graph node
instead of an eager launch: on a device whose GPU checks replayed the decoder's memory-bound
kernels in CUDA graphs, what they cost there (perfmodel.latency.graph_node), elsewhere the
spec's `graph_node_us`. What is captured is the trace's `forward`
part (CAPTURED_PARTS: the tree's positions and mask, the embedding, every layer, the final
norm and the LM head): static shapes at a given batch and tree size, no value read back by
the host. The other parts stay eager at `kernel_launch_us`: `candidates` (the Medusa heads
and the tree built from their top-k), `verification` (acceptance, which reads the accepted
length back) and `kv_update`
(the commit of the accepted path, whose length the host just read) depend on values the host
reads mid-step, and every host_sync still stalls the device for one eager launch. An engine
that captures its drafting too (SGLang's EAGLE does) runs a little faster than this prices.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from perfmodel.base.errors import PerfkitError
from perfmodel.hardware.efficiencies import RooflineParams
from perfmodel.latency.graph_node import measured_graph_node
from perfmodel.latency.kinds import HOST_ONLY_KINDS, KINDS, TRACE_KINDS
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
    "call",  # the operator call, replayable on real tensors (decoder.trace_ops.encode_call)
)
# The parts of a step (decoder.medusa.STEP_PARTS) an engine's CUDA graph captures (module doc).
CAPTURED_PARTS = ("forward",)
# The part of a Medusa step that drafts its tree: the heads and the candidates built from their
# top-k. A step verifying a tree another drafter drafted (TracedStep.with_heads=False) omits it.
DRAFT_PARTS = ("candidates",)
# A host-only row's source: no kernel, no device time (the host pipeline charges the host).
HOST_ONLY_SOURCE = "host only (no kernel)"
# Tracer: (model, batch, context, candidates, dtype) -> trace table of one step.
Tracer = Callable[[ModelConfig, int, int, int, str], pd.DataFrame]


def check_trace(trace: pd.DataFrame) -> None:
    """Refuse a table that is not a trace: missing columns or unknown kinds."""
    missing = [c for c in TRACE_COLUMNS if c not in trace.columns]
    if missing:
        raise PerfkitError(f"not a trace table: missing columns {', '.join(missing)}")
    unknown = sorted(set(trace["kind"]) - set(TRACE_KINDS))
    if unknown:
        raise PerfkitError(f"trace has unknown kernel kinds {', '.join(unknown)}; known: {', '.join(TRACE_KINDS)}")


def _params(latency) -> RooflineParams:
    return getattr(latency, "params", None) or RooflineParams()


def _gemm_times(rows: pd.DataFrame, latency, spec, dtype: str, params: RooflineParams) -> np.ndarray:
    measured = getattr(latency, "table", None) is not None or getattr(latency, "grid", None) is not None
    out = np.empty(len(rows))
    priced: dict[tuple[int, int, int, int], float] = {}  # a layer's shapes repeat in every layer
    for i, r in enumerate(rows.itertuples()):
        shape = (int(r.batch), int(r.m), int(r.k), int(r.n))
        if shape not in priced:
            weight = shape[0] == 1
            matmul = Matmul(*shape, weight=weight)
            if weight and measured:
                priced[shape] = float(np.asarray(latency.gemm_time(matmul)).ravel()[0])
            else:
                priced[shape] = float(kernel_time(matmul, dtype, spec, params))
        out[i] = priced[shape]
    return out


def _attention_times(rows: pd.DataFrame, latency, spec, dtype: str, params: RooflineParams) -> np.ndarray:
    table = getattr(latency, "attention", None)
    out = np.empty(len(rows))
    priced: dict[tuple[int, ...], float] = {}  # every layer attends with the same shapes
    for i, r in enumerate(rows.itertuples()):
        shape = tuple(int(v) for v in (r.batch, r.heads, r.kv_heads, r.q_len, r.kv_len, r.head_dim))
        if shape not in priced:
            priced[shape] = _attention_time(shape, table, dtype, spec, params)
        out[i] = priced[shape]
    return out


def _attention_time(shape: tuple[int, ...], table, dtype: str, spec, params: RooflineParams) -> float:
    """One attention kernel's seconds: the measured table's where it has head_dim 128, else the roofline's."""
    b, h, kvh, q, s, d = shape
    timed = None
    if table is not None and d == 128:
        timed = table.decode_time(b, s, h, kvh) if q == 1 else table.tree_time(b, q, s, h, kvh)
    if timed is None:
        timed = kernel_time(FusedAttention(b, h, kvh, q, s, d), dtype, spec, params)
    return float(np.asarray(timed).ravel()[0])


@dataclass(frozen=True)
class LaunchCost:
    """Seconds per kernel launched eagerly and per captured graph node (None: no graph price
    on this device); origin: the spec they come from (its key), else what the overhead is;
    node: where the graph node's price comes from, where not the spec's graph_node_us."""

    eager_s: float
    graph_s: float | None
    origin: str
    from_spec: bool = True
    node: str | None = None

    @property
    def node_source(self) -> str:
        return self.node or f"{self.origin} spec: graph_node_us"

    def label(self, cuda_graph: bool) -> str:
        """One line for tables and printed answers: the mode and its per-kernel costs."""
        eager = f"{self.eager_s * 1e6:.2f} us"
        if not cuda_graph:
            where = f"{self.origin} spec: kernel_launch_us" if self.from_spec else self.origin
            return f"eager, {eager} per kernel launch ({where})"
        node = f" ({self.node})" if self.node else ""
        sources = "kernel_launch_us" if self.node else "graph_node_us, kernel_launch_us"
        return (
            f"CUDA graph over the {'/'.join(CAPTURED_PARTS)} part, {self.graph_s * 1e6:.2f} us per captured kernel"
            f"{node}, the other parts and host syncs eager at {eager} ({self.origin} spec: {sources})"
        )


def launch_costs(latency, measured_node: bool = True) -> LaunchCost:
    """The per-kernel launch costs of `latency`'s device: on a GPU its spec's kernel_launch_us,
    and per graph node what its GPU checks replayed (perfmodel.latency.graph_node) where they
    did and measured_node, else its spec's graph_node_us; on a CPU (or a spec file without them)
    the source's per-kernel overhead, eager only."""
    spec = latency.spec
    launch = getattr(spec, "kernel_launch_us", None)
    if launch is not None:
        node = getattr(spec, "graph_node_us", None)
        replayed = measured_graph_node(spec.key) if measured_node and node is not None else None
        if replayed is not None:
            return LaunchCost(launch * 1e-6, replayed.seconds, spec.key, node=replayed.label)
        return LaunchCost(launch * 1e-6, None if node is None else node * 1e-6, spec.key)
    params = _params(latency)
    return LaunchCost(params.kernel_overhead_s, None, f"per-kernel overhead: {params.label}", from_spec=False)


def check_cuda_graph(latency) -> LaunchCost:
    """The launch costs of a device that prices a CUDA graph; one line where it cannot."""
    launch = launch_costs(latency)
    if launch.graph_s is None:
        spec = latency.spec
        raise PerfkitError(
            f"{getattr(spec, 'name', spec)}: no CUDA-graph price (its spec has no graph_node_us; a CPU runs no CUDA "
            "graphs): price it eager, without --cuda-graph"
        )
    return launch


def captured(rows: pd.DataFrame, parts: tuple[str, ...] = CAPTURED_PARTS) -> np.ndarray:
    """Which rows a CUDA graph replays: the captured parts' kernels, host syncs never."""
    return rows["part"].isin(parts).to_numpy() & (rows["kind"] != "host_sync").to_numpy()


def _memory_times(rows: pd.DataFrame, spec, params: RooflineParams, launched: np.ndarray) -> np.ndarray:
    moved = rows["bytes"].to_numpy(dtype=float) / (spec.bandwidth * params.memory_efficiency)
    return moved + launched


def price_trace(
    trace: pd.DataFrame,
    latency,
    dtype: str,
    cuda_graph: bool = False,
    measured: Mapping[str, float] | None = None,
    captured_parts: tuple[str, ...] = CAPTURED_PARTS,
    launch: LaunchCost | None = None,
) -> pd.DataFrame:
    """The trace with `time_s` per kernel (see the module doc) and the `source` of each.
    cuda_graph: the forward part replayed from a CUDA graph (a graph node per kernel) instead
    of launched kernel by kernel; refused on a device whose spec prices no graph node.
    measured: seconds per call (the trace's `call` column) timed on the device by replaying
    it (profilers.kernel_replay); a kernel whose call it holds takes that time, the others
    are priced as above. captured_parts: the parts a graph captures (the static step's graph:
    every part). launch: the launch costs to charge (default: launch_costs(latency))."""
    check_trace(trace)
    spec, params = latency.spec, _params(latency)
    if launch is None:
        launch = check_cuda_graph(latency) if cuda_graph else launch_costs(latency)
    priced = trace.copy()
    priced["time_s"] = 0.0
    priced["source"] = ""
    replayed = priced["call"].isin(list(measured or ())).to_numpy()
    if replayed.any():
        priced.loc[replayed, "time_s"] = priced.loc[replayed, "call"].map(measured).to_numpy(dtype=float)
        priced.loc[replayed, "source"] = "measured (kernel replayed)"
    for kind in KINDS:
        where = (priced["kind"] == kind).to_numpy() & ~replayed
        if not where.any():
            continue
        rows = priced[where]
        if kind == "gemm":
            times, source = _gemm_times(rows, latency, spec, dtype, params), "latency source"
        elif kind == "attention":
            times = _attention_times(rows, latency, spec, dtype, params)
            source = "measured attention" if getattr(latency, "attention", None) is not None else "roofline"
        elif kind == "host_sync":
            times, source = np.full(len(rows), launch.eager_s), "eager launch (host sync)"
        else:
            node = captured(rows, captured_parts) if cuda_graph else np.zeros(len(rows), dtype=bool)
            times = _memory_times(rows, spec, params, np.where(node, launch.graph_s or 0.0, launch.eager_s))
            source = np.where(node, "bytes / bandwidth + graph node", "bytes / bandwidth + launch")
        priced.loc[where, "time_s"] = times
        priced.loc[where, "source"] = source
    priced.loc[priced["kind"].isin(HOST_ONLY_KINDS).to_numpy(), "source"] = HOST_ONLY_SOURCE
    return priced


def kind_shares(priced: pd.DataFrame) -> pd.DataFrame:
    """Per kernel kind: kernels launched, seconds and share of the step time."""
    grouped = priced.groupby("kind")["time_s"].agg(kernels="size", time_s="sum")
    grouped = grouped.reindex([k for k in KINDS if k in grouped.index])
    grouped["share"] = grouped["time_s"] / grouped["time_s"].sum()
    return grouped.reset_index()
