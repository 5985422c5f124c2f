"""`--tree auto`: the tree the performance model picks for this machine, batch and context.

The step times are this decoder's own on this machine, by tree size, measured once and kept
(decoder.tree_calibration). The heads' accuracies are the checkpoint's own (its decoder.measure
record, else those recorded at training). perfmodel.planning.tree_choice then picks the size
with the best predicted speedup, or plain decoding where no tree beats it.

Only a run that asks for a calibration measures one (`may_calibrate`): `decoder.generate`
without `--tree` uses a kept one or none. Where no calibration kept on this machine backs a
prediction, none is made: the run says why in one line and decodes with the checkpoint's
default tree.
"""

from __future__ import annotations

import numpy as np

from decoder.checkpoint import Checkpoint
from decoder.medusa import Decoder
from decoder.tree import resolve_tree
from decoder.tree_calibration import Measuring, step_profile
from perfmodel.acceptance.record import own_record
from perfmodel.acceptance.trees import Tree
from perfmodel.base.drafter_kind import DrafterKind
from perfmodel.base.errors import PerfkitError
from perfmodel.planning.tree_choice import TreeChoice, choose_tree


def checkpoint_accuracy(ckpt: Checkpoint) -> np.ndarray | None:
    """The heads' top-k accuracies the checkpoint carries: its own decoder.measure record
    (perfmodel.acceptance.record.own_record), else those recorded at training; None without
    either."""
    record = own_record(ckpt.folder)
    if record is not None:
        return record.accuracy
    recorded = ckpt.info.get("heldout_head_accuracy")
    return None if recorded is None else np.asarray(recorded, dtype=float)


# How far a tree must be predicted faster than plain decoding to be run instead. Calibrations
# repeated minutes apart on the 2-core VM put a tree's step over the plain step 5-10% apart,
# and the heads' accuracies put a batch's acceptance up to 5% high: at batch 4 a 4-token tree
# predicted at x1.003 measured x0.79, where plain decoding was best.
CHOICE_MARGIN = 0.05


def auto_tree(
    decoder: Decoder,
    ckpt: Checkpoint,
    batch: int,
    prompt_len: int,
    new_tokens: int,
    log=print,
    recalibrate: bool = False,
    may_calibrate: bool = True,
) -> tuple[TreeChoice | None, Tree | None]:
    """The performance model's choice for this decoder at `batch` prompts of `prompt_len`
    tokens decoding `new_tokens` each: (the choice, its Tree or None for plain decoding).
    Where no calibration kept on this machine backs a prediction (see step_profile), there is
    no choice: (None, the checkpoint's default tree), and one line logged says why."""
    if ckpt.heads is None:
        raise PerfkitError(f"--tree auto needs Medusa heads; {ckpt.folder} has none")
    accuracy = checkpoint_accuracy(ckpt)
    if accuracy is None:
        raise PerfkitError(
            f"--tree auto needs the heads' accuracies; {ckpt.folder} records none "
            "(python -m decoder.measure --out FOLDER/acceptance-greedy.json measures them)"
        )
    measuring = Measuring.asked(recalibrate, may_calibrate)
    profile, basis = step_profile(decoder, ckpt, batch, prompt_len, new_tokens, accuracy, log, measuring)
    if profile is None:
        tree = resolve_tree("default", ckpt)
        log(f"no speedup predicted: {basis}; running the checkpoint's default tree of {tree.size} tokens")
        return None, tree
    latency = f"this decoder's measured step times, {basis}"
    efficiency = profile.batch_efficiency if batch > 1 else None
    choice = choose_tree(profile.step_s, accuracy, latency, efficiency, margin=CHOICE_MARGIN)
    return choice, choice.tree(accuracy)


def default_tree_name(ckpt: Checkpoint, drafter: str = "medusa") -> str:
    """auto where the checkpoint records its heads' accuracies and the heads draft, else its
    own default tree (auto prices the heads' trees: EAGLE drafts the default tree unless told)."""
    heads = drafter == DrafterKind.MEDUSA and ckpt.heads is not None
    return "auto" if heads and checkpoint_accuracy(ckpt) is not None else "default"
