import math

import pytest
import torch

from perfmodel.base.dtypes import element_bytes
from perfmodel.base.errors import PerfkitError
from perfmodel.latency.step import FLAVORS, step_inventory
from perfmodel.models.operators import DEFAULT_OPS, PHASES, STEP_OPS, Matmul, op_cost, step_operands
from profilers.benchmarks import OpBenchmark, tree_attention_mask
from tests.conftest import TINY


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
        _ = OpBenchmark(TINY, "sdpa", "tree", 1, 8, 16, "fp32", "cpu").kernels
    assert math.isclose(op_cost("sdpa", "prefill", TINY, "fp32", 1, 8).flops, 4 * 4 * 8 * 8 * 16 * 9 / 16)


def tiny_step_elements(op: str, b: int, s: int, q: int) -> int:
    """Elements each step op moves for TINY, written out by hand from what the kernels do."""
    t, h, i, d, v = b * q, 64, 96, 16, 50
    return {
        "embed": t + 2 * t * h,  # ids, the gathered table rows, the output
        "norm": 2 * t * h + h,  # x, the norm's weight, the output
        "add_norm": 4 * t * h + h,  # x and the residual in, the norm's weight, the output and the new residual
        "rope": 2 * (4 + 2) * d * t + 2 * t * d,  # q and k heads in and out, cos and sin
        "kv_write": 2 * 2 * (2 * d * t),  # k and v in, into the cache
        "act": 3 * t * i,
        "residual": 3 * t * h,
        "mask": t * s,
        "candidates": 2 * b * v + 2 * b * 10,  # two heads' logits in, their top-10 out
        "verify": t * v + t,
        "kv_move": 2 * 2 * (2 * d * b * min(q - 1, 2)),  # k and v of a path of <= 2 tokens, read and written
        "draft_topk": t * v + t * 10,  # the expanded nodes' logits in, their top-10 out
    }[op]


@pytest.mark.parametrize("op", STEP_OPS)
@pytest.mark.parametrize("phase", ["decode", "tree"])
def test_the_rest_of_a_step_runs_on_the_decoders_own_code(op, phase):
    q = 6 if phase == "tree" else 1
    bench = OpBenchmark(TINY, op, phase, batch=2, seq_len=16, candidates=q, dtype="fp32", device="cpu")
    (run,) = bench.build()
    run()
    assert op_cost(op, phase, TINY, "fp32", 2, 16, q).bytes == 4 * tiny_step_elements(op, 2, 16, q)


# Tensors the decoder's functions compute inside and do not hand back.
INTERNAL = {"candidates": {"top_tokens"}, "verify": {"prediction"}, "draft_topk": {"top_tokens"}}


def returned_tensors(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in returned_tensors(item)]
    return []


@pytest.mark.parametrize("op", STEP_OPS)
@pytest.mark.parametrize("phase", ["decode", "tree"])
def test_step_benchmark_tensors_have_the_counted_shapes(op, phase):
    q = 6 if phase == "tree" else 1
    bench = OpBenchmark(TINY, op, phase, batch=2, seq_len=16, candidates=q, dtype="fp32", device="cpu")
    ((part,),) = [run.kernels for run in bench.build()]
    declared = step_operands(op, TINY, 2, 16, q)
    assert part.kernel.operands == declared
    for name, tensor in part.operands.items():
        assert tuple(tensor.shape) == declared[name].shape, name
    returned = [tuple(t.shape) for t in returned_tensors(part.run())]
    for name in declared.keys() - part.operands.keys() - INTERNAL.get(op, set()):
        assert declared[name].shape in returned, (
            f"{name} {declared[name].shape} is neither built nor returned ({returned})"
        )
    for name, operand in declared.items():
        assert operand.reads <= math.prod(operand.shape) and operand.writes <= math.prod(operand.shape), name
    assert (
        sum(o.reads + o.writes for o in declared.values()) * element_bytes("fp32")
        == op_cost(op, phase, TINY, "fp32", 2, 16, q).bytes
    )


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("medusa", [False, True])
def test_every_op_of_a_step_has_a_benchmark(flavor, medusa):
    for item in step_inventory(TINY, flavor, medusa):
        phase = "tree" if medusa and item.tokens == "step" else "decode"
        q = 6 if phase == "tree" else 1
        (run,) = OpBenchmark(
            TINY, item.op, phase, batch=2, seq_len=16, candidates=q, dtype="fp32", device="cpu"
        ).build()
        run()


def test_an_unknown_op_names_the_known_ones():
    with pytest.raises(PerfkitError, match=r"unknown op 'layernorm'; choose from: q, k, .*norm, rope"):
        OpBenchmark(TINY, "layernorm", "decode", 1, 8, 1, "fp32", "cpu").build()
    with pytest.raises(PerfkitError, match="'up' is not a step op; choose from: embed, norm"):
        step_operands("up", TINY, 1, 8, 1)


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


def test_a_kernels_activations_are_what_the_step_hands_it_not_what_it_reads_from_memory():
    def names(op, phase="tree", q=4):
        (run,) = OpBenchmark(TINY, op, phase, 2, 16, q, "fp32", "cpu").build()
        (kernel,) = run.kernels[:1]
        found = [n for n, t in kernel.operands.items() if any(t is a for a in kernel.activations())]
        return run, sorted(found)

    assert names("up")[1] == ["a"]  # the input rows, not the weight
    assert names("sdpa")[1] == ["mask", "q"]  # not K and V: the cache
    assert names("kv_write")[1] == ["k", "v"]  # the new entries, not the cache they go into
    assert names("norm")[1] == ["x"]  # not the norm's weight
    run, _ = names("residual")
    run.warm()  # reads them; changes nothing
    before = [t.clone() for t in run.kernels[0].activations()]
    run.warm()
    assert all(torch.equal(a, b) for a, b in zip(run.kernels[0].activations(), before))
