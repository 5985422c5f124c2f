"""The Medusa-2 stage end to end (python -m decoder.train --medusa2): a Medusa-1 checkpoint
in; its original model's continuations distilled, its adapters and heads trained jointly
(decoder.medusa2), the result evaluated against the original (decoder.medusa2_eval); a
checkpoint folder and its card out.

The distillations and the training state are kept in the work folder, each under a key of
the base model's fingerprint, so an interrupted stage resumes and never mixes two base models.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import time
from pathlib import Path

import numpy as np
import torch

from decoder.checkpoint import Checkpoint, load_checkpoint, replacing, resolve_folder, save_checkpoint
from decoder.corpus import sample_prompts
from decoder.eagle import EAGLE_FILES
from decoder.lora import adapters_off, add_lora, merged
from decoder.medusa2 import Medusa2Config, cached, train_joint
from decoder.medusa2_eval import greedy_agreement, heldout_kl, tree_gains
from decoder.stages import TrainConfig, as_shipped, distill, encode, heldout_loss, measure_accuracy, training_texts
from perfmodel.acceptance.trees import expected_acceptance, greedy_tree
from perfmodel.base.errors import PerfkitError
from perfmodel.base.paths import TOOLKIT_ROOT

DISTILL_FILE, HELDOUT_FILE = "medusa2-distill.pt", "medusa2-heldout.pt"


def load_base(model: str | Path) -> tuple[Checkpoint, TrainConfig]:
    """The Medusa-1 checkpoint to start from, and the training config its card records
    (the corpus split, prompt length and continuation length to reuse)."""
    folder = resolve_folder(model)
    ckpt = load_checkpoint(folder)
    if ckpt.heads is None:
        raise PerfkitError(
            f"{folder} has no Medusa heads (medusa_num_heads in config.json); Medusa-2 starts from a Medusa-1 "
            f"checkpoint, such as the one `python -m decoder.train` writes"
        )
    if ckpt.tokenizer is None:
        raise PerfkitError(f"{folder} has no tokenizer.json, needed to encode the training prompts")
    try:
        base = TrainConfig(**ckpt.info["config"])
    except (KeyError, TypeError) as exc:
        raise PerfkitError(
            f"{folder}/training.json records no training config of decoder.train ({exc}); Medusa-2 needs it to "
            f"reuse the corpus split the checkpoint was trained on"
        ) from None
    return ckpt, base


def fingerprint(folder: Path) -> str:
    """Of the weights and config: a resume or cached distillation never mixes two base models.
    An EAGLE drafter beside them is not the base model's."""
    digest = hashlib.sha1()
    weights = sorted(p for p in folder.glob("*.safetensors") if p.name not in EAGLE_FILES.values())
    for path in weights + [folder / "config.json"]:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def build_medusa2(config: Medusa2Config, base_model: str | Path, out: Path, work: Path, command: str, log=print):
    """The whole stage: distil, train, evaluate, write the checkpoint folder; its card."""
    started = time.perf_counter()
    work.mkdir(parents=True, exist_ok=True)
    ckpt, base = load_base(base_model)
    if out.resolve() == ckpt.folder.resolve():
        raise PerfkitError(f"--out {out} is the base checkpoint itself; write Medusa-2 to another folder")
    base_id = fingerprint(ckpt.folder)
    original, medusa1_heads = ckpt.model, ckpt.heads
    prompt_len, new = base.distill_prompt_len, base.distill_new
    train_texts, heldout_texts, corpus = training_texts(base)
    if corpus["file_list_sha1"] != ckpt.info.get("corpus", {}).get("file_list_sha1"):
        log(f"medusa-2: note: this Python's standard library differs from the one {ckpt.folder} was trained on")
    train_docs, heldout_docs = encode(ckpt.tokenizer, train_texts), encode(ckpt.tokenizer, heldout_texts)

    # Self-distillation with the base config's prompts and seed: the first prompts are the
    # very ones the Medusa-1 heads were trained on, the rest new ones from the same files.
    t0 = time.perf_counter()
    key = {"base": base_id, "count": config.distill_sequences, "prompt_len": prompt_len, "new": new, "seed": base.seed}
    prompts = sample_prompts(train_docs, config.distill_sequences, prompt_len, seed=base.seed)
    sequences = cached(work / DISTILL_FILE, key, lambda: distill(original, prompts, new, log, "self-distillation"))
    heldout_prompts = sample_prompts(heldout_docs, base.eval_prompts, prompt_len, seed=base.seed + 2)
    key = {"base": base_id, "count": base.eval_prompts, "prompt_len": prompt_len, "new": new, "seed": base.seed + 2}
    original_heldout = cached(
        work / HELDOUT_FILE, key, lambda: distill(original, heldout_prompts, new, log, "held-out continuations")
    )
    distill_seconds = time.perf_counter() - t0
    medusa1_accuracy = measure_accuracy(original, medusa1_heads, original_heldout, prompt_len)
    original_loss = heldout_loss(original, heldout_docs, base)

    # From here on the original model is `model` with its adapters off: no second copy.
    torch.manual_seed(config.seed)  # the adapters' initial A
    model, heads = original, medusa1_heads
    add_lora(model, config.lora_rank, config.lora_alpha)
    training = train_joint(model, heads, sequences, prompt_len, config, work, base_id, log)
    log(f"medusa-2: {training}")

    t0 = time.perf_counter()
    medusa2_model, medusa2_heads = as_shipped(merged(model)), as_shipped(heads)
    with adapters_off(model):
        kl = heldout_kl(model, medusa2_model, original_heldout, prompt_len)
    medusa2_heldout = distill(medusa2_model, heldout_prompts, new, log, "medusa-2 held-out continuations")
    # Each model's heads against that model's own greedy continuations: what it accepts when decoding.
    medusa2_accuracy = measure_accuracy(medusa2_model, medusa2_heads, medusa2_heldout, prompt_len)
    cross_accuracy = measure_accuracy(medusa2_model, medusa2_heads, original_heldout, prompt_len)
    tree = greedy_tree(medusa2_accuracy, base.tree_nodes)
    sizes = sorted({len(tree.paths) + 1, *config.eval_tree_tokens})
    figures = {
        "accuracy_note": (
            "heldout_head_accuracy is a_k^(i) of each model's heads on that model's own greedy continuations of the "
            "held-out prompts: the original model's for Medusa-1, the Medusa-2 model's for Medusa-2 (what each "
            "accepts at decode time)"
        ),
        "heldout_prompts": len(heldout_prompts),
        "medusa1_heldout_head_accuracy": np.round(medusa1_accuracy, 4).tolist(),
        "medusa2_heldout_head_accuracy": np.round(medusa2_accuracy, 4).tolist(),
        "top1_per_head": {
            "medusa1": np.round(medusa1_accuracy[:, 0], 4).tolist(),
            "medusa2": np.round(medusa2_accuracy[:, 0], 4).tolist(),
            "medusa2_heads_on_original_continuations": np.round(cross_accuracy[:, 0], 4).tolist(),
        },
        "expected_tokens_per_step": tree_gains(medusa1_accuracy, medusa2_accuracy, sizes),
        "quality": {
            "heldout_loss_original": round(original_loss, 4),
            "heldout_loss_medusa2": round(heldout_loss(medusa2_model, heldout_docs, base), 4),
            "greedy_agreement": greedy_agreement(original_heldout, medusa2_heldout, prompt_len),
            "heldout_kl_original_to_medusa2": float(f"{kl:.4g}"),
        },
    }
    card = copy.deepcopy(ckpt.info)
    card["heldout_head_accuracy"] = figures["medusa2_heldout_head_accuracy"]
    card["default_tree"] = {
        "nodes": len(tree.paths),
        "depth": tree.depth,
        "expected_tokens_per_step": round(expected_acceptance(tree, medusa2_accuracy), 3),
    }
    card["medusa2"] = {
        "command": command,
        "base": {"folder": shown_folder(ckpt.folder), "sha1": base_id},
        "config": {**dataclasses.asdict(config), "heads_lr": config.heads_lr},
        "corpus_file_list_sha1": corpus["file_list_sha1"],
        "training": training,
        **figures,
        "seconds": {
            "distillation": round(distill_seconds, 1),
            "training": training["seconds"],
            "evaluation": round(time.perf_counter() - t0, 1),
            "total": round(time.perf_counter() - started, 1),
        },
    }
    with replacing(out) as staging:
        save_checkpoint(staging, medusa2_model, medusa2_heads, ckpt.tokenizer, tree, card)
        card["assets_bytes"] = sum(f.stat().st_size for f in staging.iterdir())
        (staging / "training.json").write_text(json.dumps(card, indent=1))
    return card


def shown_folder(folder: Path) -> str:
    """The base checkpoint's folder as a card records it: inside the toolkit, relative to
    it (the card travels with the checkpoint), else as given."""
    try:
        return str(folder.resolve().relative_to(TOOLKIT_ROOT))
    except ValueError:
        return str(folder)
