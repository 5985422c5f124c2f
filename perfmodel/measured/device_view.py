"""Everything the roofline knows about one device: its spec, its measurements, its ceilings.

A GPU's spec comes from hw_specs/ (datasheet); measured rows and empirical ceilings come
from a sweep: run now (--measure), given (--measurements FILE), or shipped with the
toolkit (profilers/measurements/<device>/). A CPU has no datasheet: its spec is built
from its measured ceilings, which are then its only ceilings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from perfmodel.base.errors import PerfkitError
from perfmodel.hardware.ceilings import Ceilings, ceilings_spec
from perfmodel.hardware.cpu_identity import this_cpu_key
from perfmodel.hardware.efficiencies import RooflineParams
from perfmodel.hardware.specs import (
    HardwareSpec,
    find_spec,
    load_all_specs,
    load_spec_file,
    name_index,
    normalize_name,
    resolve_spec,
)
from perfmodel.measured.evidence import DeviceEvidence, device_evidence
from perfmodel.measured.store import latest_run_with_ceilings, measured_rows, stored_devices, stored_sweeps


@dataclass(frozen=True)
class DeviceView:
    spec: HardwareSpec
    params: RooflineParams
    measured: pd.DataFrame | None = None  # measured rows, data-contract columns
    ceilings: dict | None = None  # the newest measured ceilings (profilers.ceilings.Ceilings as dict)
    sources: tuple[Path, ...] = field(default_factory=tuple)  # measurement files behind them
    is_cpu: bool = False
    stand_in_for: str | None = None  # this machine's CPU key, when another CPU's stored data stands in for it
    # Its stacks and profiles (perfmodel.measured.evidence), resolved with the view when not given.
    evidence: DeviceEvidence | None = None

    def __post_init__(self) -> None:
        if self.evidence is None or self.evidence.spec is not self.spec:
            object.__setattr__(self, "evidence", device_evidence(self.spec))

    def models(self) -> list[str]:
        return sorted(set(self.measured["model"])) if self.measured is not None and len(self.measured) else []


def is_cpu_name(name: str | None) -> bool:
    return name is not None and (normalize_name(name) == "cpu" or normalize_name(name).startswith("cpu-"))


def load_sources(paths: list[Path], device: str | None = None) -> tuple[pd.DataFrame | None, dict | None]:
    """Measured rows of sweep files, and the newest ceilings recorded with them; rows of
    another device than `device` are an error (perfmodel.measured.store.measured_rows)."""
    if not paths:
        return None, None
    rows = pd.concat([measured_rows(p, device) for p in paths], ignore_index=True)
    runs = [r for r in (latest_run_with_ceilings(p, device) for p in paths) if r]
    newest = max(runs, key=lambda r: r.get("started", 0)) if runs else None
    return rows, newest


MEASURE_COMMAND = "python -m perfmodel.roofline --gpu cpu --measure"


def stand_in_key(key: str, stored: list[str]) -> str | None:
    """The stored CPU closest to `key`: the same core count first, then the same vendor."""
    cpus = [k for k in stored if is_cpu_name(k) and k != key]
    if not cpus:
        return None
    cores, vendor = key.rsplit("-", 1)[-1], key.split("-")[1] if key.count("-") > 1 else ""
    return min(cpus, key=lambda k: (k.rsplit("-", 1)[-1] != cores, k.split("-")[1] != vendor, k))


def cpu_view(name: str, paths: list[Path], log=print) -> DeviceView:
    """This machine's CPU (`cpu`) or a named stored one (`cpu-...`), from its measured ceilings.

    `cpu` with nothing stored for this machine falls back to the closest stored CPU, says
    so on `log`, and marks the view `stand_in_for` this machine."""
    key = device_key(name, None)
    stand_in = None
    if not paths:
        paths = stored_sweeps(key)
    if not paths:
        stored = stored_devices()
        other = stand_in_key(key, stored) if normalize_name(name) == "cpu" else None
        if other is None:
            cpus = [k for k in stored if is_cpu_name(k)]
            have = f"stored CPUs: {', '.join(cpus)} (use --gpu NAME)" if cpus else "no CPU measurements are stored"
            raise PerfkitError(
                f"no measurements of {key} are stored; {have}. Measure this machine (a few minutes): "
                f"{MEASURE_COMMAND}, "
                "or --measure on python -m reports build; or pass --measurements FILE"
            )
        log(
            f"note: this machine's CPU ({key}) has no stored measurements: showing {other}'s, measured on another "
            "machine. "
            f"To measure this one (a few minutes): {MEASURE_COMMAND}"
        )
        key, stand_in, paths = other, key, stored_sweeps(other)
    rows, run = load_sources(paths, key)
    if run is None:
        raise PerfkitError(f"the measurements of {key} carry no ceilings; rerun the sweep without --no-ceilings")
    ceilings = Ceilings.from_dict(run["ceilings"])
    spec = ceilings_spec(ceilings, run["device"]["name"], run["device"]["memory_bytes"])
    return DeviceView(
        spec, cpu_params(ceilings), rows, run["ceilings"], tuple(paths), is_cpu=True, stand_in_for=stand_in
    )


def cpu_params(ceilings) -> RooflineParams:
    """Measured ceilings are already achievable: no derating on top of them. The per-kernel
    overhead is the machine's measured floor where the ceilings carry one."""
    if ceilings.kernel_overhead_us is None:
        return RooflineParams(
            1.0, 1.0, label="measured ceilings, no derating; kernel overhead not measured with them (the default)"
        )
    overhead = ceilings.kernel_overhead_us * 1e-6
    return RooflineParams(1.0, 1.0, overhead, label="measured ceilings and kernel overhead, no derating")


