"""Training a draft model for a checkpoint: a one-layer Llama of the same tokenizer and
vocabulary, distilled on the checkpoint's own greedy continuations of training prompts (what
a greedy draft must predict: the target's next tokens, not the corpus'), as its Medusa heads
and EAGLE drafter are. Unlike them it reads nothing of the target: its own embedding, layer
and LM head, a whole small model that a serving engine runs beside the target (vLLM's
`draft_model` method).

`python -m decoder.train --draft-model` runs it and writes the draft as a checkpoint folder of
its own (default perf-reports/trained-draft; --install: decoder/assets/draft, the `draft`
model), its training.json naming the target it was distilled from.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from decoder.checkpoint import Checkpoint, replacing, save_checkpoint
from decoder.manifest import write_manifest
from decoder.model import LlamaConfig, Transformer
from decoder.stages import as_shipped, self_distilled, train_epochs
from perfmodel.base.errors import PerfkitError


@dataclass(frozen=True)
class DraftConfig:
    seed: int = 0
    layers: int = 1
    hidden_size: int = 128
    intermediate_size: int = 320
    attention_heads: int = 4  # head_dim 32, the target's: the engine's attention kernels take it
    kv_heads: int = 2
    distill_prompts: int = 2048
    distill_prompt_len: int = 32
    distill_new: int = 96
    eval_prompts: int = 128
    epochs: int = 8
    batch: int = 32
    lr: float = 3e-3


QUICK_DRAFT = DraftConfig(distill_prompts=32, distill_new=24, eval_prompts=8, epochs=1, batch=16)
# The draft model trained for each shipped model, by name
DRAFT_MODELS = {"bundled": "draft"}


def draft_for(model: str | Path) -> str:
    """The draft model of `model` (a shipped model's name)."""
    if str(model) not in DRAFT_MODELS:
        raise PerfkitError(
            f"no draft model for {model}: the shipped ones draft for {', '.join(DRAFT_MODELS)} "
            "(python -m decoder.train --draft-model --model MODEL trains one)"
        )
    return DRAFT_MODELS[str(model)]


def draft_shape(target: LlamaConfig, config: DraftConfig) -> LlamaConfig:
    """The draft's shapes: the target's vocabulary, tokens and positions, a smaller body."""
    return dataclasses.replace(
        target,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.layers,
        num_attention_heads=config.attention_heads,
        num_key_value_heads=config.kv_heads,
        head_dim=config.hidden_size // config.attention_heads,
        medusa_num_heads=0,
        tie_word_embeddings=True,
    )


def next_token_loss(draft: Transformer, sequences: torch.Tensor, prompt_len: int):
    """Cross entropy of the draft's next token over the continuation (the prompt's text is
    read, not learned); returns the loss and the top-1 accuracy."""
    logits = draft(sequences[:, :-1])[:, prompt_len - 1 :]
    targets = sequences[:, prompt_len:]
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
    accuracy = (logits.argmax(-1) == targets).float().mean()
    return loss, accuracy


def train_draft(shape: LlamaConfig, sequences: torch.Tensor, config: DraftConfig, log) -> tuple[Transformer, dict]:
    """The draft trained on the target's continuations `sequences` (N, prompt + new)."""
    torch.manual_seed(config.seed)
    draft = Transformer(shape)
    started = time.perf_counter()
    draft.train()

    def loss_of(idx):
        return next_token_loss(draft, sequences[idx], config.distill_prompt_len)

    steps, last = train_epochs(draft, loss_of, len(sequences), config, "draft", log, clip=1.0)
    draft = as_shipped(draft)
    return draft, {
        "steps": steps,
        "sequences": len(sequences),
        "seconds": round(time.perf_counter() - started, 1),
        "final_loss": round(last, 4),
        "parameters": sum(p.numel() for p in draft.parameters()),
        "config": asdict(config),
    }


def build_draft(checkpoint: Checkpoint, out: Path, config: DraftConfig, quick_corpus: bool, log=print) -> dict:
    """Train a draft model for `checkpoint` and write it to `out` as a checkpoint folder (its
    weights, the target's tokenizer, training.json with a `draft` entry, checksums); returns
    that entry."""
    sequences, heldout_sequences, distilled_s = self_distilled(checkpoint, config, quick_corpus, "draft", log)
    target = checkpoint.model
    draft, card = train_draft(draft_shape(checkpoint.config, config), sequences, config, log)
    with torch.inference_mode():
        _, accuracy = next_token_loss(draft, heldout_sequences, config.distill_prompt_len)
    card.update(
        distillation_seconds=round(distilled_s, 1),
        heldout_top1=round(float(accuracy), 4),
        target=str(checkpoint.folder.name),
        target_parameters=sum(p.numel() for p in target.parameters()),
    )
    log(f"draft: {card['parameters']:,} parameters, held-out top-1 {card['heldout_top1']}")
    with replacing(out) as staging:
        save_checkpoint(staging, draft, None, checkpoint.tokenizer, info={"draft": card})
        write_manifest(staging)
    return card
