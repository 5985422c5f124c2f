"""One run at a time per output: a second run into a file or folder another run is writing is
refused at once, in one line. Waiting would only have it write over the first run's output
afterwards, both saying they wrote what only one of them left there.

The locks are the OS's (released when the process ends, however it ends), so a killed run
never leaves an output locked. A file's lock is FILE.lock beside it (profilers.sweep's). A
folder's is the folder itself (flock on its own descriptor), which adds no file to the
outputs; where the file system or platform cannot lock a folder (NFS, where flock needs a
file open for writing; Windows), it is FOLDER_LOCK, a file inside it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from perfmodel.base.errors import PerfkitError
from perfmodel.base.outputs import writable_dir

try:
    import fcntl
except ImportError:  # Windows: a folder is locked by FOLDER_LOCK in it
    fcntl = None

FOLDER_LOCK = ".medusa-perfkit.lock"  # hidden, beside the tool's other bookkeeping in a folder


def refused(out: Path | str, writer: str, lock: str) -> PerfkitError:
    return PerfkitError(
        f"another {writer} is writing {out} (it holds {lock}); wait for it to finish, or give another --out"
    )


def lock_path(out: Path, folder: bool = False) -> Path:
    """Where `out`'s lock file is: FOLDER_LOCK inside a folder, FILE.lock beside a file."""
    return out / FOLDER_LOCK if folder else out.with_name(out.name + ".lock")


@contextmanager
def output_lock(out: str | Path, writer: str = "command", folder: bool = False) -> Iterator[Path]:
    """Hold `out`'s lock file (lock_path) for the block. The file stays: removing it would let
    a run that opened it before lock a file no longer there, beside one that locks a new one."""
    path = lock_path(Path(out), folder)
    lock = FileLock(str(path), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise refused(out, writer, f"the lock {path}") from None
    try:
        yield path
    finally:
        lock.release()


@contextmanager
def folder_lock(folder: Path, writer: str = "command") -> Iterator[None]:
    """Hold `folder`'s lock for the block: the folder itself where it can be locked, else
    FOLDER_LOCK in it (module doc)."""
    descriptor = _locked_folder(folder, writer)
    if descriptor is None:
        with output_lock(folder, writer, folder=True):
            yield
        return
    try:
        yield
    finally:
        os.close(descriptor)  # the lock goes with the descriptor


def _locked_folder(folder: Path, writer: str) -> int | None:
    """A descriptor of `folder` holding its flock; None where it cannot be locked so."""
    if fcntl is None:
        return None
    descriptor = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        raise refused(folder, writer, "its lock") from None
    except OSError:  # a file system that cannot lock a folder
        os.close(descriptor)
        return None
    return descriptor


@contextmanager
def claimed_dir(path: str | Path, what: str = "output folder") -> Iterator[Path]:
    """`path` as writable_dir makes it, locked for the block (folder_lock): what a command that
    writes a folder of outputs holds from when it knows the folder to its end."""
    folder = writable_dir(path, what)
    with folder_lock(folder):
        yield folder
