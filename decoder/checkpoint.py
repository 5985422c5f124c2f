"""Checkpoints in the Hugging Face Llama layout, with Medusa heads in the reference layout.

A model folder holds config.json, *.safetensors (one file or shards) and tokenizer.json.
Medusa heads are medusa_lm_head.safetensors (or the reference's medusa_lm_head.pt) with
medusa_num_heads and medusa_num_layers in the config.json beside it: in the model folder
itself, or in a separate heads folder (the reference publishes heads apart from the base).

A checkpoint written here also holds checksums.sha256 (`sha256sum -c` reads it): the
SHA-256 of each weight file, verified on every load, since a corrupted payload still
loads and decodes, only into garbage. A folder without one (a Hugging Face download)
loads unchecked. After changing weights on purpose, `python -m decoder.checkpoint
--rehash DIR` records the new checksums.
"""

from __future__ import annotations

import json
import pickle
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError

from decoder.eagle import EAGLE_FILES, EagleDrafter, EagleLayout
from decoder.heads import MedusaHeads
from decoder.manifest import HEADS_FILES, MANIFEST, normal_mode, verify_manifest, weight_files, write_manifest
from decoder.model import LlamaConfig, Transformer
from perfmodel.acceptance.trees import Tree, load_tree
from perfmodel.base.errors import PerfkitError
from perfmodel.base.jsonfile import read_json
from perfmodel.cli import Parser, run
from perfmodel.cli.fields import POSITIONAL, add_options, option, read_options
from perfmodel.models.config import BUNDLED_MODEL, load_model, resolve_model_path
from perfmodel.models.hf_config import parse_medusa_config, read_config_json, read_hf_config
from perfmodel.models.unpriced import check_runs_dense

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
    eagle: EagleDrafter | None = None  # the EAGLE drafter shipped beside the heads, if any


def _config_file(folder: Path) -> Path:
    path = folder / "config.json"
    if not path.is_file():
        raise PerfkitError(f"missing checkpoint file {path}")
    return path


