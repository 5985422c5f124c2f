"""Issue 58, item 2: latency modes, measured harnesses, lenders, step flavours and drafters are
registries keyed by enums, each entry whole: a new one is one entry and its tests."""

from __future__ import annotations

from perfmodel.base.drafter_kind import DrafterKind
from perfmodel.base.stacks import SERVING_ENGINES, Engine
from perfmodel.latency.choice import LatencyMode
from perfmodel.latency.latency_model import SOURCE_LABELS
from perfmodel.latency.source import LENDERS, MEASURED_SOURCES, borrowed, latency_source, transferred
from perfmodel.planning.drafters import DRAFTER_RULES, drafters_for
from perfmodel.planning.step_models import FLAVOR_BUILDERS, STEP_FLAVORS


def test_every_mode_says_what_it_rests_on():
    assert set(SOURCE_LABELS) == set(LatencyMode)


def test_every_harness_that_times_gemms_builds_a_source():
    assert set(MEASURED_SOURCES) == {Engine.VIDUR, Engine.TORCH, *SERVING_ENGINES}
    assert LENDERS == (borrowed, transferred)  # a device of a measured architecture borrows before a transfer


def test_each_stack_gets_its_own_harness_source():
    modes = {
        stack: latency_source("h100", "llama-7b", "fp16", stack=stack).mode for stack in ("vidur", "vllm", "torch")
    }
    assert modes == {"vidur": LatencyMode.MEASURED, "vllm": LatencyMode.GRID, "torch": LatencyMode.MEASURED}
    assert latency_source("h100", "llama-7b", "fp16", stack="torch").stack.startswith("torch-")


def test_the_lenders_in_order():
    # the A100 PCIe shares the A100 SXM's architecture, which has Vidur's profiles: borrowed
    assert latency_source("a100-pcie", "llama-7b", "fp16").mode == LatencyMode.BORROWED
    # an engine asked for on an unmeasured device: its GEMMs transferred from the devices measured in it
    assert latency_source("a100-pcie", "llama-7b", "fp16", stack="sglang").mode == LatencyMode.TRANSFERRED
    assert latency_source("a40", "llama-7b", "fp16").mode == LatencyMode.TRANSFERRED


def test_every_flavour_and_drafter_has_its_builder():
    assert set(FLAVOR_BUILDERS) == set(STEP_FLAVORS)
    assert set(DRAFTER_RULES) == set(DrafterKind)
    # the simulations search the drafters with an acceptance curve; the others are priced at a point
    assert [d.name for d in drafters_for("all")] == ["medusa", "eagle", "draft"]
