"""The one reader of a Hugging Face config.json's transformer keys.

`parse_hf_config` is the only code that knows config.json's key names for the decoder's
shapes: the cost model takes them from it (perfmodel.models.config.from_hf_config), the decoder
builds its model from it (decoder.model.LlamaConfig), so the two cannot read a checkpoint
differently. The keys of what rides beside the shapes are read by their own modules
(perfmodel.models.moe, .latent_attention, .window, .quantization).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from perfmodel.base.checks import is_count
from perfmodel.base.errors import PerfkitError
from perfmodel.base.jsonfile import read_json
from perfmodel.models.multimodal import language_model
from perfmodel.models.shape_checks import MAX_HEADS
from perfmodel.models.unpriced import check_priceable


def head_size(hidden_size: int, num_heads: int, source: object) -> int:
    """hidden_size / num_heads, the head size a config implies when it names none: refused
    when it does not divide, since rounding it would silently price (or run) a different model."""
    if hidden_size % num_heads:
        raise PerfkitError(
            f"{source}: hidden_size {hidden_size} is not divisible by num_attention_heads {num_heads}; give a "
            f"head_dim, or a hidden size that is a multiple of the head count"
        )
    return hidden_size // num_heads


@dataclass(frozen=True)
class MedusaConfig:
    """The Medusa keys of a config.json. Heads published apart from their base model come
    with a config.json that holds little else, so these are read on their own."""

    num_heads: int | None = None  # None: the file declares no heads
    num_layers: int = 1  # residual blocks per head


@dataclass(frozen=True)
class HFConfig:
    """A Llama-family config.json, field by field under its own key names, with
    transformers' defaults for the keys a file may leave out. The one list of these
    fields: the cost model takes its shapes from it (perfmodel.models.config.model_shapes) and the decoder builds
    its transformer from it (decoder.model.LlamaConfig, a subclass adding what it can run)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int | None = None  # None: hidden_size / num_attention_heads
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    medusa_num_heads: int | None = None  # None: the file declares no heads
    medusa_num_layers: int = 1  # residual blocks per head
    rope_type: str = "default"  # anything but "default" is a RoPE scaling scheme

    def __post_init__(self) -> None:
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", head_size(self.hidden_size, self.num_attention_heads, "model config"))

    @property
    def medusa(self) -> MedusaConfig:
        return MedusaConfig(self.medusa_num_heads, self.medusa_num_layers)


def read_config_json(path: str | Path) -> dict:
    """The JSON object of a `config.json` (a file, or a folder holding one)."""
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    cfg = read_json(file, "model config")
    if not isinstance(cfg, dict):
        raise PerfkitError(f"{file}: expected a JSON object")
    return language_model(cfg)  # a multimodal checkpoint's text decoder (perfmodel.models.multimodal)


def parse_medusa_config(cfg: dict) -> MedusaConfig:
    return MedusaConfig(cfg.get("medusa_num_heads"), cfg.get("medusa_num_layers", 1))


def parse_hf_config(cfg: dict, source: str | Path = "config.json") -> HFConfig:
    """Parse a config.json object; `source` names the file in errors. A config declaring what
    the cost model cannot price (perfmodel.models.unpriced) is refused."""
    check_priceable(cfg, source)

    def get(key: str) -> object:
        if cfg.get(key) is None:
            raise PerfkitError(f"{source}: missing key {key!r}")
        return cfg[key]

    heads = get("num_attention_heads")
    hidden = get("hidden_size")
    if not isinstance(heads, int) or not isinstance(hidden, int) or heads <= 0:
        raise PerfkitError(f"{source}: hidden_size and num_attention_heads must be positive integers")
    # transformers >= 5 nests RoPE settings in rope_parameters; older files use rope_scaling.
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    tied = cfg.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise PerfkitError(f"{source}: tie_word_embeddings must be true or false, got {tied!r}")
    eos = cfg.get("eos_token_id")
    medusa = parse_medusa_config(cfg)
    return HFConfig(
        vocab_size=get("vocab_size"),
        hidden_size=hidden,
        intermediate_size=get("intermediate_size"),
        num_hidden_layers=get("num_hidden_layers"),
        num_attention_heads=heads,
        num_key_value_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or head_size(hidden, heads, source),
        rope_theta=rope.get("rope_theta") or cfg.get("rope_theta", 10000.0),
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
        max_position_embeddings=cfg.get("max_position_embeddings", 2048),
        tie_word_embeddings=tied,
        bos_token_id=cfg.get("bos_token_id"),
        # The decoder stops on a single end token: of several, the first.
        eos_token_id=(eos[0] if eos else None) if isinstance(eos, list) else eos,
        medusa_num_heads=medusa.num_heads,
        medusa_num_layers=medusa.num_layers,
        rope_type=rope.get("rope_type", rope.get("type")) or "default",
    )


def read_hf_config(path: str | Path) -> HFConfig:
    """A config.json file, or the one in a folder, parsed (its shapes: the precision it
    declares is perfmodel.models.quantization's to read)."""
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    return parse_hf_config(read_config_json(path), file)


def mtp_modules(cfg: dict, source: object) -> int:
    """The MTP modules a config.json declares (num_nextn_predict_layers: DeepSeek-V3's key, and
    MiMo's); 0 where it declares none."""
    value = cfg.get("num_nextn_predict_layers") or 0
    if not is_count(value, 0) or value > MAX_HEADS:
        raise PerfkitError(
            f"{source}: num_nextn_predict_layers must be an integer from 0 to {MAX_HEADS}, got {value!r}"
        )
    return value
