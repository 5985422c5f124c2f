"""A deployment's step models of the flavours asked, the traced one among them: the decoder's
traced step (its tracer on the floor above the analytic core), in a launch regime where asked.
Shared by the commands that price one point: perfmodel.speedup and perfmodel.published_check."""

from __future__ import annotations

from perfmodel.base.attention_code import AttentionCode
from perfmodel.base.launch import Launch
from perfmodel.latency.source import decoder_latency
from perfmodel.latency.step import StepFlavor
from perfmodel.latency.tensor_parallel import TensorParallelStep, step_collectives
from perfmodel.latency.traced_step import TracedStep
from perfmodel.planning.deployment import Deployment


def point_steps(
    deployment: Deployment,
    flavors,
    cuda_graph: bool = False,
    regime=None,
    host=None,
    attention: AttentionCode = AttentionCode.SDPA,
) -> dict:
    """Step models of each flavour for a deployment; a traced one traces the reference
    decoder's steps, its forward replayed from a CUDA graph with cuda_graph, or the step of a
    launch regime priced end to end (perfmodel.latency.traced_step.TracedStep.regime), its
    attention run as `attention` (perfmodel.base.attention_code)."""
    device, model, dtype, tp, latency = (
        deployment.view,
        deployment.model,
        deployment.dtype,
        deployment.tp,
        deployment.latency,
    )
    untraced = [f for f in flavors if f != StepFlavor.TRACED]
    steps = deployment.steps(untraced) if untraced else {}
    if StepFlavor.TRACED in flavors:
        from decoder.trace import StepTracer  # torch loads only when a step is traced

        shard = model.shard(tp)
        source = decoder_latency(device, shard, dtype, latency)
        regime = None if regime is None else Launch.parse(regime)
        # one tracer for the step's life: each point traced once, its weightless decoders built once
        tracer = StepTracer(launch=regime or Launch.EAGER, attention=attention)
        traced = TracedStep(shard, source, dtype, tracer, cuda_graph=cuda_graph, regime=regime, host=host)
        comm = step_collectives(device.evidence, tp, dtype, source.stack)
        steps["traced"] = TensorParallelStep(traced, tp, comm.all_reduce, dtype, comm.gather)
    return steps
