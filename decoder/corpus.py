"""The training text every Python install carries offline: the standard library's source.

Code is what Medusa accelerates most (it is predictable). Files are split by a hash of
their path, so the held-out set is stable across runs and machines with the same Python;
5% of the files never reach training and provide the measurement prompts.
"""

from __future__ import annotations

import hashlib
import os
import random
import sysconfig
from pathlib import Path

from perfmodel.base.errors import PerfkitError

EXCLUDED_PARTS = {"test", "tests", "site-packages", "idlelib", "lib2to3", "turtledemo", "__pycache__", "ensurepip"}
HELDOUT_ONE_IN = 20
EOS = "<|endoftext|>"


def stdlib_files(root: Path | None = None) -> list[Path]:
    root = root or Path(sysconfig.get_paths()["stdlib"])
    files = []
    # Excluded folders are never entered: the tests and site-packages are most of what a
    # recursive glob would walk (0.9 s of a 1 s corpus read) only to drop it.
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [name for name in subfolders if name not in EXCLUDED_PARTS]
        files += [Path(folder, name) for name in names if name.endswith(".py")]
    files.sort()
    if not files:
        raise PerfkitError(f"no Python source found under {root}")
    return files


def is_heldout(path: Path, root: Path) -> bool:
    digest = hashlib.sha1(str(path.relative_to(root)).encode()).digest()
    return int.from_bytes(digest[:4], "big") % HELDOUT_ONE_IN == 0


def split_corpus(root: Path | None = None) -> tuple[list[str], list[str], dict]:
    """(train texts, held-out texts, a description with sizes and a fingerprint)."""
    root = root or Path(sysconfig.get_paths()["stdlib"])
    train, heldout, names = [], [], []
    for path in stdlib_files(root):
        text = path.read_text(encoding="utf-8", errors="replace")
        (heldout if is_heldout(path, root) else train).append(text)
        names.append(str(path.relative_to(root)))
    fingerprint = hashlib.sha1("\n".join(names).encode()).hexdigest()[:12]
    info = {
        "root": str(root),
        "files": len(names),
        "train_files": len(train),
        "heldout_files": len(heldout),
        "train_bytes": sum(map(len, train)),
        "heldout_bytes": sum(map(len, heldout)),
        "file_list_sha1": fingerprint,
    }
    return train, heldout, info


def sample_prompts(documents: list[list[int]], count: int, length: int, seed: int) -> list[list[int]]:
    """`count` windows of `length` tokens from the documents, at seeded random offsets."""
    rng = random.Random(seed)
    usable = [d for d in documents if len(d) > length + 1]
    if not usable:
        raise PerfkitError(f"no document is longer than {length} tokens")
    prompts = []
    for _ in range(count):
        doc = usable[rng.randrange(len(usable))]
        start = rng.randrange(len(doc) - length)
        prompts.append(doc[start : start + length])
    return prompts
