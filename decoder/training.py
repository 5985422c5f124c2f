"""Training the bundled model from the offline corpus: its tokenizer, the backbone (with a
checkpoint every stage, so an interrupted run resumes), the Medusa heads, and the whole build
that python -m decoder.train runs.
"""

from __future__ import annotations

import dataclasses
import json
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from decoder.checkpoint import replacing, save_checkpoint
from decoder.corpus import EOS, sample_prompts
from decoder.heads import MedusaHeads, medusa_loss
from decoder.model import Transformer
from decoder.stages import (
    TrainConfig,
    as_shipped,
    cosine_batches,
    distill,
    encode,
    heldout_loss,
    measure_accuracy,
    training_texts,
)
from perfmodel.acceptance.trees import expected_acceptance, greedy_tree
from perfmodel.base.jsonfile import read_json


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def lr_at(step: int, config: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    progress = (step - config.warmup) / max(1, config.steps - config.warmup)
    return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train_backbone(config: TrainConfig, stream: np.ndarray, work: Path, log) -> tuple[Transformer, dict]:
    """Train (or resume training) the backbone on random windows of the token stream."""
    model_config = config.model_config(eos=config_eos(work))
    torch.manual_seed(config.seed)
    model = Transformer(model_config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.95), weight_decay=0.1)
    rng = np.random.default_rng(config.seed)
    state_file, step, losses, spent = work / "backbone.pt", 0, [], 0.0
    if state_file.exists():
        state = torch.load(state_file, weights_only=False)
        if state["config"] == dataclasses.asdict(config):
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            rng.bit_generator.state = state["rng"]
            step, losses, spent = state["step"], state["losses"], state["seconds"]
            log(f"backbone: resuming at step {step}/{config.steps}")
    from tqdm import tqdm

    bar = tqdm(total=config.steps, initial=step, unit="step", disable=None, file=sys.stderr)
    started = time.perf_counter() - spent
    model.train()
    while step < config.steps:
        starts = rng.integers(0, len(stream) - config.seq_len - 1, size=config.batch)
        batch = torch.from_numpy(np.stack([stream[s : s + config.seq_len + 1] for s in starts]).astype(np.int64))
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, config)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
        step += 1
        bar.update()
        bar.set_postfix(loss=f"{np.mean(losses[-50:]):.3f}")
        if step % 100 == 0 or step == config.steps:
            state = dict(
                config=dataclasses.asdict(config),
                model=model.state_dict(),
                optimizer=optimizer.state_dict(),
                rng=rng.bit_generator.state,
                step=step,
                losses=losses,
                seconds=time.perf_counter() - started,
            )
            torch.save(state, state_file.with_suffix(".tmp"))
            state_file.with_suffix(".tmp").replace(state_file)  # a kill never corrupts the resume point
    bar.close()
    model.eval()
    return model, {
        "steps": step,
        "tokens": step * config.batch * config.seq_len,
        "seconds": round(time.perf_counter() - started, 1),
        "final_loss": round(float(np.mean(losses[-50:])), 4),
    }


def config_eos(work: Path) -> int:
    return read_json(work / "meta.json", "training work record")["eos"]


