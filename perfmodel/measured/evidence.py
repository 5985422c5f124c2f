"""A device's measured evidence, resolved once: its spec, every software stack measured on it
(engine and version, the tables each holds, their provenance) and its per-model profiles.

A command resolves each device once at its edge (perfmodel.measured.device_view builds the
DeviceView that holds the evidence; perfmodel.planning.deployment's Deployment holds the
view), and everything below takes the evidence: the GEMM grids and calibrations, attention
tables, collectives and logits gathers built from it are kept on it, so one plan over many
batches, degrees and flavours reads and fits each table once. As aiconfigurator keeps one
database per system, one process keeps one evidence per device and spec while the files
behind it stay as they are (`device_evidence`); an edited spec or a re-imported stack is a
new one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from perfmodel.base.errors import PerfkitError
from perfmodel.hardware.specs import HardwareSpec, find_spec
from perfmodel.measured.aiconfigurator import ShippedStack, shipped_stacks, stack_stamps
from perfmodel.measured.store import measurement_roots, stored_profiles

T = TypeVar("T")


@dataclass(frozen=True, eq=False)
class DeviceEvidence:
    """What was measured on one device: `stacks` (each engine-version folder, its tables and
    provenance) and `profiles` (Vidur-style per-model profile files), with `spec` the device
    they are priced on. Whatever is built from them is kept (`derived`)."""

    spec: HardwareSpec
    stacks: tuple[ShippedStack, ...] = ()
    profiles: tuple[Path, ...] = ()
    _derived: dict = field(default_factory=dict, init=False, repr=False)

    @property
    def key(self) -> str:
        return self.spec.key

    def with_table(self, table: str) -> list[ShippedStack]:
        """The stacks that hold `table` (gemm, generation_attention, all_reduce, ...)."""
        return [s for s in self.stacks if s.has(table)]

    def derived(self, what: tuple, build: Callable[[], T]) -> T:
        """What `build` makes of this evidence, built the first time `what` is asked for."""
        if what not in self._derived:
            self._derived[what] = build()
        return self._derived[what]


# One evidence per spec and state of the files behind it, for the process (module doc).
_KEPT: dict[tuple, DeviceEvidence] = {}
_KEEP_AT_MOST = 64


def device_evidence(spec: HardwareSpec, roots: list[Path] | None = None) -> DeviceEvidence:
    """The evidence of the device `spec` describes: the stacks and profiles stored under its
    key in the measurement roots (the user's first), read once while they stay as they are."""
    roots = list(roots or measurement_roots())
    profiles = tuple(stored_profiles(spec.key, roots))
    state = (repr(spec), tuple(map(str, roots)), stack_stamps(spec.key, roots), tuple(map(file_stamp, profiles)))
    if state not in _KEPT:
        if len(_KEPT) >= _KEEP_AT_MOST:
            _KEPT.pop(next(iter(_KEPT)))
        _KEPT[state] = DeviceEvidence(spec, tuple(shipped_stacks(spec.key, roots)), profiles)
    return _KEPT[state]


def file_stamp(path: Path) -> tuple[str, int, int]:
    stat = path.stat()
    return str(path), stat.st_mtime_ns, stat.st_size


def as_evidence(device: str | HardwareSpec | DeviceEvidence) -> DeviceEvidence:
    """Evidence as given, or resolved from a device name, alias or spec: for callers at the
    edge (tests, one-off checks); the planners hand the evidence their Deployment holds."""
    if isinstance(device, DeviceEvidence):
        return device
    if isinstance(device, HardwareSpec):
        return device_evidence(device)
    if not isinstance(device, str):
        raise PerfkitError(f"a device is a name, a HardwareSpec or a DeviceEvidence, got {type(device).__name__}")
    return device_evidence(find_spec(device))
