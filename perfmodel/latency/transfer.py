"""GEMM latency on a device nobody measured, transferred from the devices that were, by physics.

A donor D has a measured GEMM grid in an engine's harness (perfmodel.latency.gemm_grid). The
target T's time for an (m x k) @ (k x n) GEMM is the donor's, scaled by the two devices' own
rooflines:

    t_T(k, n, m) = t_D(k, n, m) x roofline_T(k, n, m) / roofline_D(k, n, m)

and the donors' predictions are combined as a geometric mean weighted by similarity. What a
roofline here is made of, and why:

- compute: 2mnk over the tensor peak at the *sustained* clock (HardwareSpec.sustained_flops),
  not the boost clock: a power-limited L40S holds 2040 of its 2520 MHz through GEMM bursts;
- waves: times ceil(tiles / SMs) x SMs / tiles, for 128 x 128 output tiles. A GEMM whose tiles
  leave the last wave of SMs part-empty takes as long as a full wave, so the SM count moves
  the staircase: 128 tiles fill one wave of an H100's 132 SMs but take two on an A100's 108;
- memory: the bytes (both operands read once, the output written once) over the datasheet
  bandwidth x the share of it the harness's GEMMs reach when memory bound. The share is
  measured on each donor (m <= 16, n and k >= 4096: 0.70 on A100's HBM2e, 0.77-0.83 on
  Hopper's HBM3/HBM3e, 0.81 on L40S's GDDR6 in the vLLM harness); the target takes that of
  the donors of its memory class, else of its family (HBM, GDDR), else of all;
- the two add (a kernel overlaps little of its loads with its math at these sizes), plus a
  per-kernel floor that is a number of clock cycles, not of microseconds: each donor's floor is
  its grid's median time of tiny GEMMs (m <= 16, n and k <= 1024), and the target's is the
  donors' floor in cycles at its own sustained clock. The grids say so: 4.2 us on the A100 at
  1410 MHz, 3.0 on Hopper at 1830 and 2.7 on the L40S at 2040 (vLLM), 5900-5400 cycles each.
  A fixed 3 us floor (the datasheet roofline's) is the `fixed floor` variant of the ablation.

The staircase in m is the donor's, at the same m: tile edges are the kernels' (the same tiles
on every device), and the wave term above carries what the SM count changes. Scaling m by
the SMs ratio instead (tiles per wave) was tried and misses more (`python -m
perfmodel.transfer_check --ablation`).

Donors are weighted by similarity, exp(-(3 [other generation] + 1 [other memory family] +
2 |ln SMs ratio| + 0.5 |ln L2 ratio|)): the same generation runs the same kernels, the same
memory family reaches the same share, and near SM counts and L2 sizes quantize and cache
alike. The weights were set before the check, not fitted.

Every fitted number (the shares) is computed from the shipped grids and cached per process,
never stored. `leave_one_device_out` measures the method: each measured device predicted from
the others only; a TransferredGemm's label carries that error.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from perfmodel.base.errors import PerfkitError
from perfmodel.hardware.efficiencies import RooflineParams
from perfmodel.hardware.specs import HardwareSpec, find_spec, load_all_specs
from perfmodel.latency.gemm_grid import ENGINES, SIXTEEN_BIT, GemmGrid, gemm_grid, stack_names
from perfmodel.latency.roofline import kernel_time
from perfmodel.measured.evidence import DeviceEvidence, device_evidence
from perfmodel.models.operators import Matmul

TILE = 128  # output tile edge (rows and columns) for the wave count
ELEMENT_BYTES = 2  # the grids are 16-bit
OVERHEAD_S = RooflineParams().kernel_overhead_s
# Where the memory-bound share is measured on a donor's grid.
SHARE_MAX_M, SHARE_MIN_NK = 16, 4096
# The grid points a leave-one-device-out check compares (measured rows only, no filled holes):
# every hidden, head, MLP and vocabulary width of the model presets at TP 1-8 lies in 1024-65536
# but for llama-3's 128256-token vocabulary, and 8192 tokens covers prefill of every batch.
CHECK_MAX_M, CHECK_MIN_NK, CHECK_MAX_NK = 8192, 1024, 65536
# Where a donor's per-kernel floor is measured: GEMMs too small to be bound by anything else.
FLOOR_MAX_M, FLOOR_MAX_NK = 16, 1024
# Similarity penalties (see the module doc).
GENERATION_PENALTY, FAMILY_PENALTY, SM_PENALTY, L2_PENALTY = 3.0, 1.0, 2.0, 0.5


@dataclass(frozen=True)
class Method:
    """The transfer's choices; METHOD is the shipped one, VARIANTS what it was checked against."""

    roofline: str = "sum"  # sum: compute + memory time; max: the larger of the two
    waves: bool = True  # wave quantization by SM count
    m_scaled: bool = False  # donor staircase at m x SMs_D / SMs_T instead of at m
    clock: str = "sustained"  # sustained | datasheet (the boost-clock peak)
    weights: str = "similarity"  # similarity | equal
    shares: bool = True  # False: every device reaches the same share of its datasheet bandwidth
    floor: str = "cycles"  # cycles: the donors' floor in clock cycles; fixed: 3 us on every device


