"""Where a calibration of this decoder's step times (decoder.tree_calibration) is kept: a JSON
file per machine and model under $MEDUSA_PERFKIT_HOME (~/.cache/medusa-perfkit), an entry per
batch, context and response length. The model is keyed by its weights' content, so weights
changed in place are measured again.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from decoder.checkpoint import Checkpoint
from decoder.manifest import sha256, weight_files
from decoder.medusa import Decoder
from decoder.step_profile import StepProfile
from perfmodel.base.errors import PerfkitError
from perfmodel.base.jsonfile import read_json
from perfmodel.base.outputs import writable_dir
from perfmodel.hardware.cpu_identity import this_cpu_key
from perfmodel.measured.store import HOME_VARIABLE, user_measurements_dir


def machine_key(device: str) -> str:
    if device.startswith("cuda"):
        return "cuda-" + torch.cuda.get_device_name(device).lower().replace(" ", "-")
    return f"{this_cpu_key()}-t{torch.get_num_threads()}"


def model_key(ckpt: Checkpoint) -> str:
    """A name for the weights: the folder's name and a hash of their content, byte for byte:
    config.json, every weight file in the folder, and the heads' tensors as loaded (they
    may come from another folder). Weights changed in place, even to files of the same
    sizes, get another key. Hashing reads the weights once more: about a second per GB."""
    digest = hashlib.sha256()
    for path in [ckpt.folder / "config.json", *weight_files(ckpt.folder)]:
        if path.is_file():
            digest.update(f"{path.name} {sha256(path)}".encode())
    if ckpt.heads is not None:
        for name, tensor in sorted(ckpt.heads.state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy())
    return f"{ckpt.folder.name}-{digest.hexdigest()[:16]}"


def context_bucket(context: int) -> int:
    return 1 << max(4, int(np.ceil(np.log2(max(context, 1)))))


@dataclass
class Calibration:
    """Where one machine, model, batch and context's step profile is kept."""

    path: Path
    key: str

    def describe(self) -> str:
        return f"{self.key}, {self.path}"

    def load(self, log=print) -> StepProfile | None:
        """The kept profile, or None; a file that cannot be read is reported and ignored (it
        is a cache: measuring again replaces it)."""
        if not self.path.exists():
            return None
        try:
            data = read_json(self.path, "tree calibration cache")
            entry = data.get(self.key) if isinstance(data, dict) else None
            return None if entry is None else StepProfile.from_json(entry)
        except (PerfkitError, ValueError, TypeError, KeyError, AttributeError) as exc:
            log(f"ignoring the unreadable tree calibration {self.path} [{self.key}] ({exc}); measuring again")
            return None

    def save(self, profile: StepProfile) -> None:
        """Replace this key's entry, written to a temporary file and renamed into place so
        an interrupted write never leaves a damaged cache."""
        data = {}
        if self.path.exists():
            try:
                data = read_json(self.path, "tree calibration cache")
            except PerfkitError:
                data = {}
            data = data if isinstance(data, dict) else {}
        data[self.key] = profile.to_json()
        with tempfile.NamedTemporaryFile("w", dir=self.path.parent, suffix=".tmp", delete=False) as f:
            json.dump(data, f, indent=1)
        os.chmod(f.name, 0o644)
        os.replace(f.name, self.path)


def calibration_root() -> Path:
    return user_measurements_dir().parent / "tree-calibration"


def calibration_for(ckpt: Checkpoint, decoder: Decoder, batch: int, prompt_len: int, new_tokens: int) -> Calibration:
    folder = calibration_root() / machine_key(decoder.device)
    return Calibration(folder / f"{model_key(ckpt)}.json", f"b{batch}-s{context_bucket(prompt_len)}-n{new_tokens}")


def cache_folder(calibration: Calibration) -> Path:
    """The cache's folder, proven writable before minutes of calibration are spent."""
    what = f"tree calibration cache (set ${HOME_VARIABLE} to a writable folder, or pass --tree NAME)"
    return writable_dir(calibration.path.parent, what)
