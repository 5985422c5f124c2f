"""Every step model speaks one protocol (perfmodel.latency.step_cost.StepCost): the planners ask a
step for its times, label, evidence, model and shard, and never probe what kind it is."""

from __future__ import annotations

import ast
import functools

import numpy as np
import pytest

from decoder.trace import StepTracer
from perfmodel.latency.eagle import eagle_step, without_heads
from perfmodel.latency.step_cost import StepCost
from perfmodel.measured.device_view import resolve_view
from perfmodel.models.config import load_model
from perfmodel.planning.drafters import DraftModelStep
from perfmodel.planning.step_models import flavor_steps
from perfmodel.serving.capacity import ComposedStep
from tests.test_house import ROOT, sources

BUNDLED = load_model("bundled")


@functools.cache
def every_step_model():
    view = resolve_view("a100", None, [])
    llama = load_model("llama-7b")
    full = flavor_steps(view, llama, "fp16", flavors=("full",))["full"]
    split = flavor_steps(view, llama, "fp16", tp=2, flavors=("paper", "full"))
    traced = flavor_steps(view, BUNDLED, "fp16", flavors=("traced",), tracer=StepTracer())["traced"]
    return {
        "full": full,
        "its shard": full.shard,
        "paper, tp 2": split["paper"],
        "full, tp 2": split["full"],
        "traced": traced,
        "traced shard": traced.shard,
        "eagle": eagle_step(full),
        "draft model": DraftModelStep(without_heads(full), 0.05),
        "composed": ComposedStep(traced, flavor_steps(view, BUNDLED, "fp16")["full"]),
    }


@pytest.mark.parametrize("name", list(every_step_model()))
def test_every_step_model_answers_the_protocol(name):
    step = every_step_model()[name]
    assert isinstance(step, StepCost)
    assert step.label and isinstance(step.label, str)
    assert step.evidence in ("datasheet", "grid", "measured", "calibrated", "borrowed", "unknown")
    assert step.model.num_layers >= 1 and isinstance(step.shard, StepCost)
    plain, tree = (float(np.asarray(step.step_time(1, 256, q)).ravel()[0]) for q in (1, 16))
    assert 0 < plain <= tree
    short, long = (float(np.asarray(step.prefill_time(1, s)).ravel()[0]) for s in (16, 256))
    assert 0 < short < long


def test_a_tensor_parallel_step_is_its_shard_and_the_all_reduces():
    steps = every_step_model()
    split = steps["full, tp 2"]
    assert split.model == load_model("llama-7b").shard(2) and split.shard.model == split.model
    assert split.evidence == split.shard.evidence
    assert float(split.step_time(8, 512, 1)) > float(split.shard.step_time(8, 512, 1))


def test_no_planner_probes_a_step_for_what_it_is():
    """The protocol replaces getattr(getattr(step, "shard_step", step), ...) chains."""
    probes = []
    for path in sources("perfmodel", "reports"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr" and node.args:
                inner = node.args[0]
                if isinstance(inner, ast.Call) and getattr(inner.func, "id", None) == "getattr":
                    probes.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not probes, f"nested getattr probes: {probes}"
