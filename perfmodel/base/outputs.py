"""Where a command writes: checked before any long work starts, so a bad `--out` costs a
one-line error, not the minutes of work that came before the first write."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from perfmodel.base.errors import PerfkitError


def writable_dir(path: str | Path, what: str = "output folder") -> Path:
    """`path`, created if missing, after proving a file can be written in it.

    Raises PerfkitError naming the path and the reason (a file in the way, no permission,
    a read-only file system)."""
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise PerfkitError(f"{what} {path} is a file, not a folder: give a folder that can be created or written")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-"):
            pass
    except OSError as exc:
        raise PerfkitError(f"cannot write the {what} {path}: {exc.strerror or exc}; choose a writable folder") from None
    return path


def writable_file(path: str | Path, what: str = "output file") -> Path:
    """`path` as a file that can be written: its folder exists or can be made and is
    writable, and the file itself, if present, is writable."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise PerfkitError(f"{what} {path} is a folder: give a file name")
    writable_dir(path.parent, f"folder of the {what}")
    if path.exists() and not os.access(path, os.W_OK):
        raise PerfkitError(f"cannot write the {what} {path}: permission denied; choose a writable file")
    return path
