"""Serving capacity against latency targets: for each device, tensor-parallel degree and
Medusa setting, the highest request rate one replica serves within the targets (found by
simulating it, perfmodel.serving.simulator), the latency percentiles there and at the
target rate's share, and the devices a target rate needs.

`serve(model, devices, workload, targets, ...)` answers (a ServingAnswer,
perfmodel.serving.capacity_answer); `python -m perfmodel.plan` with `--rate` (or `--trace`)
prints it. The step and prefill are priced by one latency source per device
(perfmodel.latency.source, as every plan is), the tree at each batch and context by the
speculation schedule (perfmodel.planning.schedule) built on that same step.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from perfmodel.acceptance.rates import AcceptanceChoice, AcceptanceSetting, medusa_acceptance
from perfmodel.base.checks import split_options
from perfmodel.base.drafter_kind import DrafterKind
from perfmodel.base.errors import PerfkitError
from perfmodel.latency.step import StepFlavor
from perfmodel.latency.step_cost import StepCost
from perfmodel.latency.tensor_parallel import check_degree, usable_degrees
from perfmodel.measured.device_view import DeviceView
from perfmodel.models.config import ModelConfig
from perfmodel.planning.deployment import Deployment, DeploymentChoices, resolve
from perfmodel.planning.drafters import KIND_NAMES
from perfmodel.planning.measured_chain import MeasuredChain, drafter_memory, measured_chain
from perfmodel.planning.medusa_setting import MedusaSetting, check_medusa
from perfmodel.planning.memory import memory_fit
from perfmodel.planning.schedule import ScheduleRequest, build_schedule, view_evidence
from perfmodel.planning.schedule_format import SpeculationSchedule
from perfmodel.planning.simulations import CANDIDATE_SIZES
from perfmodel.planning.workload import Requests, Targets, Workload
from perfmodel.serving.capacity_answer import NAN, SPECULATOR, ServingAnswer, ServingOption
from perfmodel.serving.costs import CostBounds, ServingCosts, tabulate_costs
from perfmodel.serving.simulator import EngineConfig, ServingRun, simulate

# The rate search stops when the feasible and infeasible rates are this close (relative).
RATE_PRECISION = 0.02
# A rate that saturates any replica: every request arrives at once.
FLOOD_RATE = 1e9


@dataclass(frozen=True)
class Replica:
    """One configuration: a device at a tensor-parallel degree, a Medusa setting, and its
    tabulated costs (None where the model does not fit)."""

    view: DeviceView
    tp: int
    dtype: str
    medusa: str
    costs: ServingCosts | None
    schedule: SpeculationSchedule | None
    note: str = ""


def half_octaves(top: int) -> np.ndarray:
    """Batches 1, 2, 3, 4, 6, 8, 11, 16, ... up to `top`, and top: the schedule's grid for a
    simulation, twice as dense as an engine's table, since a band runs the tree of its lowest
    batch and a tree that wins at 16 may lose at 31."""
    grid = np.unique(np.rint(2 ** (np.arange(2 * int(top).bit_length() + 1) / 2)).astype(np.int64))
    return np.union1d(grid[grid <= top], [top])


def replica(
    deployment: Deployment,
    medusa: str,
    acceptance: AcceptanceChoice,
    workload: Workload,
    reserve: float = 0.1,
    max_seqs: int = 256,
    chain: MeasuredChain | None = None,
) -> Replica:
    """The costs of a deployment (its model split deployment.tp ways on its device) with
    Medusa `medusa`: the step at the schedule's tree for every batch up to what the KV cache
    holds (at most max_seqs) and every context up to the longest request's, and the prefill.
    chain: another drafter's measured chains instead of the heads' trees (the setting then
    applies to it: off, its chain where it wins, or on), its memory in place of the heads'."""
    model, view, dtype, tp, step = deployment.model, deployment.view, deployment.dtype, deployment.tp, deployment.step
    medusa = check_medusa(medusa)
    kv_tokens = workload.kv_tokens
    drafter = None if chain is None or medusa == MedusaSetting.OFF else chain.drafter_on(deployment)
    held = None if drafter is None else drafter_memory(drafter, model, dtype, tp)
    heads = chain is None and medusa != MedusaSetting.OFF and model.medusa_heads > 0
    fit = memory_fit(model, view.spec, dtype, tp, kv_tokens, reserve, heads=heads, drafter=held)
    capacity = int(fit.free // fit.kv_token) if fit.free > 0 else 0
    if fit.max_batch < 1:
        where = f"{tp} x {view.spec.key}" if tp > 1 else f"one {view.spec.key}"
        note = (
            f"does not fit: {(fit.weights + fit.heads) / 1e9:,.1f} GB of {fit.holds}, {capacity:,} KV tokens "
            f"left on {where} for sequences of {kv_tokens:,} (p95) tokens"
        )
        return Replica(view, tp, dtype, medusa, None, None, note)
    steps = deployment.steps([step, StepFlavor.FULL])
    seqs = int(min(max_seqs, capacity // max(1, round(workload.prompt.mean + workload.response.mean))))
    max_context = int(workload.kv_tokens) * 2
    # Off, plain decoding wins every cell: no tree sizes to price
    sizes = (1,) if medusa == MedusaSetting.OFF else CANDIDATE_SIZES
    batches = half_octaves(max(seqs, 1))
    if drafter is None:
        request = ScheduleRequest(acceptance, batches, medusa=medusa, sizes=sizes)
    else:
        rates, config = chain.rates, chain.draft_config
        request = ScheduleRequest(
            None, batches, medusa=medusa, drafter=chain.drafter, position_rates=rates, draft_config=config
        )
    schedule = build_schedule(steps[step], request, deployment, view_evidence(view, steps[step]))
    bounds = CostBounds(max(seqs, 1), max_context, capacity, max(band.tree_size for band in schedule.bands))
    decode = steps[step] if drafter is None else drafter.step(steps[step])
    composed = ComposedStep(decode, steps[StepFlavor.FULL])
    costs = tabulate_costs(
        composed, acceptance.model, schedule.tree_size, bounds, steps[step].label, medusa != MedusaSetting.OFF
    )
    return Replica(view, tp, dtype, medusa, costs, schedule)


@dataclass(frozen=True)
class ComposedStep:
    """Decoding priced by the chosen step flavour, prefill by the full step (a traced step
    has no prefill of its own; both use one latency source)."""

    decode: StepCost
    prefill: StepCost

    @property
    def model(self):
        return self.decode.model

    @property
    def shard(self) -> StepCost:
        return self.decode.shard

    @property
    def label(self) -> str:
        return self.decode.label

    @property
    def evidence(self) -> str:
        return self.decode.evidence

    def step_time(self, batch, seq_len, candidates=1):
        return self.decode.step_time(batch, seq_len, candidates)

    def prefill_time(self, batch, prompt_len, medusa=False):
        return self.prefill.prefill_time(batch, prompt_len, medusa)


def max_feasible_rate(requests: Requests, costs: ServingCosts, targets: Targets, engine: EngineConfig):
    """The highest request rate (per second) meeting the targets, and its run: a bisection
    between 0 and the rate that saturates the replica. (0, None) where even an idle replica
    misses them."""
    flood = simulate(requests.at_rate(FLOOD_RATE), costs, engine)
    # Past the rate whose tokens the replica makes flat out, the queue grows without bound.
    mean_output = float(np.mean(requests.output))
    high = flood.tokens_s / mean_output
    low = high * 0.01
    best = simulate(requests.at_rate(low), costs, engine, give_up=targets)
    if not meets(best, targets, low * mean_output):
        return 0.0, None
    while (high - low) / high > RATE_PRECISION:
        mid = math.sqrt(low * high)
        run = simulate(requests.at_rate(mid), costs, engine, give_up=targets)
        if meets(run, targets, mid * mean_output):
            low, best = mid, run
        else:
            high = mid
    return low, best


# A replica keeps up with a rate when its steady-state output is at least this share of the
# offered tokens/s; below, its queue grows and TTFT with it, whatever the sample shows.
KEEPS_UP = 0.9


def meets(run: ServingRun, targets: Targets, offered_tokens_s: float) -> bool:
    if run.missed:
        return False
    q = targets.percentile
    stable = run.tokens_s >= KEEPS_UP * offered_tokens_s
    return stable and targets.met(run.percentile("ttft_s", q), run.percentile("tpot_s", q))


@dataclass(frozen=True)
class ServeRequest:
    """What the serving search is asked, beside its deployments and workload: the acceptance
    (a preset or a decoder.measure record, perfmodel.acceptance.rates.resolve_acceptance),
    the Medusa setting searched beside plain decoding (off: plain decoding only), the engine's
    scheduling limits, and the fraction of each device's memory kept free."""

    acceptance: AcceptanceSetting = "paper"
    medusa: str = MedusaSetting.AUTO
    engine: EngineConfig | None = None
    reserve: float = 0.1
    # another drafter than the Medusa heads, from its measured per-position acceptance
    # (perfmodel.planning.measured_chain): `medusa` is then its setting
    drafter: str = DrafterKind.MEDUSA
    position_rates: tuple[float, ...] | None = None
    draft_config: str | Path | None = None


def serve(model: str | ModelConfig, devices, workload: Workload, targets: Targets | None = None, **options):
    """Search every device x tensor-parallel degree (the one given, or each usable degree of
    1, 2, 4, 8) x Medusa setting (off, and `medusa` unless it is off) for the capacity within
    `targets` of the workload's requests (see the module docstring); a ServingAnswer.

    model: a preset name, config.json or ModelConfig. devices: names, spec files or
    DeviceViews (perfmodel.measured.device_view.resolve_devices). options: how it is deployed,
    the fields of perfmodel.planning.deployment.DeploymentChoices (dtype: None for each
    device's default; tensor_parallel: default None, every usable degree; latency, step,
    tracer, launch, params), and the fields of ServeRequest (acceptance, medusa, engine,
    reserve). The target rate is the workload's rate (a trace's own where none is given), or
    the rate that makes targets.tokens_s where that is higher. serve_deployments() takes
    resolved deployments."""
    deployment, request = split_options(options, (DeploymentChoices, ServeRequest), "serve()")
    tp = deployment.pop("tensor_parallel", None)
    # the degree is checked per device by serve_deployments (the degrees it can use there)
    deployments = resolve(model, devices, DeploymentChoices(**deployment, tensor_parallel=None))
    return serve_deployments([d.at(tp) for d in deployments], workload, targets, ServeRequest(**request))


def serve_deployments(
    deployments, workload: Workload, targets: Targets | None = None, request: ServeRequest | None = None
) -> ServingAnswer:
    """serve() over resolved deployments of one model (perfmodel.planning.deployment.resolve);
    a deployment's tp None searches every usable degree."""
    deployments = (deployments,) if isinstance(deployments, Deployment) else tuple(deployments)
    request = request or ServeRequest()
    model = deployments[0].model
    medusa = check_medusa(request.medusa)
    chain = measured_chain(request.drafter, request.position_rates, request.draft_config)
    if chain is None:
        choice, speculator = medusa_acceptance(request.acceptance), SPECULATOR
    else:
        choice, speculator = AcceptanceChoice(chain.acceptance, chain.describe()), KIND_NAMES[chain.drafter]
    targets = targets or Targets()
    engine = request.engine or EngineConfig()
    reserve = request.reserve
    if not 0 <= reserve < 1:
        raise PerfkitError(f"reserve must be a fraction in [0, 1), got {reserve!r}")
    off = MedusaSetting.OFF
    modes = (off,) if medusa == off or not (model.medusa_heads or chain) else (off, medusa)
    requests = workload.sample()
    target_rate = workload.rate if workload.rate is not None else (requests.rate if workload.trace else None)
    if targets.tokens_s is not None:
        target_rate = max(target_rate or 0.0, targets.tokens_s / float(np.mean(requests.output)))
    options = []
    for deployment in deployments:
        usable = usable_degrees(model, deployment.view.evidence)
        if deployment.tp is not None:
            check_degree(model, deployment.view.evidence, deployment.tp)
        degrees = [deployment.tp] if deployment.tp is not None else [tp for tp in (1, 2, 4, 8) if tp in usable]
        for mode in modes:
            for tp in degrees:
                for split in deployment.at(tp).expert_splits():  # an MoE model's experts tp- and ep-wise
                    rep = replica(split, mode, choice, workload, reserve, engine.max_seqs, chain)
                    option = answer(rep, requests, targets, engine, target_rate)
                    options.append(dataclasses.replace(option, experts=split.experts))
    answered = (model.title, workload.describe(), targets, engine, choice.label, target_rate, tuple(options))
    return ServingAnswer(*answered, speculator=speculator)


def answer(rep: Replica, requests: Requests, targets: Targets, engine: EngineConfig, target_rate) -> ServingOption:
    """One configuration's capacity and latencies (see ServingOption)."""
    spec = rep.view.spec
    base = dict(device=spec.key, name=spec.name, tp=rep.tp, dtype=rep.dtype, medusa=rep.medusa)
    if rep.costs is None:  # nothing served, nothing measured: the fields' defaults
        return ServingOption(**base, fits=False, meets_targets=False, note=rep.note)
    costs = rep.costs
    mean_output = float(np.mean(requests.output))
    context = float(np.mean(requests.prompt) + mean_output / 2)
    seconds, tokens, _ = costs.step(1, context)
    unloaded_ttft = float(costs.prefill(np.mean(requests.prompt)))
    rate, run = max_feasible_rate(requests, costs, targets, engine)
    replicas = None if target_rate is None or rate == 0 else max(1, math.ceil(target_rate / rate))
    load = rate if replicas is None else target_rate / replicas
    if run is not None and replicas is not None:
        run = simulate(requests.at_rate(load), costs, engine)
    note = "" if run is not None else f"misses {targets.describe()} even unloaded"
    q = lambda what, p: NAN if run is None else run.percentile(what, p)  # noqa: E731
    return ServingOption(
        **base,
        fits=True,
        meets_targets=run is not None,
        max_rate=rate,
        max_tokens_s=rate * mean_output,
        replicas=replicas,
        devices=None if replicas is None else replicas * rep.tp,
        load_rate=load if run is not None else NAN,
        ttft_p50_s=q("ttft_s", 50),
        ttft_p90_s=q("ttft_s", 90),
        ttft_p99_s=q("ttft_s", 99),
        tpot_p50_s=q("tpot_s", 50),
        tpot_p90_s=q("tpot_s", 90),
        tpot_p99_s=q("tpot_s", 99),
        tokens_s=NAN if run is None else run.tokens_s,
        mean_batch=NAN if run is None else run.mean_batch,
        tree_share=NAN if run is None else run.tree_share,
        unloaded_ttft_s=unloaded_ttft,
        unloaded_tpot_s=seconds / tokens,
        kv_capacity_tokens=costs.kv_capacity,
        max_seqs=costs.max_seqs,
        latency=costs.label,
        note=note,
        schedule=rep.schedule,
    )