METHOD = Method()
VARIANTS = {
    "shipped": METHOD,
    "datasheet clock": Method(clock="datasheet"),
    "no bandwidth share": Method(shares=False),
    "no waves": Method(waves=False),
    "m scaled by SMs": Method(m_scaled=True),
    "max roofline": Method(roofline="max"),
    "equal weights": Method(weights="equal"),
    "fixed floor": Method(floor="fixed"),
}


@dataclass(frozen=True)
class Donor:
    """A measured device lending its grid: weight (normalized over the donors), the share
    of its datasheet bandwidth its memory-bound GEMMs reach and its per-kernel floor."""

    spec: HardwareSpec
    grid: GemmGrid
    weight: float
    share: float
    floor_s: float

    @property
    def name(self) -> str:
        return f"{self.spec.key} ({self.grid.stack.engine} {self.grid.stack.version}, weight {self.weight:.2f})"


@dataclass
class TransferredGemm:
    """GEMM times of `spec` in `engine`'s harness, transferred from other devices' grids.
    Duck-types GemmGrid where the latency source reads one: time, outside, gemms, label, dtype."""

    spec: HardwareSpec
    engine: str
    dtype: str
    donors: tuple[Donor, ...]
    share: float  # the target's assumed share of its datasheet bandwidth
    share_basis: str  # which donors it comes from
    method: Method = field(default=METHOD)

    @property
    def floor_s(self) -> float:
        """The target's per-kernel floor: the donors' weighted floor in cycles at its clock."""
        if self.method.floor == "fixed":
            return OVERHEAD_S
        cycles = sum(d.weight * d.floor_s * sustained_clock_hz(d.spec) for d in self.donors)
        return cycles / sustained_clock_hz(self.spec)

    def time(self, k, n, m) -> np.ndarray:
        """Seconds of an (m x k) @ (k x n) GEMM: the weighted geometric mean over donors."""
        m, n, k = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (m, n, k)))
        own = roofline(self.spec, self.share, m, n, k, self.dtype, self.method, self.floor_s)
        log_time = np.zeros(m.shape)
        for donor in self.donors:
            scaled = self.method.m_scaled and self.spec.sm_count and donor.spec.sm_count
            dm = np.maximum(1.0, m * donor.spec.sm_count / self.spec.sm_count) if scaled else m
            floor = donor.floor_s if self.method.floor == "cycles" else OVERHEAD_S
            theirs = roofline(donor.spec, donor.share, dm, n, k, self.dtype, self.method, floor)
            log_time += donor.weight * np.log(donor.grid.time(k, n, dm) * own / theirs)
        return np.exp(log_time)

    def outside(self, k, n, m) -> np.ndarray:
        """True where the heaviest donor's grid extrapolates."""
        return self.donors[0].grid.outside(k, n, m)

    def gemms(self) -> pd.DataFrame:
        """Transferred times on the heaviest donor's grid points (k, n, m, time_s)."""
        points = self.donors[0].grid.gemms()
        return points.assign(time_s=self.time(points["k"], points["n"], points["m"]))

    @property
    def label(self) -> str:
        lent = ", ".join(d.name for d in self.donors if d.weight >= 0.01)
        memory = self.spec.memory_type or "its memory"
        return (
            f"GEMMs transferred to {self.spec.key} from {lent} by physics (sustained tensor clock, {memory} bandwidth "
            f"share {self.share:.2f} of {self.share_basis}, SM waves, a {1e6 * self.floor_s:.1f} us kernel floor: "
            f"the donors' in cycles at its clock) ({error_summary(self.engine, self.dtype)})"
        )


