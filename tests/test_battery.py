"""The fault battery (tests/battery.py, `python -m tests.battery`) under pytest: every bad
input to every command answered in one line or sensibly, nothing left half-written."""

from __future__ import annotations

import pytest

from tests.battery import CASES, materials, run_case


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> dict[str, str]:
    return materials(tmp_path_factory.mktemp("materials"))


@pytest.mark.parametrize("case", CASES, ids=[f"{n}-{c.command}" for n, c in enumerate(CASES)])
def test_the_battery_case_is_answered_as_it_should_be(case, shared, tmp_path):
    outcome = run_case(case, shared, tmp_path / "case")
    assert not outcome.problems(case), (case.name, outcome.problems(case))
