"""The library surface a serving team imports: `from perfmodel import ...`, loaded lazily, and
the longer import paths the README has always shown. (docs/library.md documents it; its
examples run in tests/test_docs.py with every other page's.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import perfmodel

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", perfmodel.__all__)
def test_every_public_name_resolves_to_its_home_definition(name):
    value = getattr(perfmodel, name)
    home = perfmodel._HOMES[name]
    definition = getattr(sys.modules[home], name)
    assert value is definition


def test_the_names_the_issue_promises_are_public():
    from perfmodel import latency_source, load_model, plan

    assert {"load_model", "latency_source", "plan", "StepModel", "find_spec", "PlanResult"} <= set(perfmodel.__all__)
    assert callable(load_model) and callable(latency_source) and callable(plan)


def test_dir_lists_the_public_names_and_unknown_names_are_attribute_errors():
    assert set(perfmodel.__all__) <= set(dir(perfmodel))
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        perfmodel.no_such_name  # noqa: B018
    assert not hasattr(perfmodel, "no_such_name")


def test_importing_a_base_module_loads_nothing_heavy():
    # A fresh interpreter, as a user's: the package's lazy names must not load the stack.
    code = (
        "import sys, perfmodel.base.errors, perfmodel\n"
        "heavy = [m for m in ('pandas', 'scipy', 'matplotlib', 'torch', 'perfmodel.planning') if m in sys.modules]\n"
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_readme_import_paths_keep_working():
    from perfmodel.hardware import find_spec
    from perfmodel.latency import RooflineLatency
    from perfmodel.models import load_model
    from perfmodel.planning import plan
    from perfmodel.step import StepModel

    model = load_model("llama-7b")
    step = StepModel(model, RooflineLatency(find_spec("a100"), model, "fp16"), flavor="full")
    assert 0 < float(step.step_time(1, 1024, 1)) < float(step.step_time(1, 1024, 64))
    assert plan is sys.modules["perfmodel.planning.capacity"].plan
    assert StepModel is perfmodel.StepModel and find_spec is perfmodel.find_spec


def test_plan_is_the_planner_whatever_the_command_imports():
    # the command's code is reports.commands.plan; perfmodel/plan.py only runs it (python -m)
    code = (
        "import reports.commands.plan as command\n"
        "from perfmodel import plan\n"
        "from perfmodel.planning.capacity import plan as planner\n"
        "try:\n"
        "    import perfmodel.plan\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
        "from perfmodel import plan as after\n"
        "assert plan is planner and after is planner and callable(command.main)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "perfmodel.plan is the planner function" in out and "reports.commands.plan" in out
