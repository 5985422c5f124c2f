"""Attention timed from measurements: aiconfigurator-core's decode and prefill tables.

The shipped tables (perfmodel.measured.aiconfigurator) time fused attention as a serving
engine runs it, per device and software stack: decode (`generation_attention`: one query
token per sequence over kv_len cached tokens) and prefill (`context_attention`: kv_len
queries over kv_len keys, causal), over batch 1-2048 x kv_len 2-131072 (decode) or batch
1-256 x 1-16384 tokens (prefill), for ~40-50 (heads, KV heads) pairs of head size 128, bf16.

- **Measured head configuration**: log(time) is interpolated bilinearly over (log2 batch,
  log2 kv_len) on the configuration's own grid, so it is exact at measured points. The
  grid is cut where the harness ran out of memory (large batch x long context); there a
  batch's row is continued from its last two measured lengths with the exponent of kv_len
  clipped to [0, 1] (decode streams the cache: time grows at most linearly with it). Past
  the grid's edges time grows linearly in batch and as kv_len (decode) or its square
  (causal prefill), the same for every row, and before them it is the edge's: so a grid made
  non-decreasing stays so everywhere.
- **Head configuration not measured** (e.g. llama-7b's 32 x 32 in the vLLM tables, or a
  tensor-parallel shard): decode reads batch x kv_heads caches, each once for its
  heads / kv_heads query rows (FlashAttention and FlashInfer pack a KV head's query group
  into one tile), so a configuration's time at batch b is that of another with the same
  group size at the same number of (sequence, KV head) pairs, batch b x kv_heads /
  kv_heads'. Each measured configuration is read there, times the roofline ratio of the
  two (perfmodel.models.operators.FusedAttention: it carries the difference in query rows,
  i.e. compute), and the estimates are averaged in log time with weights
  1 / d^6, d = hypot(0.5 x log2 of the KV-head ratio, log2 of the group-size ratio):
  configurations of the same group size dominate (the kernel's tile and split choice
  follows the group size), the nearest KV-head count next. Configurations whose point lies
  in their measured region are used where any is (the weights and the power were chosen
  on the leave-one-configuration-out check, `python -m perfmodel.attention_check`).
  Prefill uses the same rule (the roofline ratio carries its compute).
- **Floor and order**: a measured row faster than its speed-of-light floor (reading its
  Q, K and V at the datasheet bandwidth, or its FLOPs at the peak) is raised to the floor
  when the table is read, and counted (`clamped`; the label says how many); each
  configuration's grid is then made non-decreasing in batch and kv_len
  (perfmodel.latency.monotone), and every time given, measured or predicted, is at least
  its floor.
- **Outside**: `outside()` is True where the time is an extrapolation: beyond a measured
  configuration's measured region, where no other configuration covers the point, or a
  group size beyond the measured ones.

The Medusa tree step (q_len candidates over kv_len tokens, tree mask) maps to the **decode
kernel class with query group (heads / kv_heads) x q_len**: the decode time of heads x q_len
query heads over the same KV heads. Why: each KV head is read once for all q x group query
rows (how perfmodel/models/operators.py counts attention); the engines run a tree step
through their decode kernels with q > 1 (vLLM's and SGLang's FlashAttention pack a KV head's
query group and tokens into one tile, TRT-LLM's XQA has a speculative-decoding mode); the
tree mask applies to scores that never leave the chip. The context tables cannot serve it:
they hold q = kv_len, no cached prefix. A tree step is no faster than the decode step (the
same cache, more rows; so q_len=1 is decode exactly), and it runs the model's own kernel
class: the tables switch kernel at large groups (TRT-LLM above 32 query heads per KV head
runs 12-20x slower against the roofline, FlashInfer on the L40S above 64 6x), an engine's
choice for a model of that group, not for its own tree, while across the groups one kernel
serves the measured/roofline ratio varies by less than 2x (vLLM and SGLang on the H100:
1.1-1.8 over groups 1-64). So a configuration whose estimate is over SWITCH (2) x the
model's own decode time scaled by the roofline for the extra rows is left out of the
prediction, and where none is left that scaled time is used. Such points, and those whose
group x q_len lies beyond the measured groups (llama-2-70b's 8 x 64 candidates = 512 >
128), are flagged outside. Tree-masked sdpa measured on a GPU
(profilers.campaign) would test the mapping.

A torch stack (this project's own campaign, profilers.campaign_stack) measured the tree step
itself, torch's masked sdpa at 16-112 candidates: there the tree step is linear in the tree's
size between the two measured sizes around it (decode is the tree of 1), each size's table
read as above, and past the largest size that size's time scaled by the roofline (outside);
never faster than decode.

The paper's step prices attention as two ops, qk and pv (ATTENTION_OPS). `attention_op_time`
splits the fused measured time between them in proportion to their roofline times
(op_kernels' two matmuls), so qk + pv is the measured fused time; in prefill the measured
kernel is causal while the paper's matmuls count the full square, and the engine's time is
the one kept. Kernel source: where a table holds two kernels for one point (e.g. vLLM's fa3
and fa4), the faster per point is kept, as an engine tuned for the device would run it; the
shipped stacks hold one source each. fp16 is served by bf16 tables where no fp16 one
exists: same element size and the same tensor-core peak on every imported device.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.base.dtypes import check_dtype
from perfmodel.base.errors import PerfkitError
from perfmodel.base.outputs import write_csv
from perfmodel.hardware.efficiencies import RooflineParams
from perfmodel.hardware.specs import HardwareSpec, find_spec, load_all_specs
from perfmodel.latency.monotone import non_decreasing
from perfmodel.latency.roofline import kernel_time, op_time, speed_of_light
from perfmodel.measured.aiconfigurator import ShippedStack, contract_rows, shipped_stacks, version_key
from perfmodel.measured.contract import COLUMNS
from perfmodel.models.config import ModelConfig
from perfmodel.models.operators import ATTENTION_OPS, FusedAttention, check_point, op_kernels

TABLES = {"decode": "generation_attention", "prefill": "context_attention"}
PHASES = ("decode", "tree", "prefill")
OPS = (*ATTENTION_OPS, "sdpa")
HEAD_DIM = 128  # the only head size the shipped tables keep (every model preset's)
# Without a stack named: vLLM first (the harness the issue compares with Vidur's profiles,
# and the most used open engine), then SGLang, then TRT-LLM.
ENGINE_ORDER = ("vllm", "sglang", "trtllm")
# What a 16-bit dtype may be served by when its own table is missing (see the module doc).
SUBSTITUTES = {"fp16": "bf16", "bf16": "fp16"}
# Neighbour weights 1 / hypot(KV_WEIGHT x dlog2 kv_heads, dlog2 group) ** POWER (module doc).
KV_WEIGHT = 0.5
POWER = 6
# A tree step runs the model's own decode kernel: measured configurations at its group x q
# that run more than SWITCH times slower against the roofline than the model's decode are
# another kernel class (module doc) and do not set it.
SWITCH = 2.0
EXTRA_COLUMNS = ["num_heads", "num_kv_heads", "head_dim"]


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
        grid = points.pivot_table(index="batch", columns="kv_len", values="time_s", aggfunc="median")
        log_len = np.log2(grid.columns.to_numpy(dtype=float))
        values = np.log(grid.to_numpy(dtype=float))
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
        log_batch = np.log2(grid.index.to_numpy(dtype=float))
        return cls(log_batch, log_len, non_decreasing(values), measured, length_exponent)

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

    @classmethod
    def of(cls, frame: pd.DataFrame, phase: str, spec: HardwareSpec, dtype: str, q_len: int = 1) -> KernelTable:
        keys = ["num_heads", "num_kv_heads", "batch", "kv_len"]
        # Repeats of a point: their median; two kernel sources for one point: the faster.
        per_source = frame.groupby([*keys, "kernel_source"], as_index=False)["time_s"].median()
        best = per_source.groupby(keys, as_index=False)["time_s"].min()
        columns = (best[c].to_numpy(dtype=np.int64) for c in keys)
        floor = attention_floor(phase, *columns, spec, dtype, q_len)
        clamped = int((best["time_s"].to_numpy() < floor).sum())
        best = best.assign(time_s=np.maximum(best["time_s"].to_numpy(), floor))
        exponent = 2.0 if phase == "prefill" else 1.0
        grids = {(int(h), int(kv)): HeadGrid.of(part, exponent) for (h, kv), part in best.groupby(keys[:2])}
        return cls(phase, spec, dtype, grids, clamped, len(best), q_len)

    def without(self, heads: int, kv_heads: int) -> KernelTable:
        """This table less one head configuration (to predict it from the others)."""
        return replace(self, grids={k: g for k, g in self.grids.items() if k != (heads, kv_heads)})

    def roofline(self, batch, length, heads, kv_heads) -> np.ndarray:
        q_len = length if self.phase == "prefill" else self.q_len
        kernel = FusedAttention(batch, heads, kv_heads, q_len, length, HEAD_DIM, causal=self.phase == "prefill")
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


def attention_floor(phase: str, heads, kv_heads, batch, kv_len, spec: HardwareSpec, dtype: str, q_len=1):
    """Seconds no attention kernel of `phase` can beat: its Q, K and V read and output written
    at the datasheet bandwidth, or its FLOPs at the peak (decode: one query token; a tree
    step: q_len; prefill: kv_len queries, causal)."""
    q = kv_len if phase == "prefill" else q_len
    kernel = FusedAttention(batch, heads, kv_heads, q, kv_len, HEAD_DIM, causal=phase == "prefill")
    return speed_of_light(kernel, dtype, spec)


def _positive(name: str, value) -> np.ndarray:
    array = np.asarray(value)
    if array.dtype.kind not in "iuf" or (array < 1).any():
        raise PerfkitError(f"{name} must be positive, got {value!r}")
    return array


@dataclass(frozen=True)
class AttentionTable:
    """Measured attention of one device, software stack and dtype (see the module doc)."""

    device: str  # the device spec's key
    source: ShippedStack = field(repr=False)
    dtype: str  # the dtype asked for
    table_dtype: str  # the dtype the tables were measured in
    kernel_sources: tuple[str, ...]
    decode: KernelTable = field(repr=False)
    prefill: KernelTable = field(repr=False)
    # A torch stack's measured tree steps, one table per tree size (ascending); engines' stacks have none
    tree: tuple[KernelTable, ...] = field(default=(), repr=False)

    @property
    def stack(self) -> str:
        return self.source.stack

    @property
    def label(self) -> str:
        system = self.source.provenance.get("system", self.device)
        served = f", {self.table_dtype} tables serving {self.dtype}" if self.dtype != self.table_dtype else ""
        tables = (self.decode, self.prefill, *self.tree)
        clamped = sum(t.clamped for t in tables)
        floor = (
            f"; {clamped} of {sum(t.points for t in tables)} points under the speed-of-light floor raised to it"
            if clamped
            else ""
        )
        phases = "decode/tree/prefill" if self.tree else "decode/prefill"
        return (
            f"{phases} attention measured by {self.source.engine} {self.source.version} harness on {system} "
            f"({self.source.package}; kernel {', '.join(self.kernel_sources)}{served}{floor})"
        )

    def _args(self, heads, kv_heads, head_dim, **positive) -> tuple:
        if head_dim != HEAD_DIM:
            raise PerfkitError(f"head_dim {head_dim!r}: the measured attention tables hold head_dim {HEAD_DIM} only")
        arrays = {name: _positive(name, v) for name, v in {**positive, "heads": heads, "kv_heads": kv_heads}.items()}
        if (np.mod(arrays["heads"], arrays["kv_heads"]) != 0).any():
            raise PerfkitError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
        return tuple(arrays.values())

    def _timed(self, phase: str, batch, seq_len, heads, kv_heads, candidates=1, head_dim=HEAD_DIM):
        if phase not in PHASES:
            raise PerfkitError(f"unknown phase {phase!r}; choose from: {', '.join(PHASES)}")
        b, s, q, h, kv = self._args(heads, kv_heads, head_dim, batch=batch, seq_len=seq_len, candidates=candidates)
        floor = attention_floor(phase, h, kv, b, s, self.decode.spec, self.table_dtype, q)
        if phase == "prefill":
            seconds, outside = self.prefill.predict(b, s, h, kv)
            return np.maximum(seconds, floor), outside
        if phase == "decode":
            seconds, outside = self.decode.predict(b, s, h, kv)
            return np.maximum(seconds, floor), outside
        if self.tree:
            return self._measured_tree(b, s, q, h, kv, floor)
        # The decode kernel with group x q query rows (module doc), no faster than the decode
        # step, from the configurations of the model's own kernel class (the ceiling).
        decode, decode_outside = self.decode.predict(b, s, h, kv)
        own = decode * self.decode.roofline(b, s, h * q, kv) / self.decode.roofline(b, s, h, kv)
        mapped, mapped_outside = self.decode.predict(b, s, h * q, kv, ceiling=SWITCH * own)
        return np.maximum(np.maximum(decode, mapped), floor), decode_outside | mapped_outside

    def _measured_tree(self, b, s, q, h, kv, floor) -> tuple[np.ndarray, np.ndarray]:
        """A tree step from measured tree steps (a torch stack's): linear in the tree's size
        between the two measured sizes around it (decode is the tree of 1); past the largest,
        that one's time scaled by the roofline (flagged outside). No faster than decode."""
        b, s, q, h, kv = np.broadcast_arrays(b, s, q, h, kv)
        tables = (self.decode, *self.tree)
        sizes = np.array([t.q_len for t in tables])
        seconds, outside = np.empty(b.shape), np.zeros(b.shape, dtype=bool)
        for size in np.unique(q):
            at = q == size
            args = (b[at], s[at], h[at], kv[at])
            hi = min(int(np.searchsorted(sizes, size)), len(tables) - 1)
            lo = hi if sizes[hi] <= size else hi - 1
            upper, upper_out = tables[hi].predict(*args)
            if sizes[hi] < size:  # past the largest measured tree
                own = replace(tables[hi], q_len=int(size))
                upper = upper * own.roofline(*args) / tables[hi].roofline(*args)
                seconds[at], outside[at] = upper, True
                continue
            lower, lower_out = tables[lo].predict(*args)
            share = 0.0 if hi == lo else (size - sizes[lo]) / (sizes[hi] - sizes[lo])
            seconds[at], outside[at] = lower + share * (upper - lower), lower_out | upper_out
        decode, _ = self.decode.predict(b, s, h, kv)
        return np.maximum(np.maximum(seconds, decode), floor), outside

    def decode_time(self, batch, kv_len, heads, kv_heads, head_dim=HEAD_DIM) -> np.ndarray:
        """Seconds of decode attention (one query token per sequence)."""
        return self._timed("decode", batch, kv_len, heads, kv_heads, head_dim=head_dim)[0]

    def prefill_time(self, batch, q_len, heads, kv_heads, head_dim=HEAD_DIM) -> np.ndarray:
        """Seconds of causal prefill attention over q_len tokens."""
        return self._timed("prefill", batch, q_len, heads, kv_heads, head_dim=head_dim)[0]

    def tree_time(self, batch, q_len, kv_len, heads, kv_heads, head_dim=HEAD_DIM) -> np.ndarray:
        """Seconds of a Medusa tree step's attention: q_len candidates over kv_len tokens."""
        return self._timed("tree", batch, kv_len, heads, kv_heads, q_len, head_dim)[0]

    def outside(self, phase: str, batch, seq_len, heads, kv_heads, candidates=1, head_dim=HEAD_DIM) -> np.ndarray:
        """True where a point's time is an extrapolation beyond the measurements."""
        return self._timed(phase, batch, seq_len, heads, kv_heads, candidates, head_dim)[1]

    def measured(self, phase: str, heads: int, kv_heads: int) -> bool:
        """Whether the head configuration itself was measured (a tree step's is its decode
        configuration with group x candidates query heads, rarely measured)."""
        return (heads, kv_heads) in (self.prefill if phase == "prefill" else self.decode).grids


def attention_op_time(
    table: AttentionTable | None, op: str, phase: str, model: ModelConfig, batch, seq_len, candidates=1
) -> np.ndarray | None:
    """Measured-based seconds of attention op `op` (qk, pv or the fused sdpa) of `phase` for
    a model (shard), or None where the table cannot serve it (no table, a head size the
    tables lack) and the caller keeps the roofline. qk and pv share the fused time in
    proportion to their roofline times."""
    if op not in OPS:
        raise PerfkitError(f"{op!r} is not an attention op; choose from: {', '.join(OPS)}")
    if table is None or model.head_dim != HEAD_DIM:
        return None
    check_point(op, phase, batch, seq_len, candidates)
    b, s, q = np.broadcast_arrays(*(np.asarray(v) for v in (batch, seq_len, candidates)))
    fused, _ = table._timed(phase, b, s, model.num_heads, model.num_kv_heads, q)
    if op == "sdpa":
        return fused
    spec, dtype, params = table.decode.spec, table.table_dtype, RooflineParams()
    qk, pv = (op_time(op_kernels(o, phase, model, b, s, q), dtype, spec, params) for o in ATTENTION_OPS)
    return fused * np.asarray((qk if op == "qk" else pv) / (qk + pv), dtype=float)


def _attention_stacks(device_key: str) -> list[ShippedStack]:
    found = [s for s in shipped_stacks(device_key) if all(s.has(t) for t in TABLES.values())]
    rank = {engine: i for i, engine in enumerate(ENGINE_ORDER)}
    return sorted(found, key=lambda s: (rank.get(s.engine, len(rank)), s.engine, version_key(s.version)))


def attention_stacks(device: str) -> list[str]:
    """The stacks with shipped attention tables on a device, default order first (newest
    version of an engine last among its own)."""
    return [s.stack for s in _attention_stacks(find_spec(device).key)]


def attention_devices() -> list[str]:
    """Every device spec with shipped attention tables."""
    return [key for key in load_all_specs() if _attention_stacks(key)]


def _pick(stacks: list[ShippedStack], stack_name: str | None, device: str) -> ShippedStack:
    if stack_name is None:
        first = stacks[0].engine
        return [s for s in stacks if s.engine == first][-1]
    chosen = [s for s in stacks if stack_name in (s.stack, s.engine)]
    if not chosen:
        raise PerfkitError(
            f"no attention tables of stack {stack_name!r} on {device}; known stacks: "
            f"{', '.join(s.stack for s in stacks)} (an engine name picks its newest)"
        )
    return chosen[-1]


@functools.lru_cache(maxsize=None)
def attention_table(device_key: str, stack_name: str | None = None, dtype: str = "bf16") -> AttentionTable | None:
    """The measured attention of a device (spec key or alias) in one stack: an engine
    (vllm, sglang, trtllm: its newest version), engine-version (vllm-0.24.0), or None for
    the first of ENGINE_ORDER the device has. None where the device has no shipped
    attention tables or none in (or standing for) `dtype`."""
    check_dtype(dtype)
    if not _attention_stacks(device_key):
        try:  # an alias (h100) of a device with tables, or a device hw_specs does not hold (a CPU)
            device_key = find_spec(device_key).key
        except PerfkitError:
            return None
    stacks = _attention_stacks(device_key)
    if not stacks:
        return None
    spec = find_spec(device_key)
    stack = _pick(stacks, stack_name, spec.key)
    frames = {phase: stack.table(name) for phase, name in TABLES.items()}
    have = set(frames["decode"]["dtype"]) & set(frames["prefill"]["dtype"])
    table_dtype = dtype if dtype in have else SUBSTITUTES.get(dtype)
    if table_dtype not in have:
        return None
    frames = {phase: f[(f["dtype"] == table_dtype) & (f["head_dim"] == HEAD_DIM)] for phase, f in frames.items()}
    sources = tuple(sorted(set(frames["decode"]["kernel_source"]) | set(frames["prefill"]["kernel_source"])))
    kernels = {phase: KernelTable.of(f, phase, spec, table_dtype) for phase, f in frames.items()}
    tree = ()
    if stack.has("tree_attention"):
        rows = stack.table("tree_attention")
        rows = rows[(rows["dtype"] == table_dtype) & (rows["head_dim"] == HEAD_DIM)]
        tree = tuple(KernelTable.of(part, "tree", spec, table_dtype, int(q)) for q, part in rows.groupby("q_len"))
    return AttentionTable(spec.key, stack, dtype, table_dtype, sources, kernels["decode"], kernels["prefill"], tree)


def measured_attention_rows(
    device_key: str, model: ModelConfig, dtype: str, stack_name: str | None = None
) -> pd.DataFrame:
    """Data-contract rows (op sdpa, decode and prefill) of the measured points whose head
    configuration is exactly the model's, `model` set to its name; an empty frame where
    the tables have none. The dtype column says what they were measured in."""
    table = attention_table(device_key, stack_name, dtype)
    empty = pd.DataFrame(columns=COLUMNS + EXTRA_COLUMNS)
    if table is None:
        return empty
    frames = []
    for name in TABLES.values():
        rows = contract_rows(table.source, name)
        keep = (rows["num_heads"] == model.num_heads) & (rows["num_kv_heads"] == model.num_kv_heads)
        keep &= (rows["head_dim"] == model.head_dim) & (rows["dtype"] == table.table_dtype)
        frames.append(rows[keep])
    rows = pd.concat(frames, ignore_index=True)
    return rows.assign(model=model.name) if len(rows) else empty


def write_measured_attention(out: Path, device_key: str, model: ModelConfig, dtype: str, stack_name=None) -> str | None:
    """Write the measured attention points of the model's head configuration to
    out/measured-attention-<model>.csv (the roofline and speedup commands show them beside their
    predictions) and return the line that says so; None where the device has none."""
    rows = measured_attention_rows(device_key, model, dtype, stack_name)
    if not len(rows):
        return None
    path = out / f"measured-attention-{model.name}.csv"
    write_csv(rows, path)
    phases = ", ".join(f"{(rows['phase'] == p).sum()} {p}" for p in ("decode", "prefill"))
    source = attention_table(device_key, stack_name, dtype).label
    return f"  measured attention of {model.name}'s heads: {phases} points ({source}) -> {path}"
