"""What a config.json may declare that the cost model cannot price yet, refused in one line
naming the key: the model prices dense Llama-family decoders in 16 or 32 bits, and a config
read past a key it does not understand would be priced as some other model, silently.

- mixture-of-experts keys (Mixtral's num_local_experts, Qwen3-MoE's num_experts and
  moe_intermediate_size, DeepSeek's n_routed_experts, gpt-oss's experts_per_token, ...): priced
  as a dense model, Mixtral-8x7B came out at 14.5 GB of weights where its 16-bit weights are
  about 93 GB;
- latent attention (DeepSeek's kv_lora_rank, q_lora_rank): another attention and KV cache;
- a quantized checkpoint (quantization_config, or ModelOpt's hf_quant_config.json beside the
  config): its weights priced as 16-bit ones, 1.3-1.6x slower than NVIDIA aiconfigurator's
  estimate for Llama-3.1-70B-FP8 and Qwen3-32B-FP8;
- a sliding attention window shorter than the context (Mistral-7B v0.1's 4096 of 32768): the
  model prices attention over the whole context;
- a model_type outside the Llama family the step's operators describe.
"""

from __future__ import annotations

from pathlib import Path

from perfmodel.base.errors import PerfkitError
from perfmodel.base.jsonfile import read_json

# The decoders whose step is the Llama step the operators price (perfmodel.models.operators):
# RMSNorm, rotary attention with grouped KV heads, a SwiGLU MLP. Qwen2 adds a bias to q/k/v and
# Qwen3 a norm of q and k per head, both elementwise work next to the GEMMs they follow. MiMo
# is Qwen2's decoder with MTP modules beside it (its MiMoConfig subclasses Qwen2Config and adds
# num_nextn_predict_layers), priced as perfmodel.models.config.ModelConfig.mtp_layers says.
LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3", "mimo")
MOE_KEYS = (
    "num_local_experts",
    "num_experts",
    "n_routed_experts",
    "num_experts_per_tok",
    "experts_per_token",
    "moe_intermediate_size",
    "n_shared_experts",
    "shared_expert_intermediate_size",
    "moe_layer_freq",
)
LATENT_ATTENTION_KEYS = ("kv_lora_rank", "q_lora_rank")
# ModelOpt writes a quantized checkpoint's settings to this file beside config.json (NVIDIA's
# Llama-3.1-70B-Instruct-FP8 declares nothing in config.json itself).
MODELOPT_QUANT_FILE = "hf_quant_config.json"
NOT_PRICED = "the cost model prices dense Llama-family decoders in 16 or 32 bits only"


def declared(value: object) -> bool:
    """A key that says something: not absent, null, 0, false or empty."""
    return value not in (None, 0, False, "", [], {})


def check_priceable(cfg: dict, source: object) -> None:
    """One line naming the first key of `cfg` (a config.json object) the cost model cannot
    price; nothing where it can price the whole config."""
    for keys, what in ((MOE_KEYS, "a mixture-of-experts model"), (LATENT_ATTENTION_KEYS, "latent attention")):
        for key in keys:
            if declared(cfg.get(key)):
                raise PerfkitError(f"{source}: {key} = {cfg[key]!r} declares {what}, which is not priced; {NOT_PRICED}")
    quantization = cfg.get("quantization_config")
    if declared(quantization):
        raise PerfkitError(
            f"{source}: quantization_config ({quantization_text(quantization)}) declares quantized weights, which are "
            f"not priced; {NOT_PRICED} (give the unquantized model's config to price it in 16 bits)"
        )
    # after the keys above, which say better why a model outside the family is not priced
    model_type = cfg.get("model_type")
    if model_type is not None and model_type not in LLAMA_FAMILY:
        raise PerfkitError(
            f"{source}: model_type {model_type!r} is not priced; {NOT_PRICED} (model_type one of: "
            f"{', '.join(LLAMA_FAMILY)})"
        )
    window = cfg.get("sliding_window")
    context = cfg.get("max_position_embeddings")
    shorter = not isinstance(window, int) or not isinstance(context, int) or window < context
    if declared(window) and cfg.get("use_sliding_window", True) and shorter:
        raise PerfkitError(
            f"{source}: sliding_window = {window!r} attends to the last {window} tokens only, which is not priced "
            "(the model prices attention over the whole context)"
        )


def quantization_text(quantization: object) -> str:
    """The scheme a quantization_config names, short: its method and format where it gives them."""
    if not isinstance(quantization, dict):
        return repr(quantization)
    parts = [str(quantization[k]) for k in ("quant_method", "quant_algo", "fmt", "bits") if k in quantization]
    return ", ".join(parts) or "declared"


def check_quantization_file(config_file: Path) -> None:
    """One line where a ModelOpt quantization file lies beside `config_file`: hf_quant_config.json
    in its folder, or <name>_hf_quant_config.json beside <name>_config.json (how NVIDIA
    aiconfigurator ships both files of one checkpoint in one folder)."""
    name = config_file.name
    candidates = [config_file.with_name(MODELOPT_QUANT_FILE)]
    if name.endswith("_config.json"):
        candidates.append(config_file.with_name(name.removesuffix("config.json") + MODELOPT_QUANT_FILE))
    for path in candidates:
        if path.is_file():
            settings = read_json(path, "quantization config")
            scheme = settings.get("quantization") if isinstance(settings, dict) else None
            raise PerfkitError(
                f"{config_file}: {path.name} beside it ({quantization_text(scheme)}) declares quantized weights, which "
                f"are not priced; {NOT_PRICED}"
            )
