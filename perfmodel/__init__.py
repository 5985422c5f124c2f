"""Analytic core: hardware specs, model configs, operator costs, latency prediction,
acceptance, trees and capacity planning, with their commands (python -m perfmodel.roofline).

What a serving team imports is here at the top (docs/library.md):

    from perfmodel import load_model, find_spec, latency_source, StepModel, plan

Each name is loaded on first use (PEP 562), so `import perfmodel.base.errors` or a command
that needs only a spec does not pay for pandas, scipy and the planner.
"""

from __future__ import annotations

import importlib

# name -> the module that defines it; the one table behind __all__, __getattr__ and __dir__.
_HOMES = {
    # errors
    "PerfkitError": "perfmodel.base.errors",
    # devices
    "HardwareSpec": "perfmodel.hardware.specs",
    "find_spec": "perfmodel.hardware.specs",
    "load_all_specs": "perfmodel.hardware.specs",
    "load_spec_file": "perfmodel.hardware.specs",
    "resolve_spec": "perfmodel.hardware.specs",
    "RooflineParams": "perfmodel.hardware.efficiencies",
    "DeviceView": "perfmodel.measured.device_view",
    "resolve_view": "perfmodel.measured.device_view",
    "resolve_devices": "perfmodel.measured.device_view",
    # models
    "ModelConfig": "perfmodel.models.config",
    "load_model": "perfmodel.models.config",
    "op_cost": "perfmodel.models.operators",
    # latency
    "LATENCY_CHOICES": "perfmodel.latency.choice",
    "LatencyModel": "perfmodel.latency.latency_model",
    "latency_source": "perfmodel.latency.source",
    "view_latency": "perfmodel.latency.source",
    "RooflineLatency": "perfmodel.latency.roofline",
    "MeasuredLatency": "perfmodel.latency.calibration",
    "StepModel": "perfmodel.latency.step",
    "TensorParallelStep": "perfmodel.latency.tensor_parallel",
    "tensor_parallel_steps": "perfmodel.latency.tensor_parallel",
    # acceptance
    "AcceptanceRecord": "perfmodel.acceptance.record",
    "own_record": "perfmodel.acceptance.record",
    "AcceptanceChoice": "perfmodel.acceptance.rates",
    "ACCEPTANCE_PRESETS": "perfmodel.acceptance.rates",
    "PAPER_ACCEPTANCE": "perfmodel.acceptance.rates",
    "PAPER_LN_ACCEPTANCE": "perfmodel.acceptance.rates",
    "LogAcceptance": "perfmodel.acceptance.rates",
    "HeadAccuracyAcceptance": "perfmodel.acceptance.rates",
    "fit_log_acceptance": "perfmodel.acceptance.rates",
    "resolve_acceptance": "perfmodel.acceptance.rates",
    "draft_model_tokens": "perfmodel.acceptance.rates",
    "draft_model_improvement": "perfmodel.acceptance.rates",
    # trees
    "Tree": "perfmodel.acceptance.trees",
    "greedy_tree": "perfmodel.acceptance.trees",
    "optimal_tree": "perfmodel.acceptance.trees",
    "export_tree": "perfmodel.acceptance.trees",
    "load_tree": "perfmodel.acceptance.trees",
    # speedup simulations and the capacity plan
    "speedup_table": "perfmodel.planning.simulations",
    "simulate": "perfmodel.planning.simulations",
    "optima": "perfmodel.planning.simulations",
    "device_table": "perfmodel.planning.simulations",
    "draft_model_table": "perfmodel.planning.simulations",
    # any drafter at one point, and its best chain per batch
    "DrafterKind": "perfmodel.base.drafter_kind",
    "drafter_model": "perfmodel.models.drafter_config",
    "DraftedShape": "perfmodel.planning.drafter_point",
    "drafter_point": "perfmodel.planning.drafter_point",
    "point_drafter": "perfmodel.planning.drafter_point",
    "tokens_per_step": "perfmodel.planning.drafter_point",
    "best_chains": "perfmodel.planning.chain_choice",
    "Lengths": "perfmodel.planning.lengths",
    "Workload": "perfmodel.planning.workload",
    "Targets": "perfmodel.planning.workload",
    "read_trace": "perfmodel.planning.workload",
    "plan": "perfmodel.planning.capacity",
    "plan_deployments": "perfmodel.planning.capacity",
    "PlanRequest": "perfmodel.planning.capacity",
    "PlanResult": "perfmodel.planning.result",
    # a deployment, resolved once and handed to every planner
    "Deployment": "perfmodel.planning.deployment",
    "DeploymentChoices": "perfmodel.planning.deployment",
    "resolve": "perfmodel.planning.deployment",
    "speculation_schedule": "perfmodel.planning.schedule",
    "schedule_deployment": "perfmodel.planning.schedule",
    "ScheduleRequest": "perfmodel.planning.schedule",
    "serve": "perfmodel.serving.capacity",
    "serve_deployments": "perfmodel.serving.capacity",
    "ServeRequest": "perfmodel.serving.capacity",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'perfmodel' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
