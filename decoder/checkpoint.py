"""Checkpoints in the Hugging Face Llama layout, with Medusa heads in the reference layout.

A model folder holds config.json, *.safetensors (one file or shards) and tokenizer.json.
Medusa heads are medusa_lm_head.safetensors (or the reference's medusa_lm_head.pt) with
medusa_num_heads and medusa_num_layers in the config.json beside it: in the model folder
itself, or in a separate heads folder (the reference publishes heads apart from the base).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from decoder.heads import MedusaHeads
from decoder.model import LlamaConfig, Transformer
from perfmodel.errors import PerfkitError
from perfmodel.models import BUNDLED_MODEL, parse_hf_config, parse_medusa_config, read_config_json, resolve_model_path
from perfmodel.trees import Tree, load_tree

HEADS_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")
TREE_FILE = "medusa_tree.json"
BUNDLED = BUNDLED_MODEL


@dataclass
class Checkpoint:
    folder: Path
    config: LlamaConfig
    model: Transformer
    heads: MedusaHeads | None
    tokenizer: object | None  # tokenizers.Tokenizer
    tree: Tree | None  # the tree shipped with the heads, if any
    info: dict  # anything else the folder records (training card)


def _config_file(folder: Path) -> Path:
    path = folder / "config.json"
    if not path.is_file():
        raise PerfkitError(f"missing checkpoint file {path}")
    return path


def _load_tensors(files: list[Path]) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors = {}
    for file in files:
        if file.suffix == ".pt":
            tensors.update(torch.load(file, map_location="cpu", weights_only=True))
        else:
            tensors.update(load_file(file))
    return tensors


def resolve_folder(model: str | Path) -> Path:
    folder = resolve_model_path(model) or Path(model)
    if not folder.is_dir():
        hint = " (the bundled model is made by `python -m decoder.train`)" if str(model) == "bundled" else ""
        raise PerfkitError(f"model folder {folder} does not exist{hint}")
    return folder


def load_checkpoint(model: str | Path = "bundled", heads: str | Path | None = None, dtype=torch.float32) -> Checkpoint:
    folder = resolve_folder(model)
    config_file = _config_file(folder)
    parsed = parse_hf_config(read_config_json(config_file), config_file)
    config = LlamaConfig.from_hf(parsed)
    weights = sorted(p for p in folder.glob("*.safetensors") if p.name not in HEADS_FILES)
    if not weights:
        raise PerfkitError(f"missing checkpoint file: no *.safetensors weights in {folder}")
    state = _load_tensors(weights)
    if config.tie_word_embeddings or "lm_head.weight" not in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    net = Transformer(config)
    missing, unexpected = net.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("rotary_emb.inv_freq")]
    if missing:
        raise PerfkitError(f"{folder}: weights lack {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}")
    net = net.to(dtype).eval()

    heads_folder = resolve_folder(heads) if heads is not None else folder
    heads_config = (
        parse_medusa_config(read_config_json(_config_file(heads_folder))) if heads is not None else parsed.medusa
    )
    medusa, tree = None, None
    if heads_config.num_heads:
        files = [heads_folder / f for f in HEADS_FILES if (heads_folder / f).exists()]
        if not files:
            raise PerfkitError(
                f"missing checkpoint file: {heads_folder} declares medusa_num_heads but has none of "
                f"{', '.join(HEADS_FILES)}"
            )
        medusa = MedusaHeads(config.hidden_size, config.vocab_size, heads_config.num_heads, heads_config.num_layers)
        try:
            medusa.load_state_dict(_load_tensors(files[:1]))
        except RuntimeError as exc:
            raise PerfkitError(
                f"{files[0]}: does not match medusa_num_heads/medusa_num_layers ({str(exc).splitlines()[0]})"
            ) from None
        medusa = medusa.to(dtype).eval()
        if (heads_folder / TREE_FILE).exists():
            tree = load_tree(heads_folder / TREE_FILE)
    elif heads is not None:
        raise PerfkitError(f"{heads_folder}/config.json has no medusa_num_heads")

    tokenizer = None
    if (folder / "tokenizer.json").exists():
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    info = json.loads((folder / "training.json").read_text()) if (folder / "training.json").exists() else {}
    return Checkpoint(folder, config, net, medusa, tokenizer, tree, info)


def save_checkpoint(
    folder: Path,
    model: Transformer,
    heads: MedusaHeads | None,
    tokenizer=None,
    tree: Tree | None = None,
    info: dict | None = None,
    dtype=torch.float16,
) -> None:
    """Write the HF layout (weights in `dtype` to keep the files small)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    config = model.config.to_hf()
    if heads is not None:
        config.update(medusa_num_heads=len(heads), medusa_num_layers=heads.num_layers)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    state = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight")
    save_file(state, str(folder / "model.safetensors"))
    if heads is not None:
        save_file(
            {k: v.detach().to(dtype).contiguous() for k, v in heads.state_dict().items()}, str(folder / HEADS_FILES[0])
        )
    if tokenizer is not None:
        tokenizer.save(str(folder / "tokenizer.json"))
    if tree is not None:
        (folder / TREE_FILE).write_text(json.dumps([list(p) for p in tree.paths]))
    if info is not None:
        (folder / "training.json").write_text(json.dumps(info, indent=1))
