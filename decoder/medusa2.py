"""Medusa-2 (paper section 2.2.2): the backbone trained jointly with its Medusa heads.

Starting from a Medusa-1 checkpoint (its heads are the heads warm-up), on the original
model's own greedy continuations of training prompts (self-distillation):
  loss = KL(original || adapted next-token distribution) + lambda_0 * L_Medusa-1,
the original being the adapted model with its LoRA adapters off (no second copy). The
backbone trains only through LoRA; the heads train fully at 4x its learning rate, so
they adapt fast while the backbone stays close to the original (the paper's recipe).
The KL term keeps the adapted model's next-token distributions close to the original's
(held-out KL ~0.02 for the shipped model), not its greedy decoding identical: a small
shift flips near-ties, and a flipped token changes everything after it, so only ~34% of
held-out continuation tokens and ~16% of whole continuations match the original's
(training.json, quality.greedy_agreement). Decoding with the Medusa-2 model is lossless
with respect to the Medusa-2 model itself, not to the original.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from decoder.checkpoint import Checkpoint, load_checkpoint, replacing, resolve_folder, save_checkpoint
from decoder.corpus import sample_prompts
from decoder.eagle import EAGLE_FILES
from decoder.heads import MedusaHeads, medusa_loss
from decoder.lora import adapters_off, add_lora, lora_parameters, merged
from decoder.model import Transformer
from decoder.stages import TrainConfig, as_shipped, distill, encode, heldout_loss, measure_accuracy, training_texts
from perfmodel.acceptance.trees import expected_acceptance, greedy_tree
from perfmodel.base.errors import PerfkitError
from perfmodel.base.paths import TOOLKIT_ROOT


@dataclass(frozen=True)
class Medusa2Config:
    lora_rank: int = 16
    lora_alpha: float = 32.0
    lr: float = 2.5e-4  # LoRA (backbone) learning rate; the heads get heads_lr_ratio times it
    heads_lr_ratio: float = 4.0
    lambda_0: float = 0.2  # weight of the Medusa-1 loss
    lambda_ramp: float = 0.25  # fraction of the run over which lambda rises to lambda_0 (sine)
    epochs: int = 2
    batch: int = 32
    distill_sequences: int = 6144
    warmup: int = 20
    weight_decay: float = 0.0
    seed: int = 0
    checkpoint_every: int = 25
    eval_tree_tokens: tuple[int, ...] = (16, 64)  # tree sizes reported beside the default tree's

    @property
    def heads_lr(self) -> float:
        return self.lr * self.heads_lr_ratio


# Seconds, not minutes: for the tests and for trying the stage on a --quick model.
QUICK = Medusa2Config(
    lora_rank=4, lora_alpha=8.0, epochs=1, batch=16, distill_sequences=64, warmup=1, checkpoint_every=2
)

DISTILL_FILE, HELDOUT_FILE, STATE_FILE = "medusa2-distill.pt", "medusa2-heldout.pt", "medusa2-state.pt"


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


def _save_atomically(obj, path: Path) -> None:
    torch.save(obj, path.with_suffix(".tmp"))
    path.with_suffix(".tmp").replace(path)  # a kill never leaves a half-written file to resume from


def cached(path: Path, key: dict, compute):
    """compute(), kept in `path` under `key`: reused while the key matches."""
    if path.exists():
        saved = torch.load(path, weights_only=False)
        if saved["key"] == key:
            return saved["value"]
    value = compute()
    _save_atomically({"key": key, "value": value}, path)
    return value


def schedule(step: int, total: int, config: Medusa2Config) -> tuple[float, float]:
    """(learning-rate factor, lambda) at `step`: linear warm-up then cosine to a tenth; lambda
    rising as sin(pi/2 x progress) over the ramp, so the heads' loss cannot pull the
    backbone hard before the adapters have found their footing (the reference's sine
    schedule, over part of the run rather than all of it since the heads start trained)."""
    if step < config.warmup:
        factor = (step + 1) / config.warmup
    else:
        progress = (step - config.warmup) / max(1, total - config.warmup)
        factor = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))
    ramp = max(1.0, config.lambda_ramp * total)
    return factor, config.lambda_0 * math.sin(0.5 * math.pi * min(1.0, (step + 1) / ramp))


def build_optimizer(model: Transformer, heads: MedusaHeads, config: Medusa2Config) -> torch.optim.AdamW:
    """Two groups: the LoRA adapters at lr, the heads at heads_lr_ratio x lr; nothing else trains."""
    return torch.optim.AdamW(
        [
            {"params": lora_parameters(model), "lr": config.lr, "base_lr": config.lr},
            {"params": list(heads.parameters()), "lr": config.heads_lr, "base_lr": config.heads_lr},
        ],
        betas=(0.9, 0.999),
        weight_decay=config.weight_decay,
    )


def joint_loss(model: Transformer, heads: MedusaHeads, tokens: torch.Tensor, target_mask: torch.Tensor, lam: float):
    """(loss, KL, Medusa-1 loss, heads' top-1 accuracy) on a batch of distilled sequences."""
    with torch.no_grad(), adapters_off(model):
        teacher = F.log_softmax(model(tokens).float(), dim=-1)
    hidden = model.hidden(tokens)
    student = F.log_softmax(model.lm_head(hidden).float(), dim=-1)
    # Every position, prompt included: the teacher's distribution is defined there too, and
    # matching it on human-written code keeps the backbone the original beyond its own text.
    kl = (teacher.exp() * (teacher - student)).sum(-1).mean()
    medusa, accuracy = medusa_loss(heads(hidden), tokens, target_mask=target_mask)
    return kl + lam * medusa, kl, medusa, accuracy


def train_joint(
    model: Transformer,
    heads: MedusaHeads,
    sequences: torch.Tensor,
    prompt_len: int,
    config: Medusa2Config,
    work: Path,
    base_id: str,
    log,
) -> dict:
    """Train (or resume training) the adapters and heads in place; a record of the run."""
    optimizer = build_optimizer(model, heads, config)
    per_epoch = math.ceil(len(sequences) / config.batch)
    total = config.epochs * per_epoch
    # The data order is a pure function of the seed, so a resumed run sees the batches an uninterrupted one would.
    generator = torch.Generator().manual_seed(config.seed)
    orders = [torch.randperm(len(sequences), generator=generator) for _ in range(config.epochs)]
    target_mask = torch.zeros_like(sequences, dtype=torch.bool)
    target_mask[:, prompt_len:] = True  # heads learn the model's continuations, not the prompt text
    trainable = [p for group in optimizer.param_groups for p in group["params"]]

    state_file, step, history, spent = work / STATE_FILE, 0, [], 0.0
    identity = {"config": dataclasses.asdict(config), "base": base_id, "sequences": len(sequences)}
    if state_file.exists():
        state = torch.load(state_file, weights_only=False)
        if state["identity"] == identity:
            model.load_state_dict(state["model"])
            heads.load_state_dict(state["heads"])
            optimizer.load_state_dict(state["optimizer"])
            step, history, spent = state["step"], state["history"], state["seconds"]
            log(f"medusa-2: resuming at step {step}/{total}")
    from tqdm import tqdm

    bar = tqdm(total=total, initial=step, unit="step", desc="medusa-2", disable=None, file=sys.stderr)
    started = time.perf_counter() - spent
    model.train()
    heads.train()
    while step < total:
        epoch, i = divmod(step, per_epoch)
        idx = orders[epoch][i * config.batch : (i + 1) * config.batch]
        factor, lam = schedule(step, total, config)
        for group in optimizer.param_groups:
            group["lr"] = group["base_lr"] * factor
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, kl, medusa, accuracy = joint_loss(model, heads, sequences[idx], target_mask[idx], lam)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        history.append((float(kl.detach()), float(medusa.detach()), accuracy.tolist()))
        step += 1
        bar.update()
        recent = history[-20:]
        bar.set_postfix(kl=f"{np.mean([h[0] for h in recent]):.4f}", medusa=f"{np.mean([h[1] for h in recent]):.3f}")
        if step % config.checkpoint_every == 0 or step == total:
            state = dict(
                identity=identity,
                model=model.state_dict(),
                heads=heads.state_dict(),
                optimizer=optimizer.state_dict(),
                step=step,
                history=history,
                seconds=time.perf_counter() - started,
            )
            _save_atomically(state, state_file)
    bar.close()
    model.eval()
    heads.eval()
    recent = history[-20:]
    return {
        "steps": step,
        "sequences": len(sequences),
        "tokens": step * config.batch * sequences.shape[1],
        "seconds": round(time.perf_counter() - started, 1),
        "final_kl": float(f"{np.mean([h[0] for h in recent]):.4g}"),
        "final_medusa_loss": round(float(np.mean([h[1] for h in recent])), 4),
        "final_train_top1": np.round(np.mean([h[2] for h in recent], axis=0), 4).tolist(),
        "lora_parameters": sum(p.numel() for p in lora_parameters(model)),
        "heads_parameters": sum(p.numel() for p in heads.parameters()),
    }


def greedy_agreement(original: torch.Tensor, other: torch.Tensor, prompt_len: int) -> dict:
    """How far greedy decoding of `other` departs from the original's, on the same prompts."""
    a, b = original[:, prompt_len:], other[:, prompt_len:]
    same = a == b
    prefix = torch.where(same.all(1), same.shape[1], (~same).int().argmax(1))
    return {
        "tokens_identical": round(float(same.float().mean()), 4),
        "continuations_identical": round(float(same.all(1).float().mean()), 4),
        "mean_identical_prefix_tokens": round(float(prefix.float().mean()), 2),
        "continuation_tokens": int(a.shape[1]),
    }


def heldout_kl(original: Transformer, other: Transformer, sequences: torch.Tensor, prompt_len: int) -> float:
    """Mean KL(original || other) over the continuation positions of held-out sequences."""
    total, count = 0.0, 0
    with torch.inference_mode():
        for i in range(0, len(sequences), 32):
            chunk = sequences[i : i + 32]
            p = F.log_softmax(original(chunk)[:, prompt_len - 1 : -1].float(), dim=-1)
            q = F.log_softmax(other(chunk)[:, prompt_len - 1 : -1].float(), dim=-1)
            kl = (p.exp() * (p - q)).sum(-1)
            total, count = total + float(kl.sum()), count + kl.numel()
    return total / count


def tree_gains(medusa1: np.ndarray, medusa2: np.ndarray, sizes: list[int]) -> list[dict]:
    """Expected tokens per step of the paper's greedy tree of each size (tokens, root
    included), each built from its own heads' accuracies."""
    rows = []
    for tokens in sizes:
        one = expected_acceptance(greedy_tree(medusa1, tokens - 1), medusa1)
        two = expected_acceptance(greedy_tree(medusa2, tokens - 1), medusa2)
        rows.append(
            {
                "tree_tokens": tokens,
                "medusa1": round(one, 3),
                "medusa2": round(two, 3),
                "gain": round(two / one, 4),
            }
        )
    return rows


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
