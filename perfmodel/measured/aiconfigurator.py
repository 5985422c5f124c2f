"""NVIDIA aiconfigurator-core's measured tables: read from the package, shipped compact, and
read back as data-contract rows.

aiconfigurator-core (Apache-2.0, on the package index) ships, per system, tables measured
inside serving engines: `systems/data/<system>/<kind>/<engine>/<version>/`, each folder with
a `collection_meta.yaml` naming the runtime and one or more parquet tables, latencies in
milliseconds. `profilers.imports aiconfigurator` keeps the part the toolkit uses, compact
(`aiconfigurator_package.compact_tables`), under `profilers/measurements/<device>/aiconfigurator/<stack>/` with a
provenance.json (its `tables` names the package folder of each table, the quantized ones
too); everything else here reads those files and needs no package.

What is kept (times in seconds to 6 significant digits; 16-bit rows in the tables the
latency layer reads, quantized ones in tables of their own names, so no 16-bit answer moves):
- `gemm.parquet` (from `gemm_perf`, bf16/fp16): m (token rows), n, k (the weight), dtype,
  kernel_source, time_s: the device-wide GEMM grid.
- `gemm_quantized.parquet` (from `gemm_perf`): the same columns for the quantized GEMMs,
  dtype fp8 (W8A8, per-tensor scales), fp8-block (W8A8, 128x128 block scales) or nvfp4 (W4A4,
  Blackwell only: B200, GB200, B300, GB300, RTX PRO 6000); the package's weight-only and
  SmoothQuant rows (int8_wo, int4_wo, sq) and any other dtype are left out. A device or
  engine the package timed in none of the three (the A100's) has no such table.
- `generation_attention.parquet` (decode): batch, kv_len (isl + step: the prompt and the
  tokens generated so far), num_heads, num_kv_heads, head_dim, dtype, kernel_source, time_s.
  One query token per sequence.
- `context_attention.parquet` (prefill): the same columns with kv_len = isl, the queries.
  Attention rows keep head size 128 (every model preset's), a KV cache in the attention's own
  dtype and no sliding window.
- `generation_attention_head64.parquet`, `context_attention_head64.parquet`: the same columns
  and filters for head size 64 (gpt-oss's), in tables of their own (OTHER_HEAD_DIMS).
- `generation_attention_fp8_kv.parquet`, `context_attention_fp8_kv.parquet`: the same columns
  and filters, for 16-bit attention over an fp8 KV cache; `dtype` is the attention's (bf16),
  the cache's is the table's name. fp8 attention compute (SGLang's and TRT-LLM's fp8 context
  kernels) is left out.
- `all_reduce.parquet` (from `nccl_perf`, fp16): the all-reduce table format of
  perfmodel.measured.vidur (topology, num_workers, devices_per_node, bytes, time_s, noise,
  run_id). `message_size` counts elements, not bytes: aiconfigurator sizes an all-reduce as
  tokens x hidden, and read as elements of 2 bytes the A100 tables agree with Vidur's NCCL
  bytes within 10% at 64 MiB on 2, 4 and 8 GPUs (read as bytes they would be 1.7x slower).
- `all_gather.parquet` (from `nccl_perf`, fp16 all_gather): the same format; `bytes` is the
  gathered (output) buffer, nccl-tests' size convention.
- `custom_all_reduce.parquet` (from `custom_allreduce_perf`, bf16), in an engine stack's
  folder: the engine's own all-reduce (vLLM's and SGLang's custom all-reduce, TensorRT-LLM's
  AllReduce op), the same format. Engines replay decoding steps from CUDA graphs, so where the
  package timed a kernel both in a graph and eagerly, the graph's rows are kept. The table is
  the newest the package has of that engine at or below the stack's version (the L40S's
  vLLM 0.24.0 stack takes vLLM 0.22.0's all-reduce): provenance.json names the version.

- `moe.parquet` (from `moe_perf`): one fused mixture-of-experts layer (the engine's grouped
  expert GEMMs with their activation; the router GEMM and any communication are not in it):
  num_tokens (the step's tokens, before top-k), hidden_size, inter_size (one expert's), topk,
  num_experts, moe_tp (the expert size split), moe_ep (the experts split), distribution (how
  tokens were routed: balanced, power_law_1.01, power_law_1.2), dtype (the experts' format:
  bf16, fp8, fp8-block, nvfp4, mxfp4 for W4A16 MXFP4), kernel_source, time_s. The rows are
  the shapes of the models the package supports (Qwen3-MoE, Mixtral, gpt-oss, ...); int4
  weight-only and W4A8 MXFP4 rows price no format the toolkit reads and are left out, and so
  are splits over more than MOE_GROUP devices (no all-reduce of more is measured). Taken
  from the engine's newest MoE collection at or below its GEMM stack's version, as the
  all-reduce is (provenance.json names it).
- `mla_module.parquet` (from `mla_generation_module_perf` and `mla_context_module_perf`): one
  layer of DeepSeek-V3's latent attention as a whole module (the query and KV down- and
  up-projections, RoPE, the KV-cache write, the attention and the output projection: vLLM's
  DeepseekV2MLAAttention forward, TensorRT-LLM's MLA module, in a CUDA graph) on one device:
  phase (decode: one token per sequence; prefill: a prompt with nothing cached), batch, seq_len
  (decode: the sequence's length with the new token, the cache holding seq_len - 1; prefill: the
  prompt), num_heads (the device's query heads: 128 / tp for DeepSeek-V3), dtype (the
  projections' format: bf16, fp8-block, nvfp4), kv_cache (bf16 or fp8), kernel_source,
  time_s. Kept: DeepSeek-V3's shapes (the rows of other models' modules are left out), 16-bit
  attention compute. Taken as the MoE rows are.

`contract_rows` turns a kept 16-bit table (CONTRACT_TABLES) back into data-contract rows (op
`gemm` or `sdpa`; its bytes count 16-bit operands and cache, so the quantized tables are
refused, not mispriced); every row's run_id names the package version, system, stack, table and kernel source: which
software stack measured a number is part of its provenance.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.base.dtypes import element_bytes
from perfmodel.base.errors import PerfkitError
from perfmodel.base.precision import KvFormat, WeightFormat
from perfmodel.base.stacks import Engine
from perfmodel.measured.contract import COLUMNS, significant
from perfmodel.measured.store import measurement_roots
from perfmodel.measured.vidur import TABLE_COLUMNS as ALL_REDUCE_COLUMNS
from perfmodel.models.operators import Phase

PACKAGE = "aiconfigurator-core"
# The systems imported, and the device spec (hw_specs/) each was measured on.
SYSTEMS = {
    "a100_sxm": "a100-sxm",
    "h100_sxm": "h100-sxm",
    "h200_sxm": "h200",
    "l40s": "l40s",
    "b200_sxm": "b200",
    "gb200": "gb200",
    "b300_sxm": "b300",
    "gb300": "gb300",
    "rtx_pro_6000_server": "rtx-pro-6000",
}
# aiconfigurator's dtype names -> the toolkit's: the 16-bit linear and attention rows.
DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16"}
# Its quantized GEMM dtypes kept (W8A8 per-tensor, W8A8 128x128 block-scaled, W4A4 NVFP4),
# in their own table so a 16-bit reader never meets them; the weight-only and SmoothQuant
# kernels (int8_wo, int4_wo, sq: the A100's TRT-LLM) price no model the toolkit serves.
# Named as perfmodel.base.precision names the formats, so a model's format finds its rows.
FORMATS = {"fp8": WeightFormat.FP8, "fp8_block": WeightFormat.FP8_BLOCK, "nvfp4": WeightFormat.NVFP4}
QUANTIZED_DTYPES = {package: str(fmt) for package, fmt in FORMATS.items()}
# The experts' formats of the MoE rows kept (W4A16 MXFP4: gpt-oss's experts).
MOE_DTYPES = {**DTYPES, **QUANTIZED_DTYPES, "w4a16_mxfp4": "mxfp4"}
MOE = "moe"
# The most devices an expert split spans in the rows kept: one node of eight, the largest group
# any shipped all-reduce table measured (a tensor-parallel degree is priced only where one is).
MOE_GROUP = 8
MLA_MODULE = "mla_module"
# The latent-attention module rows kept: DeepSeek-V3's (perfmodel.models.latent_attention.DEEPSEEK_V3)
MLA_MODEL = "deepseek-ai/DeepSeek-V3"
MLA_DTYPES = {"bfloat16": "bf16", **QUANTIZED_DTYPES}  # the projections' formats and the KV cache's
QUANTIZED_GEMM = "gemm_quantized"
# The one quantized KV cache kept: fp8 under 16-bit attention, in tables named <table>_fp8_kv.
FP8_KV = str(KvFormat.FP8)
FP8_KV_SUFFIX = f"_{FP8_KV}_kv"
KINDS = {
    "gemm": ("gemm_perf",),
    "attention": ("generation_attention_perf", "context_attention_perf"),
    "comm": ("nccl_perf", "custom_allreduce_perf"),
    "moe": ("moe_perf",),
    "mla": ("mla_generation_module_perf", "mla_context_module_perf"),
}
# Kinds whose collection serves an engine's GEMM stack (the newest at or below its version)
SERVING_KINDS = {"comm": "custom_allreduce_perf", "moe": "moe_perf", "mla": "mla_generation_module_perf"}
# The NCCL collectives kept, by the table each lands in.
NCCL_OPS = {"all_reduce": "all_reduce", "all_gather": "all_gather"}
# The head size of every model preset the toolkit prices (Llama 1-3, Mistral), in the main tables;
# other head sizes (gpt-oss's 64) in tables of their own names, so a reader of size 128 never meets them.
HEAD_DIMS = (128,)
OTHER_HEAD_DIMS = (64,)


def head_suffix(head_dim: int) -> str:
    """The suffix of the attention tables of a head size: none for the main tables' (HEAD_DIMS)."""
    return "" if head_dim in HEAD_DIMS else f"_head{head_dim}"


