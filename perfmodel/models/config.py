"""Transformer shapes (ModelConfig): the presets of the paper's models, and a checkpoint's
config.json read into them (`from_hf_config`: its shapes by perfmodel.models.hf_config, the
reader the decoder builds its model from too, and what rides beside them by their own readers).
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from pathlib import Path

from perfmodel.base.checks import is_count
from perfmodel.base.errors import PerfkitError
from perfmodel.base.paths import TOOLKIT_ROOT
from perfmodel.base.precision import KvFormat, WeightFormat, kv_format, weight_format
from perfmodel.base.precision import describe as describe_precision
from perfmodel.models.hf_config import HFConfig, head_size, mtp_modules, read_config_json, read_hf_config
from perfmodel.models.latent_attention import LatentAttention, parse_latent_attention
from perfmodel.models.moe import MoeShape, parse_moe
from perfmodel.models.quantization import checkpoint_precision
from perfmodel.models.shape_checks import check_shape
from perfmodel.models.window import SlidingWindow, parse_window

DEFAULT_MEDUSA_HEADS = 4  # the reference Vicuna trees are 4 deep; a checkpoint's config overrides it
BUNDLED_MODEL = TOOLKIT_ROOT / "decoder" / "assets" / "bundled"  # trained by python -m decoder.train
MEDUSA2_MODEL = TOOLKIT_ROOT / "decoder" / "assets" / "medusa2"  # python -m decoder.train --medusa2 on the bundled one
DRAFT_MODEL = TOOLKIT_ROOT / "decoder" / "assets" / "draft"  # python -m decoder.train --draft-model: the bundled one's
# the shipped checkpoints, by the name a --model gives them
SHIPPED_MODELS = {"bundled": BUNDLED_MODEL, "medusa2": MEDUSA2_MODEL, "draft": DRAFT_MODEL}


def resolve_model_path(text: str | Path) -> Path | None:
    """The file or folder a model argument names, or None: `bundled` (or `medusa2`, its
    Medusa-2 version, or `draft`, its draft model), a path from the working folder, else the same path inside the
    toolkit's folder (so the README's `decoder/assets/bundled` works from anywhere)."""
    if str(text) in SHIPPED_MODELS:
        return SHIPPED_MODELS[str(text)]
    path = Path(text).expanduser()
    if path.exists():
        return path
    inside = TOOLKIT_ROOT / path
    return inside if not path.is_absolute() and inside.exists() else None


@dataclass(frozen=True)
class ModelConfig:
    name: str
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    num_layers: int
    vocab_size: int
    head_dim: int
    medusa_heads: int = DEFAULT_MEDUSA_HEADS
    # The LM head is the embedding matrix: its weights are stored (and read) once.
    tie_word_embeddings: bool = False
    # Longest context the model was trained for (max_position_embeddings); None: not known.
    max_context: int | None = None
    # The tensor-parallel degree this is one device's shard of (shard()); 1: the whole model.
    tp: int = 1
    # Multi-token-prediction modules the checkpoint carries (num_nextn_predict_layers): each an
    # embedding norm, a feature norm, a 2h -> h projection and one decoder layer of the model's
    # own shapes, drafting with the model's LM head (DeepSeek-V3's MTP, MiMo's). 0: none.
    mtp_layers: int = 0
    # Quantized formats of the layers' linear weights and the KV cache (perfmodel.base.precision); None: the dtype
    weights: WeightFormat | None = None
    kv_cache: KvFormat | None = None
    # The experts of a mixture-of-experts model (perfmodel.models.moe); None: a dense MLP in every layer
    moe: MoeShape | None = None
    window: SlidingWindow | None = None  # layers attending to the last tokens only (perfmodel.models.window)
    mla: LatentAttention | None = None  # latent attention (perfmodel.models.latent_attention); None: grouped-query

    def __post_init__(self) -> None:
        object.__setattr__(self, "weights", weight_format(self.weights))
        object.__setattr__(self, "kv_cache", kv_format(self.kv_cache))
        check_shape(self)

    @property
    def group_size(self) -> int:
        """Query heads per key/value head (1 without GQA)."""
        return self.num_heads // self.num_kv_heads

    @property
    def vocab_per_device(self) -> int:
        """Vocabulary rows of the LM head (and of each Medusa head's projection) on one device:
        engines split the vocabulary tp ways, padding it to a multiple of tp (vLLM's
        ParallelLMHead / VocabParallelEmbedding, vllm/model_executor/layers/vocab_parallel_embedding.py;
        TensorRT-LLM's ColumnLinear LM head with gather_output, tensorrt_llm/_torch/modules/linear.py),
        then gather the logits. The whole vocabulary on one device."""
        return -(-self.vocab_size // self.tp)

    def check_context(self, context: int, tokens: int = 1) -> None:
        """One line where `context` cached tokens plus a step of `tokens` exceed the context the
        model was trained for (max_context; nothing to check where it is not known)."""
        if self.max_context is not None and context + tokens > self.max_context:
            raise PerfkitError(
                f"context {context} + tree size {tokens} exceed {self.name}'s context of {self.max_context} tokens"
            )

    def require_heads(self, why: str) -> None:
        """One line where the model has no Medusa heads: a tree asked of it is no answer (the
        capacity plan says plain decoding everywhere; nothing prices a tree it cannot run)."""
        if not self.medusa_heads:
            raise PerfkitError(f"{self.name} has no Medusa heads (medusa_num_heads 0): {why}")

    @property
    def title(self) -> str:
        """Its name, and its quantized formats where it has any: what an answer's headline names."""
        return f"{self.name} ({self.precision})" if self.precision else self.name

    @property
    def precision(self) -> str:
        """Its quantized formats in words ('' for a 16-bit model)."""
        return describe_precision(self.weights, self.kv_cache, self.moe.experts_format if self.moe else None)

    def with_precision(self, weights: str | None, kv_cache: str | None) -> ModelConfig:
        """The model with its linear weights and KV cache in the formats named (a 16-bit name
        or None: unquantized)."""
        return dataclasses.replace(self, weights=weight_format(weights), kv_cache=kv_format(kv_cache))

    def as_served(
        self, weights: str | None = None, kv_cache: str | None = None, moe_split: str | None = None, routing=None
    ) -> ModelConfig:
        """The model in the formats a command was given (--weight-format, --kv-cache-dtype): None
        keeps what the checkpoint declares, a 16-bit name serves it unquantized; an MoE model's
        experts split and routed as given (--moe-parallel, --routing; perfmodel.models.moe)."""
        served = self.with_precision(
            self.weights if weights is None else weights, self.kv_cache if kv_cache is None else kv_cache
        )
        if self.moe is None:
            return served
        return dataclasses.replace(served, moe=self.moe.served(moe_split, routing))

    @property
    def dense_layers(self) -> int:
        """Layers whose MLP is dense (of intermediate_size): all but an MoE model's expert layers."""
        return self.num_layers - (self.moe.moe_layers if self.moe else 0)

    def with_medusa_heads(self, heads: int) -> ModelConfig:
        return dataclasses.replace(self, medusa_heads=heads)

    def shard(self, tp: int) -> ModelConfig:
        """One device's share of the model under tensor parallelism of degree tp (Megatron
        style): query heads and the MLP's intermediate size split tp ways; KV heads split
        too, or are replicated (one per device) when there are fewer of them than tp; the LM
        head's vocabulary splits too (`vocab_per_device`: vocab_size stays the whole
        vocabulary, which the gathered logits span). The embedding's gather, norms and hidden
        size stay whole. tp=1 is the model itself; a shard is not split again."""
        if not is_count(tp):
            raise PerfkitError(f"model {self.name}: tensor-parallel degree must be a positive integer, got {tp!r}")
        if tp == 1:
            return self
        if self.tp != 1:
            raise PerfkitError(f"model {self.name} is already a tp={self.tp} shard; shard the whole model")
        if self.moe is not None:
            self.moe.check_degree(tp)
        kv_ok = self.num_kv_heads % tp == 0 or tp % self.num_kv_heads == 0
        if self.num_heads % tp or (self.dense_layers and self.intermediate_size % tp) or not kv_ok:
            raise PerfkitError(
                f"model {self.name}: tp={tp} does not split it ({self.num_heads} query heads, {self.num_kv_heads} KV "
                f"heads, intermediate size {self.intermediate_size}); choose from: "
                f"{', '.join(map(str, self.tensor_parallel_degrees()))}"
            )
        return dataclasses.replace(
            self,
            name=f"{self.name}@tp{tp}",
            num_heads=self.num_heads // tp,
            num_kv_heads=max(1, self.num_kv_heads // tp),
            intermediate_size=self.intermediate_size // tp,
            tp=tp,
        )

    def tensor_parallel_degrees(self, largest: int = 64) -> list[int]:
        """The degrees up to `largest` that split the model evenly (an MoE model's experts too)."""
        n, kv, i = self.num_heads, self.num_kv_heads, self.intermediate_size if self.dense_layers else 0
        return [
            t
            for t in range(1, largest + 1)
            if not n % t and not i % t and (not kv % t or not t % kv) and (self.moe is None or self.moe.spreads_over(t))
        ]


def _llama(name: str, h: int, i: int, n: int, n_kv: int, layers: int, vocab: int, context: int) -> ModelConfig:
    return ModelConfig(
        name, h, i, n, n_kv, layers, vocab, head_dim=head_size(h, n, f"model {name}"), max_context=context
    )


# Contexts are the max_position_embeddings of each family's Hugging Face config.json:
# LLaMA-1 and the paper's Vicuna v1.3 2048, Llama-2 4096, Llama-3 8192, Mistral-7B 32768.
PRESETS = {
    m.name: m
    for m in (
        _llama("llama-7b", 4096, 11008, 32, 32, 32, 32000, 2048),
        _llama("llama-13b", 5120, 13824, 40, 40, 40, 32000, 2048),
        _llama("llama-33b", 6656, 17920, 52, 52, 60, 32000, 2048),
        _llama("llama-2-70b", 8192, 28672, 64, 8, 80, 32000, 4096),
        _llama("llama-3-8b", 4096, 14336, 32, 8, 32, 128256, 8192),
        _llama("mistral-7b", 4096, 14336, 32, 8, 32, 32000, 32768),
    )
}
ALIASES = {
    "vicuna-7b": "llama-7b",
    "vicuna-13b": "llama-13b",
    "vicuna-33b": "llama-33b",
    "llama-30b": "llama-33b",
    "llama-2-7b": "llama-7b",
    "llama-2-13b": "llama-13b",
}
# Aliases whose context differs from their preset's: same shapes (and measurements), longer context.
ALIAS_CONTEXT = {"llama-2-7b": 4096, "llama-2-13b": 4096}


def model_shapes(hf: HFConfig, name: str) -> ModelConfig:
    """The shapes the cost model needs of a parsed config.json (a file without Medusa keys gets
    the default heads)."""
    heads = hf.medusa_num_heads
    return ModelConfig(
        name=name,
        hidden_size=hf.hidden_size,
        intermediate_size=hf.intermediate_size,
        num_heads=hf.num_attention_heads,
        num_kv_heads=hf.num_key_value_heads,
        num_layers=hf.num_hidden_layers,
        vocab_size=hf.vocab_size,
        head_dim=hf.head_dim,
        medusa_heads=DEFAULT_MEDUSA_HEADS if heads is None else heads,
        tie_word_embeddings=hf.tie_word_embeddings,
        max_context=hf.max_position_embeddings,
    )


def from_hf_config(path: str | Path) -> ModelConfig:
    """Shapes from a Hugging Face `config.json` (a file, or a folder holding one), its MTP
    modules included."""
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    # a checkpoint's config.json is named by its folder; another file by its own name
    # (<org>--<model>_config.json, as aiconfigurator ships them, is <org>--<model>)
    name = (file.parent.name or file.stem) if file.name == "config.json" else file.stem.removesuffix("_config")
    model = model_shapes(read_hf_config(path), name)
    cfg = read_config_json(path)
    declared = checkpoint_precision(cfg, file)
    mla = parse_latent_attention(cfg, file)
    return dataclasses.replace(
        model,
        # a latent-attention head's output is v_head_dim wide (hidden / heads says nothing of it)
        head_dim=mla.v_head_dim if mla else model.head_dim,
        mla=mla,
        mtp_layers=mtp_modules(cfg, file),
        weights=declared.weights,
        kv_cache=declared.kv_cache,
        moe=parse_moe(cfg, file, declared.experts),
        window=parse_window(cfg, file),
    )


def load_model(name_or_path: str | Path) -> ModelConfig:
    """A preset by name or alias, or the shapes of a local config.json / checkpoint folder."""
    text = str(name_or_path)
    key = text.strip().lower().replace("_", "-")
    if key in ALIAS_CONTEXT:
        return dataclasses.replace(PRESETS[ALIASES[key]], max_context=ALIAS_CONTEXT[key])
    key = ALIASES.get(key, key)
    if key in PRESETS:
        return PRESETS[key]
    path = resolve_model_path(text)
    if path is not None:
        return from_hf_config(path)
    names = [*PRESETS, *ALIASES, "bundled"]
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.5)
    hint = f"; closest match: {close[0]}" if close else ""
    raise PerfkitError(f"unknown model {text!r}; known models: {', '.join(names)}{hint} (or a path to a config.json)")
