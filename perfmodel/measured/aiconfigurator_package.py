"""aiconfigurator-core's measured folders read from the package and compacted to the tables
the toolkit ships (perfmodel.measured.aiconfigurator's module doc says what is kept):
`profilers.imports aiconfigurator` runs it; nothing else needs the package.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from perfmodel.base.dtypes import element_bytes
from perfmodel.base.errors import PerfkitError
from perfmodel.measured.aiconfigurator import (
    ATTENTION_COLUMNS,
    DTYPES,
    FP8_KV,
    FP8_KV_SUFFIX,
    HEAD_DIMS,
    KINDS,
    MLA_COLUMNS,
    MLA_DTYPES,
    MLA_MODEL,
    MLA_MODULE,
    MOE,
    MOE_COLUMNS,
    MOE_DTYPES,
    MOE_GROUP,
    NCCL_OPS,
    OTHER_HEAD_DIMS,
    QUANTIZED_DTYPES,
    QUANTIZED_GEMM,
    SERVING_KINDS,
    head_suffix,
    run_id,
    version_key,
)
from perfmodel.measured.contract import significant
from perfmodel.models.operators import Phase


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


def collections(data_root: str | Path, system: str) -> list[Collection]:
    """The newest collection of each engine and kind of a system under aiconfigurator's data
    folder (an older version of the same engine measured the same kernels on an older stack),
    every NCCL version (the message sizes and GPU counts differ between them), and per engine
    the newest all-reduce and MoE collections at or below its GEMM stack's version, serving it."""
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
            if kind not in SERVING_KINDS:
                found += versions[-1:]
            elif engine.name == "nccl":
                found += versions
            else:
                stacks = [c for c in found if c.engine == engine.name and c.kind not in SERVING_KINDS]
                found += serving_collections(versions, stacks, SERVING_KINDS[kind])
    return found


