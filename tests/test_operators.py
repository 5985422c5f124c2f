import math

import numpy as np
import pytest

from perfmodel.base.errors import PerfkitError
from perfmodel.models.config import load_model
from perfmodel.models.operators import OPS, PHASES, op_cost, op_kernels

LLAMA_7B = load_model("llama-7b")
LLAMA_33B = load_model("llama-33b")
LLAMA_70B = load_model("llama-2-70b")


def linear_intensity(tokens, h, i):
    return tokens * h * i / (tokens * h + h * i + tokens * i)


@pytest.mark.parametrize("tokens, expected", [(1, 1.0), (64, 63.17)])
def test_design_example_linear_intensity_llama_33b(tokens, expected):
    # The paper's Appendix G intensity of a linear layer: OI = T·h·i / (T·h + h·i + T·i), Llama-33B up-projection.
    cost = op_cost("up", "tree", LLAMA_33B, "fp16", batch=1, seq_len=1024, candidates=tokens)
    assert cost.intensity == pytest.approx(expected, abs=5e-3)
    assert cost.intensity == pytest.approx(linear_intensity(tokens, 6656, 17920))


@pytest.mark.parametrize("q, expected", [(1, 0.99), (16, 14.03), (64, 40.96)])
def test_design_example_tree_attention_intensity(q, expected):
    # The paper's Appendix G intensity of QK^T in tree decoding: OI = q·s·d / (q·d + s·d + q·s), d=128, s=1024.
    for op in ("qk", "pv"):
        cost = op_cost(op, "tree", LLAMA_7B, "fp16", batch=4, seq_len=1024, candidates=q)
        assert cost.intensity == pytest.approx(expected, abs=5e-3)


def test_decode_q_projection_hand_count():
    cost = op_cost("q", "decode", LLAMA_7B, "fp16", batch=1, seq_len=512)
    assert cost.flops == 2 * 4096 * 4096
    assert cost.bytes == 2 * (4096 + 4096 * 4096 + 4096)
    assert cost.kernels == 1


def test_prefill_attention_is_quadratic_in_sequence():
    b, s = 2, 256
    cost = op_cost("qk", "prefill", LLAMA_7B, "fp16", batch=b, seq_len=s)
    assert cost.flops == 2 * b * 32 * s * s * 128
    # Q (b,n,s,d) read, K (b,n,s,d) read, scores (b,n,s,s) written.
    assert cost.bytes == 2 * b * 32 * (s * 128 + 128 * s + s * s)


def test_tree_tokens_scale_linear_layers():
    one = op_cost("down", "tree", LLAMA_7B, "fp16", batch=8, seq_len=128, candidates=1)
    many = op_cost("down", "tree", LLAMA_7B, "fp16", batch=8, seq_len=128, candidates=16)
    assert many.flops == 16 * one.flops
    assert one == op_cost("down", "decode", LLAMA_7B, "fp16", batch=8, seq_len=128)


def test_gqa_reads_each_kv_head_once():
    # Llama-2-70B: 64 query heads share 8 K/V heads.
    k = op_cost("k", "decode", LLAMA_70B, "fp16", batch=1, seq_len=4096)
    assert k.flops == 2 * 8192 * (8 * 128)
    b, s, q = 2, 4096, 16
    qk = op_cost("qk", "tree", LLAMA_70B, "fp16", batch=b, seq_len=s, candidates=q)
    assert qk.flops == 2 * b * 64 * q * s * 128
    assert qk.bytes == 2 * (b * 64 * q * 128 + b * 8 * s * 128 + b * 64 * q * s)
    (mm,) = op_kernels("qk", "tree", LLAMA_70B, b, s, q)
    assert (mm.batch, mm.m, mm.k, mm.n) == (b * 8, 8 * q, 128, s)


def test_fused_qkv_does_the_same_work_reading_the_input_once():
    parts = [op_cost(op, "decode", LLAMA_70B, "fp16", 4, 1024) for op in ("q", "k", "v")]
    fused = op_cost("qkv", "decode", LLAMA_70B, "fp16", 4, 1024)
    assert fused.flops == sum(p.flops for p in parts)
    assert fused.bytes == sum(p.bytes for p in parts) - 2 * 2 * (4 * 8192)


def test_medusa_heads_count_every_head():
    model = LLAMA_7B.with_medusa_heads(5)
    cost = op_cost("medusa_heads", "decode", model, "fp16", batch=1, seq_len=128)
    h, v = 4096, 32000
    assert cost.kernels == 10
    assert cost.flops == 5 * (2 * h * h + 2 * h * v)


def test_dtype_changes_bytes_not_flops():
    half = op_cost("gate", "prefill", LLAMA_7B, "fp16", 2, 512)
    full = op_cost("gate", "prefill", LLAMA_7B, "fp32", 2, 512)
    eight = op_cost("gate", "prefill", LLAMA_7B, "fp8", 2, 512)
    assert half.flops == full.flops == eight.flops
    assert full.bytes == 2 * half.bytes == 4 * eight.bytes


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("phase", PHASES)
def test_shapes_multiply_to_the_counted_flops(op, phase):
    q = 16 if phase == "tree" else 1
    for mm in op_kernels(op, phase, LLAMA_70B, 2, 256, q):
        left, right, out = mm.left_shape, mm.right_shape, mm.out_shape
        assert left[-1] == right[-2] and out[-1] == right[-1] and out[-2] == left[-2]
        assert mm.flops == 2 * math.prod(out) * left[-1]
        assert mm.elements == math.prod(left) + math.prod(right) + math.prod(out)


def test_arrays_of_points_give_the_scalar_answers():
    b = np.array([1, 4, 64])
    s = np.array([128, 1024, 8192])
    q = np.array([1, 16, 112])
    for op in OPS:
        vector = op_kernels(op, "tree", LLAMA_70B, b, s, q)
        for j in range(3):
            scalar = op_kernels(op, "tree", LLAMA_70B, int(b[j]), int(s[j]), int(q[j]))
            assert [m.flops for m in scalar] == [int(np.broadcast_to(m.flops, 3)[j]) for m in vector]
            assert [m.elements for m in scalar] == [int(np.broadcast_to(m.elements, 3)[j]) for m in vector]


@pytest.mark.parametrize(
    "args, message",
    [
        (("mlp", "decode", 1, 128, 1), "unknown op 'mlp'"),
        (("up", "verify", 1, 128, 1), "unknown phase 'verify'"),
        (("up", "decode", 0, 128, 1), "batch must be a positive integer, got 0"),
        (("up", "decode", 1, -5, 1), "seq_len must be a positive integer, got -5"),
        (("up", "decode", 1, 128, 16), "tree phase only"),
        (("up", "tree", np.array([1, -2]), 128, 16), "batch must be a positive integer, got -2"),
        (("up", "tree", 1.5, 128, 16), "batch must be a positive integer, got 1.5"),
    ],
)
def test_bad_points_are_refused_with_the_value(args, message):
    op, phase, b, s, q = args
    with pytest.raises(PerfkitError, match=message):
        op_kernels(op, phase, LLAMA_7B, b, s, q)
