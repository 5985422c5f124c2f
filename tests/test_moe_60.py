"""Issue 60, item 2: mixture-of-experts models read from their config.json, every expert in
memory, each expert layer priced from the engines' measured MoE tables at the step's tokens,
split and routing named, and bad MoE input refused in one line."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from decoder.twin import dummy_checkpoint
from perfmodel.base.drafter_kind import DrafterKind
from perfmodel.cli import run
from perfmodel.latency.choice import LatencyChoice
from perfmodel.latency.draft_weights import DraftWeights
from perfmodel.latency.source import latency_source
from perfmodel.latency.step import WINDOW_ATTENTION, StepModel
from perfmodel.latency.tensor_parallel import tensor_parallel_steps
from perfmodel.measured.device_view import resolve_view
from perfmodel.models.config import load_model
from perfmodel.models.moe import layer_slice
from perfmodel.peer.static_batch import static_batch
from perfmodel.planning.memory import weight_bytes, weight_params
from perfmodel.schedule import main as schedule_main
from reports.commands.plan import main as plan_main
from tests.helpers import one_line_error

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "tests" / "data" / "model_configs"
QWEN3_30B = CONFIGS / "Qwen--Qwen3-30B-A3B_config.json"
H100_VLLM = ROOT / "profilers" / "measurements" / "h100-sxm" / "aiconfigurator" / "vllm-0.24.0" / "moe.parquet"


def measured_rows(path: Path, **match) -> pd.DataFrame:
    """The rows of a shipped MoE table matching every column given, at power_law_1.2 routing."""
    rows = pd.read_parquet(path)
    keep = rows["distribution"] == "power_law_1.2"
    for column, value in match.items():
        keep &= rows[column] == value
    return rows[keep]


def config_with(tmp_path: Path, **changes) -> Path:
    config = json.loads(QWEN3_30B.read_text()) | changes
    config = {k: v for k, v in config.items() if v is not None}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize(
    ("config", "params_b", "experts", "top_k"),
    [
        ("Qwen--Qwen3-30B-A3B", 30.5, 128, 8),  # the model card: 30.5B parameters
        ("Qwen--Qwen3-235B-A22B", 235.1, 128, 8),  # 235B
        ("mistralai--Mixtral-8x7B-v0.1", 46.7, 8, 2),  # Mistral's 46.7B
    ],
)
def test_an_moe_config_is_read_and_every_expert_counted_in_memory(config, params_b, experts, top_k):
    model = load_model(CONFIGS / f"{config}_config.json")
    assert (model.moe.experts, model.moe.top_k) == (experts, top_k)
    assert weight_params(model) / 1e9 == pytest.approx(params_b, abs=0.1)


def test_the_expert_layer_is_the_measured_row_at_the_step_tokens():
    model = load_model(QWEN3_30B)
    source = latency_source("h100-sxm", model, stack="vllm")
    row = measured_rows(
        H100_VLLM, hidden_size=2048, inter_size=768, num_experts=128, dtype="bf16", moe_tp=1, moe_ep=1, num_tokens=64
    )
    # 64 tokens: batch 8 of a tree of 8, or batch 64 of plain decoding
    assert source.op_time("moe", "tree", 8, 1024, 8) == pytest.approx(row.time_s.min())
    assert source.op_time("moe", "decode", 64, 1024, 1) == pytest.approx(row.time_s.min())
    assert "measured bf16 MoE layers" in source.label and "power_law_1.2 routing" in source.label


def test_routing_and_split_choose_their_rows():
    model = load_model(QWEN3_30B)
    skewed = latency_source("h100-sxm", model, stack="vllm").op_time("moe", "decode", 4096, 1024, 1)
    even = latency_source("h100-sxm", model.as_served(routing="balanced"), stack="vllm")
    assert even.op_time("moe", "decode", 4096, 1024, 1) < skewed  # a skewed routing loads one expert more
    # B200's vLLM measured this layer split by experts over 4 devices, not with each expert split 4 ways
    auto = latency_source("b200", model.shard(4), stack="vllm")
    assert "ep 4" in auto.label and "vllm 0.24.0" in auto.label
    tensor = latency_source("b200", model.as_served(moe_split="tp").shard(4), stack="vllm")
    assert "moe_tp 4" in tensor.label and "trtllm" in tensor.label  # the device's other engine measured it


def test_between_measured_steps_the_time_is_interpolated_and_past_the_table_it_grows_with_tokens():
    source = latency_source("h200", load_model(QWEN3_30B), stack="vllm")
    tokens = np.array([4096, 6144, 5120, 16384, 32768])
    low, high, middle, last, past = source.op_time("moe", "decode", tokens, 1024, np.ones_like(tokens))
    assert middle == pytest.approx((low + high) / 2) and past == pytest.approx(2 * last)


def test_the_plan_answers_on_measured_moe_tables(capsys):
    # the acceptance's command on one of its devices (docs/planning.md's sample runs all three)
    argv = ["--model", str(QWEN3_30B), "--gpu", "h200", "--tp", "auto", "--rate", "20"]
    argv += ["--prompt-len", "1024", "--response-len", "256", "--tpot-ms", "30"]
    assert run(plan_main, argv) == 0
    out = capsys.readouterr().out
    assert "Answer:" in out and "measured bf16 MoE layers" in out
    assert "61.06" in out  # 30.5B parameters of 2 bytes: every expert is in memory


def test_the_datasheet_prices_experts_by_its_roofline():
    model = load_model(QWEN3_30B)
    source = latency_source("h100-sxm", model, source="datasheet")
    assert "experts: roofline" in source.label
    step = StepModel(model, source)
    # a step of 64 tokens reaches nearly every expert; one token reads 8 of 128
    assert step.op_times(64, 1024)["moe"] > 5 * step.op_times(1, 1024)["moe"]


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"num_experts": None}, "must give 'num_experts'"),
        ({"num_experts_per_tok": 200}, "num_experts_per_tok = 200 routes each token to more than its 128 experts"),
        ({"moe_intermediate_size": 0}, "moe_intermediate_size must be an integer >= 1"),
    ],
)
def test_a_bad_moe_config_is_one_line(tmp_path, changes, fragment):
    one_line_error(lambda: load_model(config_with(tmp_path, **changes)), fragment)


def test_an_expert_split_that_does_not_divide_the_experts_is_one_line(tmp_path):
    model = load_model(config_with(tmp_path, num_experts=6, num_experts_per_tok=2)).as_served(moe_split="ep")
    one_line_error(lambda: model.shard(4), "needs a degree dividing 6")
    one_line_error(lambda: model.as_served(moe_split="wide"), "moe parallel 'wide': choose one of auto, tp, ep")


def test_a_shape_no_engine_measured_is_refused_naming_the_measured_ones(tmp_path):
    model = load_model(config_with(tmp_path, num_experts=96))
    one_line_error(
        lambda: latency_source("h100-sxm", model, stack="vllm"),
        "no MoE layer of hidden 2048, 96 experts of 768, top-8, bf16",
    )


def test_the_head_size_64_attention_tables_ship_small_beside_the_main_ones():
    tables = list((ROOT / "profilers" / "measurements").glob("*/aiconfigurator/*/*_attention_head64.parquet"))
    assert len(tables) == 48 and sum(p.stat().st_size for p in tables) < 2e6
    rows = pd.read_parquet(tables[0])
    assert set(rows["head_dim"]) == {64}


def test_the_moe_tables_ship_small_and_every_engine_has_one():
    tables = list((ROOT / "profilers" / "measurements").glob("*/aiconfigurator/*/moe.parquet"))
    # 9.6 MB for 27 stacks of nine devices: splits over at most 8 devices, three routings
    assert len(tables) == 27 and sum(p.stat().st_size for p in tables) < 10e6
    rows = pd.read_parquet(H100_VLLM)
    assert set(rows["dtype"]) == {"bf16", "fp8", "fp8-block", "mxfp4"}
    assert (rows["moe_tp"] * rows["moe_ep"]).max() == 8


def test_gpt_oss_reads_its_mxfp4_experts_and_windowed_layers():
    model = load_model(CONFIGS / "openai--gpt-oss-20b_config.json")
    assert (model.moe.experts_format, model.window.tokens, model.window.layers) == ("mxfp4", 128, 12)
    assert weight_params(model) / 1e9 == pytest.approx(20.9, abs=0.1)  # the model card's 21B
    # its experts in 4.25 bits, the rest (attention, router, embeddings) in 16
    assert weight_bytes(model, "bf16") / 1e9 == pytest.approx(13.7, abs=0.1)
    source = latency_source("h100-sxm", model, stack="vllm")
    assert "measured mxfp4 MoE layers" in source.label
    # its attention of head size 64 from the tables of that head size, not the roofline
    assert source.attention.head_dim == 64 and "attention: decode/prefill attention measured" in source.label
    step = StepModel(model, source)
    # a windowed layer's attention reads 128 keys however long the context
    near, far = (step.op_times(8, s)["sdpa_window"] for s in (1024, 8192))
    assert far == pytest.approx(near) and step.op_times(8, 8192)["sdpa"] > step.op_times(8, 1024)["sdpa"]


def test_the_decoder_refuses_an_moe_config_it_cannot_run():
    one_line_error(lambda: dummy_checkpoint(QWEN3_30B), "mixture-of-experts model, which the reference decoder")


def test_the_serving_search_tries_the_experts_tensor_and_expert_parallel(capsys):
    argv = ["--model", str(QWEN3_30B), "--gpu", "b200", "--tp", "4", "--rate", "20", "--medusa", "off"]
    assert run(plan_main, [*argv, "--prompt-len", "1024", "--response-len", "256", "--tpot-ms", "30"]) == 0
    out = capsys.readouterr().out
    assert "b200 tp 4 (experts tp), Medusa off" in out and "b200 tp 4 (experts ep), Medusa off" in out
    # asked for one split, only that one is searched
    argv += ["--moe-parallel", "ep", "--prompt-len", "1024", "--response-len", "256", "--tpot-ms", "30"]
    assert run(plan_main, argv) == 0
    out = capsys.readouterr().out
    assert "(experts ep)" in out and "(experts tp)" not in out


def qwen2_moe(tmp_path: Path, shared: int = 5632) -> Path:
    """Qwen1.5-MoE-A2.7B's shapes (its config.json's keys): 60 experts of 1408, top-4, and a
    shared expert of 5632 every token runs through."""
    shapes = dict(
        model_type="qwen2_moe",
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=24,
        num_attention_heads=16,
        num_key_value_heads=16,
        vocab_size=151936,
        max_position_embeddings=8192,
        num_experts=60,
        num_experts_per_tok=4,
        moe_intermediate_size=1408,
        shared_expert_intermediate_size=shared,
        decoder_sparse_step=1,
        mlp_only_layers=[],
    )
    (tmp_path / "config.json").write_text(json.dumps(shapes))
    return tmp_path


def test_a_shared_expert_is_held_and_priced_and_an_unmeasured_shape_refused(tmp_path):
    model = load_model(qwen2_moe(tmp_path))
    assert weight_params(model) / 1e9 == pytest.approx(14.3, abs=0.1)  # the model card's 14.3B
    step = StepModel(model, latency_source("h100-sxm", model, source="datasheet"))
    assert step.op_times(8, 1024)["shared_expert"] > 0
    measured = "2048/768/top-8/128"  # Qwen3-30B-A3B's, among others
    one_line_error(lambda: latency_source("h100-sxm", model, stack="vllm"), "60 experts of 1408, top-4", measured)
    odd = load_model(qwen2_moe(tmp_path, shared=5004))
    one_line_error(lambda: odd.shard(8), "tp=8 does not split the shared expert's intermediate size 5004")
    assert 8 not in odd.tensor_parallel_degrees(8)


def test_a_drafter_layer_of_an_moe_target_is_dense_and_an_mtp_module_repeats_its_experts():
    model = load_model(QWEN3_30B)
    eagle = layer_slice(model, 1, dense=True)
    mtp = layer_slice(model, 1, dense=False)
    assert eagle.moe is None and eagle.num_layers == 1 and eagle.dense_layers == 1
    assert (mtp.moe.moe_layers, mtp.dense_layers) == (1, 0)
    ops = {item.op for item in DraftWeights(DrafterKind.EAGLE3).pass_ops(model, "full")}
    assert "moe" not in ops and "gate_up" in ops
    one_line_error(lambda: dataclasses.replace(model, num_layers=1), "48 expert layers of its 1")


def test_a_schedule_at_a_degree_that_cannot_hold_the_model_is_one_line(capsys, tmp_path):
    mixtral = CONFIGS / "mistralai--Mixtral-8x7B-v0.1_config.json"  # 93 GB of experts: two H100s
    assert (
        run(schedule_main, ["--model", str(mixtral), "--gpu", "h100", "--tp", "1", "--out", str(tmp_path / "s")]) == 1
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "it needs 2 devices in tensor parallel" in err
    assert not (tmp_path / "s").exists()


def test_a_windowed_layer_s_attention_counts_as_attention_in_the_peer_breakdown():
    model = load_model(CONFIGS / "openai--gpt-oss-20b_config.json")
    step = tensor_parallel_steps(resolve_view("h100", None, []), model, "bf16", 1, LatencyChoice.of("auto", "vllm"))
    parts = static_batch(step["full"], 4, 1024, 16).tpot_parts
    windowed = float(np.mean(step["full"].shard.op_times(np.full(15, 4), 1024 + np.arange(1, 16), 1)[WINDOW_ATTENTION]))
    assert parts["attention"] > windowed > 0


def test_llama4_is_priced_as_its_text_decoder_with_a_shared_expert_and_chunked_attention():
    scout = load_model(CONFIGS / "meta-llama--Llama-4-Scout-17B-16E-Instruct_config.json")
    moe = scout.moe
    assert (moe.experts, moe.top_k, moe.expert_size, moe.shared_size, moe.moe_layers) == (16, 1, 8192, 8192, 48)
    assert (scout.window.tokens, scout.window.layers) == (8192, 36)  # three layers in four chunked
    assert weight_params(scout) / 1e9 == pytest.approx(107.8, abs=0.1)  # the text decoder (109B with the encoder)
    step = StepModel(scout.shard(4), latency_source("h100-sxm", scout.shard(4), stack="vllm"))
    assert {"moe", "shared_expert", WINDOW_ATTENTION, "sdpa"} <= set(step.op_times(8, 1024))


def test_llama4_maverick_interleaves_dense_and_expert_layers(tmp_path):
    config = json.loads((CONFIGS / "meta-llama--Llama-4-Scout-17B-16E-Instruct_config.json").read_text())
    config["text_config"] |= {"num_local_experts": 128, "interleave_moe_layer_step": 2}
    (tmp_path / "config.json").write_text(json.dumps(config))
    maverick = load_model(tmp_path)
    assert (maverick.moe.moe_layers, maverick.dense_layers, maverick.intermediate_size) == (24, 24, 16384)
    assert weight_params(maverick) / 1e9 == pytest.approx(400, abs=2)  # Maverick's 400B (its text decoder)
    one_line_error(lambda: dummy_checkpoint(tmp_path), "mixture-of-experts model, which the reference decoder")


def test_tensorrt_llm_s_min_latency_nvfp4_kernel_prices_decoding_not_prefill():
    model = load_model(CONFIGS / "Qwen--Qwen3-235B-A22B_config.json").as_served("nvfp4").shard(4)
    source = latency_source("b200", model, stack="trtllm")
    rows = pd.read_parquet(
        ROOT / "profilers" / "measurements" / "b200" / "aiconfigurator" / "trtllm-1.3.0rc20" / "moe.parquet"
    )
    rows = rows[
        (rows.hidden_size == 4096)
        & (rows.num_experts == 128)
        & (rows.dtype == "nvfp4")
        & (rows.moe_tp == 4)
        & (rows.moe_ep == 1)
        & (rows.distribution == "power_law_1.2")
        & (rows.num_tokens == 1024)
    ].set_index("kernel_source")["time_s"]
    assert source.op_time("moe", "prefill", 1, 1024, 1) == pytest.approx(rows["moe_torch_flow_cutlass"])
    assert source.op_time("moe", "decode", 1024, 1024, 1) == pytest.approx(rows["moe_torch_flow_min_latency"])