def train_heads(
    model: Transformer, sequences: torch.Tensor, prompt_len: int, config: TrainConfig, log
) -> tuple[MedusaHeads, dict]:
    """Medusa-1: backbone frozen, heads trained on its hidden states and continuations."""
    torch.manual_seed(config.seed)
    with torch.inference_mode():
        hidden = torch.cat([model.hidden(sequences[i : i + 256]) for i in range(0, len(sequences), 256)])
    heads = MedusaHeads(config.hidden_size, config.vocab_size, config.medusa_heads, lm_head=model.lm_head.weight.data)
    optimizer = torch.optim.AdamW(heads.parameters(), lr=config.head_lr, weight_decay=0.0)
    target_mask = torch.zeros_like(sequences, dtype=torch.bool)
    target_mask[:, prompt_len:] = True  # learn the model's own continuations, not the prompt text
    started, steps = time.perf_counter(), 0
    schedule = cosine_batches(
        optimizer, config.head_lr, len(sequences), config.head_batch, config.head_epochs, config.seed
    )
    for epoch, batches in schedule:
        for idx in batches:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = heads(hidden[idx].clone())
            loss, accuracy = medusa_loss(logits, sequences[idx], target_mask=target_mask[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            steps += 1
        log(
            f"heads: epoch {epoch + 1}/{config.head_epochs}, loss {float(loss.detach()):.3f}, top-1 accuracy "
            f"{[round(float(a), 3) for a in accuracy]}"
        )
    heads.eval()
    return heads, {
        "steps": steps,
        "sequences": len(sequences),
        "seconds": round(time.perf_counter() - started, 1),
        "final_loss": round(float(loss.detach()), 4),
    }


def build(config: TrainConfig, out: Path, work: Path, log=print) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    card: dict = {
        "config": dataclasses.asdict(config),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    t0 = time.perf_counter()
    train_texts, heldout_texts, corpus = training_texts(config)
    card["corpus"] = corpus

    tokenizer_file = work / "tokenizer.json"
    meta = work / "meta.json"
    if (
        tokenizer_file.exists()
        and meta.exists()
        and read_json(meta, "training work record").get("config") == dataclasses.asdict(config)
    ):
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(tokenizer_file))
    else:
        tokenizer = train_tokenizer(train_texts, config.vocab_size)
        tokenizer.save(str(tokenizer_file))
        (work / "meta.json").write_text(
            json.dumps({"config": dataclasses.asdict(config), "eos": tokenizer.token_to_id(EOS)})
        )
    eos = tokenizer.token_to_id(EOS)
    train_docs, heldout_docs = encode(tokenizer, train_texts), encode(tokenizer, heldout_texts)
    stream = np.array([t for doc in train_docs for t in (*doc, eos)], dtype=np.int32)
    card["tokenizer"] = {
        "vocab_size": tokenizer.get_vocab_size(),
        "train_tokens": int(len(stream)),
        "heldout_tokens": sum(map(len, heldout_docs)),
        "chars_per_token": round(corpus["train_bytes"] / len(stream), 2) if not config.max_files else None,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    log(f"tokenizer: {card['tokenizer']}")

    model, card["backbone"] = train_backbone(config, stream, work, log)
    model = as_shipped(model)
    card["backbone"]["parameters"] = sum(p.numel() for p in model.parameters())
    card["backbone"]["heldout_loss"] = round(heldout_loss(model, heldout_docs, config), 4)
    log(f"backbone: {card['backbone']}")

    t0 = time.perf_counter()
    train_prompts = sample_prompts(train_docs, config.distill_prompts, config.distill_prompt_len, seed=config.seed)
    sequences = distill(model, train_prompts, config.distill_new, log, "self-distillation")
    heldout_prompts = sample_prompts(heldout_docs, config.eval_prompts, config.distill_prompt_len, seed=config.seed + 2)
    heldout_sequences = distill(model, heldout_prompts, config.distill_new, log, "held-out continuations")
    card["distillation"] = {
        "sequences": len(sequences),
        "tokens": int(sequences.numel()),
        "seconds": round(time.perf_counter() - t0, 1),
    }

    heads, card["heads"] = train_heads(model, sequences, config.distill_prompt_len, config, log)
    heads = as_shipped(heads)
    card["heads"]["parameters"] = sum(p.numel() for p in heads.parameters())
    accuracy = measure_accuracy(model, heads, heldout_sequences, config.distill_prompt_len)
    tree = greedy_tree(accuracy, config.tree_nodes)
    card["heldout_head_accuracy"] = np.round(accuracy, 4).tolist()
    card["default_tree"] = {
        "nodes": len(tree.paths),
        "depth": tree.depth,
        "expected_tokens_per_step": round(expected_acceptance(tree, accuracy), 3),
    }
    log(
        f"heads: held-out top-1 accuracy per head {np.round(accuracy[:, 0], 3).tolist()}; default tree "
        f"{card['default_tree']}"
    )
    with replacing(out) as staging:
        save_checkpoint(staging, model, heads, tokenizer, tree, card)
        card["assets_bytes"] = sum(f.stat().st_size for f in staging.iterdir())
        (staging / "training.json").write_text(json.dumps(card, indent=1))
    return card
