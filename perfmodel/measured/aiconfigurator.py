"""NVIDIA aiconfigurator-core's measured tables: read from the package, shipped compact, and
read back as data-contract rows.

aiconfigurator-core (Apache-2.0, on the package index) ships, per system, tables measured
inside serving engines: `systems/data/<system>/<kind>/<engine>/<version>/`, each folder with
a `collection_meta.yaml` naming the runtime and one or more parquet tables, latencies in
milliseconds. `profilers.imports aiconfigurator` keeps the part the toolkit uses, compact
(`compact_tables`), under `profilers/measurements/<device>/aiconfigurator/<stack>/` with a
provenance.json; everything else here reads those files and needs no package.

What is kept (16-bit only; times in seconds to 6 significant digits):
- `gemm.parquet` (from `gemm_perf`): m (token rows), n, k (the weight), dtype,
  kernel_source, time_s: the device-wide GEMM grid.
- `generation_attention.parquet` (decode): batch, kv_len (isl + step: the prompt and the
  tokens generated so far), num_heads, num_kv_heads, head_dim, dtype, kernel_source, time_s.
  One query token per sequence.
- `context_attention.parquet` (prefill): the same columns with kv_len = isl, the queries.
  Attention rows keep head size 128 (every model preset's), a KV cache in the attention's own
  dtype and no sliding window.
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

`contract_rows` turns a kept table back into data-contract rows (op `gemm` or `sdpa`); every
row's run_id names the package version, system, stack, table and kernel source: which
software stack measured a number is part of its provenance.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from perfmodel.base.dtypes import element_bytes
from perfmodel.base.errors import PerfkitError
from perfmodel.measured.contract import COLUMNS, significant
from perfmodel.measured.store import measurement_roots
from perfmodel.measured.vidur import TABLE_COLUMNS as ALL_REDUCE_COLUMNS

PACKAGE = "aiconfigurator-core"
# The systems imported, and the device spec (hw_specs/) each was measured on.
SYSTEMS = {"a100_sxm": "a100-sxm", "h100_sxm": "h100-sxm", "h200_sxm": "h200", "l40s": "l40s"}
# aiconfigurator's dtype names -> the toolkit's; only 16-bit linear and attention are kept.
DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16"}
KINDS = {
    "gemm": ("gemm_perf",),
    "attention": ("generation_attention_perf", "context_attention_perf"),
    "comm": ("nccl_perf", "custom_allreduce_perf"),
}
# The NCCL collectives kept, by the table each lands in.
NCCL_OPS = {"all_reduce": "all_reduce", "all_gather": "all_gather"}
# The head size of every model preset the toolkit prices (Llama 1-3, Mistral).
HEAD_DIMS = (128,)
GEMM_COLUMNS = ["m", "n", "k", "dtype", "kernel_source", "time_s"]
ATTENTION_COLUMNS = ["batch", "kv_len", "num_heads", "num_kv_heads", "head_dim", "dtype", "kernel_source", "time_s"]
TABLE_COLUMNS = {
    "gemm": GEMM_COLUMNS,
    "generation_attention": ATTENTION_COLUMNS,
    "context_attention": ATTENTION_COLUMNS,
    "tree_attention": ["q_len", *ATTENTION_COLUMNS],  # a torch stack's only (profilers.campaign_stack)
    "all_reduce": ALL_REDUCE_COLUMNS,
    "all_gather": ALL_REDUCE_COLUMNS,
    "custom_all_reduce": ALL_REDUCE_COLUMNS,
}
FOLDER = "aiconfigurator"
# This project's own GPU campaigns, kept in the same table format as a stack named
# torch-<version> (profilers.campaign_stack): the reference decoder's kernels.
TORCH_ENGINE = "torch"
TORCH_FOLDER = "torch"
STACK_FOLDERS = (FOLDER, TORCH_FOLDER)


@dataclass(frozen=True)
class Collection:
    """One measured folder of the package: a system's tables of one kind, from one engine at
    one version."""

    system: str
    kind: str  # gemm, attention or comm
    engine: str  # vllm, sglang, trtllm, nccl
    version: str
    folder: Path
    # An engine's all-reduce serves the engine stack of this version (its GEMMs and attention),
    # measured at `version` at or below it; None: the collection's own version.
    serves: str | None = None

    @property
    def stack(self) -> str:
        """The software stack the tables belong to, e.g. vllm-0.14.0."""
        return f"{self.engine}-{self.serves or self.version}"


def read_meta(folder: Path) -> dict:
    path = folder / "collection_meta.yaml"
    try:
        meta = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise PerfkitError(f"{path}: not a readable collection_meta.yaml ({exc})") from None
    runtime = meta.get("runtime") if isinstance(meta, dict) else None
    if not isinstance(runtime, dict) or not runtime.get("framework") or not runtime.get("version"):
        raise PerfkitError(f"{path}: names no runtime framework and version")
    return meta


def version_key(version: str) -> tuple:
    """A version's order: numeric parts as numbers (0.5.14 after 0.5.6.post2)."""
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in version.replace("rc", ".rc.").split("."))


