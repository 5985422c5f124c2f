"""The peer check (python -m perfmodel.peer_check): the project's static-batch TPOT and TTFT
beside NVIDIA aiconfigurator's. The peer is an optional extra: without it the command says
how to install it in one line; with it (pip install 'medusa-perfkit[aiconfigurator]') the
quick grid runs and the two agree as docs/peer-check.md says."""

from __future__ import annotations

import importlib.util

import pandas as pd
import pytest

from perfmodel.cli import run
from perfmodel.peer import aiconfigurator_peer
from perfmodel.peer.compare import component_ratios, summarize, ttft_collectives
from perfmodel.peer.static_batch import COMPONENTS
from perfmodel.peer_check import main

HAS_PEER = importlib.util.find_spec("aiconfigurator") is not None


def test_without_the_peer_the_command_says_how_to_install_it(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if "aiconfigurator" in name else real(name))
    assert run(main, ["--quick", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'medusa-perfkit[aiconfigurator]'" in err


def test_a_device_the_peer_has_no_tables_of_is_refused_before_any_work(capsys):
    assert run(main, ["--gpu", "a40", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "a40" in err and "a100-sxm, h100-sxm, h200, l40s" in err and err.count("\n") == 1


def test_the_peers_op_names_fall_into_the_projects_components():
    names = {
        "generation_qkv_gemm": "gemm",
        "generation_logits_gemm": "gemm",
        "generation_attention": "attention",
        "generation_add_norm_1": "elementwise",
        "generation_act_gate": "elementwise",
        "generation_embedding": "elementwise",
        "generation_ar_1": "communication",
        "generation_embedding_ar": "communication",
        "generation_p2p": "communication",
        # DeepSeek's: its latent-attention module, its vLLM all-reduce, its MoE block overlapped with the
        # shared expert, the MoE dispatch collectives
        "generation_mla_module": "attention",
        "context_mla_block": "attention",
        "generation_tp_allreduce": "communication",
        "generation_moe_overlap": "moe",
        "context_moe_pre_dispatch": "communication",
    }
    assert {name: aiconfigurator_peer.peer_component(name) for name in names} == names


def test_the_summary_leaves_out_what_the_peer_finds_out_of_memory():
    rows = pd.DataFrame(
        {
            "device": "h100-sxm",
            "stack": "vllm",
            "model": "m",
            "tp": [1, 2, 2],
            "batch": [1, 1, 64],
            "tpot_ratio": [1.02, 0.97, 1.5],
            "ttft_ratio": [1.0, 1.01, 1.5],
            "peer_oom": [False, False, True],
            **{f"{c}_ms": [1.0, 1.0, 1.0] for c in COMPONENTS},
            **{f"peer_{c}_ms": [1.0, 0.5, 1.0] for c in COMPONENTS},
            "ttft_communication_ms": [2.0, 3.0, 9.0],
            "peer_ttft_communication_ms": [4.0, 6.0, 9.0],
        }
    )
    s = summarize(rows)
    assert s.points == 2 and s.tpot_median == pytest.approx(0.025) and s.tpot_worst == pytest.approx(0.03)
    assert s.tpot_worst_at == "m tp2 b1 on h100-sxm vllm" and s.tpot_by_tp == {1: 1.02, 2: 0.97}
    ratios = component_ratios(rows).set_index("component")["median_ratio"]
    assert ratios["gemm"] == pytest.approx(1.5)
    collectives = ttft_collectives(rows).iloc[0]
    assert collectives["ttft_communication_ms"] == 2.5 and collectives["peer_ttft_communication_ms"] == 5.0


@pytest.mark.skipif(
    not HAS_PEER, reason="the optional peer is not installed: pip install 'medusa-perfkit[aiconfigurator]'"
)
def test_the_quick_peer_check_agrees_within_its_documented_bounds(tmp_path, capsys):
    csv, page = tmp_path / "peer.csv", tmp_path / "peer.md"
    assert run(main, ["--quick", "--no-progress", "--csv", str(csv), "--markdown", str(page)]) == 0
    rows = pd.read_csv(csv)
    assert len(rows) == 2 and set(rows["stack"]) == {"trtllm"} and set(rows["tp"]) == {8}
    assert ((rows["tpot_ratio"] - 1).abs() < 0.15).all() and ((rows["ttft_ratio"] - 1).abs() < 0.15).all()
    shown = capsys.readouterr().out
    assert "TensorRT-LLM 1.3.0rc20 AllReduce op" in shown and "median |ratio - 1|" in shown
    assert page.read_text().startswith("# The peer check")


def test_the_peer_is_told_a_quantized_checkpoints_formats():
    # left to itself the peer gives Qwen3-32B-FP8 an fp8 KV cache its files do not declare, and
    # prices ModelOpt's static FP8 without a table: told the formats, both read the same rows
    from perfmodel.models.config import load_model
    from tests.battery import CONFIGS

    quant = aiconfigurator_peer.peer_quant
    assert quant(load_model(CONFIGS / "Qwen--Qwen3-32B-FP8_config.json")) == {
        "gemm_quant_mode": "fp8_block",
        "kvcache_quant_mode": "bfloat16",
    }
    llama = load_model(CONFIGS / "nvidia--Llama-3.1-70B-Instruct-FP8_config.json")
    assert quant(llama) == {"gemm_quant_mode": "fp8", "kvcache_quant_mode": "fp8"}
    assert quant(load_model("llama-3-8b")) == {}  # a 16-bit model: the peer's own defaults, as before
