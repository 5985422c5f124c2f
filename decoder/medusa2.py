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

The stage around the training (checkpoint in, distillation, evaluation, checkpoint out) is
decoder.medusa2_build's.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from decoder.heads import MedusaHeads, medusa_loss
from decoder.lora import adapters_off, lora_parameters
from decoder.model import Transformer


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

STATE_FILE = "medusa2-state.pt"


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
