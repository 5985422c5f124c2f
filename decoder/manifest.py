"""A checkpoint folder's checksum manifest: the SHA-256 of every weight file, written when a
checkpoint is saved and verified before one is loaded, so a damaged or hand-edited file is
named rather than loaded.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from perfmodel.base.errors import PerfkitError

HEADS_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")
MANIFEST = "checksums.sha256"


def normal_mode(path: Path) -> None:
    """The mode open() would give under the user's umask: safetensors writes 0600 and
    mkdtemp makes 0700, which would leave an installed model unreadable to other users."""
    umask = os.umask(0)
    os.umask(umask)
    path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def weight_files(folder: Path) -> list[Path]:
    """The files whose bytes are weights: what the checksum manifest covers."""
    return sorted(p for p in folder.iterdir() if p.is_file() and (p.suffix == ".safetensors" or p.name in HEADS_FILES))


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(folder: Path) -> Path:
    """checksums.sha256 of the folder's weight files, in sha256sum's format."""
    manifest = folder / MANIFEST
    manifest.write_text("".join(f"{sha256(p)}  {p.name}\n" for p in weight_files(folder)))
    normal_mode(manifest)
    return manifest


def _refresh_hint(folder: Path) -> str:
    return f"if the weights were changed on purpose, record them with `python -m decoder.checkpoint --rehash {folder}`"


def verify_manifest(folder: Path) -> None:
    """Each weight file checksums.sha256 lists against its SHA-256; nothing to check without
    one. A weight file added later is not covered, but cannot go unnoticed either: its
    tensors would be unused or clash with the listed files' (check_tensors, _load_tensors)."""
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return
    try:
        lines = manifest.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise PerfkitError(f"cannot read checksum manifest {manifest}: {exc}") from None
    listed = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        digest, _, name = line.partition("  ")
        name = name.removeprefix("*")
        if len(digest) != 64 or not name or any(c not in "0123456789abcdef" for c in digest.lower()):
            raise PerfkitError(
                f"{manifest}: line {number} is not `<sha256>  <file>`; {_refresh_hint(folder)} to write it anew"
            )
        listed[name] = digest.lower()
    for name, digest in listed.items():
        path = folder / name
        if not path.is_file():
            raise PerfkitError(f"{path}: missing, though {manifest} lists it; {_refresh_hint(folder)}")
        if sha256(path) != digest:
            raise PerfkitError(
                f"{path}: SHA-256 differs from the one in {manifest}: the file is corrupted or was replaced; "
                f"{_refresh_hint(folder)}"
            )
