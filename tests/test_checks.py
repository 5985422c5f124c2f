"""The one rule for what an argument must be (perfmodel.base.checks): what every check of a
count or a number across the toolkit refuses, a bool above all (True is 1 to Python)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from perfmodel.base.checks import is_count, is_integer, is_real


@pytest.mark.parametrize("value", [1, 7, np.int64(3), np.int32(1), 2**70])
def test_counts(value):
    assert is_integer(value) and is_count(value)


@pytest.mark.parametrize("value", [True, False, 0, -1, 1.0, np.float64(2.0), "2", None, [1]])
def test_not_counts(value):
    assert not is_count(value)


def test_the_least_count_is_the_callers():
    assert is_count(0, 0) and not is_count(-1, 0) and is_count(10, 10) and not is_count(9, 10)
    assert is_integer(-5) and not is_integer(True)


@pytest.mark.parametrize("value", [0, 1.5, -2.0, np.float32(0.25), np.int64(4), 10**20])
def test_reals(value):
    assert is_real(value)


@pytest.mark.parametrize("value", [True, math.nan, math.inf, -math.inf, "1.5", None, 1j])
def test_not_finite_reals(value):
    assert not is_real(value)


def test_infinity_is_a_real_where_the_caller_allows_it():
    assert is_real(math.inf, finite=False) and is_real(math.nan, finite=False) and not is_real(True, finite=False)


def test_a_medusa_setting_is_typed_at_the_edge_and_reads_as_its_name():
    from perfmodel.base.errors import PerfkitError
    from perfmodel.planning.medusa_setting import MedusaSetting, check_medusa

    setting = check_medusa("off")
    assert (
        setting is MedusaSetting.OFF
        and f"{setting}" == "off"
        and json.dumps({"medusa": setting}) == '{"medusa": "off"}'
    )
    with pytest.raises(PerfkitError, match="unknown medusa setting 'sometimes'; choose from: auto, on, off"):
        check_medusa("sometimes")


def test_a_step_flavour_is_typed_at_the_edge_and_reads_as_its_name():
    from perfmodel.base.errors import PerfkitError
    from perfmodel.latency.step import StepFlavor
    from perfmodel.planning.step_models import check_flavors

    assert check_flavors(["traced", "paper"]) == (StepFlavor.TRACED, StepFlavor.PAPER)
    assert all(type(f) is StepFlavor for f in check_flavors(["full"])) and f"{StepFlavor.FULL}" == "full"
    with pytest.raises(PerfkitError, match="unknown step flavour 'fancy'; choose from: paper, full, traced"):
        check_flavors(["fancy"])


def test_a_records_drafter_is_typed_when_it_is_read():
    from perfmodel.acceptance.record import AcceptanceRecord
    from perfmodel.base.drafter_kind import DrafterKind
    from perfmodel.base.paths import TOOLKIT_ROOT

    record = AcceptanceRecord.load(TOOLKIT_ROOT / "decoder" / "assets" / "bundled" / "acceptance-greedy.json")
    assert record.drafter is DrafterKind.MEDUSA and json.dumps(record.drafter) == '"medusa"'
    assert tuple(DrafterKind) == ("medusa", "eagle", "draft", "eagle3", "mtp", "ngram")


def test_a_phase_is_typed_and_reads_as_its_name():
    from perfmodel.models.operators import PHASES, Phase, op_cost
    from tests.conftest import TINY

    assert PHASES == ("prefill", "decode", "tree") and all(type(p) is Phase for p in PHASES)
    # a phase given as text or as a member costs the same
    assert op_cost("sdpa", "tree", TINY, "fp16", 2, 64, 8) == op_cost("sdpa", Phase.TREE, TINY, "fp16", 2, 64, 8)


def test_a_latency_sources_mode_is_typed_and_reads_as_its_name():
    from perfmodel.latency.choice import LatencyMode
    from perfmodel.latency.source import latency_source

    source = latency_source("h100", "llama-7b", "fp16")
    assert source.mode is LatencyMode.MEASURED and f"{source.mode}" == "measured"
    assert source.linear_kind("q") is LatencyMode.MEASURED and source.linear_kind("norm") is LatencyMode.DATASHEET
    assert latency_source("h100", "llama-7b", "fp16", "datasheet").mode is LatencyMode.DATASHEET
