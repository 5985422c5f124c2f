"""Which CPU this machine has, as the key its measurements are stored under
('cpu-intel-xeon-gold-6338-8c'): read from /proc/cpuinfo, or named by MEDUSA_PERFKIT_CPU.
The resolver needs the key to find stored measurements; profiling needs the rest of the
device's identity (`profilers.device`).
"""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path

from perfmodel.hardware.specs import normalize_name


def read_cpuinfo() -> dict[str, str]:
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return info


# Names this machine's CPU instead of /proc/cpuinfo: for a VM that hides or renames its
# processor, and for tests that play another machine.
CPU_NAME_VARIABLE = "MEDUSA_PERFKIT_CPU"


def cpu_model_name(info: dict[str, str] | None = None) -> str:
    override = os.environ.get(CPU_NAME_VARIABLE, "").strip()
    if override:
        return override
    info = read_cpuinfo() if info is None else info
    return info.get("model name") or platform.processor() or "unknown CPU"


def this_cpu_key() -> str:
    """This machine's CPU key, without importing torch (the roofline needs only the key)."""
    return cpu_key(cpu_model_name(), os.cpu_count() or 1)


def cpu_key(model_name: str, cores: int) -> str:
    """'Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz', 8 -> 'cpu-intel-xeon-gold-6338-8c'."""
    plain = re.sub(r"\(R\)|\(TM\)|\bCPU\b|@.*", " ", model_name)
    return re.sub(r"-+", "-", f"cpu-{normalize_name(plain).strip('-')}-{cores}c")
