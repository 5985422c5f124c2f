"""Issue 56, item 14: `profilers.sweep --budget nan` was taken and the sweep ran on past 120 s
(a budget that no elapsed time reaches). Every number option of every command refuses what
is not a number it can use when it is parsed, by the shared argument types of
perfmodel.cli.parser (positive_number: finite and > 0), in one line naming the value."""

import argparse

import pytest

from decoder import measure
from perfmodel.cli import run
from profilers import allreduce, sweep
from reports.commands.plan import main as plan_main
from tests.test_cli_options import COMMANDS, command_module, options_of

# Number options whose bound is checked after parsing, each in one line naming the value
# (the command, its arguments with the bad value, OUT a file in the test's folder, and what
# the line says).
CHECKED_LATER = {
    ("python -m decoder.measure", "--temperature"): (
        measure.main,
        [
            "--prompts",
            "1",
            "--new-tokens",
            "2",
            "--sizes",
            "1",
            "--tree",
            "chain-1",
            "--temperature",
            "nan",
            "--out",
            "OUT",
        ],
        "temperature must be a finite number > 0, got nan",
    ),
    ("python -m perfmodel.plan", "--reserve"): (
        plan_main,
        ["--gpu", "a100", "--reserve", "nan"],
        "memory_reserve must be a fraction in [0, 1), got nan",
    ),
    ("python -m profilers.allreduce", "--budget"): (
        allreduce.main,
        ["--device", "cpu", "--budget", "nan"],
        "--budget nan: must be a number of seconds >= 0",
    ),
}
# Fixed apart from this item (issue 56, items 4 and 15), in their own modules.
FIXED_ELSEWHERE = {("python -m perfmodel.speedup", "--acceleration"), ("python -m perfmodel.plan", "--throughput")}


def refused(parser: argparse.ArgumentParser, argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err.strip()


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "1e-400"])
def test_the_sweep_refuses_a_budget_that_is_not_a_positive_finite_number(value, capsys):
    err = refused(sweep.build_parser(), ["--budget", value], capsys)
    assert len(err.splitlines()) == 1
    assert f"argument --budget: must be a {'finite ' if value == 'inf' else ''}number > 0, got '{value}'" in err


@pytest.mark.parametrize(
    "option, value, allowed",
    [
        ("--target-noise", "nan", "a number > 0"),
        ("--target-noise", "0", "a number > 0"),
        ("--max-memory-gb", "nan", "a number > 0"),
        ("--max-memory-gb", "0", "a number > 0"),  # was taken as no cap at all
        ("--max-memory-gb", "1e300", "at most 1,000,000"),  # its bytes overflowed into a traceback
    ],
)
def test_the_sweeps_other_numbers_are_refused_the_same_way(option, value, allowed, capsys):
    err = refused(sweep.build_parser(), [option, value], capsys)
    assert len(err.splitlines()) == 1 and f"argument {option}: must be {allowed}" in err and f"'{value}'" in err


def test_the_validation_budget_is_refused_the_same_way(capsys):
    from reports.commands.validate import build_parser

    err = refused(build_parser(), ["--budget", "nan"], capsys)
    assert "argument --budget: must be a number > 0, got 'nan'" in err


def number_options():
    """(command, flag, argparse type) for every option of every command whose values are
    numbers with a fraction."""
    for name in COMMANDS:
        for prog, action in options_of(command_module(name).build_parser()):
            try:
                number = action.type is not None and isinstance(action.type("2.5"), float)
            except (argparse.ArgumentTypeError, ValueError, TypeError):
                number = False
            if number:
                yield prog, action.option_strings[-1], action.type


def test_every_number_option_refuses_what_is_not_a_usable_number_when_parsed():
    found = list(number_options())
    assert ("python -m profilers.sweep", "--budget") in {(prog, flag) for prog, flag, _ in found}
    taken = []
    for prog, flag, kind in found:
        if (prog, flag) in CHECKED_LATER or (prog, flag) in FIXED_ELSEWHERE:
            continue
        for value in ("nan", "inf", "-1"):
            try:
                kind(value)
                taken.append(f"{prog} {flag} {value}")
            except argparse.ArgumentTypeError:
                pass
    assert not taken, f"taken when parsed: {taken}"


@pytest.mark.parametrize("where", sorted(CHECKED_LATER))
def test_numbers_checked_after_parsing_are_refused_in_one_line(where, tmp_path, capsys):
    main, argv, said = CHECKED_LATER[where]
    assert run(main, [str(tmp_path / "out.json") if arg == "OUT" else arg for arg in argv]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1 and said in err
