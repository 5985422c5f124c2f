"""Issue 57, item 4: the static step's forward fused as gpt-fast-style decoders fuse theirs
(decoder.fused: q/k/v and gate/up one GEMM each, torch's RMSNorm, RoPE in place, keys and
values written by one index_put_), decoding the reference's greedy tokens in every static
regime, its fused weights the checkpoint's own storage, and its trace the fused kernels."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from decoder.checkpoint import load_checkpoint
from decoder.fused import FusedForward, joined_weight
from decoder.lora import add_lora
from decoder.medusa import Decoder
from decoder.runs import heldout_prompts
from decoder.trace import trace_step
from decoder.tree import Drafting
from decoder.twin import KernelList, Replay, dummy_checkpoint, random_prompts
from perfmodel.acceptance.trees import greedy_tree
from perfmodel.base.errors import PerfkitError
from perfmodel.base.launch import Launch
from perfmodel.latency.kinds import MEMORY_KINDS, kernel_rows
from perfmodel.latency.source import decoder_latency
from perfmodel.latency.traced_step import TracedStep
from perfmodel.measured.device_view import gpu_view
from perfmodel.models.config import load_model

LLAMA_2_7B = load_model("llama-2-7b")
# the kernels of llama-2-7b's static step (plain; a 64-token tree) at batches 1 and 4, before and after
KERNELS = {"reference": (1351, 1409), "fused": (646, 704)}


@pytest.fixture(scope="module")
def bundled():
    ckpt = load_checkpoint("bundled")
    return ckpt, heldout_prompts(ckpt, 3, 32, 0)


def tokens_and_operators(decoder: Decoder, prompts, new_tokens: int, **kwargs) -> tuple[list[list[int]], set[str]]:
    """A run's tokens and the operators it launched."""
    kernels = KernelList()
    with kernels:
        tokens = decoder.generate(prompts, new_tokens, **kwargs).tokens
    return tokens, {name for name, _, _ in kernels.kernels}


@pytest.mark.parametrize("batch", [1, 3])
def test_the_fused_static_step_decodes_the_reference_greedy_tokens_of_the_bundled_model(bundled, batch):
    ckpt, prompts = bundled
    decoder = Decoder(ckpt)
    for kwargs in ({}, {"drafting": Drafting(ckpt.tree)}):
        reference = decoder.generate(prompts[:batch], 24, **kwargs)  # the eager loop: the unfused reference
        tokens, launched = tokens_and_operators(decoder, prompts[:batch], 24, launch="static", **kwargs)
        assert tokens == reference.tokens
        assert {"index_put_", "roll"} <= launched  # the fused KV write and RoPE ran


def test_the_compiled_step_runs_the_fused_forward_and_decodes_the_same_tokens(bundled):
    ckpt, prompts = bundled
    decoder = Decoder(ckpt)
    # one compile, a tree step of two sequences: a compile takes seconds on a CPU, and the plain step
    # runs the same fused forward (test_the_fused_static_step_decodes_the_reference_greedy_tokens...)
    kwargs = {"drafting": Drafting(ckpt.tree)}
    reference = decoder.generate(prompts[:2], 24, **kwargs)
    assert decoder.generate(prompts[:2], 24, launch="compiled", **kwargs).tokens == reference.tokens
    steps = list(decoder._static_steps.values())  # the compiled steps, kept per shape
    assert len(steps) == 1 and isinstance(steps[0].forward_pass, FusedForward)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_twin_replays_the_same_tokens_through_the_fused_step(dtype):
    twin = Decoder(dummy_checkpoint("bundled", dtype=dtype, seed=1))
    prompts = random_prompts(twin.model.config.vocab_size, 3, 16, 0)
    tree = greedy_tree(np.full((4, 10), 0.5) / np.arange(1, 11), 15)
    lengths = [[3, 1, 2, 4], [2, 2, 1]]
    eager = twin.generate(prompts, 16, drafting=Drafting(tree), replay=Replay(lengths))
    tokens, launched = tokens_and_operators(
        twin, prompts, 16, drafting=Drafting(tree), replay=Replay(lengths), launch="static"
    )
    assert tokens == eager.tokens and "index_put_" in launched


