"""Training the EAGLE drafter (decoder.eagle) on a checkpoint, self-distilled as its Medusa
heads are: the backbone (frozen) continues training prompts greedily, and the drafter learns
to predict its next feature (smooth L1) and, through the backbone's LM head, its next token
(cross entropy, weight 0.1 as EAGLE's), over a sliding window of the drafter's context plus
the deepest tree it drafts.

`python -m decoder.train --eagle` runs it (decoder.train); the drafter is written beside the
heads as eagle_drafter.safetensors, with an `eagle` entry in training.json. With
`--eagle-layout vllm` it is vLLM's EAGLE-1 layer instead (decoder.eagle.EagleLayout), trained
attending to every earlier position: eagle_drafter_vllm.safetensors, entry `eagle_vllm`.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from decoder.checkpoint import Checkpoint, replacing
from decoder.eagle import (
    CONTEXT,
    EAGLE_CARDS,
    EAGLE_DEPTH,
    EAGLE_FILES,
    EagleDrafter,
    EagleLayout,
    parameters_of,
    window_mask,
)
from decoder.manifest import MANIFEST, write_manifest
from decoder.model import Transformer
from decoder.stages import as_shipped, self_distilled, train_epochs


def eagle_loss(
    drafter: EagleDrafter, features, tokens, embed, lm_head, window: int | None, cls_weight: float = 0.1, keep=None
):
    """L_reg + w_cls L_cls over sequences: position p reads (f_p, e(x_(p+1))) and is scored
    against f_(p+1) (smooth L1) and x_(p+2) (cross entropy of the LM head on its prediction).
    features: (B, T, h) the target's; tokens: (B, T); keep: (B, T) bool, the targets counted;
    window: the positions each attends to (None: every earlier one).
    Returns the loss and the top-1 token accuracy."""
    inputs = features[:, :-2]
    attend = None if window is None else window_mask(inputs.shape[1], window, features.device)  # None: causal
    predicted = drafter(inputs, embed(tokens[:, 1:-1]), _positions(tokens[:, :-2]), attend)
    target_feature, target_token = features[:, 1:-1], tokens[:, 2:]
    mask = torch.ones_like(target_token, dtype=torch.bool) if keep is None else keep[:, 2:]
    regression = F.smooth_l1_loss(predicted[mask].float(), target_feature[mask].float())
    logits = lm_head(predicted[mask]).float()
    classification = F.cross_entropy(logits, target_token[mask])
    accuracy = (logits.argmax(-1) == target_token[mask]).float().mean()
    return regression + cls_weight * classification, accuracy


def _positions(tokens: torch.Tensor) -> torch.Tensor:
    return torch.arange(tokens.shape[1], device=tokens.device).expand(tokens.shape[0], -1)


@dataclass(frozen=True)
class EagleConfig:
    seed: int = 0
    distill_prompts: int = 1024
    distill_prompt_len: int = 32
    distill_new: int = 96
    eval_prompts: int = 128
    epochs: int = 6
    batch: int = 32
    lr: float = 2e-3
    depth: int = EAGLE_DEPTH  # the deepest draft the window is trained for
    cls_weight: float = 0.1
    layout: EagleLayout = EagleLayout.PROJECT

    @property
    def window(self) -> int | None:
        """The positions each attends to in training: its context and the deepest draft; all
        earlier ones in vLLM's layout (None), as vLLM runs it."""
        return None if self.layout is EagleLayout.VLLM else CONTEXT + self.depth


QUICK_EAGLE = EagleConfig(distill_prompts=32, distill_new=24, eval_prompts=8, epochs=1, batch=16)


def features_of(model: Transformer, sequences: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return torch.cat([model.hidden(sequences[i : i + 256]) for i in range(0, len(sequences), 256)])


def continuation_mask(sequences: torch.Tensor, prompt_len: int) -> torch.Tensor:
    keep = torch.zeros_like(sequences, dtype=torch.bool)
    keep[:, prompt_len:] = True  # learn the model's own continuations, not the prompt text
    return keep


def train_eagle(model: Transformer, sequences: torch.Tensor, config: EagleConfig, log) -> tuple[EagleDrafter, dict]:
    """The drafter trained on the backbone's continuations `sequences` (N, prompt + new)."""
    torch.manual_seed(config.seed)
    features = features_of(model, sequences)
    keep = continuation_mask(sequences, config.distill_prompt_len)
    drafter = EagleDrafter(model.config, config.layout)
    embed, lm_head = model.model.embed_tokens, model.lm_head
    for p in model.parameters():
        p.requires_grad_(False)
    started = time.perf_counter()

    def loss_of(idx):
        return eagle_loss(
            drafter, features[idx], sequences[idx], embed, lm_head, config.window, config.cls_weight, keep[idx]
        )

    steps, last = train_epochs(drafter, loss_of, len(sequences), config, "eagle", log)
    drafter = as_shipped(drafter)
    return drafter, {
        "steps": steps,
        "sequences": len(sequences),
        "seconds": round(time.perf_counter() - started, 1),
        "final_loss": round(last, 4),
        "parameters": parameters_of(drafter),
        "window": config.window,
        "config": asdict(config),
    }


def heldout_accuracy(drafter: EagleDrafter, model: Transformer, sequences: torch.Tensor, prompt_len: int, window: int):
    """Top-1 accuracy of the drafter's next token at one step ahead, on held-out continuations
    with true features (its first depth: deeper ones read its own drafted features)."""
    features = features_of(model, sequences)
    with torch.inference_mode():
        _, accuracy = eagle_loss(
            drafter,
            features,
            sequences,
            model.model.embed_tokens,
            model.lm_head,
            window,
            keep=continuation_mask(sequences, prompt_len),
        )
    return round(float(accuracy), 4)


def build_eagle(checkpoint: Checkpoint, out: Path, config: EagleConfig, quick_corpus: bool, log=print) -> dict:
    """Train the drafter for `checkpoint` and write the checkpoint with it to `out` (every file
    of the checkpoint copied, the drafter added, training.json given an `eagle` entry,
    checksums recorded); returns that entry."""
    sequences, heldout_sequences, distilled_s = self_distilled(checkpoint, config, quick_corpus, "eagle", log)
    model = checkpoint.model
    drafter, card = train_eagle(model, sequences, config, log)
    card["distillation_seconds"] = round(distilled_s, 1)
    card["heldout_top1"] = heldout_accuracy(drafter, model, heldout_sequences, config.distill_prompt_len, config.window)
    if checkpoint.heads is not None:
        card["medusa_heads_parameters"] = parameters_of(checkpoint.heads)
    card["layout"] = str(config.layout)
    log(f"eagle: {card['parameters']:,} parameters, held-out top-1 {card['heldout_top1']}")
    written = EAGLE_FILES[config.layout]
    with replacing(out) as staging:
        for path in checkpoint.folder.iterdir():
            if path.is_file() and path.name not in (written, MANIFEST):
                shutil.copy2(path, staging / path.name)
        state = {k: v.detach().half().contiguous() for k, v in drafter.state_dict().items()}
        save_file(state, str(staging / written))
        info = dict(checkpoint.info, **{EAGLE_CARDS[config.layout]: card})
        (staging / "training.json").write_text(json.dumps(info, indent=1))
        write_manifest(staging)
    return card
