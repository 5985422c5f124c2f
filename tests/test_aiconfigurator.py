"""aiconfigurator-core's tables: the import, the shipped subset, the GEMM grid and the stack choice."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from perfmodel import latency_source, load_model
from perfmodel.base.errors import PerfkitError
from perfmodel.latency.gemm_grid import gemm_grid, resolve_stack, stack_names
from perfmodel.measured.aiconfigurator import (
    HEAD_TABLES,
    MLA_MODULE,
    MOE,
    QUANTIZED_TABLES,
    SYSTEMS,
    contract_rows,
    shipped_stacks,
)
from perfmodel.measured.contract import check_table
from perfmodel.measured.store import MEASUREMENTS_DIR
from perfmodel.models.operators import op_kernels
from profilers.import_aiconfigurator import import_systems


def test_every_imported_system_ships_its_stacks_with_provenance_and_licence():
    licence = MEASUREMENTS_DIR / "aiconfigurator-LICENSE"
    assert "Apache License" in licence.read_text() and "NVIDIA CORPORATION" in licence.read_text()
    for system, device in SYSTEMS.items():
        stacks = shipped_stacks(device)
        engines = {s.engine for s in stacks}
        assert {"vllm", "sglang", "trtllm", "nccl"} <= engines, device
        for stack in (s for s in stacks if not s.is_torch):  # the project's own campaigns: tests/test_torch_stack.py
            assert stack.provenance["system"] == system
            assert stack.provenance["package"].startswith("aiconfigurator-core ")
            assert stack.provenance["licence"].startswith("Apache-2.0")
    own_budget = (*QUANTIZED_TABLES, MOE, *HEAD_TABLES, MLA_MODULE)  # the issue-60 tables: their tests hold budgets
    sixteen_bit = [p for p in MEASUREMENTS_DIR.glob("*/aiconfigurator/*/*.parquet") if p.stem not in own_budget]
    size = sum(p.stat().st_size for p in sixteen_bit)
    # small enough to ship: 9.6 MB for nine devices (4.1 MB for the first four); the quantized
    # tables' own budget is tests/test_aiconfigurator_quantized_60.py's
    assert size < 10e6


def test_shipped_tables_are_data_contract_rows_naming_their_stack():
    stack = next(s for s in shipped_stacks("h100-sxm") if s.engine == "trtllm")
    for table, op in (("gemm", "gemm"), ("generation_attention", "sdpa"), ("context_attention", "sdpa")):
        rows = check_table(contract_rows(stack, table))
        assert set(rows["op"]) == {op} and set(rows["source"]) == {"measured"}
        assert rows["run_id"].str.startswith("aiconfigurator-core@0.12.0:h100_sxm/trtllm-1.3.0rc20/").all()
        assert (rows["time_s"] > 0).all() and (rows["time_s"] < 1).all()  # seconds, not the package's ms
    decode = contract_rows(stack, "generation_attention")
    assert set(decode["phase"]) == {"decode"} and set(decode["head_dim"]) == {128}


def package_layout(tmp_path, table: pd.DataFrame) -> None:
    """A shipped GEMM table written back in the package's own layout and units (ms), with rows
    the 16-bit table must leave out: fp8 (gemm_quantized's)."""
    folder = tmp_path / "a100_sxm" / "gemm" / "vllm" / "0.14.0"
    folder.mkdir(parents=True)
    (folder / "collection_meta.yaml").write_text("runtime:\n  framework: vllm\n  version: 0.14.0\n")
    package = pd.DataFrame(
        {
            "kernel_source": table["kernel_source"],
            "gemm_dtype": "bfloat16",
            "m": table["m"],
            "n": table["n"],
            "k": table["k"],
            "latency": table["time_s"] * 1e3,
        }
    )
    fp8 = package.assign(gemm_dtype="fp8", latency=package["latency"] / 2)
    pd.concat([package, fp8]).to_parquet(folder / "gemm_perf.parquet")


def test_the_import_keeps_16_bit_rows_in_seconds_and_writes_provenance(tmp_path):
    stack = next(s for s in shipped_stacks("a100-sxm") if s.engine == "vllm")
    table = stack.table("gemm").head(50)
    package_layout(tmp_path / "data", table)
    written = import_systems(tmp_path / "data", "0.12.0", ["a100_sxm"], tmp_path / "out", log=lambda _: None)
    one, quantized = written  # the fp8 rows land in a table of their own
    assert quantized.path.name == "gemm_quantized.parquet" and set(pd.read_parquet(quantized.path)["dtype"]) == {"fp8"}
    assert one.path == tmp_path / "out" / "a100-sxm" / "aiconfigurator" / "vllm-0.14.0" / "gemm.parquet"
    back = pd.read_parquet(one.path)
    assert len(back) == 50 and set(back["dtype"]) == {"bf16"}
    merged = back.merge(table, on=["m", "n", "k"], suffixes=("", "_shipped"))
    assert np.allclose(merged["time_s"], merged["time_s_shipped"], rtol=1e-5)
    provenance = json.loads((one.path.parent / "provenance.json").read_text())
    assert provenance["engine"] == "vllm" and provenance["version"] == "0.14.0"
    with pytest.raises(PerfkitError, match="unknown system"):
        import_systems(tmp_path / "data", "0.12.0", ["b200"], tmp_path / "out")


def test_the_grid_is_the_measured_table_made_non_decreasing_and_keeps_the_staircase_in_m():
    grid = gemm_grid("h100-sxm", "vllm-0.24.0", "bf16")
    table = grid.stack.table("gemm")
    table = table[table["dtype"] == "bf16"].groupby(["m", "n", "k"], as_index=False)["time_s"].min()
    sample = table.sample(2000, random_state=0)
    # the least-squares non-decreasing fit: a small change in the median, no bias; the table's
    # own dips between neighbouring shapes (noise, another kernel picked) are what it averages
    deviation = grid.time(sample["k"], sample["n"], sample["m"]) / sample["time_s"].to_numpy() - 1
    assert np.median(np.abs(deviation)) < 0.02 and abs(np.mean(deviation)) < 0.005
    # across a tile edge the grid's step is kept: 113 -> 128 rows is the measured jump
    shape = table[(table["n"] == 16384) & (table["k"] == 8192)].set_index("m")["time_s"]
    assert shape.loc[128] > 1.15 * shape.loc[113]
    assert grid.time(8192, 16384, 128) > 1.05 * grid.time(8192, 16384, 113)
    # within a tile, linear in m
    middle = grid.time(8192, 16384, 144.5)
    assert middle == pytest.approx((grid.time(8192, 16384, 129) + grid.time(8192, 16384, 160)) / 2, rel=1e-6)
    # between grid columns, between the neighbours' times
    between = grid.time(6000, 16384, 64)
    assert grid.time(5120, 16384, 64) <= between <= grid.time(6144, 16384, 64)
    assert not grid.outside(8192, 16384, 64) and grid.outside(8192, 100_000, 64)
    # past the last row (a prefill of 64 x 8192 tokens) the time grows in proportion to the rows,
    # and past the last column in proportion to the columns (Llama-3's 128256-token LM head)
    last = grid.ms[-1]
    assert grid.time(8192, 16384, 16 * last) == pytest.approx(16 * grid.time(8192, 16384, last), rel=1e-9)
    widest = np.exp(grid.log_ns[-1])
    assert grid.time(4096, 2 * widest, 8) == pytest.approx(2 * grid.time(4096, widest, 8), rel=1e-9)


def test_the_stack_is_a_choice_named_in_the_label():
    assert stack_names("h100-sxm")[0] == "vidur" and resolve_stack("h200", None) == "vllm-0.24.0"
    seventy = load_model("llama-2-70b").shard(8)
    source = latency_source("h200", seventy, "fp16")
    assert source.mode == "grid" and "vllm 0.24.0 harness, h200_sxm (aiconfigurator-core 0.12.0)" in source.label
    assert source.linear_kind("qkv") == "grid"
    grid = gemm_grid("h200", "vllm-0.24.0", "fp16")
    (qkv,) = op_kernels("qkv", "decode", seventy, 8, 512, 1)
    assert float(source.op_time("qkv", "decode", 8, 512, 1)) == pytest.approx(float(grid.time(qkv.k, qkv.n, 8)))
    trt = latency_source("h200", seventy, "fp16", stack="trtllm")
    assert "trtllm 1.3.0rc20" in trt.label and trt.op_time("qkv", "decode", 8, 512, 1) != source.op_time(
        "qkv", "decode", 8, 512, 1
    )
    with pytest.raises(PerfkitError, match="--stack tensorrt: h200 has no GEMM measurements of that stack; it has"):
        latency_source("h200", seventy, "fp16", stack="tensorrt")
