"""Multi-head latent attention (MLA: DeepSeek-V2/V3/R1's, Kimi-K2's): the one reader of a
config.json's latent-attention keys (q_lora_rank, kv_lora_rank, qk_nope_head_dim,
qk_rope_head_dim, v_head_dim).

A layer projects the hidden state down to a query latent (q_lora_rank) and a KV latent
(kv_lora_rank) with a shared rotary key (qk_rope_head_dim), projects the query latent up to
every head's query, and caches only the KV latent and the rotary key: kv_lora_rank +
qk_rope_head_dim elements per token and layer (576 for DeepSeek-V3, where grouped-query
attention of its 128 heads would cache 2 x 128 x 128). Engines decode with the up-projection of
the keys and values absorbed into the query and the output (attention over the latents as one
KV head: vLLM's FlashMLA, TensorRT-LLM's MLA kernels) and prefill with it expanded (ordinary
attention of head sizes 192 and 128). What the step prices is the whole module
(perfmodel.models.mla_operators; measured as a module by the engines,
perfmodel.latency.mla_table).

Under tensor parallelism the heads split (the query and KV up-projections and the output
projection are split as attention's are); the down-projection and the cached latent are the
same for every head, so every device computes and caches them whole (vLLM's
ReplicatedLinear fused_qkv_a_proj; its MLA KV cache is not split over tp).
"""

from __future__ import annotations

from dataclasses import dataclass

from perfmodel.base.checks import is_count
from perfmodel.base.errors import PerfkitError

# The model_types whose attention this reads (their MoE keys: perfmodel.models.moe.FAMILY_KEYS).
# DeepSeek-V3.2 (deepseek_v32) and GLM-5 (glm_moe_dsa) add a sparse attention indexer
# (index_topk), which is not priced.
FAMILIES = ("deepseek_v2", "deepseek_v3", "kimi_k2")
KEYS = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


@dataclass(frozen=True)
class LatentAttention:
    kv_lora_rank: int  # the cached KV latent's width
    qk_nope_head_dim: int  # each head's query/key part without rotary position
    qk_rope_head_dim: int  # the rotary part, its key shared by every head and cached with the latent
    v_head_dim: int  # each head's value (and output) width
    q_lora_rank: int = 0  # the query latent's width; 0: queries projected from the hidden state (DeepSeek-V2-Lite)

    def __post_init__(self) -> None:
        for name in (*KEYS, "q_lora_rank"):
            if not is_count(getattr(self, name), 0 if name == "q_lora_rank" else 1):
                raise PerfkitError(f"latent attention: {name} must be a positive integer, got {getattr(self, name)!r}")

    @property
    def cache_width(self) -> int:
        """Elements each layer caches per token: the KV latent and the shared rotary key."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def qk_head_dim(self) -> int:
        """Each head's query (and, expanded, key) width."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def down_width(self) -> int:
        """Output width of the down-projection every device runs whole: the query latent (where
        queries have one), the KV latent and the rotary key."""
        return self.q_lora_rank + self.cache_width

    def describe(self) -> str:
        query = f"query latent {self.q_lora_rank}, " if self.q_lora_rank else ""
        return (
            f"latent attention ({query}KV latent {self.kv_lora_rank} + rotary key {self.qk_rope_head_dim} cached per "
            f"token and layer)"
        )


# DeepSeek-V3's (and R1's, Kimi-K2's) hidden size and latent attention: the one module the
# engines' tables measured (perfmodel.latency.mla_table)
DEEPSEEK_V3 = (
    7168,
    LatentAttention(kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, q_lora_rank=1536),
)


def parse_latent_attention(cfg: dict, source: object) -> LatentAttention | None:
    """The latent attention a config.json of FAMILIES declares; None for any other model (whose
    latent-attention keys perfmodel.models.unpriced refuses); one line for a missing or bad key."""
    if cfg.get("model_type") not in FAMILIES:
        return None
    values = {}
    for key in KEYS:
        value = cfg.get(key)
        if value is None:
            raise PerfkitError(f"{source}: a latent-attention config must give {key!r}; it is missing")
        values[key] = value
    return LatentAttention(**values, q_lora_rank=cfg.get("q_lora_rank") or 0)
