"""Transformer shapes: the presets of the paper's models, and a reader for HF config.json."""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from pathlib import Path

from perfmodel.errors import PerfkitError
from perfmodel.jsonfile import read_json

DEFAULT_MEDUSA_HEADS = 4  # the reference Vicuna trees are 4 deep; a checkpoint's config overrides it
TOOLKIT_ROOT = Path(__file__).resolve().parents[1]
BUNDLED_MODEL = TOOLKIT_ROOT / "decoder" / "assets" / "bundled"  # trained by python -m decoder.train


def resolve_model_path(text: str | Path) -> Path | None:
    """The file or folder a model argument names, or None: `bundled`, a path from the
    working folder, else the same path inside the toolkit's folder (so the README's
    `decoder/assets/bundled` works from anywhere)."""
    if str(text) == "bundled":
        return BUNDLED_MODEL
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

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type != "int":
                continue
            smallest = 0 if f.name == "medusa_heads" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < smallest:
                raise PerfkitError(f"model {self.name}: {f.name} must be an integer >= {smallest}, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise PerfkitError(
                f"model {self.name}: num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )

    @property
    def group_size(self) -> int:
        """Query heads per key/value head (1 without GQA)."""
        return self.num_heads // self.num_kv_heads

    def with_medusa_heads(self, heads: int) -> ModelConfig:
        return dataclasses.replace(self, medusa_heads=heads)


def _llama(name: str, h: int, i: int, n: int, n_kv: int, layers: int, vocab: int) -> ModelConfig:
    return ModelConfig(name, h, i, n, n_kv, layers, vocab, head_dim=h // n)


PRESETS = {
    m.name: m
    for m in (
        _llama("llama-7b", 4096, 11008, 32, 32, 32, 32000),
        _llama("llama-13b", 5120, 13824, 40, 40, 40, 32000),
        _llama("llama-33b", 6656, 17920, 52, 52, 60, 32000),
        _llama("llama-2-70b", 8192, 28672, 64, 8, 80, 32000),
        _llama("llama-3-8b", 4096, 14336, 32, 8, 32, 128256),
        _llama("mistral-7b", 4096, 14336, 32, 8, 32, 32000),
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


def from_hf_config(path: str | Path) -> ModelConfig:
    """Shapes from a Hugging Face `config.json` (a file, or a folder holding one)."""
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    cfg = read_json(file, "model config")
    if not isinstance(cfg, dict):
        raise PerfkitError(f"{file}: expected a JSON object")

    def get(key: str) -> object:
        if key not in cfg:
            raise PerfkitError(f"{file}: missing key {key!r}")
        return cfg[key]

    heads = get("num_attention_heads")
    hidden = get("hidden_size")
    if not isinstance(heads, int) or not isinstance(hidden, int) or heads <= 0:
        raise PerfkitError(f"{file}: hidden_size and num_attention_heads must be positive integers")
    name = path.name if path.is_dir() else (file.parent.name or file.stem)
    return ModelConfig(
        name=name,
        hidden_size=hidden,
        intermediate_size=get("intermediate_size"),
        num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads") or heads,
        num_layers=get("num_hidden_layers"),
        vocab_size=get("vocab_size"),
        head_dim=cfg.get("head_dim") or hidden // heads,
        medusa_heads=cfg.get("medusa_num_heads", DEFAULT_MEDUSA_HEADS),
    )


def load_model(name_or_path: str | Path) -> ModelConfig:
    """A preset by name or alias, or the shapes of a local config.json / checkpoint folder."""
    text = str(name_or_path)
    key = text.strip().lower().replace("_", "-")
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
