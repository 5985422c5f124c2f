"""A multimodal checkpoint's language model. Llama-4's config.json (model_type `llama4`) wraps
its text decoder in `text_config` beside a vision encoder; the planners price the text decoder
served alone (vLLM's --language-model-only, or every --limit-mm-per-prompt at 0, loads no
multimodal module: docs.vllm.ai, models/multimodal-models), so the encoder's weights are not
counted. The decoder's keys are translated to those perfmodel.models.moe and
perfmodel.models.window read:

- its experts: `num_local_experts` routed ones of `intermediate_size`, top `num_experts_per_tok`,
  one shared expert of the same size in every expert layer, and every
  `interleave_moe_layer_step`-th layer an expert layer (transformers' Llama4TextConfig: layer i
  is one where (i + 1) is a multiple of the step); the other layers dense, of
  `intermediate_size_mlp`;
- its chunked attention: the layers that rotate (`no_rope_layers` 1; by default three in four)
  attend within chunks of `attention_chunk_size` tokens, priced as a window of that many keys:
  exact below the chunk, an upper bound past it (a token attends to the tokens of its own chunk
  only, half a chunk on average); the others attend to the whole context.
"""

from __future__ import annotations

WRAPPERS = ("llama4",)
SLIDING, FULL = "sliding_attention", "full_attention"


def language_model(cfg: dict) -> dict:
    """The text decoder's config of a multimodal wrapper (its quantization_config kept), in the
    keys the readers know; any other config as it is."""
    text = cfg.get("text_config")
    if cfg.get("model_type") not in WRAPPERS or not isinstance(text, dict):
        return cfg
    quantization = cfg.get("quantization_config")
    text = {**text, **({"quantization_config": quantization} if quantization else {})}
    return llama4_text(text)


def llama4_text(text: dict) -> dict:
    """Llama-4's text decoder in Qwen2-MoE's expert keys and gpt-oss's per-layer attention keys."""
    size = text.get("intermediate_size")
    out = {
        **text,
        "intermediate_size": text.get("intermediate_size_mlp", size),  # the dense layers'
        "moe_intermediate_size": size,
        "shared_expert_intermediate_size": size,
        "decoder_sparse_step": text.get("interleave_moe_layer_step", 1),
    }
    chunk, layers = text.get("attention_chunk_size"), text.get("num_hidden_layers")
    if chunk and isinstance(layers, int):
        rotates = text.get("no_rope_layers") or [int((i + 1) % 4 != 0) for i in range(layers)]
        out |= {"layer_types": [SLIDING if r else FULL for r in rotates], "sliding_window": chunk}
    return out
