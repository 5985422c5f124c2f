"""What we are measuring on: device identity, versions, and per-configuration state.

NVIDIA GPUs are read through NVML (nvidia-ml-py): name, UUID, driver, clocks, power,
temperature and clock-event (throttle) reasons. CPUs through /proc/cpuinfo and sysfs.
The device is matched to its hw_specs entry when there is one, so measured rows land on
the same key (`h100-sxm`, ...) as the predictions for that device.
"""

from __future__ import annotations

import os
import platform
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pynvml

from perfmodel.base.errors import PerfkitError
from perfmodel.hardware.cpu_identity import cpu_key, cpu_model_name, read_cpuinfo
from perfmodel.hardware.specs import find_spec, normalize_name

DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class DeviceInfo:
    kind: str  # "cpu" or "cuda"
    key: str  # the `device` column of measured rows
    name: str
    spec_key: str | None  # the hw_specs entry it matched, if any
    cache_bytes: int  # last-level cache (L3 on CPUs, L2 on GPUs): what a flush must evict
    memory_bytes: int
    threads: int
    details: dict  # everything else worth recording with the run

    def as_dict(self) -> dict:
        return {
            "kind": self.kind,
            "key": self.key,
            "name": self.name,
            "spec_key": self.spec_key,
            "cache_bytes": self.cache_bytes,
            "memory_bytes": self.memory_bytes,
            "threads": self.threads,
            **self.details,
        }


def check_device(device: str) -> str:
    if device not in DEVICES:
        raise PerfkitError(f"unknown device {device!r}; choose one of: {', '.join(DEVICES)}")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise PerfkitError(
                f"--device cuda: no CUDA device is visible to torch {torch.__version__} "
                f"(CUDA build: {torch.version.cuda or 'none, this is a CPU-only build'}); use --device cpu"
            )
    return device


def match_spec(name: str) -> str | None:
    try:
        return find_spec(name).key
    except PerfkitError:
        return None


def versions() -> dict:
    import torch

    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


# -- CPU ------------------------------------------------------------------------------


def _cpu_caches() -> list[dict]:
    caches = []
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        number, unit = re.match(r"(\d+)([KMG]?)", size).groups()
        caches.append(
            {"level": level, "type": kind, "bytes": int(number) * {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}[unit]}
        )
    return caches


def _meminfo(field: str) -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def cpu_available_bytes() -> int:
    return _meminfo("MemAvailable")


def cpu_info() -> DeviceInfo:
    import torch

    info = read_cpuinfo()
    name = cpu_model_name(info)
    cores = os.cpu_count() or 1
    caches = _cpu_caches()
    last_level = max(caches, key=lambda c: (c["level"], c["bytes"]))["bytes"] if caches else 64 << 20
    details = {
        "model_name": name,
        "logical_cpus": cores,
        "torch_threads": torch.get_num_threads(),
        "caches": caches,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "flags_of_note": sorted(
            set(info.get("flags", "").split())
            & {"avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_int8", "fma"}
        ),
        **versions(),
    }
    return DeviceInfo(
        "cpu", cpu_key(name, cores), name, None, last_level, _meminfo("MemTotal"), torch.get_num_threads(), details
    )


def cpu_state() -> dict:
    """Current clock of the CPU (mean over cores), where the kernel reports it."""
    mhz = []
    try:
        mhz = [float(v) for v in re.findall(r"cpu MHz\s*:\s*([\d.]+)", Path("/proc/cpuinfo").read_text())]
    except OSError:
        pass
    return {"cpu_mhz": round(sum(mhz) / len(mhz), 1) if mhz else None}


# -- NVIDIA GPU -----------------------------------------------------------------------


