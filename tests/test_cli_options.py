"""The command lines, found rather than listed: every command's --help runs and explains every
option, `medusa-perfkit` dispatches to exactly the commands there are, and each shared
option is declared once (perfmodel.cli.options) with one meaning and one default rule."""

from __future__ import annotations

import argparse
import ast
import importlib
import re
import sys
from pathlib import Path

import pytest

from perfmodel.cli import console, options

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("perfmodel", "profilers", "decoder", "reports")
SHARED = (
    "--model",
    "--gpu",
    "--spec",
    "--device",
    "--dtype",
    "--acceptance",
    "--acceptance-rates",
    "--out",
    "--csv",
    "--step",
)


def has_main_block(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            names = [n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)]
            texts = [n.value for n in ast.walk(node.test) if isinstance(n, ast.Constant)]
            if names == ["__name__"] and texts == ["__main__"]:
                return True
    return False


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__main__" else parts)


def source_files() -> list[Path]:
    return sorted(p for layer in LAYERS for p in (ROOT / layer).rglob("*.py"))


def discovered_commands() -> list[str]:
    """Every module `python -m` runs as a command: those with a `__main__` block."""
    return sorted(module_name(p) for p in source_files() if has_main_block(ast.parse(p.read_text())))


COMMANDS = discovered_commands()


def command_module(name: str):
    """The module holding a command's main and build_parser (perfmodel.plan: reports.commands.plan)."""
    name = console.command_code(name)
    package = ROOT.joinpath(*name.split("."))
    return importlib.import_module(f"{name}.__main__" if (package / "__main__.py").exists() else name)


def subcommands(parser: argparse.ArgumentParser) -> list[str]:
    return [name for a in parser._actions if isinstance(a, argparse._SubParsersAction) for name in a.choices]


def options_of(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from options_of(sub)
        elif action.option_strings and not isinstance(action, argparse._HelpAction):
            yield parser.prog, action


def test_discovery_finds_the_known_commands():
    # A floor, not the list: a command added later is found without an edit here.
    for known in ("perfmodel.roofline", "perfmodel.plan", "profilers.sweep", "decoder.measure", "reports"):
        assert known in COMMANDS
    assert "perfmodel.cli.console" not in COMMANDS  # reached through its console script only


@pytest.mark.parametrize("name", COMMANDS)
def test_help_runs(name, capsys):
    module = command_module(name)
    for words in ([], *([sub] for sub in subcommands(module.build_parser()))):
        with pytest.raises(SystemExit) as exit_:
            module.main([*words, "--help"])
        assert exit_.value.code == 0, f"{name} {' '.join(words)} --help"
        assert capsys.readouterr().out.startswith("usage: "), f"{name} {' '.join(words)} --help"


@pytest.mark.parametrize("name", COMMANDS)
def test_every_option_has_help(name):
    parser = command_module(name).build_parser()
    silent = [f"{prog} {'/'.join(a.option_strings)}" for prog, a in options_of(parser) if not (a.help or "").strip()]
    assert not silent, f"options without help: {silent}"


def test_the_console_script_runs_exactly_the_commands():
    assert sorted(module for module, _ in console.COMMANDS.values()) == COMMANDS


def test_console_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exit_:
        console.main(["--help"])
    shown = capsys.readouterr().out
    assert exit_.value.code == 0
    for name, (_, summary) in console.COMMANDS.items():
        assert re.search(rf"^  {re.escape(name)} +{re.escape(summary)}$", shown, re.M), name


def test_console_dispatches_to_the_command(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # runpy rewrites it, as `python -m` does
    monkeypatch.delitem(sys.modules, "perfmodel.plan", raising=False)  # run fresh, as in a new process
    with pytest.raises(SystemExit) as exit_:
        console.main(["plan", "--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("usage: python -m perfmodel.plan")
    with pytest.raises(SystemExit) as exit_:
        console.main(["no-such-command"])
    assert exit_.value.code == 2
    assert "invalid choice: 'no-such-command'" in capsys.readouterr().err


def test_the_console_script_is_declared():
    tomllib = pytest.importorskip("tomllib")
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, function = scripts["medusa-perfkit"].split(":")
    assert getattr(importlib.import_module(module), function) is console.main


@pytest.mark.parametrize("flag", SHARED)
def test_each_shared_option_is_declared_once(flag):
    pattern = re.compile(rf"""["']{re.escape(flag)}["']""")
    found = [(p.relative_to(ROOT).as_posix(), n) for p in source_files() for n in pattern.findall(p.read_text())]
    assert [path for path, _ in found] == ["perfmodel/cli/options.py"], found


def shared_actions():
    """(command, flag, action) for every shared option any command (or subcommand) has."""
    for name in COMMANDS:
        for prog, action in options_of(command_module(name).build_parser()):
            for flag in set(action.option_strings) & set(SHARED):
                yield prog, flag, action


def test_one_default_rule_per_option():
    defaults: dict[str, set] = {}
    for _, flag, action in shared_actions():
        defaults.setdefault(flag, set()).add(action.default if not isinstance(action.default, list) else None)
    # --model: the bundled checkpoint where weights run, else llama-7b (the roofline: None, its paper models)
    assert defaults["--model"] <= {"bundled", "llama-7b", None}
    # --dtype: resolved per device by perfmodel.base.dtypes.default_dtype, never fixed by a parser
    assert defaults["--dtype"] == {None}
    assert defaults["--acceptance"] == {"greedy"}
    assert defaults["--acceptance-rates"] == {None}  # resolve_acceptance(None) is the paper's curve


def test_model_default_follows_whether_weights_run():
    runs_weights = {
        "decoder.measure",
        "decoder.generate",
        "decoder.ablation",
        "decoder.train",
        "perfmodel.validate",
        "profilers.step_bench",
        "profilers.engine",
    }
    for prog, flag, action in shared_actions():
        if flag == "--model":
            command = prog.removeprefix("python -m ").split()[0]
            expected = "bundled" if command in runs_weights else ("llama-7b" if action.nargs is None else None)
            assert action.default == expected, prog


def test_the_old_acceptance_spelling_still_reaches_the_rates():
    from reports.commands.speedup import build_parser

    parser = build_parser()
    assert parser.allow_abbrev
    args = parser.parse_args(["--gpu", "a100", "--acceptance", "paper-ln"])
    assert args.acceptance_rates == "paper-ln"
    assert parser.parse_args(["--gpu", "a100", "--acceptance-rates", "x.json"]).acceptance_rates == "x.json"


def test_a_preset_on_a_decoder_command_is_a_one_line_error(capsys):
    from decoder import generate
    from perfmodel.cli import run

    assert run(generate.main, ["--model", "llama-7b", "--prompt", "x"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'llama-7b' is a preset" in err and "checkpoint folder" in err


def test_a_decoder_command_takes_a_checkpoints_config_json():
    from decoder.checkpoint import resolve_folder
    from perfmodel.models.config import BUNDLED_MODEL

    assert resolve_folder(BUNDLED_MODEL / "config.json") == BUNDLED_MODEL
    assert resolve_folder("bundled") == BUNDLED_MODEL


def test_out_and_csv_defaults_come_from_the_command():
    p = argparse.ArgumentParser()
    options.out(p, "perf-reports/x/<device>", value=Path("perf-reports/x"))
    options.csv(p, "the table", default="DIR/x.csv")
    assert p.parse_args([]).out == Path("perf-reports/x") and p.parse_args([]).csv is None
    shown = p.format_help()
    assert "(default perf-reports/x/<device>)" in shown and "(default DIR/x.csv)" in shown
