"""Attention timed from measurements: aiconfigurator-core's decode and prefill tables.

The shipped tables (perfmodel.measured.aiconfigurator) time fused attention as a serving
engine runs it, per device and software stack: decode (`generation_attention`: one query
token per sequence over kv_len cached tokens) and prefill (`context_attention`: kv_len
queries over kv_len keys, causal), over batch 1-2048 x kv_len 2-131072 (decode) or batch
1-256 x 1-16384 tokens (prefill), for ~40-50 (heads, KV heads) pairs of head size 128 (or, in
tables of their own, 64: gpt-oss's; perfmodel.measured.aiconfigurator.head_suffix), bf16.

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
never faster than decode. A stack without prefill rows (the H200's: its GPU checks timed decode
and tree steps only) still serves decode and tree steps from its rows; its prefill attention is
the roofline's (attention_op_time gives None), and the label says which phases are measured.

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

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.base.dtypes import check_dtype
from perfmodel.base.errors import PerfkitError
from perfmodel.base.outputs import write_csv
from perfmodel.base.precision import KvFormat
from perfmodel.base.stacks import SERVING_ENGINES
from perfmodel.hardware.efficiencies import RooflineParams
from perfmodel.hardware.specs import load_all_specs
from perfmodel.latency.attention_grid import HEAD_DIM, SWITCH, KernelTable, attention_floor, attention_kernel
from perfmodel.latency.roofline import op_time
from perfmodel.measured.aiconfigurator import FP8_KV_SUFFIX, ShippedStack, contract_rows, head_suffix, version_key
from perfmodel.measured.contract import COLUMNS
from perfmodel.measured.evidence import DeviceEvidence, as_evidence, device_evidence
from perfmodel.models.config import ModelConfig
from perfmodel.models.operators import ATTENTION_OPS, Phase, check_point, op_kernels

TABLES = {"decode": "generation_attention", "prefill": "context_attention"}
# The same kernels over an fp8 KV cache (perfmodel.base.precision.KvFormat), queries in 16 bits.
FP8_KV_TABLES = {phase: name + FP8_KV_SUFFIX for phase, name in TABLES.items()}
PHASES = (Phase.DECODE, Phase.TREE, Phase.PREFILL)
OPS = (*ATTENTION_OPS, "sdpa")
# Without a stack named: vLLM first (the harness the issue compares with Vidur's profiles,
# and the most used open engine), then SGLang, then TRT-LLM.
ENGINE_ORDER = SERVING_ENGINES
# What a 16-bit dtype may be served by when its own table is missing (see the module doc).
SUBSTITUTES = {"fp16": "bf16", "bf16": "fp16"}
EXTRA_COLUMNS = ["num_heads", "num_kv_heads", "head_dim"]


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
    prefill: KernelTable | None = field(repr=False)  # None: the stack timed no prefill (in this dtype)
    # A torch stack's measured tree steps, one table per tree size (ascending); engines' stacks have none
    tree: tuple[KernelTable, ...] = field(default=(), repr=False)
    kv_cache: KvFormat | None = None  # the KV cache's format where it is not the dtype (an fp8 cache)
    # Points already priced: a traced step asks for the same attention in every layer, and a
    # drafter's passes and verifications for the same shapes again (pure in its arguments).
    _memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def stack(self) -> str:
        return self.source.stack

    head_dim = property(lambda self: self.decode.head_dim)

    @property
    def label(self) -> str:
        system = self.source.provenance.get("system", self.device)
        served = f", {self.table_dtype} tables serving {self.dtype}" if self.dtype != self.table_dtype else ""
        served += f", over an {self.kv_cache} KV cache" if self.kv_cache else ""
        tables = tuple(t for t in (self.decode, self.prefill, *self.tree) if t is not None)
        clamped = sum(t.clamped for t in tables)
        floor = (
            f"; {clamped} of {sum(t.points for t in tables)} points under the speed-of-light floor raised to it"
            if clamped
            else ""
        )
        timed = {Phase.DECODE: True, Phase.TREE: bool(self.tree), Phase.PREFILL: self.prefill is not None}
        phases = "/".join(p for p in PHASES if timed[p])  # an engine's tree step is mapped, not timed
        roofline = "" if self.serves(Phase.PREFILL) else "; prefill attention: roofline (the stack timed none)"
        return (
            f"{phases} attention measured by {self.source.engine} {self.source.version} harness on {system} "
            f"({self.source.package}; kernel {', '.join(self.kernel_sources)}{served}{floor}){roofline}"
        )

    def serves(self, phase: str) -> bool:
        """Whether this stack's measurements time `phase` (a tree step: measured, or mapped
        onto the decode kernel; prefill: only where the stack timed prefill)."""
        return (phase == Phase.PREFILL and self.prefill is not None) or phase in (Phase.DECODE, Phase.TREE)

    def kernels(self, phase: str) -> KernelTable:
        """The measured decode or prefill table (a tree step reads the decode table's configurations)."""
        if phase == Phase.PREFILL and self.prefill is None:
            raise PerfkitError(f"{self.stack} on {self.device} timed no prefill attention: its price is the roofline's")
        return self.prefill if phase == Phase.PREFILL else self.decode

    def _args(self, heads, kv_heads, head_dim, **positive) -> tuple:
        if head_dim != self.head_dim:
            raise PerfkitError(f"head_dim {head_dim!r}: these measured attention tables hold head_dim {self.head_dim}")
        arrays = {name: _positive(name, v) for name, v in {**positive, "heads": heads, "kv_heads": kv_heads}.items()}
        if (np.mod(arrays["heads"], arrays["kv_heads"]) != 0).any():
            raise PerfkitError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
        return tuple(arrays.values())

    def _timed(self, phase: str, batch, seq_len, heads, kv_heads, candidates=1, head_dim=HEAD_DIM):
        values = [np.asarray(v) for v in (batch, seq_len, heads, kv_heads, candidates)]
        key = (phase, head_dim, *((v.dtype.str, v.shape, v.tobytes()) for v in values))
        if key not in self._memo:
            self._memo[key] = self._priced(phase, batch, seq_len, heads, kv_heads, candidates, head_dim)
        seconds, outside = self._memo[key]
        return seconds.copy(), outside.copy()

    def _priced(self, phase: str, batch, seq_len, heads, kv_heads, candidates=1, head_dim=HEAD_DIM):
        if phase not in PHASES:
            raise PerfkitError(f"unknown phase {phase!r}; choose from: {', '.join(PHASES)}")
        b, s, q, h, kv = self._args(heads, kv_heads, head_dim, batch=batch, seq_len=seq_len, candidates=candidates)
        floor = attention_floor(attention_kernel(phase, h, kv, b, s, q, self.head_dim), *self.decode.bounds)
        if phase in (Phase.PREFILL, Phase.DECODE):
            seconds, outside = self.kernels(phase).predict(b, s, h, kv)
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
        return self.serves(phase) and (heads, kv_heads) in self.kernels(phase).grids


def attention_op_time(
    table: AttentionTable | None, op: str, phase: str, model: ModelConfig, batch, seq_len, candidates=1
) -> np.ndarray | None:
    """Measured-based seconds of attention op `op` (qk, pv or the fused sdpa) of `phase` for
    a model (shard), or None where the table cannot serve it (no table, a head size the
    tables lack) and the caller keeps the roofline. qk and pv share the fused time in
    proportion to their roofline times."""
    if op not in OPS:
        raise PerfkitError(f"{op!r} is not an attention op; choose from: {', '.join(OPS)}")
    if table is None or model.head_dim != table.head_dim or not table.serves(phase):
        return None
    check_point(op, phase, batch, seq_len, candidates)
    b, s, q = np.broadcast_arrays(*(np.asarray(v) for v in (batch, seq_len, candidates)))
    fused, _ = table._timed(phase, b, s, model.num_heads, model.num_kv_heads, q, table.head_dim)
    if op == "sdpa":
        return fused
    spec, dtype, params = table.decode.spec, table.table_dtype, RooflineParams()
    qk, pv = (op_time(op_kernels(o, phase, model, b, s, q), dtype, spec, params) for o in ATTENTION_OPS)
    return fused * np.asarray((qk if op == "qk" else pv) / (qk + pv), dtype=float)


def _attention_stacks(evidence: DeviceEvidence, names: dict[str, str] = TABLES) -> list[ShippedStack]:
    """The device's stacks with decode attention tables (prefill ones are optional: module doc)."""
    found = evidence.with_table(names["decode"])
    rank = {engine: i for i, engine in enumerate(ENGINE_ORDER)}
    return sorted(found, key=lambda s: (rank.get(s.engine, len(rank)), s.engine, version_key(s.version)))


def attention_stacks(device: str | DeviceEvidence) -> list[str]:
    """A device's stacks with attention tables, default order first (an engine's newest last)."""
    return [s.stack for s in _attention_stacks(as_evidence(device))]


def attention_devices() -> list[str]:
    """Every device spec with shipped attention tables."""
    return [key for key, spec in load_all_specs().items() if _attention_stacks(device_evidence(spec))]


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


def attention_table(
    device: str | DeviceEvidence,
    stack_name: str | None = None,
    dtype: str = "bf16",
    kv_cache: KvFormat | None = None,
    head_dim: int = HEAD_DIM,
) -> AttentionTable | None:
    """The measured attention of a device (its evidence, or a spec key or alias) in one stack:
    an engine (vllm, sglang, trtllm: its newest version), engine-version (vllm-0.24.0), or
    None for the first of ENGINE_ORDER the device has; built once per evidence. None where the
    device has no shipped attention tables (a device hw_specs does not hold, a CPU) or none in
    (or standing for) `dtype`, or, for an fp8 KV cache (`kv_cache`), none over one, or none of
    the head size (128 in the main tables, 64 in tables of their own, over a 16-bit cache)."""
    check_dtype(dtype)
    if not isinstance(device, DeviceEvidence):
        try:
            device = as_evidence(device)
        except PerfkitError:
            return None
    evidence = device
    key = ("attention", stack_name, dtype) + ((kv_cache,) if kv_cache else ()) + (head_suffix(head_dim),)
    return evidence.derived(key, lambda: _attention_table(evidence, stack_name, dtype, kv_cache, head_dim))


def _attention_table(
    evidence: DeviceEvidence, stack_name: str | None, dtype: str, kv_cache: KvFormat | None, head_dim: int
) -> AttentionTable | None:
    names = {phase: name + head_suffix(head_dim) for phase, name in (FP8_KV_TABLES if kv_cache else TABLES).items()}
    stacks = _attention_stacks(evidence, names)
    if not stacks:
        return None
    spec = evidence.spec
    stack = _pick(stacks, stack_name, spec.key)
    frames = {phase: stack.table(name) for phase, name in names.items() if stack.has(name)}
    have = set(frames["decode"]["dtype"])
    table_dtype = dtype if dtype in have else SUBSTITUTES.get(dtype)
    if table_dtype not in have:
        return None
    frames = {phase: f[(f["dtype"] == table_dtype) & (f["head_dim"] == head_dim)] for phase, f in frames.items()}
    frames = {phase: f for phase, f in frames.items() if len(f)}  # a stack may time no prefill (module doc)
    sources = tuple(sorted(set().union(*(f["kernel_source"] for f in frames.values()))))
    # an fp8 cache is read at a byte an element: its floor (and roofline beyond the table) is fp8's
    # where the device has an fp8 peak, else the 16-bit one, which can only raise a time
    bound = "fp8" if kv_cache and "fp8" in spec.peak_tflops else table_dtype
    kernels = {phase: KernelTable.of(f, phase, spec, bound, head_dim=head_dim) for phase, f in frames.items()}
    tree = ()
    if stack.has("tree_attention") and not kv_cache and head_dim == HEAD_DIM:
        rows = stack.table("tree_attention")
        rows = rows[(rows["dtype"] == table_dtype) & (rows["head_dim"] == HEAD_DIM)]
        tree = tuple(KernelTable.of(part, "tree", spec, table_dtype, int(q)) for q, part in rows.groupby("q_len"))
    decode, prefill = kernels.get("decode"), kernels.get("prefill")
    if decode is None:  # the decode table holds other head sizes only
        return None
    return AttentionTable(spec.key, stack, dtype, table_dtype, sources, decode, prefill, tree, kv_cache)


def measured_attention_rows(
    device: str | DeviceEvidence, model: ModelConfig, dtype: str, stack_name: str | None = None
) -> pd.DataFrame:
    """Data-contract rows (op sdpa, decode and prefill) of the measured points whose head
    configuration is exactly the model's, `model` set to its name; an empty frame where
    the tables have none. The dtype column says what they were measured in."""
    table = attention_table(device, stack_name, dtype)
    empty = pd.DataFrame(columns=COLUMNS + EXTRA_COLUMNS)
    if table is None:
        return empty
    frames = []
    for phase, name in TABLES.items():
        if not table.serves(phase):
            continue
        rows = contract_rows(table.source, name)
        keep = (rows["num_heads"] == model.num_heads) & (rows["num_kv_heads"] == model.num_kv_heads)
        keep &= (rows["head_dim"] == model.head_dim) & (rows["dtype"] == table.table_dtype)
        frames.append(rows[keep])
    rows = pd.concat(frames, ignore_index=True)
    return rows.assign(model=model.name) if len(rows) else empty


def write_measured_attention(
    out: Path, device: str | DeviceEvidence, model: ModelConfig, dtype: str, stack_name=None
) -> str | None:
    """Write the measured attention points of the model's head configuration to
    out/measured-attention-<model>.csv (the roofline and speedup commands show them beside their
    predictions) and return the line that says so; None where the device has none."""
    rows = measured_attention_rows(device, model, dtype, stack_name)
    if not len(rows):
        return None
    path = out / f"measured-attention-{model.name}.csv"
    write_csv(rows, path)
    phases = ", ".join(f"{(rows['phase'] == p).sum()} {p}" for p in ("decode", "prefill"))
    source = attention_table(device, stack_name, dtype).label
    return f"  measured attention of {model.name}'s heads: {phases} points ({source}) -> {path}"
