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
    RoPE and the KV-cache write inside attention (`rope_kv_in_attention`); and what it runs
    side by side: an MoE layer's shared expert on a second CUDA stream beside its router and
    routed experts, in decoding steps of at most `shared_expert_stream` tokens (0: never; the
    step's shared expert then costs only what it takes beyond them, as the engine's layer takes
    the longer of the two)."""

    add_norm: bool = False
    rope_kv_in_attention: bool = False
    shared_expert_stream: int = 0
    source: str = ""

    def describe(self, shared_expert: bool = False) -> str:
        """In words; the shared expert's stream named for a model that has one (`shared_expert`)."""
        parts = []
        if self.add_norm:
            parts.append("residual add + RMSNorm fused")
        if self.rope_kv_in_attention:
            parts.append("RoPE and the KV-cache write inside attention")
        if self.shared_expert_stream and shared_expert:
            every = self.shared_expert_stream >= EVERY_DECODING_STEP
            bound = "" if every else f" of <= {self.shared_expert_stream:,} tokens"
            parts.append(f"a shared expert beside the routed experts in decoding steps{bound}")
        return "; ".join(parts) or "every elementwise op its own kernel"


UNFUSED = Fusion()
# TensorRT-LLM and SGLang overlap the streams inside their CUDA graphs, which hold decoding steps
# only: no token bound within them.
EVERY_DECODING_STEP = 1 << 30
ENGINE_FUSION = {
    "vllm": Fusion(
        add_norm=True,
        shared_expert_stream=256,
        source=(
            "vLLM: RMSNorm.forward_cuda with a residual calls fused_add_rms_norm (vllm/model_executor/layers/"
            "layernorm.py, csrc/layernorm_kernels.cu); RoPE is its own rotary_embedding kernel (vllm/model_executor/"
            "layers/rotary_embedding, csrc/pos_encoding_kernels.cu) and the KV-cache write its own "
            "reshape_and_cache_flash (csrc/cache_kernels.cu, called by vllm/v1/attention/backends/flash_attn.py); "
            "SharedFusedMoE runs a shared expert on an aux CUDA stream beside the routed experts in steps of at most "
            "VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD tokens (default 256; vllm-project/vllm#26440, "
            "vllm/model_executor/layers/fused_moe)"
        ),
    ),
    "sglang": Fusion(
        add_norm=True,
        shared_expert_stream=EVERY_DECODING_STEP,
        source=(
            "SGLang: RMSNorm.forward_cuda with a residual calls sgl-kernel's fused_add_rmsnorm (python/sglang/srt/"
            "layers/layernorm.py); RoPE is its own apply_rope_with_cos_sin_cache_inplace kernel (python/sglang/srt/"
            "layers/rotary_embedding.py) and the KV-cache write its own set_kv_buffer copy (python/sglang/srt/"
            "mem_cache/memory_pool.py); DeepseekV2MoE.forward_normal_dual_stream runs the shared experts on an alt "
            "stream beside the routed experts in CUDA-graph decoding (python/sglang/srt/models/deepseek_v2.py)"
        ),
    ),
    "trtllm": Fusion(
        add_norm=True,
        rope_kv_in_attention=True,
        shared_expert_stream=EVERY_DECODING_STEP,
        source=(
            "TensorRT-LLM: RMSNorm with a residual runs flashinfer's fused_add_rmsnorm (tensorrt_llm/_torch/modules/"
            "rms_norm.py); its attention op applies RoPE and writes the KV cache in the QKV preprocessing kernel "
            "before the attention kernel (tensorrt_llm/_torch/attention_backend/trtllm.py, cpp/tensorrt_llm/kernels/"
            "unfusedAttentionKernels: invokeQKVPreprocessing); DeepseekV3MoE and Llama4MoE run the shared expert "
            "beside the routed experts with maybe_execute_in_parallel on an aux stream, under the decoding CUDA graphs "
            "(tensorrt_llm/_torch/models/modeling_deepseekv3.py, modeling_llama.py)"
        ),
    ),
}


def stack_fusion(stack: str | None) -> Fusion:
    """The fusion of a latency source's stack (an engine, or engine-version such as
    vllm-0.24.0); every other stack (vidur, given rows, the datasheet, a CPU) runs unfused."""
    engine = (stack or "").split("-")[0]
    return ENGINE_FUSION.get(engine, UNFUSED)
