"""A deployment: one model on one device, as it is priced. `resolve(model, devices, ...)` builds
one per device at the edge, checking every choice once, and every planner (the capacity plan,
the serving search, the speculation schedule, the simulations, the report) takes deployments
instead of looking the model, device, dtype and latency source up again.

A Deployment owns its step models: `steps(...)` prices each flavour once per instance and
keeps it, and `at(tp)` gives the same deployment split tp ways (kept too), so a plan and a
serving search of one deployment share their step models.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from perfmodel.base.checks import is_count
from perfmodel.base.dtypes import check_dtype, default_dtype
from perfmodel.base.errors import PerfkitError
from perfmodel.base.launch import Launch
from perfmodel.base.precision import check_runs_on
from perfmodel.hardware.efficiencies import RooflineParams
from perfmodel.latency.choice import LatencyChoice
from perfmodel.latency.step import StepFlavor
from perfmodel.latency.tensor_parallel import TensorParallelStep, check_degree
from perfmodel.latency.traced import Tracer
from perfmodel.measured.device_view import DeviceView, resolve_devices
from perfmodel.models.config import ModelConfig, load_model
from perfmodel.models.moe import MoeSplit
from perfmodel.planning.step_models import (
    WHOLE_STEP_FLAVORS,
    StepSetting,
    check_flavors,
    check_launch_step,
    check_tracer,
    setting_steps,
)


@dataclass(frozen=True)
class DeploymentChoices:
    """How a model is deployed and priced, the same on every device asked about.

    dtype: the weights' and KV cache's type, None for each device's default (fp32 on a CPU,
    fp16 on a GPU). tensor_parallel: devices per replica, None for the planner's choice (the
    degree with the most tokens/s per device). latency: the latency source (auto, measured,
    calibrated, datasheet, or a LatencyChoice with its stack). step: the step flavour, full
    (the whole model's operators) or traced (every kernel of the reference decoder's step,
    traced by `tracer`, decoder.trace.StepTracer). launch: the regime the traced step is
    priced in end to end (eager, static, graph; None: its kernels' sum). params: the datasheet
    roofline's efficiencies for every device, None for each device's own."""

    dtype: str | None = None
    tensor_parallel: int | None = 1
    latency: str | LatencyChoice = "auto"
    step: StepFlavor | str = StepFlavor.FULL
    tracer: Tracer | None = None
    launch: Launch | str | None = None
    params: RooflineParams | None = None


@dataclass(frozen=True)
class Deployment:
    """`model` on `view` in `dtype`, split `tp` ways (None: not yet chosen), its steps priced by
    `latency` as the `step` flavour (see DeploymentChoices). Built by resolve()."""

    model: ModelConfig
    view: DeviceView
    dtype: str
    tp: int | None = 1
    latency: LatencyChoice = LatencyChoice()
    step: StepFlavor = StepFlavor.FULL
    tracer: Tracer | None = None
    launch: Launch | None = None
    _steps: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _degrees: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def device(self) -> str:
        """The device's key (h100-sxm, cpu-..., a spec file's key)."""
        return self.view.spec.key

    def at(self, tp: int) -> Deployment:
        """This deployment split `tp` ways: itself where it is, else one kept per degree."""
        if tp == self.tp:
            return self
        if tp not in self._degrees:
            self._degrees[tp] = dataclasses.replace(self, tp=tp)
        return self._degrees[tp]

    def expert_splits(self) -> tuple[Deployment, ...]:
        """The deployments the planners search at this degree: an MoE model served `auto` (the
        default) over more than one device once with its experts tensor-parallel and once
        expert-parallel (perfmodel.models.moe), those whose experts the tables measured (each
        priced here, once); any other deployment itself. Where neither split is measured, the
        expert-parallel one's error."""
        moe = self.model.moe
        if moe is None or moe.split != MoeSplit.AUTO or not self.tp or self.tp == 1:
            return (self,)
        split = [dataclasses.replace(self, model=self.model.as_served(moe_split=s)) for s in (MoeSplit.TP, MoeSplit.EP)]
        measured = []
        for deployment in split:
            try:
                deployment.steps()
            except PerfkitError:
                if deployment is split[-1] and not measured:
                    raise
                continue
            measured.append(deployment)
        return tuple(measured)

    @property
    def experts(self) -> str:
        """How an MoE model's experts are split over the degree (tp, ep, auto); '' otherwise."""
        return str(self.model.moe.split) if self.model.moe is not None and self.tp and self.tp > 1 else ""

    def steps(self, flavors: Iterable[str] | None = None) -> dict[StepFlavor, TensorParallelStep]:
        """One step model per flavour (default: the deployment's own), priced once per
        instance (perfmodel.planning.step_models.setting_steps)."""
        if self.tp is None:
            raise PerfkitError("a deployment's steps need its tensor-parallel degree: price deployment.at(tp)")
        wanted = check_flavors(dict.fromkeys(flavors or (self.step,)))
        missing = [f for f in wanted if f not in self._steps]
        if missing:
            self._steps.update(setting_steps(self.step_setting, missing))
        return {f: self._steps[f] for f in wanted}

    @property
    def step_setting(self) -> StepSetting:
        """What every flavour of this deployment's step shares (perfmodel.planning.step_models)."""
        return StepSetting(self.view, self.model, self.dtype, self.tp, self.latency, self.tracer, self.launch)

    def step_model(self, flavor: str | None = None) -> TensorParallelStep:
        """The step model of one flavour (default: the deployment's own)."""
        flavor = flavor or self.step
        return self.steps([flavor])[StepFlavor(flavor)]


def resolve(
    model: str | Path | ModelConfig, devices, choices: DeploymentChoices | None = None
) -> tuple[Deployment, ...]:
    """One Deployment per device: `model` a preset name, config.json or ModelConfig; `devices`
    names, spec files, HardwareSpecs or DeviceViews, one or many (resolve_devices); `choices`
    the same on every device (DeploymentChoices; default: each device's dtype, one device, the
    auto latency source, the full step). Every choice is checked here, once, each bad one in
    one line naming it and what is allowed."""
    choices = choices or DeploymentChoices()
    if choices.dtype is not None:
        check_dtype(choices.dtype)
    if choices.tensor_parallel is not None and not is_count(choices.tensor_parallel):
        raise PerfkitError(
            f"tensor_parallel must be a positive integer or None (auto), got {choices.tensor_parallel!r}"
        )
    latency = LatencyChoice.of(choices.latency)
    (step,) = check_flavors([choices.step], WHOLE_STEP_FLAVORS)
    check_tracer([step], choices.tracer)
    launch = check_launch_step(choices.launch, step)
    model = model if isinstance(model, ModelConfig) else load_model(model)
    views = resolve_devices(devices)
    for view in views:  # a format the device cannot run is refused before anything is priced
        check_runs_on(model.weights, view.spec)
    if choices.tensor_parallel is not None:
        for view in views:
            check_degree(model, view.evidence, choices.tensor_parallel)
    if choices.params is not None:
        views = [dataclasses.replace(view, params=choices.params) for view in views]
    return tuple(
        Deployment(
            model,
            view,
            choices.dtype or default_dtype(view),
            choices.tensor_parallel,
            latency,
            step,
            choices.tracer,
            launch,
        )
        for view in views
    )
