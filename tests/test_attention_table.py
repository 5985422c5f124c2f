"""Measured attention (perfmodel.latency.attention_table): exact where measured, physical
where not, and a held-out head configuration predicted within the issue's 8% median."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from perfmodel.attention_check import leave_one_config_out, main
from perfmodel.base.errors import PerfkitError
from perfmodel.latency.attention_table import (
    attention_devices,
    attention_op_time,
    attention_table,
    measured_attention_rows,
)
from perfmodel.measured.aiconfigurator import shipped_stacks
from perfmodel.models.config import load_model


@pytest.fixture(scope="module")
def h100():
    return attention_table("h100-sxm", "vllm", "bf16")


def shipped(device: str, engine: str, table: str):
    (stack,) = [s for s in shipped_stacks(device) if s.engine == engine]
    return stack.table(table)


@pytest.mark.parametrize("phase, table", [("decode", "generation_attention"), ("prefill", "context_attention")])
def test_measured_points_come_back_where_they_rise(h100, phase, table):
    """A measured point comes back as measured, unless a dip under a smaller neighbour broke the
    order: the non-decreasing fit then moves it a little (perfmodel.latency.monotone)."""
    frame = shipped("h100-sxm", "vllm", table)
    frame = frame[(frame["num_heads"] == 32) & (frame["num_kv_heads"] == 8)]
    time = h100.decode_time if phase == "decode" else h100.prefill_time
    got = time(frame["batch"].to_numpy(), frame["kv_len"].to_numpy(), 32, 8)
    deviation = np.abs(got / frame["time_s"].to_numpy() - 1)
    assert np.median(deviation) < 1e-9 and (deviation < 1e-9).mean() > 0.6 and deviation.max() < 0.03
    assert not h100.outside(phase, frame["batch"].to_numpy(), frame["kv_len"].to_numpy(), 32, 8).any()


def test_decode_grows_with_context_and_batch_where_measured(h100):
    # Long contexts, where decode streams the cache: off-grid points between the measured ones.
    kv_len = np.unique(np.geomspace(1024, 8192, 40).astype(int))
    batch = np.unique(np.geomspace(1, 32, 25).astype(int))
    times = h100.decode_time(batch[:, None], kv_len[None, :], 32, 8)
    assert not h100.outside("decode", batch[:, None], kv_len[None, :], 32, 8).any()
    assert (np.diff(times, axis=1) >= 0).all() and (np.diff(times, axis=0) >= 0).all()
    assert times[-1, -1] > 10 * times[0, 0]


def test_a_held_out_head_configuration_is_predicted_within_8_percent(h100):
    result = leave_one_config_out(h100, "decode")
    assert result.groupby(["num_heads", "num_kv_heads"]).ngroups == len(h100.decode.grids) > 30
    assert np.median(result["error"].abs()) <= 0.08


def test_an_unmeasured_configuration_lies_between_its_neighbours(h100):
    # llama-7b's 32 x 32 is not in the vLLM tables: it reads 4x the cache of 32 x 8 (same batch)
    # and the same as 8 x 8 at 4x the batch.
    assert not h100.measured("decode", 32, 32) and h100.measured("decode", 8, 8)
    mha = h100.decode_time(8, 8192, 32, 32)
    assert h100.decode_time(8, 8192, 32, 8) * 2 < mha
    assert mha == pytest.approx(h100.decode_time(32, 8192, 8, 8), rel=0.15)


def test_beyond_the_table_is_flagged_outside(h100):
    assert h100.outside("decode", 1, [4096, 10**6], 32, 8).tolist() == [False, True]
    assert h100.outside("prefill", [1, 4096], 1024, 32, 8).tolist() == [False, True]


def test_the_tree_step_is_decode_at_one_candidate_and_grows_with_candidates(h100):
    candidates = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256])
    for heads, kv_heads in ((32, 8), (32, 32), (8, 1)):
        tree = h100.tree_time(16, candidates, 2048, heads, kv_heads)
        assert tree[0] == h100.decode_time(16, 2048, heads, kv_heads)
        assert (np.diff(tree) >= -0.03 * tree[:-1]).all(), tree  # kernel noise of a few % at most
        assert tree[-1] > 1.1 * tree[0]  # 256 candidates: the query rows' compute shows


def test_qk_and_pv_share_the_fused_time():
    model = load_model("llama-2-70b").shard(8)
    table = attention_table("h200", None, "fp16")
    for phase, candidates in (("decode", 1), ("tree", 64), ("prefill", 1)):
        qk, pv, fused = (attention_op_time(table, op, phase, model, 4, 2048, candidates) for op in ("qk", "pv", "sdpa"))
        assert qk + pv == pytest.approx(fused, rel=1e-9)
    assert fused == pytest.approx(table.prefill_time(4, 2048, 8, 1))


def test_what_the_tables_cannot_serve_falls_back():
    small_heads = dataclasses.replace(load_model("llama-7b"), name="hd64", num_heads=64, num_kv_heads=64, head_dim=64)
    table = attention_table("h100-sxm", None, "fp16")
    assert attention_op_time(table, "sdpa", "decode", small_heads, 1, 1024) is None
    assert attention_op_time(None, "qk", "decode", load_model("llama-7b"), 1, 1024) is None
    assert attention_table("h100-sxm", None, "fp32") is None
    assert attention_table("a40") is None  # no shipped tables
    with pytest.raises(PerfkitError, match="head_dim 64"):
        table.decode_time(1, 1024, 32, 32, head_dim=64)


def test_a_stack_is_picked_by_engine_or_exact_name_and_a_bad_one_is_named():
    assert attention_table("l40s").stack == "vllm-0.24.0"  # the default order starts with vLLM
    assert attention_table("l40s", "trtllm").stack == attention_table("l40s", "trtllm-1.3.0rc20").stack
    with pytest.raises(PerfkitError, match="known stacks: vllm-0.24.0, sglang-0.5.14, trtllm-1.3.0rc20"):
        attention_table("h100-sxm", "tensorrt")
    assert set(attention_devices()) >= {"a100-sxm", "h100-sxm", "h200", "l40s"}


def test_the_label_names_the_data():
    table = attention_table("h200", "sglang", "fp16")
    assert table.label == (
        "decode/prefill attention measured by sglang 0.5.14 harness on h200_sxm (aiconfigurator-core 0.12.0; "
        "kernel fa3, bf16 tables serving fp16)"
    )


def test_measured_rows_are_those_of_the_models_own_heads():
    shard = load_model("llama-2-70b").shard(8)  # 8 query heads, 1 KV head
    rows = measured_attention_rows("h100-sxm", shard, "fp16")
    assert set(rows["phase"]) == {"decode", "prefill"} and (rows["op"] == "sdpa").all()
    assert (rows["num_heads"] == 8).all() and (rows["num_kv_heads"] == 1).all() and (rows["model"] == shard.name).all()
    assert rows["run_id"].str.contains("vllm-0.24.0").all()
    assert measured_attention_rows("h100-sxm", load_model("llama-33b"), "fp16").empty  # 52 heads: never measured


def test_the_check_command_prints_each_stack_and_phase(capsys):
    assert main(["--gpu", "l40s", "--stack", "sglang"]) == 0
    out = capsys.readouterr().out
    assert "l40s" in out and "sglang-0.5.14" in out and "decode" in out and "prefill" in out
    with pytest.raises(PerfkitError, match="a40"):
        main(["--gpu", "a40"])