HEAD_TABLES = tuple(
    table + head_suffix(d) for d in OTHER_HEAD_DIMS for table in ("generation_attention", "context_attention")
)
GEMM_COLUMNS = ["m", "n", "k", "dtype", "kernel_source", "time_s"]
MOE_SHAPE = ["hidden_size", "inter_size", "topk", "num_experts"]
MOE_COLUMNS = ["num_tokens", *MOE_SHAPE, "moe_tp", "moe_ep", "distribution", "dtype", "kernel_source", "time_s"]
MLA_COLUMNS = ["phase", "batch", "seq_len", "num_heads", "dtype", "kv_cache", "kernel_source", "time_s"]
ATTENTION_COLUMNS = ["batch", "kv_len", "num_heads", "num_kv_heads", "head_dim", "dtype", "kernel_source", "time_s"]
TABLE_COLUMNS = {
    "gemm": GEMM_COLUMNS,
    QUANTIZED_GEMM: GEMM_COLUMNS,
    "generation_attention": ATTENTION_COLUMNS,
    "context_attention": ATTENTION_COLUMNS,
    "generation_attention" + FP8_KV_SUFFIX: ATTENTION_COLUMNS,
    "context_attention" + FP8_KV_SUFFIX: ATTENTION_COLUMNS,
    **dict.fromkeys(HEAD_TABLES, ATTENTION_COLUMNS),
    "tree_attention": ["q_len", *ATTENTION_COLUMNS],  # a torch stack's only (profilers.campaign_stack)
    "all_reduce": ALL_REDUCE_COLUMNS,
    "all_gather": ALL_REDUCE_COLUMNS,
    "custom_all_reduce": ALL_REDUCE_COLUMNS,
    MOE: MOE_COLUMNS,
    MLA_MODULE: MLA_COLUMNS,
}
# The tables of quantized rows, beside the 16-bit ones (the module doc).
QUANTIZED_TABLES = (QUANTIZED_GEMM, "generation_attention" + FP8_KV_SUFFIX, "context_attention" + FP8_KV_SUFFIX)
# The tables contract_rows reads: 16-bit operands and KV cache (the module doc).
CONTRACT_TABLES = ("gemm", "generation_attention", "context_attention")
FOLDER = "aiconfigurator"
# This project's own GPU campaigns, kept in the same table format as a stack named
# torch-<version> (profilers.campaign_stack): the reference decoder's kernels.
TORCH_ENGINE = Engine.TORCH
TORCH_FOLDER = "torch"
STACK_FOLDERS = (FOLDER, TORCH_FOLDER)