def test_the_fused_weights_are_the_checkpoints_own_storage_joined_once():
    ckpt = load_checkpoint("bundled")
    model = ckpt.model
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    params = {name: p for name, p in model.named_parameters()}
    before = {name: p.detach().clone() for name, p in params.items()}
    tokens = torch.tensor([[5, 9, 11, 2]])
    with torch.inference_mode():
        logits = model(tokens)
    first = FusedForward.of(model).layers[0]
    # q, k and v are views of the one joined tensor, in order: no copy beside the checkpoint's
    assert first.qkv.shape == (256 + 2 * 128, 256)
    assert attn.q_proj.weight.data_ptr() == first.qkv.data_ptr()
    assert attn.v_proj.weight.data_ptr() == first.qkv[384:].data_ptr()
    assert mlp.up_proj.weight.data_ptr() == first.gate_up[640:].data_ptr()
    # built once: a second fused forward (another static step) views the same memory
    again = FusedForward.of(model).layers[0]
    assert again.qkv.data_ptr() == first.qkv.data_ptr() and again.gate_up.data_ptr() == first.gate_up.data_ptr()
    # the same Parameter objects with the same values: the eager reference is untouched
    assert {name: p for name, p in model.named_parameters()} == params
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())
    with torch.inference_mode():
        assert torch.equal(model(tokens), logits)


def test_a_model_whose_projections_are_not_plain_linears_is_refused_in_one_line():
    ckpt = load_checkpoint("bundled")
    add_lora(ckpt.model, rank=2, alpha=4.0)
    with pytest.raises(PerfkitError, match="LoRA-adapted model decodes with --launch eager"):
        joined_weight([ckpt.model.model.layers[0].self_attn.q_proj])


@pytest.mark.parametrize("batch", [1, 4])
def test_the_traced_fused_step_launches_fewer_kernels_and_the_joined_gemms(batch):
    for size, before, after in zip((1, 64), KERNELS["reference"], KERNELS["fused"]):
        reference = trace_step(LLAMA_2_7B, batch, 512, size, launch=Launch.STATIC, fused=False)
        fused = trace_step(LLAMA_2_7B, batch, 512, size, launch=Launch.STATIC)
        assert (len(kernel_rows(reference)), len(kernel_rows(fused))) == (before, after)
        gemms = fused[(fused["kind"] == "gemm") & (fused["batch"] == 1)]
        shapes = set(zip(gemms["k"], gemms["n"]))
        assert {(4096, 3 * 4096), (4096, 2 * 11008)} <= shapes  # qkv and gate_up, one GEMM each
        assert (4096, 11008) not in shapes  # no gate or up alone
        assert (gemms["n"] == 3 * 4096).sum() == LLAMA_2_7B.num_layers
        forward = fused[fused["part"] == "forward"]
        names = forward["aten"].value_counts()
        assert names["rms_norm"] == 2 * LLAMA_2_7B.num_layers + 1  # one kernel a norm, the final one too
        assert names["index_put_"] == LLAMA_2_7B.num_layers and "scatter_.src" not in names


def test_the_fused_gemms_are_priced_from_measurements_and_the_graph_step_is_cheaper():
    latency = decoder_latency(gpu_view("h100", None, []), LLAMA_2_7B, "fp16")
    assert latency.table.measured(4096, 3 * 4096) and latency.table.measured(4096, 2 * 11008)

    def tracer(fused):
        return lambda *point: trace_step(*point, launch=Launch.GRAPH, fused=fused)

    fused, reference = (TracedStep(LLAMA_2_7B, latency, "fp16", tracer(f), regime=Launch.GRAPH) for f in (True, False))
    assert fused.step_time(1, 512, 1) < reference.step_time(1, 512, 1)

    def memory_bound_s(step) -> float:
        priced = step.priced(1, 512, 1)
        return priced.loc[priced["kind"].isin(MEMORY_KINDS), "time_s"].sum()

    assert memory_bound_s(fused) < 0.6 * memory_bound_s(reference)  # 609 memory-bound kernels fewer, of 1,094


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: torch.cuda.is_available() is False")
def test_on_a_gpu_the_fused_graph_step_decodes_the_eager_tokens_of_the_twin_in_fp16():
    twin = Decoder(dummy_checkpoint("bundled", dtype=torch.float16, seed=1, device="cuda"), device="cuda")
    prompts = random_prompts(twin.model.config.vocab_size, 3, 16, 0)
    tree = greedy_tree(np.full((4, 10), 0.5) / np.arange(1, 11), 15)
    eager = twin.generate(prompts, 16, drafting=Drafting(tree), replay=Replay([[3, 1, 2, 4], [2, 2, 1]]))
    graph = twin.generate(
        prompts, 16, drafting=Drafting(tree), replay=Replay([[3, 1, 2, 4], [2, 2, 1]]), launch="graph"
    )
    assert graph.tokens == eager.tokens
