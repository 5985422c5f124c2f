"""Issue #37: engine-regime step times as the engines run them. Each test fails on the main
before the fix: an unsharded LM head under tensor parallelism, NCCL instead of the engine's
own all-reduce, GEMM extrapolation under the memory floor and not monotone, measured
attention under the HBM floor, Medusa heads counted with Medusa off, unfused norms."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from perfmodel.base.dtypes import element_bytes
from perfmodel.latency.attention_table import attention_table
from perfmodel.latency.choice import LatencyChoice
from perfmodel.latency.fusion import stack_fusion
from perfmodel.latency.source import latency_source
from perfmodel.latency.step import StepModel, layer_ops
from perfmodel.latency.tensor_parallel import tensor_parallel_steps
from perfmodel.measured.device_view import resolve_view
from perfmodel.models.config import ModelConfig, load_model
from perfmodel.models.operators import FusedAttention, Matmul, op_cost, op_kernels
from perfmodel.peer.static_batch import COMPONENTS, static_batch
from perfmodel.planning.capacity import plan
from perfmodel.planning.lengths import Lengths
from perfmodel.planning.workload import Targets, Workload
from perfmodel.serving.capacity import serve

# Llama-3.1-70B's shapes (its config.json): 128256-token vocabulary, 80 layers, 64 x 8 heads.
LLAMA31_70B = ModelConfig("llama-3.1-70b", 8192, 28672, 64, 8, 80, 128256, 128, max_context=131072)
H100 = resolve_view("h100-sxm", None, [])


def step(model, tp, stack, view=H100, flavor="full", dtype="bf16"):
    return tensor_parallel_steps(view, model, dtype, tp, LatencyChoice.of("auto", stack), [flavor])[flavor]


def floor(matmul: Matmul, spec) -> float:
    """A GEMM's speed of light: its FLOPs at the peak or its bytes at the bandwidth."""
    return max(matmul.flops / spec.peak_flops("bf16"), matmul.elements * 2 / spec.bandwidth)


# --------------------------------------------------------------------------- item 1


