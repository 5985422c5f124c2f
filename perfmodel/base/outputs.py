"""Where a command writes: checked before any long work starts, so a bad `--out` costs a
one-line error, not the minutes of work that came before the first write."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from perfmodel.base.errors import PerfkitError

# POSIX limits where the file system does not say: a name of 255 bytes, a path of 4096.
NAME_MAX, PATH_MAX = 255, 4096


def check_path_length(path: Path, what: str) -> None:
    """A one-line error for a path the file system cannot hold: a part longer than its
    name limit or the whole longer than its path limit (checked before any work)."""
    anchor = nearest_existing(path)
    name_max = _pathconf(anchor, "PC_NAME_MAX", NAME_MAX)
    path_max = _pathconf(anchor, "PC_PATH_MAX", PATH_MAX)
    size = len(os.fsencode(str(path.absolute())))
    if size >= path_max:
        raise PerfkitError(f"{what} is a path of {size:,} bytes; this file system takes at most {path_max - 1:,}")
    for part in path.parts:
        if len(os.fsencode(part)) > name_max:
            raise PerfkitError(
                f"{what} {part[:40]}... is a name of {len(os.fsencode(part))} bytes; this file system takes at most "
                f"{name_max}"
            )


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # a name too long to look up
        return False


def _pathconf(path: Path, name: str, default: int) -> int:
    try:
        return os.pathconf(path, name)
    except (OSError, ValueError):
        return default


def nearest_existing(path: Path) -> Path:
    """The deepest folder of `path` (or `path` itself) that exists."""
    found = Path(path.anchor or ".")
    for part in reversed((path.absolute(), *path.absolute().parents)):  # from the root down
        if not _exists(part):
            break
        found = part
    return found


def preflight(path: str | Path, what: str, folder: bool) -> Path:
    """An output path checked with nothing created: a name the file system can hold, no file
    where a folder is wanted (or the reverse), and write access where it will be made. For
    command-line options, so a bad one fails before any work (perfmodel.cli.options)."""
    path = Path(path).expanduser()
    check_path_length(path, what)
    if _exists(path) and path.is_dir() != folder:
        kind = "a file, not a folder" if folder else "a folder: give a file name"
        raise PerfkitError(f"{what} {path} is {kind}")
    existing = nearest_existing(path)
    if existing != path.absolute() and not existing.is_dir():
        raise PerfkitError(f"{what} {path} is under {existing}, a file, not a folder")
    target = existing if existing.is_dir() else existing.parent
    if existing != path.absolute() or folder:
        if not os.access(target, os.W_OK | os.X_OK):
            raise PerfkitError(f"cannot write the {what} {path}: {target} is not writable; choose a writable place")
    elif not os.access(path, os.W_OK):
        raise PerfkitError(f"cannot write the {what} {path}: permission denied; choose a writable file")
    return path


def writable_dir(path: str | Path, what: str = "output folder") -> Path:
    """`path`, created if missing, after proving a file can be written in it.

    Raises PerfkitError naming the path and the reason (a file in the way, no permission,
    a read-only file system, a name too long)."""
    path = Path(path).expanduser()
    check_path_length(path, what)
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
    check_path_length(path, what)
    if path.is_dir():
        raise PerfkitError(f"{what} {path} is a folder: give a file name")
    writable_dir(path.parent, f"folder of the {what}")
    if path.exists() and not os.access(path, os.W_OK):
        raise PerfkitError(f"cannot write the {what} {path}: permission denied; choose a writable file")
    return path


@contextmanager
def replaced_atomically(path: str | Path) -> Iterator[Path]:
    """A temporary file beside `path` to write instead of it: on success it replaces `path`
    in one step (os.replace), on any failure (a full disk, an interruption) it is removed
    and `path` keeps what it held. The temporary file ends as `path`'s suffix, so writers
    that choose a format by suffix pick the same one."""
    path = Path(path)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:100]}.", suffix=path.suffix)
    os.close(fd)
    temporary = Path(name)
    try:
        yield temporary
        os.chmod(temporary, 0o644)  # mkstemp's 0600 would hide the file from the folder's other readers
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def write_csv(frame, path: str | Path) -> Path:
    """A table (anything with pandas' to_csv) written to `path` whole or not at all
    (replaced_atomically), its folder made first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with replaced_atomically(path) as temporary:
        frame.to_csv(temporary, index=False)
    return path


def write_file(data: bytes | str, path: str | Path) -> Path:
    """`data` (text as UTF-8) written to `path` whole or not at all (replaced_atomically): a
    figure or a JSON file the way write_csv writes a table."""
    path = Path(path)
    with replaced_atomically(path) as temporary:
        temporary.write_bytes(data.encode() if isinstance(data, str) else data)
    return path
