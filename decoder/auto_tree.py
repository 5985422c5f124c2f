"""`--tree auto`: the tree the performance model picks for this machine, batch and context.

The step times are this decoder's own on this machine: a quick calibration decodes a few
held-out prompts plainly and with the greedy tree of each candidate size, interleaved
(decoder.runs.decode_interleaved), and keeps seconds per step. It runs once per machine,
model, batch and context (rounded up to a power of two), with a progress bar, and is kept
under $MEDUSA_PERFKIT_HOME (~/.cache/medusa-perfkit) for later runs. The heads' accuracies
are the checkpoint's own (its decoder.measure record, else those recorded at training).
perfmodel.tree_choice then picks the size with the best predicted speedup, or plain decoding
where no tree beats it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from decoder.acceptance import AcceptanceConfig
from decoder.checkpoint import Checkpoint
from decoder.medusa import Decoder
from decoder.runs import decode_interleaved, heldout_prompts
from perfmodel.cpu_identity import this_cpu_key
from perfmodel.errors import PerfkitError
from perfmodel.measurements import user_measurements_dir
from perfmodel.tree_choice import TreeChoice, choose_tree
from perfmodel.trees import HEAD_TOP_K, greedy_tree

CALIBRATION_SIZES = (1, 2, 4, 8, 16, 32, 64)
CALIBRATION_PROMPTS = 2  # batches of prompts per size and round
CALIBRATION_ROUNDS = 2


def checkpoint_accuracy(ckpt: Checkpoint) -> np.ndarray | None:
    """The heads' top-k accuracies the checkpoint carries: its decoder.measure record
    (acceptance-greedy.json), else those recorded at training; None without either."""
    record = ckpt.folder / "acceptance-greedy.json"
    if record.exists():
        accuracy = json.loads(record.read_text()).get("head_topk_accuracy")
        if accuracy:
            return np.asarray(accuracy, dtype=float)
    recorded = ckpt.info.get("heldout_head_accuracy")
    return None if recorded is None else np.asarray(recorded, dtype=float)


def machine_key(device: str) -> str:
    if device.startswith("cuda"):
        return "cuda-" + torch.cuda.get_device_name(device).lower().replace(" ", "-")
    return f"{this_cpu_key()}-t{torch.get_num_threads()}"


def model_key(ckpt: Checkpoint) -> str:
    """A name for the weights: the folder's name and a hash of its config and file sizes."""
    digest = hashlib.sha256()
    for path in sorted(ckpt.folder.iterdir()):
        if path.suffix in (".json", ".safetensors") and path.name != "acceptance-greedy.json":
            digest.update(path.name.encode())
            digest.update(str(path.stat().st_size).encode())
    return f"{ckpt.folder.name}-{digest.hexdigest()[:12]}"


def context_bucket(context: int) -> int:
    return 1 << max(4, int(np.ceil(np.log2(max(context, 1)))))


@dataclass
class Calibration:
    """Seconds per decoding step by tree size, for one machine, model, batch and context."""

    path: Path
    key: str

    def load(self) -> dict[str, dict[int, float]] | None:
        if not self.path.exists():
            return None
        entry = json.loads(self.path.read_text()).get(self.key)
        if entry is None:
            return None
        return {name: {int(n): float(v) for n, v in entry[name].items()} for name in ("step_s", "batch_efficiency")}

    def save(self, measured: dict[str, dict[int, float]]) -> None:
        data = json.loads(self.path.read_text()) if self.path.exists() else {}
        data[self.key] = {name: {str(n): v for n, v in sorted(values.items())} for name, values in measured.items()}
        data[self.key]["torch"] = torch.__version__
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(data, indent=1))


def calibration_for(ckpt: Checkpoint, decoder: Decoder, batch: int, context: int, new_tokens: int) -> Calibration:
    folder = user_measurements_dir().parent / "tree-calibration" / machine_key(decoder.device)
    return Calibration(folder / f"{model_key(ckpt)}.json", f"b{batch}-s{context_bucket(context)}-n{new_tokens}")


