"""aiconfigurator-core's quantized GEMM rows (gemm_quantized) and fp8-KV attention rows
(*_fp8_kv) shipped beside the 16-bit tables, which they leave as they were."""

from __future__ import annotations

import json

import pandas as pd
import pyarrow.parquet as pq
import pytest

from perfmodel.base.errors import PerfkitError
from perfmodel.measured.aiconfigurator import QUANTIZED_TABLES, SYSTEMS, TABLE_COLUMNS, contract_rows, shipped_stacks
from perfmodel.measured.aiconfigurator_package import Collection, compact_tables
from perfmodel.measured.store import MEASUREMENTS_DIR
from profilers.import_aiconfigurator import write_collection

# The package's GEMM dtypes: the 16-bit one, the three kept quantized ones, and one left out.
GEMM_DTYPES = ("bfloat16", "fp8", "fp8_block", "nvfp4", "int8_wo")
# Blackwell (SM100 and SM120): the devices the package timed nvfp4 on.
BLACKWELL = {"b200", "b300", "gb200", "gb300", "rtx-pro-6000"}


def gemm_rows(dtypes=GEMM_DTYPES) -> pd.DataFrame:
    """Two shapes per package dtype, in its layout and units (ms)."""
    rows = [
        {
            "kernel_source": f"k-{dtype}",
            "gemm_dtype": dtype,
            "m": m,
            "n": 4096,
            "k": 4096,
            "latency": 0.01 * (i + 1) * m,
        }
        for i, dtype in enumerate(dtypes)
        for m in (1, 8)
    ]
    return pd.DataFrame(rows)


def attention_rows(kinds) -> pd.DataFrame:
    """One decode/prefill point per (attn_dtype, kv_cache_dtype, head_dim, window_size)."""
    rows = [
        {
            "batch_size": 4,
            "isl": 1024,
            "step": 16,
            "num_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": head_dim,
            "attn_dtype": attn,
            "kv_cache_dtype": cache,
            "window_size": window,
            "beam_width": 1,
            "kernel_source": f"{attn}-{cache}",
            "latency": 0.02 * (i + 1),
        }
        for i, (attn, cache, head_dim, window) in enumerate(kinds)
    ]
    return pd.DataFrame(rows)


SIXTEEN_BIT_ATTENTION = [("bfloat16", "bfloat16", 128, 0)]
# fp8 cache under bf16 attention (kept), and what the fp8-KV tables leave out: fp8 attention
# compute, another head size, a sliding window.
FP8_KV_ATTENTION = [("bfloat16", "fp8", 128, 0), ("fp8", "fp8", 128, 0), ("bfloat16", "fp8", 64, 0)]
FP8_KV_ATTENTION += [("bfloat16", "fp8", 128, 1024)]


def collection(tmp_path, kind: str, tables: dict[str, pd.DataFrame]) -> Collection:
    folder = tmp_path / kind
    folder.mkdir(parents=True)
    for name, frame in tables.items():
        frame.to_parquet(folder / f"{name}.parquet")
    return Collection("h100_sxm", kind, "vllm", "0.24.0", folder)


def test_quantized_gemm_rows_land_in_gemm_quantized_only_with_the_toolkits_names(tmp_path):
    mixed = compact_tables(collection(tmp_path, "gemm", {"gemm_perf": gemm_rows()}), "0.12.0")
    alone = compact_tables(collection(tmp_path / "alone", "gemm", {"gemm_perf": gemm_rows(["bfloat16"])}), "0.12.0")
    assert set(mixed) == {"gemm", "gemm_quantized"} and set(alone) == {"gemm"}
    pd.testing.assert_frame_equal(mixed["gemm"], alone["gemm"])  # the 16-bit table as before
    quantized = mixed["gemm_quantized"]
    assert list(quantized.columns) == TABLE_COLUMNS["gemm_quantized"] == TABLE_COLUMNS["gemm"]
    assert quantized.groupby("dtype").size().to_dict() == {"fp8": 2, "fp8-block": 2, "nvfp4": 2}  # no int8_wo
    fp8 = quantized[quantized["dtype"] == "fp8"].set_index("m")["time_s"]
    assert fp8.to_dict() == pytest.approx({1: 2e-5, 8: 16e-5})  # the package's ms as seconds
    assert set(quantized["kernel_source"]) == {"k-fp8", "k-fp8_block", "k-nvfp4"}