def roofline(
    spec: HardwareSpec,
    share: float,
    m,
    n,
    k,
    dtype: str = "bf16",
    method: Method = METHOD,
    floor_s: float = OVERHEAD_S,
) -> np.ndarray:
    """The transfer's roofline of one device, seconds (see the module doc). A spec without
    an SM count gets no wave term."""
    flops = spec.sustained_flops(dtype) if method.clock == "sustained" else spec.peak_flops(dtype)
    compute = 2 * m * n * k / flops
    if method.waves and spec.sm_count:
        tiles = np.ceil(m / TILE) * np.ceil(n / TILE)
        compute = compute * np.ceil(tiles / spec.sm_count) * spec.sm_count / tiles
    memory = ELEMENT_BYTES * (m * k + k * n + m * n) / (spec.bandwidth * (share if method.shares else 1.0))
    combined = compute + memory if method.roofline == "sum" else np.maximum(compute, memory)
    return combined + floor_s


def sustained_clock_hz(spec: HardwareSpec) -> float:
    """The SM clock a per-kernel benchmark runs at: sustained, else the tensor peak's, else boost."""
    mhz = spec.sustained_clock_mhz or spec.tensor_clock_mhz or spec.boost_clock_mhz
    if not mhz:
        raise PerfkitError(f"{spec.key}: no SM clock in its spec (sustained_clock_mhz or boost_clock_mhz)")
    return mhz * 1e6


def similarity(target: HardwareSpec, donor: HardwareSpec) -> float:
    """How alike two devices are for the transfer (1 = identical); unknown fields count as different."""
    penalty = GENERATION_PENALTY * (target.generation is None or target.generation != donor.generation)
    penalty += FAMILY_PENALTY * (target.memory_family is None or target.memory_family != donor.memory_family)
    for weight, mine, theirs in (
        (SM_PENALTY, target.sm_count, donor.sm_count),
        (L2_PENALTY, target.l2_cache_mb, donor.l2_cache_mb),
    ):
        penalty += weight * (abs(math.log(mine / theirs)) if mine and theirs else 1.0)
    return math.exp(-penalty)


def measured_points(evidence: DeviceEvidence, stack: str, dtype: str) -> pd.DataFrame:
    """The grid's measured rows (m, n, k, time_s; the faster kernel where two were timed),
    without the holes GemmGrid fills: what a check may compare against. Kept on the evidence."""

    def points() -> pd.DataFrame:
        grid = gemm_grid(evidence, stack, dtype)
        table = grid.stack.table("gemm")
        table = table[table["dtype"] == grid.dtype]
        return table.groupby(["m", "n", "k"], as_index=False)["time_s"].min()

    return evidence.derived(("grid_points", stack, dtype), points)


