"""Issue 60, item 3: DeepSeek-V3/R1's latent attention (MLA) read from its config.json, each
layer's attention priced as the engines' measured MLA module, its latent cached whole on every
device, its MTP module drafting, and what is not priced refused in one line."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfmodel.base.drafter_kind import DrafterKind
from perfmodel.latency.fusion import stack_fusion
from perfmodel.latency.source import latency_source
from perfmodel.latency.step import StepModel, layer_ops
from perfmodel.models.config import load_model
from perfmodel.models.hf_config import read_config_json
from perfmodel.models.mla_operators import mla_kernels
from perfmodel.models.moe import layer_slice
from perfmodel.models.operators import op_cost, op_groups
from perfmodel.models.unpriced import check_dense
from perfmodel.planning.memory import (
    feature_head_bytes,
    kv_bytes_per_token,
    replica_kv_bytes_per_token,
    weight_bytes,
    weight_params,
)
from reports.commands.plan import main as plan_main
from tests.helpers import one_line_error

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "tests" / "data" / "model_configs"
DEEPSEEK_V3 = CONFIGS / "deepseek-ai--DeepSeek-V3_config.json"
KIMI_K2 = CONFIGS / "moonshotai--Kimi-K2-Instruct_config.json"
H200_VLLM = ROOT / "profilers" / "measurements" / "h200" / "aiconfigurator" / "vllm-0.24.0" / "mla_module.parquet"


def module_rows(phase: str, heads: int, dtype: str = "fp8-block", kv_cache: str = "bf16") -> pd.DataFrame:
    rows = pd.read_parquet(H200_VLLM)
    keep = (rows["phase"] == phase) & (rows["num_heads"] == heads)
    return rows[keep & (rows["dtype"] == dtype) & (rows["kv_cache"] == kv_cache)]


def config_with(tmp_path: Path, **changes) -> Path:
    config = {k: v for k, v in (json.loads(DEEPSEEK_V3.read_text()) | changes).items() if v is not None}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize(
    ("config", "params_b", "experts", "moe_layers", "heads"),
    [(DEEPSEEK_V3, 671.0, 256, 58, 128), (KIMI_K2, 1026.4, 384, 60, 64)],  # DeepSeek's 671B; Moonshot's "1T"
)
def test_a_latent_attention_config_is_read_with_its_experts(config, params_b, experts, moe_layers, heads):
    model = load_model(config)
    assert model.mla.cache_width == 576 and model.mla.q_lora_rank == 1536 and model.num_heads == heads
    assert model.head_dim == 128  # v_head_dim (hidden / heads says nothing of a latent head)
    assert model.moe.experts == experts and model.moe.top_k == 8 and model.moe.shared_size == 2048
    assert model.moe.moe_layers == moe_layers  # first_k_dense_replace dense layers before the experts
    assert str(model.weights) == "fp8-block"
    assert weight_params(model) / 1e9 == pytest.approx(params_b, abs=0.1)
    assert weight_bytes(model, "bf16") / 1e9 == pytest.approx(params_b, rel=0.01)  # fp8: about a byte each


def test_the_latent_is_cached_once_per_layer_and_whole_on_every_device():
    model = load_model(DEEPSEEK_V3)
    per_token = 61 * (512 + 64) * 2  # 70 KB: grouped-query attention of 128 heads would cache 61 x 2 x 128 x 128 x 2
    assert kv_bytes_per_token(model, "bf16") == per_token
    assert replica_kv_bytes_per_token(model, "bf16", 8) == 8 * per_token
    assert kv_bytes_per_token(model.with_precision("fp8-block", "fp8"), "bf16") == per_token // 2


def test_the_module_s_kernels_count_decoding_absorbed_and_prefill_expanded():
    shard = load_model(DEEPSEEK_V3).shard(8)  # 16 heads a device
    decode = op_cost("mla", "decode", shard, "bf16", 4, 1024)
    # projections 7168 -> 2112 whole, 1536 -> 16 x 192, 16 x 128 -> 7168; absorbed 16 x 128 x 512 and 16 x 512 x 128
    weights = 7168 * 2112 + 1536 * 16 * 192 + 16 * 128 * 7168 + 2 * 16 * 128 * 512
    attention = 2 * 4 * 16 * 1024 * (576 + 512)  # scores over the 576-wide latents, values the 512-wide latent
    assert decode.flops == 2 * 4 * weights + attention
    # prefill expands the KV latent (512 -> 16 x 256) and attends causally at query/key 192, value 128
    prefill = mla_kernels(shard, True, 1, 1024, 1024)
    assert [k.n for k in prefill[:3]] == [2112, 16 * 192, 16 * 256]
    assert prefill[3].flops == 2 * 16 * 1024 * 1025 * (192 + 128) / 2  # causal: the diagonal and below


def test_the_full_step_runs_one_module_where_grouped_query_attention_runs_five_ops():
    model = load_model(DEEPSEEK_V3)
    ops = [item.op for item in layer_ops(model, "full", stack_fusion("vllm"))]
    assert "mla" in ops and not {"qkv", "rope", "kv_write", "sdpa", "o"} & set(ops)
    assert [item.op for item in layer_ops(model, "paper")][0] == "mla"
    assert list(op_groups(model))[0] == "latent attention"


def test_the_module_is_the_measured_row_at_a_measured_point_and_interpolated_between():
    shard = load_model(DEEPSEEK_V3).shard(8)
    source = latency_source("h200", shard, stack="vllm")
    assert "latent attention: measured fp8-block DeepSeek-V3 MLA modules over a bf16 cache" in source.label
    rows = module_rows("decode", 16).set_index(["batch", "seq_len"])["time_s"]
    assert source.op_time("mla", "decode", 16, 4096, 1) == pytest.approx(rows[(16, 4096)])
    between = float(source.op_time("mla", "decode", 24, 4096, 1))
    assert between == pytest.approx((rows[(16, 4096)] + rows[(32, 4096)]) / 2)
    # a tree of 4 tokens per sequence: 4 sequences of one token over the same context
    assert source.op_time("mla", "tree", 4, 4096, 4) == pytest.approx(rows[(16, 4096)])
    prefill = module_rows("prefill", 16).set_index(["batch", "seq_len"])["time_s"]
    assert source.op_time("mla", "prefill", 2, 8192, 1) == pytest.approx(prefill[(2, 8192)])


def test_past_the_measured_lengths_decoding_grows_linearly_and_prefill_quadratically():
    shard = load_model(DEEPSEEK_V3).shard(8)
    source = latency_source("h200", shard, stack="vllm")
    decode = module_rows("decode", 16)
    d = decode[decode["batch"] == 512].set_index("seq_len")["time_s"]  # measured to 65,536 at batch 512
    slope = (d.iloc[-1] - d.iloc[-2]) / (d.index[-1] - d.index[-2])
    far = d.index[-1] * 2
    assert source.op_time("mla", "decode", 512, far, 1) == pytest.approx(d.iloc[-1] + slope * d.index[-1])
    prefill = module_rows("prefill", 16)
    p = prefill[prefill["batch"] == 1].set_index("seq_len")["time_s"]
    longest = p.index[-1]
    twice = float(source.op_time("mla", "prefill", 1, 2 * longest, 1))
    assert 2 * p.iloc[-1] < twice <= 4 * p.iloc[-1]  # causal attention: more than twice, at most four times


def test_a_shared_expert_runs_beside_the_routed_experts_in_an_engine_s_decoding_steps():
    shard = load_model(DEEPSEEK_V3).shard(8)
    source = latency_source("h200", shard, stack="trtllm")
    engine = StepModel(shard, source).op_times(16, 1024)
    unfused = StepModel(shard, source, flavor="reference").op_times(16, 1024)  # the reference decoder's step
    beyond = max(unfused["shared_expert"][()] - unfused["router"][()] - unfused["moe"][()], 0.0)
    assert engine["shared_expert"] == pytest.approx(beyond) and beyond < unfused["shared_expert"]
    # vLLM overlaps steps of at most 256 tokens only
    vllm = StepModel(shard, latency_source("h200", shard, stack="vllm"))
    assert vllm.op_times(512, 1024)["shared_expert"] > vllm.op_times(256, 1024)["shared_expert"]


def test_the_plan_answers_on_the_measured_modules(capsys):
    argv = ["--model", str(DEEPSEEK_V3), "--gpu", "h200", "--tp", "8", "--rate", "2", "--tpot-ms", "40"]
    assert plan_main(argv) in (0, None)
    out = capsys.readouterr().out
    assert "Answer: h200 tp 8 (experts tp)" in out and "latent attention: measured fp8-block" in out


def test_the_mtp_module_drafts_with_its_experts_and_latent_attention():
    target = load_model(DEEPSEEK_V3)
    assert target.mtp_layers == 1
    head = layer_slice(target, target.mtp_layers, dense=False)
    assert head.mla == target.mla and head.moe.moe_layers == 1
    eagle = layer_slice(target, 1, dense=True)
    assert eagle.mla is None and eagle.moe is None  # an EAGLE head is a Llama layer, whatever its target
    # in 16 bits: its 4 x 16384 x 7168 attention and 3 x 18432 x 7168 MLP (the target's fp8 is the target's)
    linear = 4 * 16384 * 7168 + 3 * 18432 * 7168
    assert feature_head_bytes(DrafterKind.EAGLE, eagle, target, "bf16") > 2 * linear
    held = feature_head_bytes(DrafterKind.MTP, head, target, "bf16")
    # one layer of 256 experts of 7168 x 2048 x 3 (11.3B) in fp8 blocks dominates; eh_proj 2h -> h in 16 bits
    assert held == pytest.approx(11.72e9, rel=1e-3)


def test_the_datasheet_prices_the_module_by_its_roofline():
    shard = load_model(DEEPSEEK_V3).shard(8)
    source = latency_source("h200", shard, "bf16", "datasheet")
    assert source.latent is None and "latent attention: roofline" in source.label
    assert source.op_time("mla", "decode", 1, 1024, 1) > 0


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"kv_lora_rank": None}, "must give 'kv_lora_rank'"),
        ({"v_head_dim": 0}, "v_head_dim must be a positive integer"),
        ({"model_type": "deepseek_v32", "index_topk": 2048}, "index_topk = 2048 declares a sparse attention indexer"),
        ({"model_type": "llama"}, "n_routed_experts = 256 declares a mixture-of-experts model"),
    ],
)
def test_a_bad_latent_attention_config_is_one_line(tmp_path, changes, fragment):
    one_line_error(lambda: load_model(config_with(tmp_path, **changes)), fragment)


def test_a_module_no_engine_measured_is_one_line(tmp_path):
    wider = load_model(config_with(tmp_path, hidden_size=5120))  # DeepSeek-V2's width: never measured
    other = dataclasses.replace(wider, moe=None).shard(8)  # (its experts would be refused first)
    one_line_error(
        lambda: latency_source("h200", other, stack="vllm"), "is not DeepSeek-V3's, the one MLA module the engines"
    )
    bf16 = dataclasses.replace(load_model(DEEPSEEK_V3), moe=None).with_precision("bf16", None).shard(8)
    one_line_error(lambda: latency_source("a100-sxm", bf16), "no engine measured latent attention on a100-sxm")


def test_the_decoder_refuses_latent_attention():
    model = dataclasses.replace(load_model(DEEPSEEK_V3), moe=None)
    one_line_error(lambda: check_dense(model, "the reference decoder"), "latent attention", "cannot run")


def test_the_mla_tables_ship_small_in_the_vllm_and_tensorrt_llm_stacks():
    files = sorted(ROOT.glob("profilers/measurements/*/aiconfigurator/*/mla_module.parquet"))
    assert {f.parent.name for f in files} == {"vllm-0.24.0", "trtllm-1.3.0rc20"}
    assert sum(f.stat().st_size for f in files) < 1.2e6
    rows = pd.read_parquet(H200_VLLM)
    assert set(rows["phase"]) == {"decode", "prefill"} and set(rows["num_heads"]) == {1, 2, 4, 8, 16, 32, 64, 128}
    assert read_config_json(DEEPSEEK_V3)["model_type"] == "deepseek_v3"
    assert np.isfinite(rows["time_s"]).all()
