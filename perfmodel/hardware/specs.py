"""Device specs: load and validate the YAML files in hw_specs/ (or a user's own file).

A spec is data, never code: adding a device is adding one YAML file. Every number must
carry a source, so a roofline can always say where its ceilings come from.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from hw_specs import SPEC_DIR
from perfmodel.base.checks import is_real
from perfmodel.base.dtypes import DTYPES, check_dtype
from perfmodel.base.errors import PerfkitError

REQUIRED_NUMBERS = ("memory_gb", "memory_bandwidth_gb_s")
OPTIONAL_NUMBERS = (
    "memory_bus_width_bits",
    "memory_clock_mhz",
    "boost_clock_mhz",
    "sm_count",
    "l2_cache_mb",
    # Per-GPU bidirectional GPU-to-GPU bandwidth as the datasheet gives it (NVLink, or PCIe
    # where the card has no NVLink); perfmodel.latency.allreduce's ring model halves it per direction.
    "interconnect_gb_s",
    # The SM clock the datasheet's tensor peak_tflops are stated at, where it is not
    # boost_clock_mhz (Hopper's tensor cores boost to 1830 MHz, its SMs to 1980).
    "tensor_clock_mhz",
    # The SM clock held while back-to-back dense 16-bit GEMMs run at the default power limit,
    # as a per-kernel benchmark times them: the tensor peak scales with it (sustained_flops).
    "sustained_clock_mhz",
)
# How many devices the interconnect joins at interconnect_gb_s, where it joins fewer than a
# node holds (2 for a card's NVLink bridge): the ring model prices no all-reduce over more
# (perfmodel.latency.allreduce_ring). Given by the bridged cards only.
REACH_NUMBERS = ("interconnect_devices",)
# What each number may be: ranges far past any device's, so that a unit slip (bytes for GB,
# Hz for MHz) or a stray exponent is refused at load instead of planning a batch of 2^40
# sequences. Keyed by field; peak_tflops per dtype.
PHYSICAL_RANGES = {
    "memory_gb": (0.25, 16384.0),
    "memory_bandwidth_gb_s": (1.0, 100_000.0),
    "memory_bus_width_bits": (8.0, 65536.0),
    "memory_clock_mhz": (10.0, 100_000.0),
    "boost_clock_mhz": (100.0, 10_000.0),
    "sm_count": (1.0, 10_000.0),
    "l2_cache_mb": (0.01, 10_000.0),
    "interconnect_gb_s": (0.1, 100_000.0),
    "tensor_clock_mhz": (100.0, 10_000.0),
    "sustained_clock_mhz": (100.0, 10_000.0),
    "interconnect_devices": (1.0, 1024.0),
    "peak_tflops": (0.001, 100_000.0),
}
# Per-kernel launch costs (microseconds) of the traced step (perfmodel.latency.traced): what one
# more small kernel adds to a step launched eagerly, one kernel at a time from the host, and
# inside a captured CUDA graph. A graph node replaces a launch, so it costs no more than one.
LAUNCH_NUMBERS = ("kernel_launch_us", "graph_node_us")
# Microseconds, not seconds: a launch cost outside this range is a unit slip.
LAUNCH_RANGE_US = (0.05, 1000.0)
# Short name of that link (nvlink3, nvlink4, nvlink5, pcie4, pcie5): picks the ring model's fitted
# latency and efficiency (perfmodel.latency.allreduce). Text, but it needs a source like a number.
# architecture: the GPU generation and die (e.g. ampere-ga100); a device without measurements
# borrows the latency calibration of a measured one of the same architecture.
# memory_type: the DRAM class (MEMORY_TYPES); the bandwidth a GEMM achieves depends on it.
OPTIONAL_TEXT = ("interconnect", "architecture", "memory_type")
MEMORY_TYPES = ("HBM2", "HBM2e", "HBM3", "HBM3e", "GDDR6", "GDDR6X", "GDDR7")
# tf32 is a tensor-core mode for fp32 tensors, recorded for reference, not a storage dtype.
# A quantized weight format's tensor rate with no compute dtype of its own (NVFP4's, which
# perfmodel.base.precision.WEIGHT_PEAK names): a peak a spec may state and peak_flops answers.
FORMAT_PEAKS = ("fp4",)
PEAK_KEYS = DTYPES + ("tf32", *FORMAT_PEAKS)


@dataclass(frozen=True)
class HardwareSpec:
    key: str
    name: str
    memory_gb: float
    memory_bandwidth_gb_s: float
    peak_tflops: dict[str, float]
    sources: dict[str, str]
    aliases: tuple[str, ...] = ()
    memory_bus_width_bits: float | None = None
    memory_clock_mhz: float | None = None
    boost_clock_mhz: float | None = None
    sm_count: float | None = None
    l2_cache_mb: float | None = None
    interconnect_gb_s: float | None = None
    interconnect_devices: float | None = None
    tensor_clock_mhz: float | None = None
    sustained_clock_mhz: float | None = None
    kernel_launch_us: float | None = None
    graph_node_us: float | None = None
    interconnect: str | None = None
    architecture: str | None = None
    memory_type: str | None = None
    notes: str = ""
    path: Path | None = field(default=None, compare=False)

    @property
    def bandwidth(self) -> float:
        """DRAM bandwidth in bytes/s."""
        return self.memory_bandwidth_gb_s * 1e9

    def peak_flops(self, dtype: str) -> float:
        """Dense peak in FLOP/s for `dtype` (or a format's: FORMAT_PEAKS)."""
        if dtype not in FORMAT_PEAKS:
            check_dtype(dtype)
        if dtype not in self.peak_tflops:
            have = ", ".join(k for k in self.peak_tflops if k in DTYPES)
            raise PerfkitError(f"{self.name} has no {dtype} peak in its spec; it has: {have}")
        return self.peak_tflops[dtype] * 1e12

    def sustained_flops(self, dtype: str) -> float:
        """Dense FLOP/s for `dtype` at the sustained clock: the datasheet peak scaled by
        sustained_clock_mhz over the clock the peak is stated at (tensor_clock_mhz, else
        boost_clock_mhz); the peak itself where the spec gives no sustained clock."""
        stated = self.tensor_clock_mhz or self.boost_clock_mhz
        if self.sustained_clock_mhz is None or stated is None:
            return self.peak_flops(dtype)
        return self.peak_flops(dtype) * self.sustained_clock_mhz / stated

    @property
    def memory_family(self) -> str | None:
        """HBM or GDDR: stacked on the package, or chips on the board."""
        return None if self.memory_type is None else self.memory_type.rstrip("0123456789eX")

    @property
    def generation(self) -> str | None:
        """The architecture's generation (ampere of ampere-ga102)."""
        return None if self.architecture is None else self.architecture.split("-")[0]

    def ridge_point(self, dtype: str) -> float:
        """The datasheet roofline's ridge (FLOP/byte) for `dtype`."""
        return ridge(self.peak_flops(dtype), self.bandwidth)

    @property
    def computed_bandwidth_gb_s(self) -> float | None:
        """2 x memory clock x bus width / 8: what the clocks imply, to cross-check the datasheet."""
        if self.memory_clock_mhz is None or self.memory_bus_width_bits is None:
            return None
        return 2 * self.memory_clock_mhz * 1e6 * self.memory_bus_width_bits / 8 / 1e9

    def source_of(self, name: str) -> str:
        """The source for field `name` ('peak_tflops.fp16' falls back to 'peak_tflops')."""
        while name:
            if name in self.sources:
                return self.sources[name]
            name = name.rpartition(".")[0]
        return ""


def ridge(peak_flops: float, bandwidth: float) -> float:
    """Operational intensity (FLOP/byte) where a roofline's bandwidth slope meets its compute
    ceiling: peak FLOP/s over bytes/s. Below it a kernel is memory-bound, above it compute-bound."""
    return peak_flops / bandwidth


def normalize_name(name: str) -> str:
    return re.sub(r"[\s_]+", "-", str(name).strip().lower())


def parse_spec(data: object, path: Path) -> HardwareSpec:
    """Validate the YAML content of one spec file; every error names the file and the field."""
    where = str(path)
    if not isinstance(data, dict):
        raise PerfkitError(f"{where}: expected a mapping of fields, got {type(data).__name__}")

    def number(name: str, value: object, positive: bool = False) -> float:
        if not is_real(value):
            raise PerfkitError(f"{where}: field {name!r} must be a number, got {value!r}")
        if value < 0 or (positive and value == 0):
            raise PerfkitError(f"{where}: field {name!r} must be positive, got {value!r}")
        low, high = PHYSICAL_RANGES.get(name.partition(".")[0], (-math.inf, math.inf))
        if not low <= value <= high:
            raise PerfkitError(f"{where}: field {name!r} is {value:g}, outside what a device has ({low:g} to {high:g})")
        return float(value)

    for name in ("name", "peak_tflops", "sources", *REQUIRED_NUMBERS):
        if data.get(name) is None:
            raise PerfkitError(f"{where}: missing field {name!r}")
    unknown = set(data) - {
        "name",
        "aliases",
        "peak_tflops",
        "sources",
        "notes",
        *REQUIRED_NUMBERS,
        *OPTIONAL_NUMBERS,
        *REACH_NUMBERS,
        *LAUNCH_NUMBERS,
        *OPTIONAL_TEXT,
    }
    if unknown:
        raise PerfkitError(f"{where}: unknown field(s) {', '.join(sorted(map(str, unknown)))}")

    sources = data["sources"]
    if not isinstance(sources, dict) or not all(isinstance(v, str) and v.strip() for v in sources.values()):
        raise PerfkitError(f"{where}: field 'sources' must map field names to non-empty text")
    peaks = data["peak_tflops"]
    if not isinstance(peaks, dict) or not peaks:
        raise PerfkitError(f"{where}: field 'peak_tflops' must map dtypes ({', '.join(PEAK_KEYS)}) to TFLOP/s")
    for dtype in peaks:
        if dtype not in PEAK_KEYS:
            raise PerfkitError(f"{where}: field 'peak_tflops.{dtype}': unknown dtype; allowed: {', '.join(PEAK_KEYS)}")
    peak_tflops = {str(k): number(f"peak_tflops.{k}", v, positive=True) for k, v in peaks.items()}

    numbers = {n: number(n, data[n], positive=True) for n in REQUIRED_NUMBERS}
    optional = (*OPTIONAL_NUMBERS, *REACH_NUMBERS)
    numbers.update({n: number(n, data[n], positive=True) for n in optional if data.get(n) is not None})
    numbers.update(launch_costs(data, number, where))
    if numbers.get("interconnect_devices", 1) % 1:
        raise PerfkitError(f"{where}: field 'interconnect_devices' must be a whole number of devices")
    texts = {}
    for name in OPTIONAL_TEXT:
        if data.get(name) is not None:
            if not isinstance(data[name], str) or not data[name].strip():
                raise PerfkitError(f"{where}: field {name!r} must be a short name, got {data[name]!r}")
            texts[name] = data[name].strip()
    if texts.get("memory_type", MEMORY_TYPES[0]) not in MEMORY_TYPES:
        raise PerfkitError(
            f"{where}: field 'memory_type' is {texts['memory_type']!r}; allowed: {', '.join(MEMORY_TYPES)}"
        )
    for name in [*numbers, *texts, *(f"peak_tflops.{k}" for k in peak_tflops)]:
        if name not in sources and name.partition(".")[0] not in sources:
            raise PerfkitError(f"{where}: field {name!r} has no entry in 'sources'")

    aliases = data.get("aliases") or []
    names = isinstance(aliases, list) and all(isinstance(a, (str, int, float)) and len(str(a)) <= 100 for a in aliases)
    if not names:
        raise PerfkitError(f"{where}: field 'aliases' must be a list of names (each at most 100 characters)")
    return HardwareSpec(
        key=normalize_name(path.stem),
        name=str(data["name"]),
        aliases=tuple(str(a) for a in aliases),
        peak_tflops=peak_tflops,
        sources={str(k): str(v) for k, v in sources.items()},
        notes=str(data.get("notes") or "").strip(),
        path=path,
        **numbers,
        **texts,
    )


def launch_costs(data: dict, number, where: str) -> dict[str, float]:
    """kernel_launch_us and graph_node_us where given: microseconds in LAUNCH_RANGE_US, a graph
    node no dearer than a launch, and a graph node only beside the launch it replaces."""
    low, high = LAUNCH_RANGE_US
    costs = {}
    for name in LAUNCH_NUMBERS:
        if data.get(name) is None:
            continue
        value = number(name, data[name], positive=True)
        if not low <= value <= high:
            raise PerfkitError(
                f"{where}: field {name!r} is {value:g}; give microseconds per kernel, {low:g} to {high:g}"
            )
        costs[name] = value
    if "graph_node_us" in costs and "kernel_launch_us" not in costs:
        raise PerfkitError(f"{where}: field 'graph_node_us' needs 'kernel_launch_us' (the eager launch it replaces)")
    if costs.get("graph_node_us", 0) > costs.get("kernel_launch_us", math.inf):
        raise PerfkitError(
            f"{where}: field 'graph_node_us' ({costs['graph_node_us']:g}) exceeds 'kernel_launch_us' "
            f"({costs['kernel_launch_us']:g}): a graph node replaces an eager launch and costs no more"
        )
    return costs


# A spec is a few kilobytes of numbers and sources; anything much larger is not one.
MAX_SPEC_BYTES = 256 * 1024


def load_spec_file(path: str | Path) -> HardwareSpec:
    path = Path(path)
    try:
        if path.stat().st_size > MAX_SPEC_BYTES:
            raise PerfkitError(
                f"{path}: {path.stat().st_size:,} bytes is not a spec file (at most {MAX_SPEC_BYTES:,}; see hw_specs/)"
            )
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PerfkitError(f"cannot read spec file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        byte = exc.object[exc.start]
        raise PerfkitError(f"{path}: not UTF-8 text (byte {byte:#04x} at offset {exc.start})") from None
    try:
        data = parsed_yaml(text)
    except yaml.YAMLError as exc:
        raise PerfkitError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    except PerfkitError as exc:
        raise PerfkitError(f"{path}: {exc}") from None
    return parse_spec(data, path)


# libyaml's parser where PyYAML was built with it: the pure-Python one is ~10x slower.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.lru_cache(maxsize=64)
def parsed_yaml(text: str) -> object:
    """The YAML content of a spec file's text, parsed once per process.

    One command resolves devices many times (every latency source looks for a device to
    borrow from), so each spec would otherwise be parsed a dozen times. Keyed on the text
    itself, not the file's name or timestamp, so an edited spec is always reread; the file
    read that this costs is a fraction of a millisecond. parse_spec only reads the result
    and builds fresh containers, so no caller can change what the cache holds.
    """
    # YAML anchors and aliases let a few kilobytes stand for an exponentially large document
    # (nested lists of lists of ...): refused before anything is built, as no spec needs them.
    for token in yaml.scan(text, Loader=_LOADER):
        if isinstance(token, (yaml.AnchorToken, yaml.AliasToken)):
            line = token.start_mark.line + 1 if token.start_mark else "?"
            raise PerfkitError(f"line {line}: YAML anchors and aliases (&name, *name) are not allowed in a spec file")
    return yaml.load(text, Loader=_LOADER)


def load_all_specs(spec_dir: Path = SPEC_DIR) -> dict[str, HardwareSpec]:
    """Every shipped spec by key, sorted by key: each file read once per process while it stays
    as it is (its name, modification time and size), each call given its own copies."""
    stamps = tuple((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(spec_dir.glob("*.yaml")))
    return {key: own_copy(spec) for key, spec in _specs_in(spec_dir, stamps).items()}


@functools.lru_cache(maxsize=8)
def _specs_in(spec_dir: Path, stamps: tuple) -> dict[str, HardwareSpec]:
    specs = (load_spec_file(spec_dir / name) for name, _, _ in stamps)
    return {s.key: s for s in sorted(specs, key=lambda s: s.key)}


def own_copy(spec: HardwareSpec) -> HardwareSpec:
    """A spec whose containers are the caller's: changing them cannot change the next load."""
    return dataclasses.replace(spec, peak_tflops=dict(spec.peak_tflops), sources=dict(spec.sources))


def name_index(specs: dict[str, HardwareSpec]) -> dict[str, str]:
    """Normalized key, name and alias -> spec key; two devices claiming one name is an error."""
    index: dict[str, str] = {}
    for spec in specs.values():
        for name in {spec.key, normalize_name(spec.name), *map(normalize_name, spec.aliases)}:
            if index.get(name, spec.key) != spec.key:
                raise PerfkitError(f"device name {name!r} is claimed by both {index[name]} and {spec.key}")
            index[name] = spec.key
    return index


def find_spec(name: str, spec_dir: Path = SPEC_DIR) -> HardwareSpec:
    """The spec whose key, name or alias matches `name`; an unknown name lists the known ones."""
    specs = load_all_specs(spec_dir)
    index = name_index(specs)
    wanted = normalize_name(name)
    if wanted in index:
        return specs[index[wanted]]
    close = difflib.get_close_matches(wanted, list(index), n=1, cutoff=0.5)
    hint = f"; closest match: {index[close[0]]}" if close else ""
    raise PerfkitError(f"unknown device {name!r}; known devices: {', '.join(specs)}{hint} (or pass --spec FILE)")


def resolve_spec(gpu: str | None = None, spec: str | Path | None = None) -> HardwareSpec:
    """A device from `--gpu NAME` or `--spec FILE` (exactly one)."""
    if (gpu is None) == (spec is None):
        raise PerfkitError("give exactly one of a device name (--gpu) or a spec file (--spec)")
    return find_spec(gpu) if gpu is not None else load_spec_file(spec)
