"""A mixture-of-experts decoder's MLP: how many experts, how many each token is routed to, how
big one is, which layers have them, and how a serving engine splits them over devices.

The one reader of a config.json's expert keys (Mixtral's num_local_experts, Qwen2/3-MoE's
num_experts and moe_intermediate_size, gpt-oss's experts_per_token, DeepSeek's n_routed_experts;
the layers a config keeps dense, Qwen's mlp_only_layers and decoder_sparse_step, DeepSeek's
first_k_dense_replace and moe_layer_freq; Qwen2-MoE's and DeepSeek's shared experts). The step
prices an MoE layer as its router GEMM, the engine's fused expert kernel at the step's tokens
(perfmodel.latency.moe_table) and any shared expert; memory counts every expert.

Two serving choices travel with the shape, as a checkpoint's formats do (ModelConfig.as_served):
- the split (`--moe-parallel`): under tensor parallelism of degree t the experts run either
  tensor-parallel (each expert's intermediate size split t ways: vLLM's, SGLang's and
  TensorRT-LLM's default) or expert-parallel (the experts spread t ways, each whole: vLLM's
  --enable-expert-parallel); with `auto` the capacity plan and the serving search try both
  (perfmodel.planning.deployment.Deployment.expert_splits), and a single step takes the
  engine's default where its tables measured it, else expert parallelism where they did.
  Attention stays tensor-parallel either way, so every device holds every token and the layer
  ends in the all-reduce a dense MLP's ends in (wide expert parallelism with data-parallel
  attention and all-to-all dispatch is not priced);
- the routing (`--routing`): how evenly tokens fall on experts, as the tables measured it:
  balanced, or a power law of exponent 1.01 or 1.2 (aiconfigurator's default, 1.2).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum

from perfmodel.base.checks import is_count
from perfmodel.base.errors import PerfkitError
from perfmodel.base.precision import WeightFormat


class MoeSplit(StrEnum):
    AUTO = "auto"
    TP = "tp"  # each expert split (moe_tp = t, moe_ep = 1)
    EP = "ep"  # the experts spread (moe_tp = 1, moe_ep = t)


class Routing(StrEnum):
    """The tables' token distributions over experts (aiconfigurator's names)."""

    BALANCED = "balanced"
    POWER_LAW_1_01 = "power_law_1.01"
    POWER_LAW_1_2 = "power_law_1.2"


DEFAULT_ROUTING = Routing.POWER_LAW_1_2  # aiconfigurator's default workload distribution
# The model_types whose MLPs this reads, and the key each names its experts, top-k and expert size by.
FAMILY_KEYS = {
    "mixtral": ("num_local_experts", "num_experts_per_tok", "intermediate_size"),
    "qwen2_moe": ("num_experts", "num_experts_per_tok", "moe_intermediate_size"),
    "qwen3_moe": ("num_experts", "num_experts_per_tok", "moe_intermediate_size"),
    "gpt_oss": ("num_local_experts", "experts_per_token", "intermediate_size"),
    # Llama-4's text decoder, its keys translated by perfmodel.models.multimodal
    "llama4_text": ("num_local_experts", "num_experts_per_tok", "moe_intermediate_size"),
    # DeepSeek-V2/V3/R1 and Kimi-K2, whose attention is latent (perfmodel.models.latent_attention)
    **dict.fromkeys(
        ("deepseek_v2", "deepseek_v3", "kimi_k2"), ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size")
    ),
}


@dataclass(frozen=True)
class MoeShape:
    experts: int  # routed experts per MoE layer
    top_k: int  # experts each token is routed to
    expert_size: int  # one expert's intermediate size (its gate, up: h -> expert_size; down back)
    moe_layers: int  # layers whose MLP is the experts (the others: a dense MLP of intermediate_size)
    shared_size: int = 0  # a shared expert every token runs through (Qwen2-MoE), its intermediate size; 0: none
    split: MoeSplit = MoeSplit.AUTO
    routing: Routing = DEFAULT_ROUTING
    # The experts' own format where the checkpoint stores them apart (gpt-oss's mxfp4); None: the model's weights'
    experts_format: WeightFormat | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "split", moe_split(self.split))
        object.__setattr__(self, "routing", routing(self.routing))
        for name in ("experts", "top_k", "expert_size", "moe_layers"):
            if not is_count(getattr(self, name)):
                raise PerfkitError(f"mixture of experts: {name} must be an integer >= 1, got {getattr(self, name)!r}")
        if not is_count(self.shared_size, 0):
            raise PerfkitError(f"mixture of experts: shared_size must be an integer >= 0, got {self.shared_size!r}")
        if self.top_k > self.experts:
            raise PerfkitError(
                f"mixture of experts: top-k {self.top_k} is more than its {self.experts} experts (top-k at most "
                f"{self.experts})"
            )

    def served(self, split: str | None, routing_name: str | None) -> MoeShape:
        """The shape with the split and routing a command was given (None keeps the current)."""
        return dataclasses.replace(
            self,
            split=self.split if split is None else split,
            routing=self.routing if routing_name is None else routing_name,
        )

    def splits(self, tp: int) -> list[tuple[int, int]]:
        """The (moe_tp, moe_ep) splits over tp devices that split this shape evenly, the
        engine's default (tensor-parallel experts) first; what `split` allows of them."""
        both = [(tp, 1), (1, tp)] if tp > 1 else [(1, 1)]
        allowed = {MoeSplit.AUTO: both, MoeSplit.TP: both[:1], MoeSplit.EP: both[-1:]}[self.split]
        return [(mt, me) for mt, me in allowed if not self.expert_size % mt and not self.experts % me]

    def spreads_over(self, tp: int) -> bool:
        """Whether the experts (an allowed split) and any shared expert split tp ways evenly."""
        return not self.shared_size % tp and bool(self.splits(tp))

    def check_degree(self, tp: int) -> None:
        """One line where no allowed split spreads the experts over tp devices evenly, or the
        shared expert (split as a dense MLP is) does not split tp ways."""
        if self.shared_size % tp:
            raise PerfkitError(
                f"tp={tp} does not split the shared expert's intermediate size {self.shared_size} (choose a divisor)"
            )
        if not self.splits(tp):
            raise PerfkitError(
                f"tp={tp} does not split the experts {self.split}-wise ({self.experts} experts of intermediate size "
                f"{self.expert_size}): expert parallelism needs a degree dividing {self.experts}, tensor-parallel "
                f"experts one dividing {self.expert_size}"
            )

    def describe(self) -> str:
        shared = f" and a shared expert of {self.shared_size}" if self.shared_size else ""
        stored = f" in {self.experts_format}" if self.experts_format else ""
        layers = f"in {self.moe_layers} layers"
        return f"{self.experts} experts{stored} of {self.expert_size}, top-{self.top_k}{shared}, {layers}"