def bandwidth_share(evidence: DeviceEvidence, stack: str, dtype: str) -> float:
    """The median share of the datasheet bandwidth the grid's memory-bound GEMMs reach."""
    rows = measured_points(evidence, stack, dtype)
    rows = rows[(rows["m"] <= SHARE_MAX_M) & (rows["n"] >= SHARE_MIN_NK) & (rows["k"] >= SHARE_MIN_NK)]
    if not len(rows):
        raise PerfkitError(f"{evidence.key} {stack}: no memory-bound GEMMs (m <= {SHARE_MAX_M}) to measure a share on")
    m, n, k = (rows[c].to_numpy(dtype=float) for c in ("m", "n", "k"))
    achieved = ELEMENT_BYTES * (m * k + k * n + m * n) / rows["time_s"].to_numpy(dtype=float)
    return float(np.median(achieved)) / evidence.spec.bandwidth


def kernel_floor(evidence: DeviceEvidence, stack: str, dtype: str) -> float:
    """The median time of the grid's tiny GEMMs (m <= 16, n and k <= 1024): the per-kernel floor."""
    rows = measured_points(evidence, stack, dtype)
    rows = rows[(rows["m"] <= FLOOR_MAX_M) & (rows["n"] <= FLOOR_MAX_NK) & (rows["k"] <= FLOOR_MAX_NK)]
    if not len(rows):
        raise PerfkitError(f"{evidence.key} {stack}: no GEMMs with m <= {FLOOR_MAX_M}, n and k <= {FLOOR_MAX_NK}")
    return float(rows["time_s"].median())


def donor_stacks(engine: str) -> dict[str, tuple[DeviceEvidence, str]]:
    """Device key -> its evidence and stack of `engine` (e.g. vllm-0.24.0), for every device
    with a grid of it."""
    if engine not in ENGINES:
        raise PerfkitError(f"engine {engine!r}: no grids of it; choose from: {', '.join(ENGINES)}")
    found = {}
    for key, spec in load_all_specs().items():
        evidence = device_evidence(spec)
        stacks = [s for s in stack_names(evidence) if s.split("-")[0] == engine]
        if stacks:
            found[key] = (evidence, stacks[0])
    return found


def engine_stacks(engine: str) -> dict[str, str]:
    """Device key -> its stack of `engine` (e.g. vllm-0.24.0), for every device with a grid of it."""
    return {key: stack for key, (_, stack) in donor_stacks(engine).items()}


def transferred_gemm(
    spec: HardwareSpec | str, engine: str, dtype: str, exclude=(), method: Method = METHOD
) -> TransferredGemm | None:
    """`spec`'s GEMM times in `engine`'s harness (vllm, sglang, trtllm), transferred from every
    other device with a grid of that engine, less `exclude` (names or keys). A device never
    lends to itself. None where no donor is left, or for a dtype the grids do not hold."""
    spec = spec if isinstance(spec, HardwareSpec) else find_spec(spec)
    if dtype not in SIXTEEN_BIT:
        return None
    left_out = {spec.key, *(find_spec(name).key for name in exclude)}
    donors = {key: found for key, found in donor_stacks(engine).items() if key not in left_out}
    grids = {key: gemm_grid(evidence, stack, dtype) for key, (evidence, stack) in donors.items()}
    donors = {key: found for key, found in donors.items() if grids[key] is not None}
    if not donors:
        return None
    specs = {key: evidence.spec for key, (evidence, _) in donors.items()}
    raw = {key: similarity(spec, s) if method.weights == "similarity" else 1.0 for key, s in specs.items()}
    total = sum(raw.values())
    weighted = (
        Donor(
            specs[key],
            grids[key],
            raw[key] / total,
            bandwidth_share(evidence, grids[key].stack.stack, dtype),
            kernel_floor(evidence, stack, dtype),
        )
        for key, (evidence, stack) in donors.items()
    )
    ordered = tuple(sorted(weighted, key=lambda d: -d.weight))
    share, basis = target_share(spec, ordered)
    return TransferredGemm(spec, engine, dtype, ordered, share, basis, method)


