"""Which of a layer's small operators each software stack runs fused, with its source.

A serving engine does not run the `full` step's elementwise operators as separate kernels:
every engine adds the residual and applies the RMSNorm in one kernel, and TensorRT-LLM
applies RoPE and writes the KV cache inside its attention op. Pricing them apart costs a
kernel each (a few microseconds at decoding's batch sizes, 2 x layers times a step). So each
stack declares what it fuses, citing the engine's code path, and the step prices that
(perfmodel.latency.step.layer_ops). The reference decoder's own step (the `reference` and
`paper` flavours) and the stacks measured outside an engine (Vidur's profiles, which time the
add and the norm apart; this toolkit's own sweeps; the datasheet) keep their kernels apart.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fusion:
    """What a stack runs fused: the residual add with the RMSNorm after it (`add_norm`), and
    RoPE and the KV-cache write inside attention (`rope_kv_in_attention`)."""

    add_norm: bool = False
    rope_kv_in_attention: bool = False
    source: str = ""

    def describe(self) -> str:
        parts = []
        if self.add_norm:
            parts.append("residual add + RMSNorm fused")
        if self.rope_kv_in_attention:
            parts.append("RoPE and the KV-cache write inside attention")
        return "; ".join(parts) or "every elementwise op its own kernel"


UNFUSED = Fusion()
ENGINE_FUSION = {
    "vllm": Fusion(
        add_norm=True,
        source=(
            "vLLM: RMSNorm.forward_cuda with a residual calls fused_add_rms_norm (vllm/model_executor/layers/"
            "layernorm.py, csrc/layernorm_kernels.cu); RoPE is its own rotary_embedding kernel (vllm/model_executor/"
            "layers/rotary_embedding, csrc/pos_encoding_kernels.cu) and the KV-cache write its own "
            "reshape_and_cache_flash (csrc/cache_kernels.cu, called by vllm/v1/attention/backends/flash_attn.py)"
        ),
    ),
    "sglang": Fusion(
        add_norm=True,
        source=(
            "SGLang: RMSNorm.forward_cuda with a residual calls sgl-kernel's fused_add_rmsnorm (python/sglang/srt/"
            "layers/layernorm.py); RoPE is its own apply_rope_with_cos_sin_cache_inplace kernel (python/sglang/srt/"
            "layers/rotary_embedding.py) and the KV-cache write its own set_kv_buffer copy (python/sglang/srt/"
            "mem_cache/memory_pool.py)"
        ),
    ),
    "trtllm": Fusion(
        add_norm=True,
        rope_kv_in_attention=True,
        source=(
            "TensorRT-LLM: RMSNorm with a residual runs flashinfer's fused_add_rmsnorm (tensorrt_llm/_torch/modules/"
            "rms_norm.py); its attention op applies RoPE and writes the KV cache in the QKV preprocessing kernel "
            "before the attention kernel (tensorrt_llm/_torch/attention_backend/trtllm.py, cpp/tensorrt_llm/kernels/"
            "unfusedAttentionKernels: invokeQKVPreprocessing)"
        ),
    ),
}


def stack_fusion(stack: str | None) -> Fusion:
    """The fusion of a latency source's stack (an engine, or engine-version such as
    vllm-0.24.0); every other stack (vidur, given rows, the datasheet, a CPU) runs unfused."""
    engine = (stack or "").split("-")[0]
    return ENGINE_FUSION.get(engine, UNFUSED)
