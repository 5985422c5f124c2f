"""Issue 58, item 3: --latency and --stack travel as one typed choice, not a str carrying a hidden stack."""

from __future__ import annotations

import pytest

from perfmodel.base.errors import PerfkitError
from perfmodel.cli import Parser, pricing_options
from perfmodel.latency.choice import LatencyChoice, LatencySetting
from perfmodel.latency.source import view_latency
from perfmodel.measured.device_view import resolve_devices
from perfmodel.models.config import load_model


def test_a_choice_is_its_setting_and_its_stack():
    choice = LatencyChoice.of("measured", "sglang")
    assert (choice.setting, choice.stack, str(choice)) == (LatencySetting.MEASURED, "sglang", "measured")
    assert not isinstance(choice, str)  # compared as a choice, never as text
    assert LatencyChoice.of(choice) is choice and LatencyChoice.of(choice, "vllm").stack == "vllm"
    with pytest.raises(PerfkitError, match=r"unknown latency source 'fast'; choose from: auto, measured, calibrated"):
        LatencyChoice.of("fast")


def test_the_command_line_makes_one_choice_of_latency_and_stack():
    parser = Parser()
    pricing_options.latency(parser)
    assert parser.parse_args(["--stack", "trtllm"]).latency == LatencyChoice(LatencySetting.AUTO, "trtllm")


def test_the_stack_of_a_choice_is_the_stack_priced():
    (view,) = resolve_devices("h100")
    model = load_model("llama-7b")
    assert view_latency(view, model, "fp16", LatencyChoice.of("auto", "sglang")).stack.startswith("sglang-")
    # a stack given beside the choice is the one priced
    assert view_latency(view, model, "fp16", LatencyChoice.of("auto", "sglang"), "trtllm").stack.startswith("trtllm-")
