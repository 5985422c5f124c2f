"""How long each stage of a campaign will take, before it runs (--dry-run): predicted, not
measured.

A point's kernel time t comes from the roofline of the device (perfmodel.latency.roofline):
a GPU's datasheet with the public efficiency defaults, a CPU's measured ceilings. The
timing procedure (profilers.timer, profilers.sweeper.Sweeper.time) then sets the point's
wall time:

- warm-up calls, then samples until the noise target or the budget: a GPU kernel of
  STABLE_ABOVE_S or longer is taken to meet the target at min_reps (event timings of long
  kernels vary by well under 1%); shorter ones, and every CPU sample, to sample until the
  budget or max_reps is spent;
- every sample also pays the cache flush (twice the last-level cache written at the
  device's bandwidth) and REP_OVERHEAD_S (the call's launch and event records);
- on a GPU a kernel under 50 us is timed again in a CUDA graph over as many operand copies
  as overflow L2 (profilers.sweeper.GRAPH_BELOW_S): warm-up, capture and min_reps replays;
- every point pays POINT_OVERHEAD_S (making its operands, reading the device state before
  and after, freeing memory); one that does not fit in memory only that (a recorded skip).

The constants are read off the code path, not fitted to a run: campaign.json keeps each
stage's measured wall time beside its estimate, to check them on the first lent GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from perfmodel.base.dtypes import element_bytes
from perfmodel.base.errors import PerfkitError
from perfmodel.base.launch import Launch
from perfmodel.hardware.cpu_identity import this_cpu_key
from perfmodel.hardware.efficiencies import RooflineParams
from perfmodel.hardware.specs import HardwareSpec, find_spec
from perfmodel.latency.roofline import kernel_time, op_time
from perfmodel.measured.device_view import cpu_view
from perfmodel.models.config import load_model
from perfmodel.models.grid import iter_blocks
from perfmodel.models.operators import Matmul, op_kernels
from perfmodel.planning.memory import head_params, weight_params
from profilers.benchmarks import workspace_elements
from profilers.campaign_plan import CeilingsStage, GemmStage, HostDispatchStage, Plan, Stage, SweepStage, TwinStage
from profilers.ceilings import TORCH_DTYPES
from profilers.device import DeviceInfo, cpu_info, cuda_info
from profilers.sweeper import GRAPH_BELOW_S, MAX_GRAPH_COPIES
from profilers.timer import TimerConfig

POINT_OVERHEAD_S = {"cuda": 0.015, "cpu": 0.005}
REP_OVERHEAD_S = {"cuda": 20e-6, "cpu": 5e-6}
STABLE_ABOVE_S = {"cuda": 100e-6, "cpu": math.inf}
GRAPH_CAPTURE_S = 10e-6  # per captured call
# First touch of the ceilings' bandwidth arrays: page faults on a CPU (about 1 GB/s on the
# small virtual machines measured here), a fill at the device's bandwidth on a GPU.
FIRST_TOUCH_B_S = {"cpu": 1e9, "cuda": None}


@dataclass(frozen=True)
class Machine:
    """What an estimate needs of the device: its roofline and its memory and cache sizes."""

    device: str  # cpu | cuda
    spec: HardwareSpec
    params: RooflineParams
    cache_bytes: int
    memory_bytes: int
    basis: str  # where the roofline comes from, for the plan's header

    @property
    def bandwidth(self) -> float:
        return self.spec.bandwidth * self.params.memory_efficiency


def timing_seconds(machine: Machine, timer: TimerConfig, t, operand_bytes, needed_bytes) -> np.ndarray:
    """Wall seconds to time points of kernel time `t` (arrays), as the module doc says."""
    device = machine.device
    t = np.asarray(t, dtype=float)
    flush = 2 * machine.cache_bytes / machine.bandwidth if timer.flush_cache else 0.0
    sample = t + flush + REP_OVERHEAD_S[device]
    budget_reps = np.ceil(timer.budget_s / sample)
    reps = np.where(t >= STABLE_ABOVE_S[device], timer.min_reps, np.clip(budget_reps, timer.min_reps, timer.max_reps))
    seconds = (timer.warmup + reps) * sample
    if device == "cuda":
        copies = np.clip(np.ceil(2 * machine.cache_bytes / np.maximum(operand_bytes, 1)), 1, MAX_GRAPH_COPIES)
        replays = max(1, timer.warmup) + 1 + timer.min_reps
        graph = copies * (replays * t + GRAPH_CAPTURE_S) + copies * operand_bytes / machine.bandwidth
        seconds = seconds + np.where(t < GRAPH_BELOW_S, graph, 0.0)
    fits = np.asarray(needed_bytes) <= 0.9 * machine.memory_bytes
    return np.where(fits, seconds, 0.0) + POINT_OVERHEAD_S[device]


def sweep_seconds(stage: SweepStage, plan: Plan, machine: Machine) -> float:
    total = 0.0
    size = element_bytes(plan.dtype)
    for op, phase, points in iter_blocks(stage.model, stage.grid, stage.ops, stage.phases):
        b, s, q = (points[:, i] for i in range(3))
        kernels = op_kernels(op, phase, stage.model, b, s, q)
        t = op_time(kernels, plan.dtype, machine.spec, machine.params)
        operands = size * sum(np.asarray(k.elements, dtype=float) for k in kernels)
        workspace = size * np.maximum.reduce([np.broadcast_to(workspace_elements(k), b.shape) for k in kernels])
        total += float(np.sum(timing_seconds(machine, plan.timer, t, operands, operands + workspace)))
    return total


def gemm_seconds(stage: GemmStage, plan: Plan, machine: Machine) -> float:
    k, n, m = (np.array([p[i] for p in stage.points], dtype=float) for i in range(3))
    matmul = Matmul(1, m, k, n, weight=True)
    t = kernel_time(matmul, plan.dtype, machine.spec, machine.params)
    operands = element_bytes(plan.dtype) * np.asarray(matmul.elements, dtype=float)
    return float(np.sum(timing_seconds(machine, plan.timer, t, operands, operands)))


def ceilings_seconds(stage: CeilingsStage, machine: Machine) -> float:
    """profilers.ceilings: three arrays far beyond the cache, three streams over them, a
    large square matmul per dtype (n = 8192 on a GPU, the largest of 1024-4096 a CPU takes
    in half a second), the kernel overhead; each at least its budget once past min_reps."""
    timer, spec, device = stage.timer, machine.spec, machine.device
    target = max(16 * machine.cache_bytes, 1 << 30) if device == "cuda" else max(8 * machine.cache_bytes, 256 << 20)
    array = min(target, machine.memory_bytes // 8)
    calls = timer.warmup + timer.min_reps
    touch = 3 * array / (FIRST_TOUCH_B_S[device] or machine.bandwidth) if stage.streams else 0.0
    moves = (2, 3, 1) if stage.streams else ()
    streams = sum(max(timer.budget_s, calls * moved * array / machine.bandwidth) for moved in moves)
    peaks = 0.0
    # Every dtype the device runs: those of the ceilings' matmuls its spec has a peak for.
    for dtype in stage.dtypes or [d for d in TORCH_DTYPES if d in spec.peak_tflops]:
        rate = spec.peak_tflops.get(dtype)
        if not rate:
            continue
        sizes = (8192,) if device == "cuda" else (1024, 2048, 4096)
        for n in sizes:
            call = 2 * n**3 / (rate * 1e12 * machine.params.compute_efficiency)
            peaks += max(timer.budget_s, calls * call)
            if 8 * call > 0.5:
                break
    return touch + streams + peaks + max(timer.budget_s, calls * REP_OVERHEAD_S[device])


# The twin: kernels a step of the reference decoder launches per layer (about 40, measured by
# decoder.trace), each paying at least a launch from Python; and the work besides the timed
# decoding (warm-up, torch.profiler runs of the plain step and largest tree, the kernels'
# replay), as a multiple of it.
TWIN_KERNELS_PER_LAYER = 40
TWIN_LAUNCH_S = {"cuda": 10e-6, "cpu": 10e-6}
TWIN_EXTRA = 1.5
# Per batch, besides decoding: the dummy model built, its steps traced, and each of some 270
# distinct kernel calls replayed in a CUDA graph within the replay timer's budget (0.05 s).
TWIN_SETUP_S = {"cuda": 25.0, "cpu": 5.0}
# Profiling the kernel classes (torch.profiler with CUDA activity over two runs of two
# settings): the 7B twin's batches took 80-100 s on an H100 with it, some 60 s over their decoding.
TWIN_PROFILE_S = {"cuda": 45.0, "cpu": 2.0}


def twin_seconds(stage: TwinStage, plan: Plan, machine: Machine) -> float:
    """Every setting's decoding of the prompts, a step at the roofline of its weights
    streamed and its tokens' FLOPs, or the Python launches of its kernels, whichever is
    longer; every setting taken to decode new_tokens steps (the plain step's count, an
    upper bound for a tree)."""
    model = load_model(stage.model)
    model = replace(model, medusa_heads=max(model.medusa_heads, 1))
    params = weight_params(model) - model.vocab_size * model.hidden_size + head_params(model)  # the embedding: a gather
    weights = params * element_bytes(plan.dtype)
    peak = machine.spec.peak_flops(plan.dtype) * machine.params.compute_efficiency
    # a graph replays its kernels with no launch between them
    per_launch = TWIN_LAUNCH_S[machine.device]
    launches = 0.0 if stage.launch is Launch.GRAPH else TWIN_KERNELS_PER_LAYER * model.num_layers * per_launch
    total = 0.0
    for batch in stage.batches:
        for size in (1, *stage.sizes):
            step = max(weights / machine.bandwidth + 2 * params * batch * size / peak, launches)
            total += math.ceil(max(stage.prompts, batch) / batch) * stage.new_tokens * stage.rounds * step
    fixed = len(stage.batches) * (TWIN_SETUP_S[machine.device] + stage.profile * TWIN_PROFILE_S[machine.device])
    return total * (1 + TWIN_EXTRA) + fixed


# The host-dispatch microbenchmark: per kind, rounds of back-to-back calls of a few microseconds.
HOST_DISPATCH_S = {False: 10.0, True: 2.0}


def stage_seconds(stage: Stage, plan: Plan, machine: Machine) -> float:
    if isinstance(stage, HostDispatchStage):
        return HOST_DISPATCH_S[stage.quick]
    if isinstance(stage, CeilingsStage):
        return ceilings_seconds(stage, machine)
    if isinstance(stage, SweepStage):
        return sweep_seconds(stage, plan, machine)
    if isinstance(stage, TwinStage):
        return twin_seconds(stage, plan, machine)
    return gemm_seconds(stage, plan, machine)


def clock(seconds: float) -> str:
    """h:mm:ss or m:ss, rounded up (a stage of half a second shows 0:01, not 0:00)."""
    whole = math.ceil(seconds)
    hours, rest = divmod(whole, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


# A campaign planned on a machine without the GPU it is for is priced on this one: the GPU the
# lent machines carry.
DEFAULT_GPU = "h100-sxm"


def gpu_machine(info: DeviceInfo | None, gpu: str | None = None) -> Machine | None:
    """A GPU's datasheet roofline: `gpu` (a spec name), else the GPU here (`info`) where it
    has a spec, else DEFAULT_GPU when no GPU is here; None for a GPU here without a spec."""
    if gpu is None and info is not None and info.spec_key is None:
        return None
    spec = find_spec(gpu or (info.spec_key if info is not None else DEFAULT_GPU))
    here = info is not None and info.spec_key == spec.key
    cache = info.cache_bytes if here else int((spec.l2_cache_mb or 50) * 2**20)
    memory = info.memory_bytes if here else int(spec.memory_gb * 1e9)
    basis = f"the {spec.key} datasheet roofline with the public efficiency defaults"
    return Machine("cuda", spec, RooflineParams(), cache, memory, basis)


def cpu_machine(info: DeviceInfo) -> Machine | None:
    """This CPU's roofline from its stored ceilings, or the closest stored CPU's (said so);
    None where no stored CPU has ceilings (an estimate never stops a campaign)."""
    try:
        view = cpu_view("cpu", [], log=lambda *_: None)
    except PerfkitError:
        return None
    basis = f"the measured ceilings of {view.spec.key}"
    if view.stand_in_for:
        basis += f", standing in for this CPU ({view.stand_in_for}, not measured yet)"
    return Machine("cpu", view.spec, view.params, info.cache_bytes, info.memory_bytes, basis)


def plan_lines(plan: Plan, machine: Machine | None, folder) -> list[str]:
    """The plan as a table: each stage's points, estimated time and output."""
    estimates = [stage_seconds(s, plan, machine) if machine else None for s in plan.stages]
    basis = (
        f"predicted from {machine.basis} and the timer's repetitions"
        if machine
        else "none: no roofline for this device (a GPU without a spec in hw_specs/, or no stored CPU ceilings)"
    )
    lines = [
        f"{plan.variant} campaign on {plan.device}, {plan.dtype}, into {folder}/",
        f"estimated times: {basis}",
        f"{'#':>2}  {'stage':<20} {'points':>7} {'estimate':>9}  output / what",
    ]
    for i, (stage, seconds) in enumerate(zip(plan.stages, estimates), 1):
        shown = clock(seconds) if seconds is not None else "-"
        lines.append(f"{i:>2}  {stage.name:<20} {stage.size():>7,} {shown:>9}  {stage.out}")
        lines.append(f"{'':>2}  {'':<20} {'':>7} {'':>9}  {stage.what}")
    total = sum(s.size() for s in plan.stages)
    known = [s for s in estimates if s is not None]
    lines.append(f"total: {len(plan.stages)} stages, {total:,} points, estimated {clock(sum(known)) if known else '-'}")
    return lines


def dry_run_lines(plan: Plan, out: Path, gpu: str | None = None) -> list[str]:
    """The plan's table for --dry-run, priced on `gpu` (its datasheet alone: the same answer
    on any machine), else the GPU here, else DEFAULT_GPU (cuda), or on this CPU's measured
    ceilings (cpu). Nothing is measured or written."""
    if plan.device == "cuda":
        import torch

        info = cuda_info()[0] if gpu is None and torch.cuda.is_available() else None
        machine = gpu_machine(info, gpu)
        return plan_lines(plan, machine, out / (info.key if info is not None else machine.spec.key))
    return plan_lines(plan, cpu_machine(cpu_info()), out / this_cpu_key())