def test_the_lm_head_and_the_heads_projections_split_over_the_vocabulary():
    model = load_model("llama-3-8b")
    one, eight = (op_cost("lm_head", "decode", model.shard(tp), "bf16", 1, 1024) for tp in (1, 8))
    assert model.shard(8).vocab_per_device == 128256 // 8
    assert eight.flops == one.flops / 8
    assert eight.bytes == pytest.approx(one.bytes / 8, rel=1e-3)
    heads = [m.n for m in op_kernels("medusa_heads", "decode", model.shard(4), 1, 1024)]
    assert heads == [4096, 128256 // 4] * model.medusa_heads
    assert model.shard(8).vocab_size == 128256  # the gathered logits span the whole vocabulary


def test_the_lm_head_of_a_tp8_shard_costs_about_an_eighth_and_its_logits_are_gathered():
    lm_head = [float(step(LLAMA31_70B, tp, "trtllm").shard_step.op_times(1, 1024, 1)["lm_head"]) for tp in (1, 8)]
    # the weight's bytes at the measured GEMMs: about an eighth, a small GEMM's floor aside
    assert lm_head[1] < lm_head[0] / 4
    eight = step(LLAMA31_70B, 8, "trtllm")
    gather = float(eight.gather_time(1, 1, False))
    assert 0 < gather < 50e-6  # one row of 128256 logits over NCCL
    assert "all_gather_perf" in eight.label
    # a Medusa step gathers the heads' logits too
    assert float(eight.gather_time(1, 4, True)) > float(eight.gather_time(1, 4, False))


# --------------------------------------------------------------------------- item 2


def test_each_engine_stack_is_priced_with_its_own_all_reduce():
    model = load_model("llama-2-70b")
    message = 8192 * element_bytes("bf16")  # one token's activations, 8192 elements
    trtllm, vllm = (step(model, 8, stack) for stack in ("trtllm", "vllm"))
    vidur = step(model, 8, "vidur", dtype="fp16")  # Vidur's profiles are fp16
    assert "TensorRT-LLM 1.3.0rc20 AllReduce op" in trtllm.label
    assert "vLLM 0.24.0 custom all-reduce (CUDA-graph kernel)" in vllm.label
    assert "NCCL" in vidur.label.split("all-reduces per layer")[1].split(";")[0]
    assert float(trtllm.all_reduce.time(message, 8)) == pytest.approx(3.56e-6, rel=0.01)
    assert float(vllm.all_reduce.time(message, 8)) == pytest.approx(5.31e-6, rel=0.01)
    assert float(vidur.all_reduce.time(message, 8)) > 15e-6  # NCCL's all_reduce_perf: ~19 us
    # the step's all-reduces: 2 per layer at the engine's own cost
    assert float(trtllm.comm_time(1, 1)) == pytest.approx(2 * 80 * 3.56e-6, rel=0.01)


# --------------------------------------------------------------------------- item 3


def test_the_lm_head_past_the_grid_is_monotone_and_above_its_memory_floor():
    model = load_model("llama-3-8b")
    weight = Matmul(1, 1, 4096, 128256, weight=True)
    floor = weight.elements * element_bytes("bf16") / (3350e9)
    for stack in ("vllm", "sglang", "trtllm"):
        source = latency_source("h100-sxm", model, "bf16", stack=stack)
        times = [float(source.op_time("lm_head", "decode", b, 1024, 1)) for b in (1, 8, 32, 128, 512)]
        assert times == sorted(times), (stack, times)
        assert times[0] >= floor * 0.999, (stack, times[0], floor)


# split eight ways: the H100's one-row point took 56.6 us against 49-50 at 8-128 rows (its README)
@pytest.mark.parametrize(
    "run, split_bound", [("h100-sxm/engine-kernels-2026-11-27", 0.21), ("h200/engine-kernels-2026-11-28", 0.10)]
)
def test_the_lm_head_measured_on_lent_gpus_is_predicted_within_a_quarter(run, split_bound):
    import pandas as pd

    from perfmodel.measured.store import MEASUREMENTS_DIR
    from profilers.engine_kernels import predicting_stacks, predictions

    measured = pd.read_csv(MEASUREMENTS_DIR / run / "engine-kernels.csv")
    device = run.split("/")[0]
    assert predicting_stacks(device) == ["vllm", "trtllm"]
    head = predictions(measured[measured["kernel"] == "lm_head"], device)
    for stack in ("vllm", "trtllm"):
        error = head[f"predicted_{stack}_s"] / head["time_s"] - 1
        assert (error.abs() < 0.25).all(), (stack, error.round(3).tolist())
        assert (error[head["split"] == 8].abs() < split_bound).all(), (stack, error.round(3).tolist())


@pytest.mark.parametrize("device, stack", [("h100-sxm", "vllm"), ("a100-sxm", "trtllm"), ("l40s", "sglang")])
def test_every_grid_gemm_is_non_decreasing_in_m_n_and_k_and_above_its_floor(device, stack):
    source = latency_source(device, load_model("llama-7b"), "bf16", stack=stack)
    rng = np.random.default_rng(0)
    ms = np.unique(np.round(np.exp(rng.uniform(0, np.log(70000), 60)))).astype(int)
    for _ in range(20):
        k, n = (int(x) for x in np.round(np.exp(rng.uniform(np.log(16), np.log(200000), 2))))
        along_m = source.gemm_time(Matmul(1, ms, k, n, weight=True))
        assert (np.diff(along_m) >= -1e-15).all(), (k, n)
        sol = np.array([floor(Matmul(1, int(m), k, n, weight=True), source.spec) for m in ms])
        assert (along_m >= sol * (1 - 1e-9)).all()
    grid_n = np.unique(np.round(np.exp(np.linspace(np.log(16), np.log(300000), 80)))).astype(int)
    for m in (1, 37, 300, 5000):
        for k in (100, 4096, 90000):
            along_n = [float(source.gemm_time(Matmul(1, m, k, int(n), weight=True))) for n in grid_n]
            along_k = [float(source.gemm_time(Matmul(1, m, int(n), k, weight=True))) for n in grid_n]
            assert np.all(np.diff(along_n) >= -1e-15) and np.all(np.diff(along_k) >= -1e-15), (m, k)


def test_no_gemm_of_the_per_model_profiles_goes_under_its_floor():
    source = latency_source("h100-sxm", load_model("llama-3-8b"), "fp16", stack="vidur")
    for tokens in (1, 64, 1024):
        for op in ("lm_head", "gate_up", "qkv"):
            (matmul,) = op_kernels(op, "decode", source.model, tokens, 1024)
            sol = max(matmul.flops / source.spec.peak_flops("fp16"), matmul.elements * 2 / source.spec.bandwidth)
            assert float(source.op_time(op, "decode", tokens, 1024, 1)) >= sol * (1 - 1e-9)


# --------------------------------------------------------------------------- item 4


def test_measured_attention_under_the_hbm_floor_is_raised_to_it_and_counted():
    table = attention_table("a100-sxm", "trtllm", "bf16")
    kernel = FusedAttention(32, 32, 8, 1, 4096, 128)
    floor = kernel.elements * element_bytes("bf16") / 2039e9
    assert floor == pytest.approx(0.263e-3, rel=0.01)
    assert float(table.decode_time(32, 4096, 32, 8)) >= floor * (1 - 1e-9)  # the table reads 0.203 ms
    assert table.decode.clamped > 0
    assert f"{table.decode.clamped + table.prefill.clamped} of" in table.label and "floor" in table.label
    assert "floor" not in attention_table("h100-sxm", "vllm", "bf16").label  # none clamped there


@pytest.mark.parametrize("device, stack", [("a100-sxm", "trtllm"), ("l40s", "vllm"), ("h100-sxm", "sglang")])
def test_attention_is_non_decreasing_in_batch_and_context(device, stack):
    table = attention_table(device, stack, "bf16")
    batches = np.array([1, 2, 3, 5, 8, 13, 32, 64, 100, 256, 700])
    lengths = np.array([2, 17, 100, 513, 1024, 3000, 8192, 20000, 65536])
    for heads, kv_heads in ((32, 8), (64, 8), (32, 32), (8, 1)):
        for phase in ("decode", "prefill"):
            times = np.array([[table._timed(phase, b, s, heads, kv_heads)[0] for s in lengths] for b in batches])
            assert (np.diff(times, axis=0) >= -1e-15).all(), (phase, heads, kv_heads)
            assert (np.diff(times, axis=1) >= -1e-15).all(), (phase, heads, kv_heads)


# --------------------------------------------------------------------------- item 5


def test_medusa_off_fits_without_the_heads_weights():
    # 70.6 B parameters: 141 GB, under the 144 GB usable on two 80 GB H100s; the heads
    # (4 x (h^2 + h x 128256)) would take 8.9 GB more and leave no room for a sequence.
    off = plan(LLAMA31_70B, ["h100"], prompt_len=1024, response_len=256, tensor_parallel=2, medusa="off")
    row = off.devices.iloc[0]
    assert row["fits"] and row["heads_gb"] == 0 and row["max_batch"] >= 1
    with pytest.raises(Exception, match="weights and heads"):
        plan(LLAMA31_70B, ["h100"], prompt_len=1024, response_len=256, tensor_parallel=2, medusa="on")
    workload = Workload(Lengths(1024, 1024), Lengths(256, 256), rate=0.5, requests=10)
    answer = serve(LLAMA31_70B, ["h100"], workload, Targets(), tensor_parallel=2, medusa="off")
    (option,) = answer.options
    assert option.fits, option.note


# --------------------------------------------------------------------------- item 6


def test_each_stack_prices_the_fusions_its_engine_runs():
    model = load_model("llama-3-8b")
    trtllm, vllm, vidur = (
        {item.op for item in layer_ops(model, "full", stack_fusion(s))}
        for s in ("trtllm-1.3.0rc20", "vllm-0.24.0", "vidur")
    )
    assert "add_norm" in trtllm and not {"norm", "residual", "rope", "kv_write"} & trtllm
    assert "add_norm" in vllm and {"rope", "kv_write"} <= vllm and not {"norm", "residual"} & vllm
    assert {"norm", "residual", "rope", "kv_write"} <= vidur and "add_norm" not in vidur
    for s in ("vllm", "sglang", "trtllm"):
        assert stack_fusion(s).source.startswith(("vLLM", "SGLang", "TensorRT-LLM"))


def test_the_engine_step_is_cheaper_fused_and_the_reference_decoder_keeps_its_kernels():
    model = load_model("llama-3-8b")
    source = latency_source("h100-sxm", model, "bf16", stack="trtllm")
    fused = StepModel(model, source, "full").op_times(1, 1024, 1)
    unfused = StepModel(model, dataclasses.replace(source, stack="vidur"), "full").op_times(1, 1024, 1)
    small = ("norm", "residual", "add_norm", "rope", "kv_write")
    assert sum(float(fused.get(op, 0)) for op in small) < 0.5 * sum(float(unfused.get(op, 0)) for op in small)
    reference = StepModel(model, source, "reference").op_times(1, 1024, 1)
    assert {"norm", "residual", "rope", "kv_write"} <= set(reference) and "add_norm" not in reference
    assert "RoPE and the KV-cache write inside attention" in step(model, 1, "trtllm").label


def test_a_static_batch_splits_its_step_into_components_that_add_up():
    eight = step(LLAMA31_70B, 8, "vllm")
    batch = static_batch(eight, 4, 1024, 64)
    assert set(batch.tpot_parts) == set(COMPONENTS)
    assert sum(batch.tpot_parts.values()) == pytest.approx(batch.tpot_s, rel=1e-9)
    assert batch.ttft_s == pytest.approx(float(eight.prefill_time(4, 1024)))
