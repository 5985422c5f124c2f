"""The tensor-parallel degree python -m perfmodel.speedup prices a device at, and the lines
that say it: --tp auto is the capacity plan's choice, an explicit degree is checked to hold
the model, for every answer the command gives (the simulations, one point, the best chains).
"""

from __future__ import annotations

from perfmodel.base.drafter_kind import DrafterKind
from perfmodel.planning.capacity import MedusaSetting, PlanRequest, serving_plan
from perfmodel.planning.deployment import Deployment, DeploymentChoices, resolve


def tp_line(asked: int | None, tp: int) -> str:
    """Which tensor-parallel degree the numbers are of, and who chose it."""
    split = f"{tp} devices per replica, each running 1/{tp} of the query heads and MLP, 2 all-reduces per layer"
    if asked is None:
        return (
            f"  tensor parallel: --tp auto chose {tp} (the capacity plan's choice: the most tokens/s per device "
            f"among the degrees that fit); " + (split if tp > 1 else "one device")
        )
    return f"  tensor parallel: {split}"


def point_plan_request(drafter: str, position_rates=None, draft_config=None) -> PlanRequest:
    """What the capacity plan prices to choose one point's degree: the drafter's own measured
    chains where its per-position rates are given (its steps and its weights), the Medusa
    heads' default plan for theirs, and plain decoding for another drafter known only by its
    tokens per step (no acceptance curve of it to plan over)."""
    if position_rates is not None and drafter != DrafterKind.MEDUSA:
        return PlanRequest(drafter=drafter, position_rates=tuple(position_rates), draft_config=draft_config)
    return PlanRequest() if drafter == DrafterKind.MEDUSA else PlanRequest(medusa=MedusaSetting.OFF)


def planned_deployment(model, device, choices: DeploymentChoices, request: PlanRequest) -> tuple[Deployment, list[str]]:
    """The deployment at the degree asked (choices.tensor_parallel; None: the plan's), and the
    lines to print above its numbers: the degree and who chose it, and where the model fits
    at no usable degree, that the steps are priced as if it did. A degree asked that does not
    hold the model, where another would, is one error naming that degree (serving_plan)."""
    (deployment,) = resolve(model, [device], choices)
    tp, planned = serving_plan(deployment, request)
    asked = choices.tensor_parallel
    lines = [tp_line(asked, tp)] if asked is None or tp > 1 else []
    if isinstance(planned, str):  # nothing to advise: say so above steps priced as if it fitted
        lines.append(f"  note: {planned}; the speedups below time its steps as if it fitted")
    return deployment.at(tp), lines
