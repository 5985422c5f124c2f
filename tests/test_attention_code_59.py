"""Issue 59: a step traced as a published harness ran it. Spec-Bench's Medusa and EAGLE rows
run their own modeling_llama_kv.py, attention written out as matmuls; its plain decoding runs
Hugging Face's fused SDPA. The decoder runs either, and they decode alike."""

from __future__ import annotations

import pytest

from decoder.checkpoint import load_checkpoint
from decoder.medusa import Decoder
from decoder.runs import heldout_prompts
from decoder.trace import trace_step
from decoder.tree import Drafting
from perfmodel.base.attention_code import AttentionCode
from perfmodel.base.errors import PerfkitError
from perfmodel.models.config import load_model


def test_matmul_attention_decodes_the_same_tokens_as_sdpa_on_the_bundled_model():
    ckpt = load_checkpoint("bundled")
    prompts = heldout_prompts(ckpt, 2, 32, seed=5)
    fused = Decoder(ckpt).generate(prompts, 16, drafting=Drafting(ckpt.tree))
    ckpt.model.with_attention(AttentionCode.MATMUL)
    try:
        written_out = Decoder(ckpt).generate(prompts, 16, drafting=Drafting(ckpt.tree))
    finally:
        ckpt.model.with_attention(AttentionCode.SDPA)
    assert written_out.tokens == fused.tokens


def test_the_written_out_attention_issues_its_kernels_one_by_one():
    model = load_model("vicuna-7b")
    fused, written = (trace_step(model, 1, 512, 64, "fp16", attention=code) for code in AttentionCode)
    extra = len(written) - len(fused)
    assert extra > 0 and extra % model.num_layers == 0  # the same ops in every layer
    # q k^T and the values, two matmuls in place of each fused attention kernel
    assert (written["kind"] == "gemm").sum() == (fused["kind"] == "gemm").sum() + 2 * model.num_layers
    assert (written["kind"] == "attention").sum() < (fused["kind"] == "attention").sum()
    with pytest.raises(PerfkitError, match="traced in the eager loop"):
        trace_step(model, 1, 512, 64, "fp16", launch="static", attention=AttentionCode.MATMUL)