def serving_collections(versions: list[Collection], stacks: list[Collection], table: str) -> list[Collection]:
    """An engine's collection of `table` (its custom all-reduce, its MoE layers) for each of
    its stacks (GEMM or attention, newest version): the newest at or below that version
    holding the table."""
    out = []
    for version in dict.fromkeys(c.version for c in stacks):
        usable = [
            c
            for c in versions
            if version_key(c.version) <= version_key(version) and (c.folder / f"{table}.parquet").is_file()
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


def compact_gemm(frame: pd.DataFrame, dtypes: dict[str, str] = DTYPES) -> pd.DataFrame:
    """The GEMM rows of the package dtypes in `dtypes`, named the toolkit's way: 16-bit by
    default, QUANTIZED_DTYPES for gemm_quantized."""
    frame = frame[frame["gemm_dtype"].isin(dtypes)]
    out = pd.DataFrame(
        {
            "m": frame["m"].astype(np.int64),
            "n": frame["n"].astype(np.int64),
            "k": frame["k"].astype(np.int64),
            "dtype": frame["gemm_dtype"].map(dtypes),
            "kernel_source": frame["kernel_source"].astype(str),
            "time_s": seconds(frame["latency"]),
        }
    )
    return out.sort_values(["dtype", "kernel_source", "n", "k", "m"], ignore_index=True)


def compact_attention(
    frame: pd.DataFrame, phase: str, kv_cache: str | None = None, head_dims: tuple[int, ...] = HEAD_DIMS
) -> pd.DataFrame:
    """16-bit attention rows of the head sizes `head_dims` over a KV cache in `kv_cache` (None:
    the attention's own dtype); `dtype` is the attention's either way."""
    cache = frame["attn_dtype"] if kv_cache is None else kv_cache
    keep = (
        frame["attn_dtype"].isin(DTYPES)
        & (frame["kv_cache_dtype"] == cache)
        & frame["head_dim"].isin(head_dims)
        & (frame.get("window_size", 0) == 0)
        & (frame.get("beam_width", 1) == 1)
    )
    frame = frame[keep]
    kv_len = frame["isl"] + frame["step"] if phase == Phase.DECODE else frame["isl"]
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


def compact_moe(frame: pd.DataFrame) -> pd.DataFrame:
    """The MoE layers of the experts' formats kept (MOE_DTYPES) over at most MOE_GROUP
    devices, named the toolkit's way."""
    frame = frame[frame["moe_dtype"].isin(MOE_DTYPES) & (frame["moe_tp_size"] * frame["moe_ep_size"] <= MOE_GROUP)]
    ints = {c: frame[c].astype(np.int64) for c in ("num_tokens", "hidden_size", "inter_size", "topk", "num_experts")}
    out = pd.DataFrame(
        {
            **ints,
            "moe_tp": frame["moe_tp_size"].astype(np.int64),
            "moe_ep": frame["moe_ep_size"].astype(np.int64),
            "distribution": frame["distribution"].astype(str),
            "dtype": frame["moe_dtype"].map(MOE_DTYPES),
            "kernel_source": frame["kernel_source"].astype(str),
            "time_s": seconds(frame["latency"]),
        }
    )
    return out.sort_values(MOE_COLUMNS[:-2], ignore_index=True)


def compact_mla_module(frame: pd.DataFrame, phase: str) -> pd.DataFrame:
    """DeepSeek-V3's latent-attention module rows of one phase in 16-bit compute, named the
    toolkit's way (perfmodel.measured.aiconfigurator's module doc)."""
    keep = (frame["model"] == MLA_MODEL) & (frame["mla_dtype"] == "bfloat16") & (frame["tp_size"] == 1)
    keep &= frame["gemm_type"].isin(MLA_DTYPES) & frame["kv_cache_dtype"].isin(MLA_DTYPES)
    if phase == Phase.PREFILL:
        keep &= frame["step"] == 0  # nothing cached before the prompt
    frame = frame[keep]
    out = pd.DataFrame(
        {
            "phase": str(phase),
            "batch": frame["batch_size"].astype(np.int64),
            "seq_len": (frame["isl"] if phase == Phase.PREFILL else frame["step"]).astype(np.int64),
            "num_heads": frame["num_heads"].astype(np.int64),
            "dtype": frame["gemm_type"].map(MLA_DTYPES),
            "kv_cache": frame["kv_cache_dtype"].map(MLA_DTYPES),
            "kernel_source": frame["kernel_source"].astype(str),
            "time_s": seconds(frame["latency"]),
        }
    )
    return out.sort_values(MLA_COLUMNS[:-1], ignore_index=True)


def compact_tables(collection: Collection, package_version: str) -> dict[str, pd.DataFrame]:
    """The part of a collection the toolkit keeps, by table name (see the module doc)."""
    out = {}
    for table in KINDS[collection.kind]:
        frame = read_table(collection, table)
        if frame is None:
            continue
        name = table.removesuffix("_perf")
        if table == "gemm_perf":
            kept = {name: compact_gemm(frame), QUANTIZED_GEMM: compact_gemm(frame, QUANTIZED_DTYPES)}
        elif table == "nccl_perf":
            kept = {kept: compact_nccl(frame, op, collection, package_version) for op, kept in NCCL_OPS.items()}
        elif table == "moe_perf":
            kept = {MOE: compact_moe(frame)}
        elif table.startswith("mla_"):
            phase = Phase.DECODE if "generation" in table else Phase.PREFILL
            both = pd.concat([out.get(MLA_MODULE), compact_mla_module(frame, phase)], ignore_index=True)
            kept = {MLA_MODULE: both.sort_values(MLA_COLUMNS[:-1], ignore_index=True)}
        elif table == "custom_allreduce_perf":
            kept = {"custom_all_reduce": compact_custom_all_reduce(frame, collection, package_version)}
        else:
            phase = "decode" if table.startswith("generation") else "prefill"
            kept = {
                name: compact_attention(frame, phase),
                name + FP8_KV_SUFFIX: compact_attention(frame, phase, FP8_KV),
                **{name + head_suffix(d): compact_attention(frame, phase, head_dims=(d,)) for d in OTHER_HEAD_DIMS},
            }
        out.update({name: rows for name, rows in kept.items() if len(rows)})
    return out