def gpu_view(gpu: str | None, spec_file: str | Path | None, paths: list[Path]) -> DeviceView:
    return spec_view(resolve_spec(gpu, spec_file), paths)


def spec_view(spec: HardwareSpec, paths: list[Path] | tuple = ()) -> DeviceView:
    """A datasheet device with the public efficiency defaults, and its measurements when
    there are some (given, else stored)."""
    paths = list(paths) or stored_sweeps(spec.key)
    rows, run = load_sources(paths, spec.key)
    return DeviceView(spec, RooflineParams(), rows, run["ceilings"] if run else None, tuple(paths))


def device_key(gpu: str | None, spec_file: str | Path | None) -> str:
    """The key measured rows and output folders use: 'cpu' means this machine's CPU."""
    if is_cpu_name(gpu):
        return this_cpu_key() if normalize_name(gpu) == "cpu" else normalize_name(gpu)
    return resolve_spec(gpu, spec_file).key


def resolve_view(gpu: str | None, spec_file: str | Path | None, measurement_files: list[Path], log=print) -> DeviceView:
    if is_cpu_name(gpu):
        return cpu_view(gpu, measurement_files, log)
    return gpu_view(gpu, spec_file, measurement_files)


def resolve_devices(items, log=print) -> list[DeviceView]:
    """The one device resolver for many devices: names or aliases (cpu: this machine's CPU,
    cpu-...: a stored CPU), spec files, HardwareSpecs or DeviceViews, one or many, each
    device once, in the order given."""
    items = [items] if isinstance(items, (str, Path, HardwareSpec, DeviceView)) else list(items)
    if not items:
        raise PerfkitError("give at least one device")
    specs, index, out = None, None, {}
    for item in items:
        if isinstance(item, DeviceView):
            view = item
        elif isinstance(item, HardwareSpec):
            view = spec_view(item)
        elif is_cpu_name(str(item)):
            view = cpu_view(str(item), [], log)
        elif isinstance(item, Path) or str(item).endswith((".yaml", ".yml")):
            view = spec_view(load_spec_file(item))
        else:
            if specs is None:  # one read of hw_specs/ for all the names
                specs = load_all_specs()
                index = name_index(specs)
            key = index.get(normalize_name(item))
            view = spec_view(specs[key] if key else find_spec(item))  # find_spec raises, listing the known devices
        out.setdefault(view.spec.key, view)
    return list(out.values())
