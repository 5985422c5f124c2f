"""What the Medusa-1 pipeline (decoder.train) and Medusa-2 (decoder.medusa2) share: the
training configuration of the bundled model, its corpus split, self-distillation, and the
measurements of a backbone and its heads on held-out text."""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from decoder.checkpoint import Checkpoint
from decoder.corpus import sample_prompts, split_corpus
from decoder.heads import MedusaHeads, topk_accuracy
from decoder.medusa import Decoder
from decoder.model import LlamaConfig, Transformer
from perfmodel.base.errors import PerfkitError
from perfmodel.models.operators import HEAD_TOP_K


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    vocab_size: int = 2048
    hidden_size: int = 256
    intermediate_size: int = 640
    layers: int = 4
    attention_heads: int = 8
    kv_heads: int = 4
    seq_len: int = 256
    batch: int = 16
    steps: int = 2000
    lr: float = 2e-3
    warmup: int = 100
    medusa_heads: int = 4
    distill_prompts: int = 4096
    distill_prompt_len: int = 32
    distill_new: int = 96
    eval_prompts: int = 256
    head_epochs: int = 4
    head_batch: int = 32
    head_lr: float = 1e-3
    tree_nodes: int = 48
    max_files: int | None = None

    def model_config(self, eos: int) -> LlamaConfig:
        return LlamaConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.layers,
            num_attention_heads=self.attention_heads,
            num_key_value_heads=self.kv_heads,
            max_position_embeddings=4096,
            tie_word_embeddings=True,
            eos_token_id=eos,
        )


# Minutes, not hours: for the tests and for trying the pipeline end to end.
QUICK = TrainConfig(
    vocab_size=384,
    hidden_size=64,
    intermediate_size=128,
    layers=2,
    attention_heads=4,
    kv_heads=2,
    seq_len=64,
    batch=8,
    steps=30,
    warmup=5,
    distill_prompts=64,
    distill_prompt_len=16,
    distill_new=24,
    eval_prompts=16,
    head_epochs=2,
    head_batch=16,
    tree_nodes=8,
    max_files=30,
)


def encode(tokenizer, texts: list[str]) -> list[list[int]]:
    return [e.ids for e in tokenizer.encode_batch(texts)]


def heldout_loss(model: Transformer, documents: list[list[int]], config: TrainConfig) -> float:
    windows = sample_prompts(documents, 64, config.seq_len + 1, seed=config.seed + 1)
    batch = torch.tensor(windows)
    with torch.inference_mode():
        logits = model(batch[:, :-1])
    return float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)))


def distill(model: Transformer, prompts: list[list[int]], new_tokens: int, log, what: str) -> torch.Tensor:
    """The backbone's greedy continuations of `prompts`: (N, prompt + new) tokens."""
    decoder = Decoder(Checkpoint(Path("."), model.config, model, None, None, None, {}))
    rows = []
    from tqdm import tqdm

    for start in tqdm(range(0, len(prompts), 128), desc=what, unit="batch", disable=None, file=sys.stderr):
        chunk = prompts[start : start + 128]
        result = decoder.generate(chunk, new_tokens)
        rows += [p + t for p, t in zip(chunk, result.tokens)]
    return torch.tensor(rows)


def self_distilled(checkpoint, config, quick_corpus: bool, what: str, log) -> tuple[torch.Tensor, torch.Tensor, float]:
    """A drafter's training data: the checkpoint's greedy continuations of training prompts and
    of held-out ones, as `config` sizes them (its distill_prompts, distill_prompt_len,
    distill_new, eval_prompts and seed), and the seconds they took."""
    if checkpoint.tokenizer is None:
        raise PerfkitError(f"{checkpoint.folder} has no tokenizer.json: its training prompts cannot be encoded")
    texts = training_texts(QUICK if quick_corpus else TrainConfig())
    train_docs, heldout_docs = encode(checkpoint.tokenizer, texts[0]), encode(checkpoint.tokenizer, texts[1])
    model = checkpoint.model.float().eval()
    started = time.perf_counter()
    prompts = sample_prompts(train_docs, config.distill_prompts, config.distill_prompt_len, seed=config.seed)
    sequences = distill(model, prompts, config.distill_new, log, f"{what} self-distillation")
    heldout = sample_prompts(heldout_docs, config.eval_prompts, config.distill_prompt_len, seed=config.seed + 2)
    heldout_sequences = distill(model, heldout, config.distill_new, log, "held-out continuations")
    return sequences, heldout_sequences, time.perf_counter() - started


def measure_accuracy(model: Transformer, heads: MedusaHeads, sequences: torch.Tensor, prompt_len: int) -> np.ndarray:
    """a_k^(i): how often rank i of head k names the model's own token k+1 steps ahead."""
    with torch.inference_mode():
        logits = heads(model.hidden(sequences))
    mask = torch.zeros_like(sequences, dtype=torch.bool)
    mask[:, prompt_len:] = True
    return topk_accuracy(logits, sequences, HEAD_TOP_K, mask)


def as_shipped(module: torch.nn.Module) -> torch.nn.Module:
    """The module, in place, as the fp16 checkpoint will load it (fp16 weights read back as
    fp32): what is measured and recorded is the model shipped, not its fp32 training copy,
    which decodes a few held-out tokens differently."""
    return module.half().float().eval()


def training_texts(config: TrainConfig) -> tuple[list[str], list[str], dict]:
    """The corpus split a model of `config` is trained and measured on (--quick keeps a few files)."""
    train_texts, heldout_texts, corpus = split_corpus()
    if config.max_files:
        train_texts, heldout_texts = train_texts[: config.max_files], heldout_texts[: max(2, config.max_files // 10)]
    return train_texts, heldout_texts, corpus


def train_epochs(module: torch.nn.Module, loss_of, count: int, config, what: str, log, clip: float | None = None):
    """Train `module` with AdamW (no weight decay) on a cosine schedule for `config.epochs`
    shuffled passes over `count` rows in batches of `config.batch` (its lr and seed too);
    loss_of(indices) -> (loss, top-1 accuracy). Returns the steps taken and the last loss."""
    optimizer = torch.optim.AdamW(module.parameters(), lr=config.lr, weight_decay=0.0)
    steps = 0
    for epoch, batches in cosine_batches(optimizer, config.lr, count, config.batch, config.epochs, config.seed):
        for idx in batches:
            loss, accuracy = loss_of(idx)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(module.parameters(), clip)
            optimizer.step()
            steps += 1
        log(f"{what}: epoch {epoch + 1}/{config.epochs}, loss {float(loss.detach()):.4f}, top-1 {float(accuracy):.3f}")
    return steps, float(loss.detach())


def cosine_batches(optimizer: torch.optim.Optimizer, lr: float, count: int, batch: int, epochs: int, seed: int):
    """(epoch, its minibatches): `epochs` shuffled passes over `count` rows in batches of
    `batch` indices, the optimizer's learning rate set on a cosine from `lr` to 0 before each."""
    total = epochs * math.ceil(count / batch)
    generator = torch.Generator().manual_seed(seed)
    step = 0

    def passes(order: torch.Tensor):
        nonlocal step
        for i in range(0, count, batch):
            for group in optimizer.param_groups:
                group["lr"] = lr * 0.5 * (1 + math.cos(math.pi * step / total))
            step += 1
            yield order[i : i + batch]

    for epoch in range(epochs):
        yield epoch, passes(torch.randperm(count, generator=generator))
