import math

import pytest
import torch

from perfmodel.dtypes import element_bytes
from perfmodel.errors import PerfkitError
from perfmodel.models import ModelConfig
from perfmodel.operators import ALL_OPS, DEFAULT_OPS, PHASES, STEP_OPS, Matmul, op_cost
from profilers.benchmarks import OpBenchmark, tree_attention_mask

# Small shapes with GQA and two Medusa heads: every op builds in milliseconds.
TINY = ModelConfig("tiny", hidden_size=64, intermediate_size=96, num_heads=4, num_kv_heads=2, num_layers=1, vocab_size=50, head_dim=16, medusa_heads=2)


@pytest.mark.parametrize("op", DEFAULT_OPS)
@pytest.mark.parametrize("phase", PHASES)
def test_benchmark_tensors_have_exactly_the_counted_shapes(op, phase):
    q = 4 if phase == "tree" else 1
    bench = OpBenchmark(TINY, op, phase, batch=3, seq_len=8, candidates=q, dtype="fp32", device="cpu")
    (run,) = bench.build()
    assert [k.kernel for k in run.kernels] == list(bench.kernels)
    elements = 0
    for part in run.kernels:
        kernel, operands = part.kernel, part.operands
        if isinstance(kernel, Matmul):
            assert tuple(operands["a"].shape) == kernel.left_shape
            assert tuple(operands["b"].shape) == kernel.right_shape
            assert tuple(operands["out"].shape) == kernel.out_shape
            elements += sum(t.numel() for t in (operands["a"], operands["b"], operands["out"]))
        else:
            out = part.run()
            assert out.shape == operands["q"].shape
            elements += sum(operands[n].numel() for n in ("q", "k", "v")) + out.numel()
    run()  # every kernel runs on its operands
    cost = op_cost(op, phase, TINY, "fp32", 3, 8, q)
    assert elements * element_bytes("fp32") == cost.bytes


def test_matmul_benchmark_computes_the_product():
    bench = OpBenchmark(TINY, "qk", "tree", 2, 8, 4, "fp32", "cpu")
    (run,) = bench.build()
    part = run.kernels[0]
    run()
    torch.testing.assert_close(part.operands["out"], torch.bmm(part.operands["a"], part.operands["b"]))


def test_weights_are_shared_across_batches_but_not_across_heads():
    weights = {}
    OpBenchmark(TINY, "medusa_heads", "decode", 1, 8, 1, "fp32", "cpu").build(weights=weights)
    assert len(weights) == 4  # two heads x (residual block, vocabulary projection)
    (run,) = OpBenchmark(TINY, "medusa_heads", "decode", 4, 8, 1, "fp32", "cpu").build(weights=weights)
    assert len(weights) == 4
    heads = [k.operands["b"] for k in run.kernels]
    assert heads[0].data_ptr() != heads[2].data_ptr()


def test_graph_copies_have_their_own_operands():
    runs = OpBenchmark(TINY, "up", "decode", 2, 8, 1, "fp32", "cpu").build(copies=3)
    pointers = {r.kernels[0].operands["b"].data_ptr() for r in runs}
    assert len(runs) == 3 and len(pointers) == 3


def test_tree_mask_sees_the_cache_and_the_ancestors_only():
    mask = tree_attention_mask(q_len=5, kv_len=12, device="cpu")
    assert mask.shape == (5, 12)
    assert mask[:, :7].all()  # the cached prefix
    tree = mask[:, 7:]
    assert tree.diagonal().all()  # each token sees itself
    assert tree[:, 0].all()  # and the root
    assert not tree[1, 2]  # siblings do not see each other


def test_memory_estimate_covers_the_operands():
    bench = OpBenchmark(TINY, "lm_head", "tree", 2, 8, 4, "bf16", "cpu")
    assert bench.operand_bytes() == op_cost("lm_head", "tree", TINY, "bf16", 2, 8, 4).bytes
    assert bench.bytes_needed(copies=3) == 3 * bench.operand_bytes()


def test_unsupported_benchmark_dtype():
    with pytest.raises(PerfkitError, match="measured as a ceiling only"):
        OpBenchmark(TINY, "up", "decode", 1, 8, 1, "fp8", "cpu").build()


def test_sdpa_tree_needs_the_candidates_inside_the_context():
    with pytest.raises(PerfkitError, match="candidates <= seq_len"):
        OpBenchmark(TINY, "sdpa", "tree", 1, 8, 16, "fp32", "cpu").kernels
    assert math.isclose(op_cost("sdpa", "prefill", TINY, "fp32", 1, 8).flops, 4 * 4 * 8 * 8 * 16 * 9 / 16)


@pytest.mark.parametrize("op", STEP_OPS)
@pytest.mark.parametrize("phase", ["decode", "tree"])
def test_the_rest_of_a_step_runs_on_the_decoders_own_code(op, phase):
    q = 6 if phase == "tree" else 1
    bench = OpBenchmark(TINY, op, phase, batch=2, seq_len=16, candidates=q, dtype="fp32", device="cpu")
    (run,) = bench.build()
    run()
    assert op_cost(op, phase, TINY, "fp32", 2, 16, q).bytes >= 0


def test_step_op_names_are_known():
    assert set(STEP_OPS) <= set(ALL_OPS)


def test_medusa_heads_run_as_the_reference_modules_on_the_counted_weights():
    from decoder.heads import MedusaHeads

    (run,) = OpBenchmark(TINY, "medusa_heads", "decode", 3, 8, 1, "fp32", "cpu").build()
    heads, (hidden,) = run.call.func, run.call.args
    assert isinstance(heads, MedusaHeads) and hidden is run.kernels[0].operands["a"]
    # each head's residual block and projection are the counted matmuls' weight operands
    for k, head in enumerate(heads):
        assert head[0].linear.weight.data_ptr() == run.kernels[2 * k].operands["b"].data_ptr()
        assert head[1].weight.data_ptr() == run.kernels[2 * k + 1].operands["b"].data_ptr()
    logits = run.call()
    assert logits.shape == (TINY.medusa_heads, 3, TINY.vocab_size)
    torch.testing.assert_close(logits[1], heads[1](hidden))