def version_key(version: str) -> tuple:
    """A version's order: numeric parts as numbers (0.5.14 after 0.5.6.post2)."""
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in version.replace("rc", ".rc.").split("."))


def run_id(system: str, stack: str, table: str, kernel_source, package_version: str):
    return f"{PACKAGE}@{package_version}:{system}/{stack}/{table}:" + pd.Series(kernel_source).astype(str)


# ----------------------------------------------------------------------------- shipped tables


@dataclass(frozen=True, eq=False)
class ShippedStack:
    """One shipped folder: the tables one software stack measured on one device.

    Read once per process while its files stay as they are (shipped_stacks): its provenance
    when found, each table when first asked for; pandas' copy-on-write keeps a caller's
    changes to a table its own."""

    device: str
    folder: Path
    provenance: dict
    tables: frozenset[str] = frozenset()  # the parquet tables the folder holds, by name
    _read: dict = field(default_factory=dict, init=False, repr=False)

    @property
    def stack(self) -> str:
        return self.folder.name  # e.g. vllm-0.24.0

    @property
    def engine(self) -> Engine:
        name = self.provenance.get("engine", self.stack.split("-")[0])
        if name not in Engine._value2member_map_:
            raise PerfkitError(f"{self.folder}/provenance.json: engine {name!r} is none of {', '.join(Engine)}")
        return Engine(name)

    @property
    def version(self) -> str:
        return self.provenance.get("version", self.stack.split("-", 1)[-1])

    @property
    def package(self) -> str:
        return self.provenance.get("package", PACKAGE)

    @property
    def is_torch(self) -> bool:
        """This project's own harness and torch's kernels (a campaign), not an engine's."""
        return self.engine == TORCH_ENGINE

    def has(self, table: str) -> bool:
        return table in self.tables

    def table(self, table: str) -> pd.DataFrame:
        """A shipped table, its columns checked; read once."""
        if table not in self._read:
            self._read[table] = self._load(table)
        return self._read[table]

    def _load(self, table: str) -> pd.DataFrame:
        path = self.folder / f"{table}.parquet"
        try:
            frame = pd.read_parquet(path)
        except Exception as exc:  # pyarrow raises its own types for a missing or damaged file
            raise PerfkitError(f"{path}: not a readable table ({exc})") from None
        missing = [c for c in TABLE_COLUMNS[table] if c not in frame.columns]
        if missing:
            raise PerfkitError(f"{path}: not an imported {table} table, missing column(s) {', '.join(missing)}")
        return frame

    def describe(self) -> str:
        """For labels: the stack, the system and the package it came from."""
        return f"{self.engine} {self.version} harness, {self.provenance.get('system', self.device)} ({self.package})"


