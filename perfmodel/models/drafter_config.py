"""A drafter's own config.json, read for the shapes its drafting runs: a draft model's, or an
EAGLE / EAGLE-3 head's.

- A draft model is a whole decoder of the Llama family (any config.json the toolkit reads). Its
  tokens are the target's: the two must share one vocabulary.
- An EAGLE or EAGLE-3 head is a Llama config of its decoder layer(s) (num_hidden_layers, one in
  the published heads). Its fc reads the target's features, so its hidden_size is the target's,
  and its vocab_size is the target's too. EAGLE-3's own LM head has draft_vocab_size rows (32,000
  of Llama-3's 128,256 in yuhuili/EAGLE3-LLaMA3.1-Instruct-8B), its ids mapped to the target's.
  vLLM's speculators format (RedHatAI/*speculator.eagle3) nests the layer's keys under
  transformer_layer_config and keeps draft_vocab_size at the top.

The result is a ModelConfig of the drafter's own shapes: for a head, its layers and, as the
vocabulary, the rows of the LM head it drafts with (draft_vocab_size where it has one).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from perfmodel.base.drafter_kind import FEATURE_DRAFTERS, DrafterKind
from perfmodel.base.errors import PerfkitError
from perfmodel.models.config import ModelConfig, model_shapes, resolve_model_path
from perfmodel.models.hf_config import parse_hf_config, read_config_json

# Where the speculators format keeps an EAGLE head's layer keys.
NESTED_LAYER_KEY = "transformer_layer_config"


def drafter_model(path: str | Path, kind: DrafterKind, target: ModelConfig) -> ModelConfig:
    """The shapes of the drafter `kind` whose config.json is at `path`, checked against the
    target it drafts for (one line naming the key that does not fit)."""
    path = resolve_model_path(path) or Path(path)  # a shipped folder's path works from anywhere
    file = path / "config.json" if path.is_dir() else path
    if kind not in (DrafterKind.DRAFT, *FEATURE_DRAFTERS) or kind == DrafterKind.MTP:
        raise PerfkitError(
            f"--draft-config: {kind} has no config of its own (a draft model's or an EAGLE / EAGLE-3 head's "
            "config.json; an MTP module's shapes are the target's, from its num_nextn_predict_layers)"
        )
    cfg = read_config_json(path)
    layer = cfg.get(NESTED_LAYER_KEY) if isinstance(cfg.get(NESTED_LAYER_KEY), dict) else cfg
    parsed = parse_hf_config(layer, file)
    name = path.name if path.is_dir() else (path.parent.name or path.stem)
    model = model_shapes(parsed, name)
    if model.vocab_size != target.vocab_size:
        raise PerfkitError(
            f"{file}: vocab_size {model.vocab_size:,} is not the target's {target.vocab_size:,} ({target.name}); a "
            "drafter proposes the target's tokens, so it must share the target's vocabulary"
        )
    if kind == DrafterKind.DRAFT:
        return model
    if model.hidden_size != target.hidden_size:
        raise PerfkitError(
            f"{file}: hidden_size {model.hidden_size} is not the target's {target.hidden_size} ({target.name}); an "
            f"{kind} head reads the target's features, so it has the target's hidden size"
        )
    draft_vocab = cfg.get("draft_vocab_size") or layer.get("draft_vocab_size")
    if draft_vocab is None or kind == DrafterKind.EAGLE:
        return model
    if not isinstance(draft_vocab, int) or not 1 <= draft_vocab <= model.vocab_size:
        raise PerfkitError(
            f"{file}: draft_vocab_size must be an integer from 1 to the vocabulary's {model.vocab_size:,}, got "
            f"{draft_vocab!r}"
        )
    return dataclasses.replace(model, vocab_size=draft_vocab)
