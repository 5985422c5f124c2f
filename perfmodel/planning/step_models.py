"""The step models a sweep or a plan is priced by, one per flavour:

- `paper`: the Medusa paper's simplified Llama block (Appendix G.3; perfmodel.latency.step);
- `full`: the whole model step from its operator inventory (perfmodel.latency.step);
- `traced`: every kernel the reference decoder's step launches, from a trace table, each
  priced (perfmodel.latency.traced_step.TracedStep).

A traced step needs a tracer: the command hands in the decoder's (decoder.trace.StepTracer),
so that the analytic core prices trace tables without importing the decoder.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from perfmodel.base.errors import PerfkitError
from perfmodel.base.launch import Launch
from perfmodel.latency.choice import LatencyChoice
from perfmodel.latency.source import decoder_latency
from perfmodel.latency.step import StepFlavor
from perfmodel.latency.tensor_parallel import TensorParallelStep, tensor_parallel_steps
from perfmodel.latency.traced import Tracer
from perfmodel.latency.traced_step import TracedStep
from perfmodel.measured.device_view import DeviceView
from perfmodel.models.config import ModelConfig

STEP_FLAVORS = (StepFlavor.PAPER, StepFlavor.FULL, StepFlavor.TRACED)
# The flavours that price a whole decoding step (a capacity plan, a report's recommendations).
WHOLE_STEP_FLAVORS = (StepFlavor.FULL, StepFlavor.TRACED)


def check_flavors(flavors, allowed=STEP_FLAVORS) -> tuple[StepFlavor, ...]:
    flavors = tuple(flavors)
    unknown = [f for f in flavors if f not in allowed]
    if not flavors:
        raise PerfkitError(f"no step flavour given; choose from: {', '.join(allowed)}")
    if unknown:
        raise PerfkitError(f"unknown step flavour {', '.join(map(repr, unknown))}; choose from: {', '.join(allowed)}")
    return tuple(StepFlavor(f) for f in flavors)


def check_tracer(flavors, tracer) -> None:
    """A traced flavour needs a tracer: one line where none was handed in."""
    if StepFlavor.TRACED in flavors and tracer is None:
        raise PerfkitError(
            "the traced step needs a tracer (decoder.trace.StepTracer: the commands' --step traced hands it in)"
        )


def check_launch_step(launch: Launch | str | None, step: str) -> Launch | None:
    """The launch regime as a Launch (None stays None), refused in one line for a step other
    than the traced one: only the reference decoder's traced step has launches to price."""
    if launch is None:
        return None
    launch = Launch.parse(launch)
    if step != StepFlavor.TRACED:
        raise PerfkitError(f"--launch {launch} prices the traced step's launches: use --step traced (not {step})")
    return launch


@dataclass(frozen=True)
class StepSetting:
    """What every flavour of one deployment's step shares: `model` split `tp` ways on `view`
    in `dtype`, priced as `latency` asks; `tracer` and `launch` for the traced flavour."""

    view: DeviceView
    model: ModelConfig
    dtype: str
    tp: int
    latency: str | LatencyChoice
    tracer: Tracer | None
    launch: Launch | None


def source_priced(setting: StepSetting, full: TensorParallelStep, flavor: StepFlavor) -> TensorParallelStep:
    """A step priced op by op from the shard's latency source (the paper's, the full step)."""
    shard = full.shard_step
    return (
        full
        if flavor == shard.flavor
        else dataclasses.replace(full, shard_step=dataclasses.replace(shard, flavor=flavor))
    )


def traced_priced(setting: StepSetting, full: TensorParallelStep, flavor: StepFlavor) -> TensorParallelStep:
    """The reference decoder's step on its own kernels (the device's torch stack where it has
    one, perfmodel.latency.source.decoder_latency), the full step's collectives around it. The
    decoder runs 16-bit kernels only: a quantized model's traced step would be another model's."""
    if full.model.weights is not None or full.model.kv_cache is not None:
        raise PerfkitError(
            f"the traced step is the reference decoder's 16-bit kernels; {full.model.name}'s {full.model.precision} "
            "are priced in the full and paper steps (--step full)"
        )
    own = decoder_latency(setting.view, full.model, setting.dtype, setting.latency)
    traced = TracedStep(full.model, own, setting.dtype, setting.tracer, regime=setting.launch)
    return TensorParallelStep(traced, setting.tp, full.all_reduce, setting.dtype, full.gather)


# How each flavour is built over the full step (its shard, latency source and collectives):
# a new flavour is one entry here and one in STEP_FLAVORS.
FLAVOR_BUILDERS: dict[StepFlavor, Callable[[StepSetting, TensorParallelStep, StepFlavor], TensorParallelStep]] = {
    StepFlavor.PAPER: source_priced,
    StepFlavor.FULL: source_priced,
    StepFlavor.TRACED: traced_priced,
}


def flavor_steps(
    view: DeviceView,
    model: ModelConfig,
    dtype: str,
    tp: int = 1,
    latency: str | LatencyChoice = "auto",
    flavors=("full",),
    tracer: Tracer | None = None,
    launch: Launch | None = None,
) -> dict[str, TensorParallelStep]:
    """One step model per flavour, in the order asked, for `model` split tp ways on `view`
    (setting_steps, its arguments spelled out). tracer: (model, batch, context, candidates,
    dtype) -> trace table, needed by the traced flavour. launch: the regime the traced step
    is priced in end to end (perfmodel.latency.traced_step.TracedStep.regime; None: its kernels'
    sum), its tracer tracing that regime's step."""
    return setting_steps(StepSetting(view, model, dtype, tp, latency, tracer, launch), flavors)


def setting_steps(setting: StepSetting, flavors=("full",)) -> dict[str, TensorParallelStep]:
    """One step model per flavour, in the order asked: the shard timed by the view's latency
    source plus its all-reduces where tp > 1 (perfmodel.latency.tensor_parallel), each flavour
    built over that full step by its FLAVOR_BUILDERS entry."""
    flavors = check_flavors(flavors)
    check_tracer(flavors, setting.tracer)
    full = tensor_parallel_steps(setting.view, setting.model, setting.dtype, setting.tp, setting.latency)
    return {f: FLAVOR_BUILDERS[f](setting, full[StepFlavor.FULL], f) for f in flavors}
