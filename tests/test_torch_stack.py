"""The project's own GPU campaign as the torch stack (profilers.campaign_stack): the shipped
H100 campaign converted, read back as a latency source, and the reference decoder's traced
step priced on it by default."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfmodel.base.errors import PerfkitError
from perfmodel.cli import run
from perfmodel.latency.attention_table import attention_table
from perfmodel.latency.choice import LatencyChoice
from perfmodel.latency.gemm_grid import resolve_stack, stack_names, torch_stack
from perfmodel.latency.source import decoder_latency, latency_source, view_latency
from perfmodel.measured.device_view import gpu_view
from perfmodel.models.config import load_model
from perfmodel.models.operators import op_kernels
from profilers.campaign_stack import campaign_stack
from profilers.imports import main as imports_main

CAMPAIGN = Path(__file__).resolve().parents[1] / "profilers/measurements/h100-sxm/campaign-2026-11-24"
CHECK = Path(__file__).resolve().parents[1] / "profilers/measurements/h100-sxm/gpu-check-2026-11-28"
SHIPPED = Path(__file__).resolve().parents[1] / "profilers/measurements/h100-sxm/torch/torch-2.11.0"
HEADS = {"llama-7b": 32, "llama-13b": 40, "llama-33b": 52}


def campaign_tree_rows(graph_only: bool = False) -> pd.DataFrame:
    frames = []
    for model, heads in HEADS.items():
        rows = pd.read_csv(CAMPAIGN / f"{model}-fp16-attention.csv")
        frames.append(rows.assign(heads=heads))
    rows = pd.concat(frames, ignore_index=True)
    rows = rows[(rows["op"] == "sdpa") & (rows["phase"] == "tree") & (rows["candidates"] > 1)]
    rows = rows[rows["status"] == "ok"]
    return rows[rows["mode"] == "cuda-graph"] if graph_only else rows


def test_the_shipped_stack_is_the_campaign_converted(tmp_path, capsys):
    assert run(imports_main, ["campaign", str(CAMPAIGN), str(CHECK), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    folder = tmp_path / "h100-sxm" / "torch" / "torch-2.11.0"
    assert str(folder) in out and "left out:" in out
    for name in ("gemm", "generation_attention", "context_attention", "tree_attention"):
        written, shipped = pd.read_parquet(folder / f"{name}.parquet"), pd.read_parquet(SHIPPED / f"{name}.parquet")
        pd.testing.assert_frame_equal(written, shipped)
    provenance = json.loads((folder / "provenance.json").read_text())
    assert provenance["engine"] == "torch" and provenance["version"] == "2.11.0+cu130"
    assert provenance["machine"]["name"] == "NVIDIA H100 80GB HBM3"
    assert provenance["checks"]["gpu-check-2026-11-28"]["name"] == "NVIDIA H100 80GB HBM3"


def test_a_later_gpu_check_wins_where_it_timed_a_point_in_a_cuda_graph():
    alone, folded = campaign_stack(CAMPAIGN), campaign_stack(CAMPAIGN, CHECK)
    key = ["m", "n", "k", "dtype"]
    check = folded.tables["gemm"].merge(alone.tables["gemm"], on=key, suffixes=("", "_campaign"))
    assert len(check) == len(alone.tables["gemm"])  # nothing of the campaign's is lost
    rows = pd.read_csv(CHECK / "check/llama-7b-fp16-linear.csv")
    # llama-7b's 4096 x 4096 GEMM at 32 rows (q, k, v and o) is one of the check's timings, not the campaign's
    square = rows[rows["op"].isin(["q", "k", "v", "o"]) & (rows["seq_len"] == 32)]
    row = folded.tables["gemm"].query("m == 32 and n == 4096 and k == 4096").iloc[0]
    assert set(square["mode"]) == {row["mode"]} == {"cuda-graph"}
    assert any(row["time_s"] == pytest.approx(t, rel=1e-3) for t in square["time_s"])
    assert row["time_s"] != pytest.approx(check.query("m == 32 and n == 4096 and k == 4096")["time_s_campaign"].iloc[0])
    assert len(folded.tables["tree_attention"]) > len(alone.tables["tree_attention"])  # sizes the campaign left out


def test_a_check_of_another_device_is_refused():
    h200 = CAMPAIGN.parents[1] / "h200/gpu-check-2026-11-27"
    with pytest.raises(PerfkitError, match="measured on h200 .* one device's kernels"):
        campaign_stack(CAMPAIGN, h200)


def test_event_timings_that_hold_launch_gaps_are_left_out_and_counted():
    stack = campaign_stack(CAMPAIGN)
    tree = stack.tables["tree_attention"]
    rows = campaign_tree_rows()
    assert len(tree) < len(rows)  # some event timings far above their floor are not kept
    assert stack.provenance["left_out"]["attention"] > 0
    # every graph-timed tree row is kept, with the mode and the throttle reasons of its row
    assert len(tree[tree["mode"] == "cuda-graph"]) == len(rows[rows["mode"] == "cuda-graph"])
    assert set(tree["mode"]) <= {"cuda-graph", "cuda-events"} and "throttle" in tree


def test_a_gpu_check_without_ceilings_leaves_out_event_timings_far_above_the_datasheet_floor():
    # The H200's second check timed four tree-attention points in CUDA events at 73-94 us (the
    # first check: 15-18 us in a graph): a check measures no ceilings, so the datasheet's floor judges.
    first, second = (CAMPAIGN.parents[1] / f"h200/gpu-check-2026-11-2{day}" for day in (7, 8))
    stack = campaign_stack(first, second)
    tree = stack.tables["tree_attention"]
    assert set(tree["mode"]) == {"cuda-graph"} and (tree["time_s"] < 20e-6).all()
    assert stack.provenance["left_out"]["attention"] == 8  # 2 of the first check's, 6 of the second's


def test_a_folder_that_is_not_a_campaign_is_one_line(tmp_path):
    with pytest.raises(PerfkitError, match="not a campaign folder"):
        campaign_stack(tmp_path)


def test_the_stack_is_named_and_never_the_default():
    assert "torch-2.11.0" in stack_names("h100-sxm")
    assert resolve_stack("h100-sxm", "torch") == torch_stack("h100-sxm") == "torch-2.11.0"
    assert resolve_stack("h100-sxm", None) == "vidur"  # engines and Vidur's harness come first
    assert torch_stack("a100-sxm") is None


def test_its_gemms_are_measured_where_the_campaign_timed_them():
    source = latency_source("h100", "llama-7b", "fp16", stack="torch")
    assert source.mode == "measured" and source.stack == "torch-2.11.0"
    assert "torch 2.11.0+cu130 harness" in source.label and "decode/tree/prefill attention" in source.label
    gemm = pd.read_parquet(SHIPPED / "gemm.parquet")
    row = gemm[(gemm["k"] == 4096) & (gemm["n"] == 11008) & (gemm["m"] == 64)].iloc[0]
    (up,) = op_kernels("up", "prefill", source.model, 1, 64, 1)
    assert float(source.gemm_time(up)) == pytest.approx(row["time_s"], rel=0.05)


def test_tree_attention_comes_back_at_measured_points_and_between_tree_sizes():
    table = attention_table("h100-sxm", "torch", "fp16")
    assert [t.q_len for t in table.tree] == [16, 32, 48, 64, 80, 96, 112]
    rows = campaign_tree_rows(graph_only=True)
    got = table.tree_time(rows["batch"], rows["candidates"], rows["seq_len"], rows["heads"], rows["heads"])
    assert np.median(np.abs(got / rows["time_s"].to_numpy() - 1)) < 0.01
    # each tree size held out in turn, predicted from the sizes around it
    errors = []
    for size in (32, 48, 64, 80, 96):
        less = replace(table, tree=tuple(t for t in table.tree if t.q_len != size))
        part = rows[rows["candidates"] == size]
        got = less.tree_time(part["batch"], size, part["seq_len"], part["heads"], part["heads"])
        errors.extend(got / part["time_s"].to_numpy() - 1)
    assert np.median(np.abs(errors)) < 0.05
    # the engines' decode-kernel mapping is what the decoder's masked sdpa is not
    engine = attention_table("h100-sxm", None, "fp16")
    mapped = engine.tree_time(rows["batch"], rows["candidates"], rows["seq_len"], rows["heads"], rows["heads"])
    assert np.median(mapped / rows["time_s"].to_numpy()) < 0.85


def test_past_the_largest_tree_it_grows_and_is_flagged_outside():
    table = attention_table("h100-sxm", "torch", "fp16")
    at_112 = table.tree_time(4, 112, 2048, 32, 32)
    at_256 = table.tree_time(4, 256, 2048, 32, 32)
    assert at_256 > at_112
    assert table.outside("tree", 4, 2048, 32, 32, 256) and not table.outside("tree", 16, 2048, 32, 32, 112)


def test_the_decoders_own_step_is_priced_on_the_torch_stack_by_default():
    model = load_model("llama-7b")
    h100 = gpu_view("h100", None, [])
    assert decoder_latency(h100, model, "fp16").stack == "torch-2.11.0"
    assert decoder_latency(h100, model, "fp16", LatencyChoice.of("auto", "vllm")).stack == "vllm-0.24.0"
    assert decoder_latency(h100, model, "fp16", "datasheet").mode == "datasheet"
    assert view_latency(h100, model, "fp16").stack == "vidur"  # engines' steps keep their default
    a100 = gpu_view("a100", None, [])
    assert decoder_latency(a100, model, "fp16").stack == view_latency(a100, model, "fp16").stack


def test_a_device_without_a_campaign_refuses_the_torch_stack_in_one_line():
    with pytest.raises(PerfkitError, match="a100-pcie has no GPU campaign of this project's"):
        latency_source("a100", "llama-7b", "fp16", stack="torch")
    with pytest.raises(PerfkitError, match="a100-sxm has no GEMM measurements of that stack"):
        latency_source("a100-sxm", "llama-7b", "fp16", stack="torch")