class Nvml:
    """An NVML session for one GPU, found by UUID: NVML numbers every GPU in the machine,
    torch only the visible ones (CUDA_VISIBLE_DEVICES), so indices can differ."""

    def __init__(self, index: int = 0, uuid: str | None = None):
        self.nvml = pynvml
        try:
            pynvml.nvmlInit()
            self.handle = pynvml.nvmlDeviceGetHandleByUUID(uuid) if uuid else pynvml.nvmlDeviceGetHandleByIndex(index)
        except pynvml.NVMLError as exc:
            raise PerfkitError(f"NVML is not available ({exc}); is the NVIDIA driver installed?") from None

    def _try(self, fn, *args, default=None):
        try:
            return fn(self.handle, *args)
        except self.nvml.NVMLError:
            return default

    def identity(self) -> dict:
        n = self.nvml
        return {
            "name": self._try(n.nvmlDeviceGetName),
            "uuid": self._try(n.nvmlDeviceGetUUID),
            "driver": n.nvmlSystemGetDriverVersion(),
            "max_sm_clock_mhz": self._try(n.nvmlDeviceGetMaxClockInfo, n.NVML_CLOCK_SM),
            "max_mem_clock_mhz": self._try(n.nvmlDeviceGetMaxClockInfo, n.NVML_CLOCK_MEM),
            "memory_bus_width_bits": self._try(n.nvmlDeviceGetMemoryBusWidth),
            "power_limit_w": (self._try(n.nvmlDeviceGetEnforcedPowerLimit) or 0) / 1000 or None,
        }

    def state(self) -> dict:
        """Clocks, power, temperature and why clocks are held down, right now."""
        n = self.nvml
        reasons = self._try(n.nvmlDeviceGetCurrentClocksEventReasons, default=0) or 0
        return {
            "sm_clock_mhz": self._try(n.nvmlDeviceGetClockInfo, n.NVML_CLOCK_SM),
            "mem_clock_mhz": self._try(n.nvmlDeviceGetClockInfo, n.NVML_CLOCK_MEM),
            "power_w": (self._try(n.nvmlDeviceGetPowerUsage) or 0) / 1000 or None,
            "temp_c": self._try(n.nvmlDeviceGetTemperature, n.NVML_TEMPERATURE_GPU),
            "throttle": decode_clock_events(reasons),
        }


# Bits of nvmlDeviceGetCurrentClocksEventReasons; GPU idle and application clocks are normal.
CLOCK_EVENT_BITS = {
    pynvml.nvmlClocksEventReasonGpuIdle: "gpu_idle",
    pynvml.nvmlClocksEventReasonApplicationsClocksSetting: "applications_clocks",
    pynvml.nvmlClocksEventReasonSwPowerCap: "sw_power_cap",
    pynvml.nvmlClocksEventReasonHwSlowdown: "hw_slowdown",
    pynvml.nvmlClocksEventReasonSyncBoost: "sync_boost",
    pynvml.nvmlClocksEventReasonSwThermalSlowdown: "sw_thermal",
    pynvml.nvmlClocksEventReasonHwThermalSlowdown: "hw_thermal",
    pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown: "hw_power_brake",
    pynvml.nvmlClocksEventReasonDisplayClockSetting: "display_clocks",
}


def decode_clock_events(mask: int) -> str:
    """'sw_power_cap+hw_thermal' for a reasons bitmask; '' when none are set."""
    return "+".join(name for bit, name in CLOCK_EVENT_BITS.items() if mask & bit)


def cuda_info(index: int = 0) -> tuple[DeviceInfo, Nvml | None]:
    import torch

    props = torch.cuda.get_device_properties(index)
    uuid = getattr(props, "uuid", None)
    try:
        nvml = Nvml(index, f"GPU-{uuid}" if uuid else None)
        identity = nvml.identity()
    except PerfkitError as exc:  # a GPU without NVML (some containers): still measurable
        nvml, identity = None, {"nvml_error": str(exc)}
    name = identity.get("name") or props.name
    spec_key = match_spec(name)
    details = {
        **identity,
        "compute_capability": f"{props.major}.{props.minor}",
        "allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "sm_count": props.multi_processor_count,
        **versions(),
    }
    key = spec_key or normalize_name(name)
    l2 = getattr(props, "L2_cache_size", 0) or 50 << 20
    return DeviceInfo("cuda", key, name, spec_key, l2, props.total_memory, torch.get_num_threads(), details), nvml


def available_bytes(info: DeviceInfo) -> int:
    """Memory free for benchmark tensors right now."""
    if info.kind == "cuda":
        import torch

        return torch.cuda.mem_get_info()[0]
    return cpu_available_bytes()


@contextmanager
def torch_threads(count: int | None):
    """torch's intra-op thread count set for a block (None: left as it is), and restored
    after it: whoever called (a notebook, a test, a command's --measure) goes on with its own."""
    import torch

    before = torch.get_num_threads()
    if count:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)