def _load_tensors(files: list[Path]) -> tuple[dict[str, torch.Tensor], dict[str, Path]]:
    """The tensors of `files`, and the file each came from (errors name the file)."""
    from safetensors.torch import load_file

    tensors, origin = {}, {}
    for file in files:
        try:
            if file.suffix == ".pt":
                loaded = torch.load(file, map_location="cpu", weights_only=True)
            else:
                loaded = load_file(file)
        except (SafetensorError, pickle.UnpicklingError, EOFError, RuntimeError, ValueError, OSError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise PerfkitError(f"{file}: not a readable weight file ({reason}); it is damaged or truncated") from None
        if not isinstance(loaded, dict):
            raise PerfkitError(f"{file}: holds a {type(loaded).__name__}, not a dict of tensors")
        twice = [k for k in loaded if k in origin]
        if twice:
            raise PerfkitError(f"{file}: holds {_listed(twice)}, already in {origin[twice[0]]}; which one is meant?")
        tensors.update(loaded)
        origin.update(dict.fromkeys(loaded, file))
    return tensors, origin


def _listed(names: list[str], limit: int = 4) -> str:
    return ", ".join(names[:limit]) + (f" ... ({len(names)} in all)" if len(names) > limit else "")


def check_tensors(expected: dict[str, torch.Tensor], state: dict, origin: dict[str, Path], config_file: Path) -> None:
    """Every tensor the config implies is there with its shape, and no other: a config that
    disagrees with its weights (say num_hidden_layers 2 over 4 layers' weights) would
    otherwise run part of the network and still print plausible text."""
    files = sorted({str(f) for f in origin.values()}) or ["the weight files"]
    derived = "rotary_emb.inv_freq"  # older HF files store RoPE's frequencies; they are recomputed
    missing = [k for k in expected if k not in state and not k.endswith(derived)]
    if missing:
        raise PerfkitError(
            f"{', '.join(files)}: lacks tensors that {config_file} implies: {_listed(missing)}; the config and the "
            f"weights disagree"
        )
    unused = [k for k in state if k not in expected and not k.endswith(derived)]
    if unused:
        by_file = sorted({str(origin[k]) for k in unused})
        raise PerfkitError(
            f"{', '.join(by_file)}: holds tensors that {config_file} does not use: {_listed(unused)}; the config and "
            f"the weights disagree (num_hidden_layers or another shape?)"
        )
    for key, tensor in expected.items():
        if key in state and tuple(state[key].shape) != tuple(tensor.shape):
            raise PerfkitError(
                f"{origin.get(key, files[0])}: {key} has shape {tuple(state[key].shape)} where {config_file} implies "
                f"{tuple(tensor.shape)}; the config and the weights disagree"
            )


def resolve_folder(model: str | Path) -> Path:
    """The checkpoint folder a --model names (perfmodel.cli.options.model): bundled or
    medusa2, a folder, or a config.json, whose weights are beside it."""
    path = resolve_model_path(model)
    if path is not None and path.is_file() and path.name == "config.json":
        path = path.parent
    if path is None and is_preset(model):
        raise PerfkitError(
            f"model {model!r} is a preset: shapes without weights, which this command cannot run; give a checkpoint "
            "folder, its config.json, or bundled"
        )
    folder = path or Path(model)
    if not folder.is_dir():
        hint = " (the bundled model is made by `python -m decoder.train`)" if str(model) == "bundled" else ""
        raise PerfkitError(f"model folder {folder} does not exist{hint}")
    return folder


def is_preset(model: str | Path) -> bool:
    """Whether `model` names one of perfmodel's presets (llama-7b, ...) rather than files."""
    if resolve_model_path(model) is not None:
        return False
    try:
        load_model(model)
    except PerfkitError:
        return False
    return True


def load_checkpoint(model: str | Path = "bundled", heads: str | Path | None = None, dtype=torch.float32) -> Checkpoint:
    folder = resolve_folder(model)
    config_file = _config_file(folder)
    check_runs_dense(read_config_json(config_file), config_file, "the reference decoder")
    parsed = read_hf_config(config_file)
    config = LlamaConfig.from_hf(parsed)
    weights = sorted(p for p in folder.glob("*.safetensors") if p.name not in (*HEADS_FILES, *EAGLE_FILES.values()))
    if not weights:
        raise PerfkitError(f"missing checkpoint file: no *.safetensors weights in {folder}")
    verify_manifest(folder)
    state, origin = _load_tensors(weights)
    tied = config.tie_word_embeddings or "lm_head.weight" not in state
    if tied and "model.embed_tokens.weight" in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    net = Transformer(config)
    check_tensors(net.state_dict(), state, origin, config_file)
    net.load_state_dict(state, strict=False)
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
        if heads_folder != folder:
            verify_manifest(heads_folder)
        try:
            medusa.load_state_dict(_load_tensors(files[:1])[0])
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

        try:
            tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as exc:  # the tokenizers library raises a bare Exception for a bad file
            raise PerfkitError(f"{folder / 'tokenizer.json'}: not a readable tokenizer ({exc})") from None
    info = read_json(folder / "training.json", "training card") if (folder / "training.json").exists() else {}
    if not isinstance(info, dict):
        raise PerfkitError(f"{folder / 'training.json'}: expected a JSON object (the training card)")
    eagle = load_eagle(folder, config, EagleLayout.PROJECT, dtype)
    return Checkpoint(folder, config, net, medusa, tokenizer, tree, info, eagle)


def load_eagle(folder: Path, config: LlamaConfig, layout: EagleLayout, dtype) -> EagleDrafter | None:
    """The checkpoint folder's EAGLE drafter of `layout` (decoder.eagle.EAGLE_FILES), None
    where it has none."""
    path = Path(folder) / EAGLE_FILES[layout]
    if not path.exists():
        return None
    eagle = EagleDrafter(config, layout)
    try:
        eagle.load_state_dict(_load_tensors([path])[0])
    except RuntimeError as exc:
        raise PerfkitError(f"{path}: not this model's {layout} EAGLE drafter ({str(exc).splitlines()[0]})") from None
    return eagle.to(dtype).eval()


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
    for path in folder.iterdir():
        normal_mode(path)
    write_manifest(folder)


def folder_in_the_way(target: Path) -> str | None:
    """Why writing a checkpoint to `target` would replace something (None: nothing there)."""
    if not target.exists():
        return None
    if not target.is_dir():
        return f"{target} is a file, not a folder"
    files = list(target.iterdir())
    return f"{target} already holds {len(files)} file(s)" if files else None


@contextmanager
def replacing(target: Path) -> Iterator[Path]:
    """A new sibling folder to write a checkpoint into, which then takes `target`'s place
    whole: the result holds exactly what was written (no file of the old checkpoint, such as
    its acceptance record, survives beside new weights), and a failure or a kill while
    writing leaves `target` as it was. Only a non-checkpoint folder is refused, so a slip
    of --out cannot delete unrelated files."""
    if target.is_dir() and any(target.iterdir()) and not (target / "config.json").is_file():
        raise PerfkitError(f"{target} is not a checkpoint folder (no config.json); choose a new or empty folder")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.new-", dir=target.parent))
    try:
        yield staging
        for path in (staging, *staging.iterdir()):
            normal_mode(path)
        _swap_in(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _swap_in(staging: Path, target: Path) -> None:
    """Two renames on one file system: the old folder aside, the new one in its place; the
    old one is removed only once the new one is there."""
    if not target.exists():
        staging.rename(target)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
    old.rmdir()
    target.rename(old)
    try:
        staging.rename(target)
    except OSError:
        old.rename(target)
        raise
    shutil.rmtree(old, ignore_errors=True)


@dataclass(frozen=True)
class CheckpointOptions:
    """The command's options, each declared once (perfmodel.cli.fields)."""

    folder: str = field(
        default="", metadata=option(POSITIONAL, "the checkpoint folder to check", metavar="DIR|bundled|medusa2")
    )
    rehash: bool = field(
        default=False,
        metadata=option(
            "--rehash",
            f"first write {MANIFEST} anew from the weight files now in the folder (after changing them on purpose)",
            action="store_true",
        ),
    )


def build_parser() -> Parser:
    p = Parser(
        prog="python -m decoder.checkpoint",
        description="Check a checkpoint folder: its weights against checksums.sha256, and its config against its "
        "weights.",
    )
    add_options(p, CheckpointOptions)
    return p


def main(argv: list[str] | None = None) -> int:
    args = read_options(CheckpointOptions, build_parser().parse_args(argv))
    folder = resolve_folder(args.folder)
    if args.rehash:
        write_manifest(folder)
        print(f"wrote {folder / MANIFEST} ({len(weight_files(folder))} weight files)")
    ckpt = load_checkpoint(folder)
    checked = "checksums verified" if (folder / MANIFEST).is_file() else f"no {MANIFEST}: checksums not checked"
    heads = f", {len(ckpt.heads)} Medusa heads" if ckpt.heads is not None else ""
    print(f"{folder}: loads ({ckpt.config.num_hidden_layers} layers{heads}); {checked}")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