def collections(data_root: str | Path, system: str) -> list[Collection]:
    """The newest collection of each engine and kind of a system under aiconfigurator's data
    folder (an older version of the same engine measured the same kernels on an older stack),
    every NCCL version (the message sizes and GPU counts differ between them), and per engine
    the newest all-reduce collection at or below its GEMM stack's version, serving it."""
    root = Path(data_root) / system
    if not root.is_dir():
        raise PerfkitError(f"no system {system!r} under {data_root}")
    found = []
    for kind in KINDS:
        for engine in sorted(p for p in (root / kind).glob("*") if p.is_dir()):
            versions = []
            for folder in sorted(engine.glob("*")):
                if not (folder / "collection_meta.yaml").is_file():
                    continue
                # The folders name the engine (a collection_meta may name a variant of it, e.g.
                # wideep_sglang under sglang/); the version must agree.
                version = str(read_meta(folder)["runtime"]["version"])
                if folder.name != version:
                    raise PerfkitError(f"{folder}: its collection_meta.yaml says version {version}")
                versions.append(Collection(system, kind, engine.name, version, folder))
            versions.sort(key=lambda c: version_key(c.version))
            if kind != "comm":
                found += versions[-1:]
            elif engine.name == "nccl":
                found += versions
            else:
                found += engine_all_reduce(versions, [c for c in found if c.engine == engine.name])
    return found


def engine_all_reduce(versions: list[Collection], stacks: list[Collection]) -> list[Collection]:
    """An engine's all-reduce collection for each of its stacks (GEMM or attention, newest
    version): the newest at or below that version holding a custom all-reduce table."""
    out = []
    for version in dict.fromkeys(c.version for c in stacks):
        usable = [
            c
            for c in versions
            if version_key(c.version) <= version_key(version) and (c.folder / "custom_allreduce_perf.parquet").is_file()
        ]
        if usable:
            out.append(replace(usable[-1], serves=version))
    return out


def read_table(collection: Collection, table: str) -> pd.DataFrame | None:
    path = collection.folder / f"{table}.parquet"
    if not path.is_file():
        return None
    try:
        return pd.read_parquet(path)
    except Exception as exc:  # pyarrow raises its own types for a damaged file
        raise PerfkitError(f"{path}: not a readable parquet table ({exc})") from None


def seconds(latency_ms) -> np.ndarray:
    """aiconfigurator's milliseconds as seconds, to the digits kept."""
    return significant(np.asarray(latency_ms, dtype=float) / 1e3)