def layer_slice(model, layers: int, dense: bool):
    """`model` (a ModelConfig) cut to `layers` decoder layers of its shapes, a drafter's layers:
    dense ones (an EAGLE head is a Llama decoder layer, grouped-query attention and a dense MLP,
    whatever experts or latent attention its target has), or layers of the target's own kind (an
    MTP module repeats the target's layer: expert layers where the target's are, its latent
    attention). Either attends to the whole context."""
    moe = model.moe
    kept = None if dense or moe is None else dataclasses.replace(moe, moe_layers=min(layers, moe.moe_layers))
    return dataclasses.replace(model, num_layers=layers, moe=kept, window=None, mla=None if dense else model.mla)


def moe_split(value: str) -> MoeSplit:
    if value not in MoeSplit._value2member_map_:
        raise PerfkitError(f"moe parallel {value!r}: choose one of {', '.join(MoeSplit)}")
    return MoeSplit(value)


def routing(value: str) -> Routing:
    if value not in Routing._value2member_map_:
        raise PerfkitError(f"routing {value!r}: choose one of {', '.join(Routing)}")
    return Routing(value)


def _count(cfg: dict, key: str, source: object, smallest: int = 1) -> int:
    value = cfg.get(key)
    if value is None:
        raise PerfkitError(f"{source}: a mixture-of-experts config must give {key!r}; it is missing")
    if not is_count(value, smallest):
        raise PerfkitError(f"{source}: {key} must be an integer >= {smallest}, got {value!r}")
    return value


def parse_moe(cfg: dict, source: object, experts_format: WeightFormat | None = None) -> MoeShape | None:
    """The experts a config.json declares (FAMILY_KEYS' model types), stored in `experts_format`
    where the checkpoint declares one for them alone; None for a dense model; one line for a
    missing or impossible count."""
    keys = FAMILY_KEYS.get(cfg.get("model_type"))
    if keys is None:
        if experts_format is not None:
            raise PerfkitError(f"{source}: declares {experts_format} experts but has no experts")
        return None
    experts, top_k, size = (_count(cfg, key, source) for key in keys)
    if top_k > experts:
        raise PerfkitError(f"{source}: {keys[1]} = {top_k} routes each token to more than its {experts} experts")
    layers = _count(cfg, "num_hidden_layers", source)
    step, every = (cfg.get(key) or 1 for key in ("decoder_sparse_step", "moe_layer_freq"))
    first = cfg.get("first_k_dense_replace") or 0
    dense = set(cfg.get("mlp_only_layers") or [])
    for key, value, smallest in (
        ("decoder_sparse_step", step, 1),
        ("moe_layer_freq", every, 1),
        ("first_k_dense_replace", first, 0),
    ):
        if not is_count(value, smallest):
            raise PerfkitError(f"{source}: {key} must be an integer >= {smallest}, got {value!r}")
    # Qwen's rule (transformers' Qwen2MoeDecoderLayer): layer i is sparse unless listed in
    # mlp_only_layers, and only where (i + 1) is a multiple of decoder_sparse_step; DeepSeek's
    # (DeepseekV3DecoderLayer): from layer first_k_dense_replace on, where i is a multiple of moe_layer_freq.
    moe_layers = sum(
        1 for i in range(layers) if i not in dense and (i + 1) % step == 0 and i >= first and i % every == 0
    )
    shared = cfg.get("shared_expert_intermediate_size") or size * (cfg.get("n_shared_experts") or 0)
    if not moe_layers:
        raise PerfkitError(f"{source}: declares experts but keeps every layer dense (mlp_only_layers)")
    return MoeShape(experts, top_k, size, moe_layers, shared_size=shared, experts_format=experts_format)