def test_fp8_kv_attention_rows_land_in_the_fp8_kv_tables_only(tmp_path):
    package = {
        name: attention_rows(SIXTEEN_BIT_ATTENTION + FP8_KV_ATTENTION)
        for name in ("generation_attention_perf", "context_attention_perf")
    }
    mixed = compact_tables(collection(tmp_path, "attention", package), "0.12.0")
    only = {name: attention_rows(SIXTEEN_BIT_ATTENTION) for name in package}
    alone = compact_tables(collection(tmp_path / "alone", "attention", only), "0.12.0")
    assert set(mixed) == {
        name + suffix for name in ("generation_attention", "context_attention") for suffix in ("", "_fp8_kv")
    }
    for name in ("generation_attention", "context_attention"):
        pd.testing.assert_frame_equal(mixed[name], alone[name])  # the 16-bit tables as before
        fp8_kv = mixed[f"{name}_fp8_kv"]
        assert list(fp8_kv.columns) == TABLE_COLUMNS[f"{name}_fp8_kv"] == TABLE_COLUMNS[name]
        # one row: bf16 attention over an fp8 cache, head size 128, no window; dtype the attention's
        (row,) = fp8_kv.to_dict("records")
        assert row["dtype"] == "bf16" and row["kernel_source"] == "bfloat16-fp8" and row["head_dim"] == 128
        assert row["kv_len"] == (1024 + 16 if name.startswith("generation") else 1024)
    # a collection's provenance names the package folder of the new tables too
    out = tmp_path / "out"
    write_collection(collection(tmp_path / "again", "attention", package), "h100-sxm", out, "0.12.0")
    provenance = json.loads((out / "h100-sxm" / "aiconfigurator" / "vllm-0.24.0" / "provenance.json").read_text())
    assert provenance["tables"]["generation_attention_fp8_kv"].endswith("h100_sxm/attention/vllm/0.24.0")


def test_shipped_fp8_gemms_beat_bf16_where_memory_bound_and_nvfp4_is_blackwells():
    stack = next(s for s in shipped_stacks("h100-sxm") if s.stack == "vllm-0.24.0")
    quantized, bf16 = stack.table("gemm_quantized"), stack.table("gemm")
    assert {"fp8", "fp8-block"} == set(quantized["dtype"]) and (quantized["time_s"] > 0).all()
    with pytest.raises(PerfkitError, match="not one of the 16-bit tables"):
        contract_rows(stack, "gemm_quantized")  # its bytes would count 2-byte operands
    # one token through an 8192 x 8192 weight reads the weight once: half the bytes in fp8
    point = "m == 1 and n == 8192 and k == 8192"
    fp8 = quantized.query(point + " and dtype == 'fp8'")["time_s"].min()
    assert fp8 < 0.8 * bf16.query(point + " and dtype == 'bf16'")["time_s"].min()  # 30 us against 52 us
    # every device with a quantized GEMM table: nvfp4 exactly on Blackwell; the new tables' size
    found = list(MEASUREMENTS_DIR.glob("*/aiconfigurator/*/gemm_quantized.parquet"))
    devices = {p.parts[-4] for p in found}
    assert devices == set(SYSTEMS.values()) - {"a100-sxm"}  # the A100's TRT-LLM timed weight-only kernels only
    with_nvfp4 = {p.parts[-4] for p in found if "nvfp4" in pq.read_table(p, columns=["dtype"])["dtype"].to_pylist()}
    assert with_nvfp4 == BLACKWELL
    size = sum(
        p.stat().st_size for p in MEASUREMENTS_DIR.glob("*/aiconfigurator/*/*.parquet") if p.stem in QUANTIZED_TABLES
    )
    assert size < 16e6  # 14.7 MB for eight devices (12.6 MB of it the GEMMs)