def compact_gemm(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame[frame["gemm_dtype"].isin(DTYPES)]
    out = pd.DataFrame(
        {
            "m": frame["m"].astype(np.int64),
            "n": frame["n"].astype(np.int64),
            "k": frame["k"].astype(np.int64),
            "dtype": frame["gemm_dtype"].map(DTYPES),
            "kernel_source": frame["kernel_source"].astype(str),
            "time_s": seconds(frame["latency"]),
        }
    )
    return out.sort_values(["dtype", "kernel_source", "n", "k", "m"], ignore_index=True)


def compact_attention(frame: pd.DataFrame, phase: str) -> pd.DataFrame:
    keep = (
        frame["attn_dtype"].isin(DTYPES)
        & (frame["kv_cache_dtype"] == frame["attn_dtype"])
        & frame["head_dim"].isin(HEAD_DIMS)
        & (frame.get("window_size", 0) == 0)
        & (frame.get("beam_width", 1) == 1)
    )
    frame = frame[keep]
    kv_len = frame["isl"] + frame["step"] if phase == "decode" else frame["isl"]
    out = pd.DataFrame(
        {
            "batch": frame["batch_size"].astype(np.int64),
            "kv_len": kv_len.astype(np.int64),
            "num_heads": frame["num_heads"].astype(np.int64),
            "num_kv_heads": frame["num_key_value_heads"].astype(np.int64),
            "head_dim": frame["head_dim"].astype(np.int64),
            "dtype": frame["attn_dtype"].map(DTYPES),
            "kernel_source": frame["kernel_source"].astype(str),
            "time_s": seconds(frame["latency"]),
        }
    )
    return out.sort_values(ATTENTION_COLUMNS[:-1], ignore_index=True)


def run_id(system: str, stack: str, table: str, kernel_source, package_version: str):
    return f"{PACKAGE}@{package_version}:{system}/{stack}/{table}:" + pd.Series(kernel_source).astype(str)


def compact_nccl(frame: pd.DataFrame, op: str, collection: Collection, package_version: str) -> pd.DataFrame:
    """fp16 NCCL `op` (all_reduce, all_gather) in the all-reduce table format: one node
    (devices_per_node = num_workers), message sizes in bytes."""
    frame = frame[(frame["op_name"] == op) & (frame["nccl_dtype"] == "half")].reset_index(drop=True)
    return collective_table(frame, collection, "nccl_perf", package_version)


def compact_custom_all_reduce(frame: pd.DataFrame, collection: Collection, package_version: str) -> pd.DataFrame:
    """An engine's bf16 all-reduce, its CUDA-graph kernel where both were timed, in the
    all-reduce table format."""
    frame = frame[(frame["op_name"] == "all_reduce") & (frame["allreduce_dtype"] == "bfloat16")]
    if "backend" in frame:
        graph = frame["backend"].astype(str).str.endswith("_graph")
        frame = frame[graph] if graph.any() else frame
    return collective_table(frame.reset_index(drop=True), collection, "custom_allreduce_perf", package_version)


def collective_table(frame: pd.DataFrame, collection: Collection, table: str, package_version: str) -> pd.DataFrame:
    """Rows of a collective (message_size in 16-bit elements, latency in ms) in the all-reduce
    table format; run ids name the collection's own version."""
    measured = f"{collection.engine}-{collection.version}"
    ids = run_id(collection.system, measured, table, frame["kernel_source"], package_version)
    out = pd.DataFrame(
        {
            "topology": f"{collection.system}_{collection.engine}",
            "num_workers": frame["num_gpus"].astype(np.int64),
            "devices_per_node": frame["num_gpus"].astype(np.int64),
            "bytes": frame["message_size"].astype(np.int64) * element_bytes("bf16"),
            "time_s": seconds(frame["latency"]),
            "noise": np.nan,
            "run_id": ids.to_numpy(),
        }
    )
    return out.sort_values(["num_workers", "bytes"], ignore_index=True)


def compact_tables(collection: Collection, package_version: str) -> dict[str, pd.DataFrame]:
    """The part of a collection the toolkit keeps, by table name (see the module doc)."""
    out = {}
    for table in KINDS[collection.kind]:
        frame = read_table(collection, table)
        if frame is None:
            continue
        name = table.removesuffix("_perf")
        if table == "gemm_perf":
            kept = {name: compact_gemm(frame)}
        elif table == "nccl_perf":
            kept = {kept: compact_nccl(frame, op, collection, package_version) for op, kept in NCCL_OPS.items()}
        elif table == "custom_allreduce_perf":
            kept = {"custom_all_reduce": compact_custom_all_reduce(frame, collection, package_version)}
        else:
            kept = {name: compact_attention(frame, "decode" if table.startswith("generation") else "prefill")}
        out.update({name: rows for name, rows in kept.items() if len(rows)})
    return out


# ----------------------------------------------------------------------------- shipped tables


@dataclass(frozen=True)
class ShippedStack:
    """One shipped folder: the tables one software stack measured on one device."""

    device: str
    folder: Path
    provenance: dict

    @property
    def stack(self) -> str:
        return self.folder.name  # e.g. vllm-0.24.0

    @property
    def engine(self) -> str:
        return self.provenance.get("engine", self.stack.split("-")[0])

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
        return (self.folder / f"{table}.parquet").is_file()

    def table(self, table: str) -> pd.DataFrame:
        """A shipped table, its columns checked."""
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


def shipped_stacks(device_key: str, roots: list[Path] | None = None) -> list[ShippedStack]:
    """The stacks of a device: aiconfigurator's imported ones (<root>/<device>/aiconfigurator/
    <stack>/) and this project's campaigns (<root>/<device>/torch/torch-<version>/), the
    user's first; a stack shipped in two roots is the user's."""
    found: dict[str, ShippedStack] = {}
    for root in roots or measurement_roots():
        for folder in sorted(f for parent in STACK_FOLDERS for f in (root / device_key / parent).glob("*")):
            provenance_path = folder / "provenance.json"
            if folder.name in found or not provenance_path.is_file():
                continue
            try:
                provenance = json.loads(provenance_path.read_text())
            except (OSError, ValueError) as exc:
                raise PerfkitError(f"{provenance_path}: not readable JSON ({exc})") from None
            found[folder.name] = ShippedStack(device_key, folder, provenance)
    return list(found.values())


def contract_rows(stack: ShippedStack, table: str) -> pd.DataFrame:
    """A shipped GEMM or attention table as data-contract rows (measured, noise unknown: the
    tables keep one value per point), the table's shape columns after the contract's.

    GEMM: op `gemm`, phase prefill, batch 1, seq_len = m, model empty (the grid is the
    device's, not a model's); flops 2mnk, bytes = element size x (mk + kn + mn).
    Attention: op `sdpa`, phase decode (one query token) or prefill (kv_len queries), seq_len =
    kv_len; flops count QK^T and PV over every (query, key) pair; bytes read Q, K and V once
    and write the output."""
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
        queries = 1 if phase == "decode" else seq_len
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