# A folder's state: each file's name, modification time and size. A stack is read again when
# any of them changes (an import rewrites its folder), else its first reading is kept.
FolderStamp = tuple[str, tuple[tuple[str, int, int], ...]]


def folder_stamp(folder: Path) -> FolderStamp:
    files = sorted((e for e in os.scandir(folder) if e.is_file()), key=lambda e: e.name)
    return str(folder), tuple((e.name, e.stat().st_mtime_ns, e.stat().st_size) for e in files)


def stack_stamps(device_key: str, roots: list[Path] | None = None) -> tuple[FolderStamp, ...]:
    """The state of every stack folder of a device, the user's root first."""
    return tuple(
        folder_stamp(folder)
        for root in roots or measurement_roots()
        for folder in sorted(f for parent in STACK_FOLDERS for f in (root / device_key / parent).glob("*"))
        if folder.is_dir()
    )


def shipped_stacks(device_key: str, roots: list[Path] | None = None) -> list[ShippedStack]:
    """The stacks of a device: aiconfigurator's imported ones (<root>/<device>/aiconfigurator/
    <stack>/) and this project's campaigns (<root>/<device>/torch/torch-<version>/), the
    user's first; a stack shipped in two roots is the user's. Read once per process while
    the folders stay as they are (as aiconfigurator keeps one database per system)."""
    return list(_read_stacks(device_key, stack_stamps(device_key, roots)))


