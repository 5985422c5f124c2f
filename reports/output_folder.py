"""A report folder that never holds two builds at once.

A build writes into a hidden staging folder inside the target and moves its files in only
when it has finished: an interrupted or failed build leaves the folder as it was. The
target keeps a manifest of the files the tool wrote there, so a later build removes the
files of the previous one that it does not write again (a figure that no longer applies)
and never touches a file it did not write (a user's notes beside the report).

The staging folder is inside the target, not beside it, so the one folder proven writable
(perfmodel.base.outputs.writable_dir) is the only one written, and every move stays on one file
system (os.replace, atomic per file).

Two builds into one folder at once are kept apart by the command, not here: it holds the
folder (perfmodel.base.output_locks.claimed_dir) from before its work to its end, and a second
build is refused in one line instead of writing over the first one's files.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from perfmodel.base.outputs import writable_dir

MANIFEST = ".medusa-perfkit-files.json"
STAGING_PREFIX = ".medusa-perfkit-staging-"


def written_before(folder: Path) -> list[str]:
    """The files the manifest says the tool wrote in `folder` (plain names only: a manifest
    edited by hand cannot point outside the folder)."""
    try:
        names = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return [n for n in names if isinstance(n, str) and n == Path(n).name and n not in ("", ".", "..", MANIFEST)]


def write_manifest(folder: Path, names) -> None:
    fd, temporary = tempfile.mkstemp(dir=folder, prefix=f"{MANIFEST}.")
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        json.dump({"written_by": "medusa-perfkit", "files": sorted(names)}, file, indent=1)
    os.chmod(temporary, 0o644)  # mkstemp's 0600 would hide the manifest from the folder's other readers
    os.replace(temporary, folder / MANIFEST)


def remove_abandoned_staging(folder: Path) -> None:
    """Staging folders of builds that were killed (their process is gone)."""
    for staging in folder.glob(f"{STAGING_PREFIX}*"):
        pid = staging.name.removeprefix(STAGING_PREFIX).split("-")[0]
        if pid.isdigit() and not process_alive(int(pid)):
            shutil.rmtree(staging, ignore_errors=True)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, someone else's
    return True


def swap_in(staging: Path, target: Path) -> list[str]:
    """Move the staged files into `target`, then remove the previous build's files that this
    one did not write again. The manifest first claims both builds' files, so an
    interruption during the moves leaves nothing that a later build would not clean up."""
    old = written_before(target)
    new = sorted(p.name for p in staging.iterdir())
    write_manifest(target, set(old) | set(new))
    for name in new:
        os.replace(staging / name, target / name)
    for name in sorted(set(old) - set(new)):
        stale = target / name
        if stale.is_file() or stale.is_symlink():
            stale.unlink()
    write_manifest(target, new)
    return new


@contextmanager
def staged(target: Path) -> Iterator[Path]:
    """A staging folder for one build of `target`: write the files there; on a normal exit
    they replace the previous build's, on an exception the target is left as it was."""
    target = writable_dir(target, "report folder")
    remove_abandoned_staging(target)
    staging = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-", dir=target))
    try:
        yield staging
        swap_in(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