def calibrate(
    decoder: Decoder, ckpt: Checkpoint, batch: int, context: int, new_tokens: int, accuracy, log=print, sizes=None
) -> dict[str, dict[int, float]]:
    """Time this decoder's steps with plain decoding and the greedy tree of every candidate
    size (`sizes`, plain decoding's 1 among them; default CALIBRATION_SIZES), interleaved, at
    `batch` prompts of about `context` tokens each decoding `new_tokens`. Returns seconds
    per step and the batch efficiency (tokens per sequence and step over the tokens each
    active sequence accepted per step) per tree size."""
    heads = len(ckpt.heads)
    if sizes is None:
        sizes = [n for n in CALIBRATION_SIZES if n == 1 or n - 1 <= heads * HEAD_TOP_K]
    elif 1 not in sizes:
        raise PerfkitError(f"calibration sizes need plain decoding (size 1); got {list(sizes)}")
    settings = {n: {"tree": greedy_tree(accuracy, n - 1) if n > 1 else None} for n in sizes}
    prompts = heldout_prompts(ckpt, batch * CALIBRATION_PROMPTS, context_bucket(context), seed=1)
    log(
        f"calibrating the decoder's step time on this machine (batch {batch}, context {context_bucket(context)}, "
        f"tree sizes {', '.join(map(str, sizes))})"
    )
    kwargs = dict(acceptance=AcceptanceConfig("greedy"), topk=HEAD_TOP_K)
    decoder.generate(prompts[:batch], 4, **kwargs, **settings[sizes[-1]])  # warm-up, not timed
    steps = {n: 0 for n in sizes}
    seconds = {n: 0.0 for n in sizes}
    tokens = {n: 0 for n in sizes}
    accepted = {n: [] for n in sizes}
    chunks = [prompts[i : i + batch] for i in range(0, len(prompts), batch)]
    with tqdm(total=CALIBRATION_ROUNDS * len(chunks), desc="calibrating", unit="batch", leave=False) as bar:
        for _ in range(CALIBRATION_ROUNDS):
            for chunk in chunks:
                runs = decode_interleaved(decoder, chunk, batch, new_tokens, settings, 1, **kwargs)
                for n, result in runs.items():
                    steps[n] += result.steps
                    seconds[n] += result.decode_s
                    tokens[n] += result.new_tokens
                    accepted[n] += [a for row in result.accepted for a in row]
                bar.update()
    return {
        "step_s": {n: seconds[n] / steps[n] for n in sizes},
        "batch_efficiency": {n: tokens[n] / (steps[n] * batch) / np.mean(accepted[n]) for n in sizes},
    }


def auto_tree(
    decoder: Decoder, ckpt: Checkpoint, batch: int, context: int, new_tokens: int, log=print
) -> tuple[TreeChoice, object]:
    """The performance model's choice for this decoder at `batch` prompts of `context`
    tokens decoding `new_tokens` each: (the choice, its Tree or None for plain decoding)."""
    if ckpt.heads is None:
        raise PerfkitError(f"--tree auto needs Medusa heads; {ckpt.folder} has none")
    accuracy = checkpoint_accuracy(ckpt)
    if accuracy is None:
        raise PerfkitError(
            f"--tree auto needs the heads' accuracies; {ckpt.folder} records none "
            "(python -m decoder.measure --out FOLDER/acceptance-greedy.json measures them)"
        )
    calibration = calibration_for(ckpt, decoder, batch, context, new_tokens)
    measured = calibration.load()
    if measured is None:
        measured = calibrate(decoder, ckpt, batch, context, new_tokens, accuracy, log)
        calibration.save(measured)
    latency = f"this decoder's measured step times, {calibration.key}, {calibration.path}"
    choice = choose_tree(measured["step_s"], accuracy, latency, measured["batch_efficiency"] if batch > 1 else None)
    return choice, choice.tree(accuracy)


def default_tree_name(ckpt: Checkpoint) -> str:
    """auto where the checkpoint records its heads' accuracies, else its own default tree."""
    return "auto" if ckpt.heads is not None and checkpoint_accuracy(ckpt) is not None else "default"
