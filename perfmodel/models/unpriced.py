"""What a config.json may declare that the cost model cannot price yet, refused in one line
naming the key: the model prices dense Llama-family decoders (in the precisions
perfmodel.models.quantization reads), and a config read past a key it does not understand
would be priced as some other model, silently.

- mixture-of-experts keys of a model_type perfmodel.models.moe does not read (DeepSeek's
  n_routed_experts, ...): priced as a dense model, Mixtral-8x7B came out at 14.5 GB of weights
  where its 16-bit weights are about 93 GB (Mixtral, Qwen2/3-MoE, gpt-oss and Llama-4's text
  decoder are read, their experts priced);
- latent attention (kv_lora_rank, q_lora_rank) outside the model types perfmodel.models.latent_attention
  reads (DeepSeek-V2/V3/R1's, Kimi-K2's); a sparse attention indexer (index_topk: DeepSeek-V3.2's
  and GLM-5's DSA), which picks the tokens each query attends to;
- a sliding attention window shorter than the context (Mistral-7B v0.1's 4096 of 32768): the
  model prices attention over the whole context;
- a model_type outside the Llama family the step's operators describe.
"""

from __future__ import annotations

from perfmodel.base.errors import PerfkitError
from perfmodel.models.latent_attention import FAMILIES as LATENT_FAMILIES
from perfmodel.models.moe import FAMILY_KEYS

# The decoders whose step is the Llama step the operators price (perfmodel.models.operators):
# RMSNorm, rotary attention with grouped KV heads, a SwiGLU MLP. Qwen2 adds a bias to q/k/v and
# Qwen3 a norm of q and k per head, both elementwise work next to the GEMMs they follow. MiMo
# is Qwen2's decoder with MTP modules beside it (its MiMoConfig subclasses Qwen2Config and adds
# num_nextn_predict_layers), priced as perfmodel.models.config.ModelConfig.mtp_layers says.
# The MoE families (perfmodel.models.moe.FAMILY_KEYS) are these decoders with experts for an MLP.
LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3", "mimo", *FAMILY_KEYS)  # FAMILY_KEYS: the latent families too
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
SPARSE_ATTENTION_KEYS = ("index_topk",)
NOT_PRICED = (
    "the cost model prices Llama-family decoders, dense or with the experts of Mixtral, Qwen2/3-MoE, gpt-oss and "
    "Llama-4, and DeepSeek-V2/V3/R1 and Kimi-K2 (latent attention and experts)"
)


def declared(value: object) -> bool:
    """A key that says something: not absent, null, 0, false or empty."""
    return value not in (None, 0, False, "", [], {})


def check_priceable(cfg: dict, source: object) -> None:
    """One line naming the first key of `cfg` (a config.json object) the cost model cannot
    price; nothing where it can price the whole config."""
    model_type = cfg.get("model_type")
    moe_keys = () if model_type in FAMILY_KEYS else MOE_KEYS  # perfmodel.models.moe reads these
    latent_keys = () if model_type in LATENT_FAMILIES else LATENT_ATTENTION_KEYS  # .latent_attention reads these
    refused = (
        (SPARSE_ATTENTION_KEYS, "a sparse attention indexer (DeepSeek-V3.2's DSA)"),
        (moe_keys, "a mixture-of-experts model"),
        (latent_keys, "latent attention"),
    )
    for keys, what in refused:
        for key in keys:
            if declared(cfg.get(key)):
                raise PerfkitError(f"{source}: {key} = {cfg[key]!r} declares {what}, which is not priced; {NOT_PRICED}")
    # after the keys above, which say better why a model outside the family is not priced
    if model_type is not None and model_type not in LLAMA_FAMILY:
        raise PerfkitError(
            f"{source}: model_type {model_type!r} is not priced; {NOT_PRICED} (model_type one of: "
            f"{', '.join(LLAMA_FAMILY)})"
        )
    window = cfg.get("sliding_window")
    context = cfg.get("max_position_embeddings")
    shorter = not isinstance(window, int) or not isinstance(context, int) or window < context
    windowed = isinstance(cfg.get("layer_types"), list)  # per layer: perfmodel.models.window reads them
    if declared(window) and cfg.get("use_sliding_window", True) and shorter and not windowed:
        raise PerfkitError(
            f"{source}: sliding_window = {window!r} attends to the last {window} tokens only, which is not priced "
            "(the model prices attention over the whole context)"
        )


def check_runs_dense(cfg: dict, source: object, what: str) -> None:
    """One line where a config.json declares experts (perfmodel.models.moe) or windowed layers
    (perfmodel.models.window), which `what` cannot run: it runs dense Llama-family decoders, and
    built from such a config it would run some other, dense, model."""
    if cfg.get("model_type") in FAMILY_KEYS:
        raise PerfkitError(
            f"{source}: model_type {cfg['model_type']!r} is a mixture-of-experts model, which {what} cannot run (it "
            "runs dense Llama-family decoders); the cost model prices it (python -m perfmodel.plan --model ...)"
        )
    if isinstance(cfg.get("layer_types"), list) and cfg.get("sliding_window"):
        raise PerfkitError(
            f"{source}: layers attending to a sliding window of {cfg['sliding_window']} tokens, which {what} cannot run"
        )


def check_dense(model, what: str) -> None:
    """check_runs_dense for a model already read (a ModelConfig)."""
    if model.moe is not None:
        raise PerfkitError(
            f"{model.name} is a mixture-of-experts model ({model.moe.describe()}), which {what} cannot run (it runs "
            "dense Llama-family decoders); the cost model prices it (python -m perfmodel.plan --model ...)"
        )
    if model.window is not None:
        raise PerfkitError(f"{model.name} has layers attending to a sliding window, which {what} cannot run")
    if model.mla is not None:
        raise PerfkitError(f"{model.name} has {model.mla.describe()}, which {what} cannot run")
