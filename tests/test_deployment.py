"""A deployment resolved once (perfmodel.planning.deployment): its choices checked in one line
each, its step models priced once, and the planners' options declared by dataclasses."""

from __future__ import annotations

import pytest

from perfmodel import DeploymentChoices, PlanRequest, plan, plan_deployments, resolve, speculation_schedule
from perfmodel.base.errors import PerfkitError
from perfmodel.planning.workload import Workload
from perfmodel.serving.capacity import serve


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: plan("llama-7b", "a100", prompt_lenn=512), "plan() got an unknown option 'prompt_lenn'; it takes: "),
        (lambda: serve("llama-7b", "a100", Workload(rate=1.0), tp=2), "serve() got an unknown option 'tp'"),
        (lambda: speculation_schedule("llama-7b", "a100", tp=2), "speculation_schedule() got an unknown option 'tp'"),
    ],
)
def test_an_option_no_dataclass_declares_is_one_line_naming_it(call, message):
    with pytest.raises(PerfkitError, match="^" + message.replace("(", r"\(").replace(")", r"\)")) as error:
        call()
    assert "\n" not in str(error.value) and "tensor_parallel" in str(error.value)


@pytest.mark.parametrize(
    "choices, message",
    [
        (DeploymentChoices(latency="fast"), "unknown latency source 'fast'; choose from: auto, measured"),
        (DeploymentChoices(step="paper"), "unknown step flavour 'paper'; choose from: full, traced"),
        (DeploymentChoices(step="traced"), "the traced step needs a tracer"),
        (DeploymentChoices(launch="graph"), "--launch graph prices the traced step's launches"),
        (DeploymentChoices(tensor_parallel=0), "tensor_parallel must be a positive integer or None"),
        (DeploymentChoices(tensor_parallel=3), "tensor parallel 3 cannot be served on a100-pcie \\(it does not split"),
        (DeploymentChoices(dtype="fp12"), "fp12"),
    ],
)
def test_resolve_refuses_each_bad_choice_in_one_line(choices, message):
    with pytest.raises(PerfkitError, match=message) as error:
        resolve("llama-7b", ["a100"], choices)
    assert "\n" not in str(error.value)


def test_a_deployment_prices_its_steps_once_and_keeps_one_per_degree():
    (deployment,) = resolve("llama-7b", ["h100"], DeploymentChoices(dtype="fp16", tensor_parallel=None))
    with pytest.raises(PerfkitError, match=r"need its tensor-parallel degree: price deployment.at\(tp\)"):
        deployment.steps()
    two = deployment.at(2)
    assert deployment.at(2) is two and two.at(2) is two and two.tp == 2 and deployment.tp is None
    assert two.step_model() is two.step_model() and two.steps(["paper", "full"])["full"] is two.step_model()
    # the plan of a deployment and plan() of the same choices agree
    request = PlanRequest(prompt_len=1024, response_len=256)
    by_deployment = plan_deployments(two, request).devices
    assert by_deployment.equals(plan("llama-7b", "h100", dtype="fp16", tensor_parallel=2, **vars(request)).devices)


def test_one_plan_is_of_one_model():
    deployments = [*resolve("llama-7b", ["a100"]), *resolve("llama-2-13b", ["a100"])]
    with pytest.raises(PerfkitError, match="plan_deployments plans one model"):
        plan_deployments(deployments)
