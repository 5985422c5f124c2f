"""python -m perfmodel.search_benchmark times the serving search as a user runs it, beside the
import floor (what it measures is not asserted: that depends on the machine)."""

from __future__ import annotations

import re

import pytest

from perfmodel.base.errors import PerfkitError
from perfmodel.cli.wall_time import interpreter_seconds
from reports.commands import search_benchmark
from reports.commands.search_benchmark import main, search_parts

SMALL = "python -m perfmodel.plan --model llama-7b --gpu a100 --rate 2 --prompt-len 128 --response-len 32 --tpot-ms 50"


def test_one_repetition_prints_the_floor_the_whole_and_its_parts(capsys, monkeypatch):
    monkeypatch.setattr(search_benchmark, "SEARCH", SMALL)
    assert main(["--repeat", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"\d+ cores, load average .*", lines[0])
    assert lines[1] == SMALL
    labels = [re.fullmatch(r"(.+?)\s+\d+\.\d\d s", row).group(1) for row in lines[3:]]
    assert labels == [
        "floor: import pandas, matplotlib",
        "floor: import the plan command",
        "the search, end to end",
        "  of which the unloaded plan",
        "  of which the serving search",
    ]


def test_the_parts_are_the_commands_plan_and_search():
    parts = search_parts(SMALL)
    assert set(parts) == {"unloaded plan", "serving search"}
    assert all(seconds > 0 for seconds in parts.values())
    # without a percentile target there is no search to time
    assert search_parts(SMALL.replace(" --tpot-ms 50", "").replace(" --rate 2", ""))["serving search"] < 0.01


def test_a_failing_command_is_an_error_naming_it():
    with pytest.raises(PerfkitError, match=r"-m perfmodel.roofline --gpu nope failed \(exit [1-9]\d*\): .*nope"):
        interpreter_seconds(["-m", "perfmodel.roofline", "--gpu", "nope"])
