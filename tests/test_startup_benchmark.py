"""python -m reports.startup_benchmark runs its commands as a user does and says how long
each took (what it measures is not asserted: that depends on the machine)."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from perfmodel.base.errors import PerfkitError
from reports import startup_benchmark
from reports.startup_benchmark import Command, main, summary_line, wall_time

ROOT = Path(__file__).resolve().parents[1]


def test_one_repetition_prints_the_machine_and_the_command(capsys, monkeypatch):
    # A command as the benchmark runs it (a fresh interpreter, no figure kept), on one point:
    # the benchmark's two commands themselves run in the docs test, as the README shows them.
    one_point = "--model llama-7b --batch 1 --seq 1024 --candidates 1 --jobs 1"
    commands = (Command(f"python -m perfmodel.roofline --gpu a100 {one_point}"),)
    monkeypatch.setattr(startup_benchmark, "COMMANDS", commands)
    assert main(["--repeat", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"\d+ cores, load average .*", lines[0])
    assert len(lines) == 1 + len(commands)
    for line, command in zip(lines[1:], commands):
        assert re.fullmatch(rf"{re.escape(command.line)}: \d+\.\d\d s wall, median of 1 run", line)


def test_the_median_and_spread_of_several_runs():
    line = summary_line(Command("x"), [3.0, 1.0, 2.0])
    assert line == "x: 2.00 s wall, median of 3 runs (1.00-3.00 s)"


def test_a_failing_command_is_an_error_naming_it(tmp_path):
    command = Command("python -m perfmodel.roofline --gpu nope")
    with pytest.raises(PerfkitError, match=r"--gpu nope failed \(exit [1-9]\d*\): .*nope"):
        wall_time(command, str(tmp_path / "out"))


def test_drawing_and_reporting_import_no_torch_and_no_sweeper():
    # Nothing is measured unless --measure asks: the commands leave torch (about a second) unloaded.
    code = (
        "import sys, reports.commands.roofline, reports.__main__\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith(('profilers.sweep', 'decoder.'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_measure_option_finds_its_sweeper():
    for command in ("reports/commands/roofline.py", "reports/build.py"):
        tree = ast.parse((ROOT / command).read_text())
        lazy = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module.startswith("profilers.")]
        assert lazy, command
        for node in lazy:
            module = importlib.import_module(node.module)
            assert all(hasattr(module, alias.name) for alias in node.names), (command, node.module)