@functools.lru_cache(maxsize=64)
def _read_stacks(device_key: str, stamps: tuple[FolderStamp, ...]) -> tuple[ShippedStack, ...]:
    found: dict[str, ShippedStack] = {}
    for folder_name, files in stamps:
        folder = Path(folder_name)
        names = {name for name, _, _ in files}
        if folder.name in found or "provenance.json" not in names:
            continue
        provenance_path = folder / "provenance.json"
        try:
            provenance = json.loads(provenance_path.read_text())
        except (OSError, ValueError) as exc:
            raise PerfkitError(f"{provenance_path}: not readable JSON ({exc})") from None
        tables = frozenset(name.removesuffix(".parquet") for name in names if name.endswith(".parquet"))
        found[folder.name] = ShippedStack(device_key, folder, provenance, tables)
    return tuple(found.values())


def contract_rows(stack: ShippedStack, table: str) -> pd.DataFrame:
    """A shipped GEMM or attention table as data-contract rows (measured, noise unknown: the
    tables keep one value per point), the table's shape columns after the contract's.

    GEMM: op `gemm`, phase prefill, batch 1, seq_len = m, model empty (the grid is the
    device's, not a model's); flops 2mnk, bytes = element size x (mk + kn + mn).
    Attention: op `sdpa`, phase decode (one query token) or prefill (kv_len queries), seq_len =
    kv_len; flops count QK^T and PV over every (query, key) pair; bytes read Q, K and V once
    and write the output."""
    if table not in CONTRACT_TABLES:
        raise PerfkitError(f"{stack.folder}: {table} is not one of the 16-bit tables ({', '.join(CONTRACT_TABLES)})")
    frame = stack.table(table)
    size = frame["dtype"].map(element_bytes).to_numpy()
    if table == "gemm":
        m, n, k = (frame[c].to_numpy(dtype=np.int64) for c in ("m", "n", "k"))
        batch, seq_len, op, phase = np.ones_like(m), m, "gemm", "prefill"
        flops, nbytes, extra = 2 * m * n * k, size * (m * k + k * n + m * n), {"n": n, "k": k}
    else:
        phase = "decode" if table == "generation_attention" else "prefill"
        batch, seq_len = frame["batch"].to_numpy(dtype=np.int64), frame["kv_len"].to_numpy(dtype=np.int64)
        heads, kv_heads, d = (frame[c].to_numpy(dtype=np.int64) for c in ("num_heads", "num_kv_heads", "head_dim"))
        queries = 1 if phase == Phase.DECODE else seq_len
        op, flops = "sdpa", 4 * batch * heads * queries * seq_len * d
        nbytes = size * batch * d * (2 * heads * queries + 2 * kv_heads * seq_len)
        extra = {"num_heads": heads, "num_kv_heads": kv_heads, "head_dim": d}
    time_s = frame["time_s"].to_numpy(dtype=float)
    system = stack.provenance.get("system", stack.device)
    version = stack.package.rsplit(" ", 1)[-1]
    rows = pd.DataFrame(
        {
            "device": stack.device,
            "model": "",
            "dtype": frame["dtype"].to_numpy(),
            "op": op,
            "phase": phase,
            "batch": batch,
            "seq_len": seq_len,
            "candidates": 1,
            "flops": flops,
            "bytes": nbytes,
            "intensity": significant(flops / nbytes),
            "time_s": time_s,
            "tflops": significant(flops / time_s / 1e12),
            "source": "measured",
            "noise": np.nan,
            "run_id": run_id(system, stack.stack, f"{table}_perf", frame["kernel_source"], version).to_numpy(),
            **extra,
        }
    )
    return rows[COLUMNS + list(extra)]
