"""The benchmark commands' timer: a command's wall time from a new interpreter's start to its
exit, as a user runs it, and the machine line that says what else the time depended on."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time

from perfmodel.base.errors import PerfkitError


def interpreter_seconds(argv: list[str], env: dict | None = None, label: str | None = None) -> float:
    """Wall seconds of `python argv...` in a new interpreter; a failed run is an error naming
    it (as `label`, by default the arguments)."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise PerfkitError(f"{label or shlex.join(argv)} failed (exit {done.returncode}): {last}")
    return elapsed


def machine_line() -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "unknown"
    return f"{os.cpu_count()} cores, load average {load} (1, 5, 15 min)"