def target_share(spec: HardwareSpec, donors: tuple[Donor, ...]) -> tuple[float, str]:
    """The share of the donors of the target's memory class, else family, else all; weighted."""
    for same in (
        lambda d: spec.memory_type is not None and d.spec.memory_type == spec.memory_type,
        lambda d: spec.memory_family is not None and d.spec.memory_family == spec.memory_family,
        lambda d: True,
    ):
        pool = [d for d in donors if same(d)]
        if pool:
            weight = sum(d.weight for d in pool)
            share = sum(d.weight * d.share for d in pool) / weight
            return share, ", ".join(d.spec.key for d in pool)
    raise PerfkitError(f"{spec.key}: no donors to take a bandwidth share from")


# ----------------------------------------------------------------------------- the check


@dataclass(frozen=True)
class DeviceError:
    """One held-out device: its measured grid points against the transfer from the others,
    and against the datasheet roofline (the public efficiency defaults) on the same points."""

    device: str
    stack: str
    donors: str
    points: int
    median: float  # of |predicted / measured - 1|
    p90: float
    bias: float  # median of predicted / measured - 1 (negative: predicted too fast)
    datasheet_median: float
    datasheet_p90: float


def held_out_error(device_key: str, engine: str, dtype: str = "bf16", method: Method = METHOD) -> DeviceError:
    """Predict one measured device from the others only, on its measured grid points."""
    found = donor_stacks(engine).get(device_key)
    if found is None:
        raise PerfkitError(f"{device_key} has no {engine} grid to check against")
    evidence, stack = found
    transfer = transferred_gemm(evidence.spec, engine, dtype, method=method)
    if transfer is None:
        raise PerfkitError(f"{device_key}: no other device has a {engine} grid to transfer from")
    rows = measured_points(evidence, stack, dtype)
    rows = rows[
        (rows["m"] <= CHECK_MAX_M)
        & rows["n"].between(CHECK_MIN_NK, CHECK_MAX_NK)
        & rows["k"].between(CHECK_MIN_NK, CHECK_MAX_NK)
    ]
    m, n, k = (rows[c].to_numpy(dtype=float) for c in ("m", "n", "k"))
    measured = rows["time_s"].to_numpy(dtype=float)
    error = transfer.time(k, n, m) / measured - 1
    datasheet = kernel_time(Matmul(1, m, k, n, weight=True), dtype, transfer.spec, RooflineParams()) / measured - 1
    return DeviceError(
        device_key,
        stack,
        ", ".join(f"{d.spec.key} {d.weight:.2f}" for d in transfer.donors),
        len(rows),
        float(np.median(np.abs(error))),
        float(np.quantile(np.abs(error), 0.9)),
        float(np.median(error)),
        float(np.median(np.abs(datasheet))),
        float(np.quantile(np.abs(datasheet), 0.9)),
    )


@functools.lru_cache(maxsize=32)
def leave_one_device_out(engine: str, dtype: str = "bf16", method: Method = METHOD) -> tuple[DeviceError, ...]:
    """Every device with a grid of `engine`, each predicted from the others only."""
    return tuple(held_out_error(key, engine, dtype, method) for key in engine_stacks(engine))


def error_summary(engine: str, dtype: str = "bf16") -> str:
    """The method's measured error for a label, e.g. 'leave-one-device-out median 6-11%, p90 ...'."""
    errors = [e for e in leave_one_device_out(engine, dtype) if e.points]
    if len(errors) < 2:
        return "no leave-one-device-out check: fewer than two devices have this engine's grid"
    medians, p90s = [100 * e.median for e in errors], [100 * e.p90 for e in errors]
    return (
        f"leave-one-device-out median {min(medians):.0f}-{max(medians):.0f}%, p90 {min(p90s):.0f}-{max(p90s):.0f}% "
        f"over {', '.join(e.device for e in errors)}"
    )
