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

from perfmodel.errors import PerfkitError
from perfmodel.hardware import HardwareSpec, normalize_name, resolve_spec
from perfmodel.latency import RooflineParams


@dataclass(frozen=True)
class DeviceView:
    spec: HardwareSpec
    params: RooflineParams
    measured: pd.DataFrame | None = None  # measured rows, data-contract columns
    ceilings: dict | None = None  # the newest measured ceilings (profilers.ceilings.Ceilings as dict)
    sources: tuple[Path, ...] = field(default_factory=tuple)  # measurement files behind them
    is_cpu: bool = False

    def models(self) -> list[str]:
        return sorted(set(self.measured["model"])) if self.measured is not None and len(self.measured) else []


def is_cpu_name(name: str | None) -> bool:
    return name is not None and (normalize_name(name) == "cpu" or normalize_name(name).startswith("cpu-"))


def load_sources(paths: list[Path], device: str | None = None) -> tuple[pd.DataFrame | None, dict | None]:
    """Measured rows of sweep files, and the newest ceilings recorded with them."""
    from profilers.store import latest_run_with_ceilings, measured_rows

    if not paths:
        return None, None
    rows = pd.concat([measured_rows(p) for p in paths], ignore_index=True)
    runs = [r for r in (latest_run_with_ceilings(p, device) for p in paths) if r]
    newest = max(runs, key=lambda r: r.get("started", 0)) if runs else None
    return rows, newest


def cpu_view(name: str, paths: list[Path]) -> DeviceView:
    from profilers.ceilings import Ceilings, ceilings_spec
    from profilers.store import stored_sweeps

    key = device_key(name, None)
    paths = paths or stored_sweeps(key)
    if not paths:
        raise PerfkitError(f"no measurements of {key} are stored; run with --measure (a few minutes) or pass --measurements FILE")
    rows, run = load_sources(paths, key)
    if run is None:
        raise PerfkitError(f"the measurements of {key} carry no ceilings; rerun the sweep without --no-ceilings")
    ceilings = Ceilings.from_dict(run["ceilings"])
    spec = ceilings_spec(ceilings, run["device"]["name"], run["device"]["memory_bytes"])
    # Measured ceilings are already achievable: no derating on top of them.
    params = RooflineParams(compute_efficiency=1.0, memory_efficiency=1.0, label="measured ceilings, no derating")
    return DeviceView(spec, params, rows, run["ceilings"], tuple(paths), is_cpu=True)


def gpu_view(gpu: str | None, spec_file: str | Path | None, paths: list[Path]) -> DeviceView:
    from profilers.store import stored_sweeps

    spec = resolve_spec(gpu, spec_file)
    paths = paths or stored_sweeps(spec.key)
    rows, run = load_sources(paths)
    return DeviceView(spec, RooflineParams(), rows, run["ceilings"] if run else None, tuple(paths))


def device_key(gpu: str | None, spec_file: str | Path | None) -> str:
    """The key measured rows and output folders use: 'cpu' means this machine's CPU."""
    if is_cpu_name(gpu):
        from profilers.device import this_cpu_key

        return this_cpu_key() if normalize_name(gpu) == "cpu" else normalize_name(gpu)
    return resolve_spec(gpu, spec_file).key


def resolve_view(gpu: str | None, spec_file: str | Path | None, measurement_files: list[Path]) -> DeviceView:
    if is_cpu_name(gpu):
        return cpu_view(gpu, measurement_files)
    return gpu_view(gpu, spec_file, measurement_files)
