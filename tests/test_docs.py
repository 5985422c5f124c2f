"""The docs can be trusted: every command shown in README.md and docs/ runs, and every sample
output shown there is its command's output today.

Which commands run, from the shell blocks (```bash, ```sh, ```shell, ```console) of each page:

- `python -m ...` and `medusa-perfkit ...` run as shown, in a fresh folder with an empty
  measurements home (reports.readme_samples.run_command), each once however many pages show
  it; a sample block of the same command is checked against that one run.
- A long command (training, full sweeps, closed loops) is shown with its quick variant in a
  marker right before the block, `<!-- quick: python -m MODULE ... -->`: the quick variant
  runs instead of the block's commands of the same module.
- A command another test already runs is named by a marker
  `<!-- covered: MODULE tests/FILE.py::TEST -->`: that test must exist and import MODULE.
- The install and check commands (venv, pip, pytest, lint-imports, ruff) are what .ci/run
  runs: they must appear there, as the README's test command does.

```python blocks run too, each in a fresh folder. Anything else in a shell block fails the
test: a page shows no command this file does not check.
"""

from __future__ import annotations

import ast
import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from perfmodel.cli import console
from reports import readme_samples
from reports.readme_samples import Done, doc_files, find_samples, fresh_folder, run_command

ROOT = Path(__file__).resolve().parents[1]
CI_SCRIPT = ROOT / ".ci" / "run"
SHELL_LANGUAGES = {"bash", "sh", "shell", "console"}
QUICK = re.compile(r"^<!-- quick: (.+) -->$")
COVERED = re.compile(r"^<!-- covered: (\S+) (tests/\S+\.py)::(\w+) -->$")
# What CI runs itself (.ci/run): installing, the import-layer / lint / format checks and the suite.
CI_PROGRAMS = ("python -m venv", "pip install", "python -m pytest", "lint-imports", "ruff", "bash .ci/run")


@dataclass(frozen=True)
class Shown:
    """One command a page shows, and what the test does with it."""

    page: str
    line: int
    command: str  # as the page shows it, normalised (no .venv/bin/, python3 -> python)
    runs: str | None  # the command line that runs for it (itself or its quick variant)
    covered: tuple[str, str, str] | None  # (module, test file, test name) that runs it elsewhere


def normalise(segment: str) -> str:
    segment = re.sub(r"(^|\s)\.venv/bin/", r"\1", segment.replace('"$PYTHON" ', "python "))
    segment = re.sub(r"^python3\b", "python", segment.strip())
    return segment.replace("-e '.[test]'", "-e .")


def module_of(command: str) -> str:
    """The module a command line runs: `python -m a.b ...` -> a.b; `medusa-perfkit X` -> medusa-perfkit X."""
    argv = shlex.split(command)
    if argv[:2] == ["python", "-m"]:
        return argv[2]
    return " ".join(argv[:2])


def segments(line: str) -> list[str]:
    """The commands of one shell line: split at && and ;, a trailing comment dropped."""
    words = shlex.split(line, comments=True)
    parts, current = [], []
    for word in words:
        if word in ("&&", ";"):
            parts.append(current)
            current = []
        else:
            current.append(word)
    parts.append(current)
    return [normalise(shlex.join(part)) for part in parts if part]


def blocks(text: str) -> list[tuple[str, int, list[str], list[str]]]:
    """(language, first line number, the block's lines, the marker lines right above it)."""
    lines = text.split("\n")
    found, i = [], 0
    while i < len(lines):
        if lines[i].startswith("```"):
            language = lines[i][3:].strip()
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            markers, k = [], i - 1
            while k >= 0 and lines[k].startswith("<!-- "):
                markers.insert(0, lines[k])
                k -= 1
            found.append((language, i + 2, lines[i + 1 : end], markers))
            i = end + 1
        else:
            i += 1
    return found


def shown_commands(page: str, text: str) -> tuple[list[Shown], list[str]]:
    """Every command the page's shell blocks show, and the page's problems (a command of no
    known kind, a marker that stands for no command)."""
    shown, problems = [], []
    for language, first, body, markers in blocks(text):
        if language not in SHELL_LANGUAGES:
            continue
        quick = {module_of(m.group(1)): m.group(1) for m in map(QUICK.match, markers) if m}
        covered = {m.group(1): m.groups() for m in map(COVERED.match, markers) if m}
        used = set()
        for offset, raw in enumerate(body):
            line = raw.removeprefix("$ ").strip()
            if not line or line.startswith("#"):
                continue
            for command in segments(line):
                where = f"{page}:{first + offset}"
                if command.startswith(CI_PROGRAMS):
                    shown.append(Shown(page, first + offset, command, None, None))
                    continue
                if not command.startswith(("python -m ", readme_samples.CONSOLE_SCRIPT)):
                    problems.append(f"{where}: {command!r} is no command the docs test can check")
                    continue
                module = module_of(command)
                used.add(module)
                if module in covered:
                    shown.append(Shown(page, first + offset, command, None, covered[module]))
                else:
                    shown.append(Shown(page, first + offset, command, quick.get(module, command), None))
        for module in (set(quick) | set(covered)) - used:
            problems.append(f"{page}:{first - 2}: a marker for {module} stands for no command of the block below it")
    return shown, problems


def pages() -> dict[str, str]:
    return {str(path.relative_to(ROOT)): path.read_text(encoding="utf-8") for path in doc_files()}


def all_shown() -> list[Shown]:
    return [one for page, text in pages().items() for one in shown_commands(page, text)[0]]


def all_samples() -> list[tuple[str, readme_samples.Sample, list[str]]]:
    found = []
    for page, text in pages().items():
        lines = text.split("\n")
        found += [(page, sample, lines[sample.start : sample.end]) for sample in find_samples(lines, page)]
    return found


@cache
def ran(command: str) -> Done:
    """Each command runs once in this file, for its own test and for every sample of it."""
    return run_command(command)


RUNS = sorted({one.runs for one in all_shown() if one.runs})
SAMPLES = all_samples()
EXAMPLES = [
    (page, first, "\n".join(body))
    for page, text in pages().items()
    for language, first, body, _ in blocks(text)
    if language == "python"
]


@pytest.mark.parametrize("command", RUNS, ids=[command.removeprefix("python -m ")[:70] for command in RUNS])
def test_every_command_shown_runs(command):
    done = ran(command)
    assert done.status == 0, f"{command} failed (exit {done.status}):\n{done.stderr[-2000:]}"


@pytest.mark.parametrize("page, sample, block", SAMPLES, ids=[f"{page}:{sample.start}" for page, sample, _ in SAMPLES])
def test_every_sample_is_its_commands_output(page, sample, block):
    done = ran(sample.command)
    assert done.status == 0, f"{sample.command} failed (exit {done.status}):\n{done.stderr[-2000:]}"
    assert block == sample.shown(done.output_lines()), (
        f"{page}: the sample of {sample.command} is out of date: python -m reports.readme_samples rewrites it"
    )


def test_the_pages_show_only_commands_the_test_checks():
    problems = [problem for page, text in pages().items() for problem in shown_commands(page, text)[1]]
    assert not problems, "\n".join(problems)


def test_commands_run_elsewhere_name_a_test_that_runs_them():
    for one in (one for one in all_shown() if one.covered):
        module, file, name = one.covered
        tree = ast.parse((ROOT / file).read_text(encoding="utf-8"))
        assert any(isinstance(node, ast.FunctionDef) and node.name == name for node in tree.body), (
            f"{one.page}:{one.line}: {file} has no test {name}"
        )
        module = console.command_code(module)  # perfmodel.validate's code is reports.commands.validate
        parent, _, last = module.rpartition(".")
        imports = [node for node in ast.walk(tree) if isinstance(node, ast.ImportFrom | ast.Import)]
        assert any(
            (isinstance(node, ast.ImportFrom) and (node.module or "").startswith(module))
            or (isinstance(node, ast.ImportFrom) and node.module == parent and last in {a.name for a in node.names})
            or (isinstance(node, ast.Import) and module in {a.name for a in node.names})
            for node in imports
        ), f"{one.page}:{one.line}: {file} does not import {module}, so {name} cannot run {one.command}"


def test_install_and_check_commands_are_what_ci_runs():
    ci = normalise(" ".join(CI_SCRIPT.read_text(encoding="utf-8").split()))
    shown = [one for one in all_shown() if one.runs is None and one.covered is None]
    assert any(one.command == "python -m pytest -q" for one in shown), "the README's test command"
    for one in shown:
        assert one.command == "bash .ci/run" or one.command in ci, (
            f"{one.page}:{one.line}: .ci/run never runs {one.command}"
        )


@pytest.mark.parametrize(
    "page, number, code",
    EXAMPLES,
    ids=[f"{page}:{first}" for page, first, _ in EXAMPLES],
)
def test_every_python_example_runs(page, number, code):
    with fresh_folder(), contextlib.redirect_stdout(io.StringIO()):
        exec(compile(code, f"{page}:{number}", "exec"), {"__name__": "__docs__"})


def test_the_runner_substitutes_quick_variants_and_refuses_what_it_cannot_check():
    page = "\n".join(
        [
            "<!-- quick: python -m decoder.train --quick --out q -->",
            "```bash",
            ".venv/bin/python -m decoder.train   # ~40 min",
            "python -m perfmodel.plan --model llama-7b && make everything",
            "```",
            "<!-- covered: decoder.ablation tests/test_ablation.py::test_x -->",
            "```bash",
            "python -m perfmodel.roofline --gpu a100",
            "```",
        ]
    )
    shown, problems = shown_commands("page.md", page)
    assert [(one.command, one.runs) for one in shown] == [
        ("python -m decoder.train", "python -m decoder.train --quick --out q"),
        ("python -m perfmodel.plan --model llama-7b", "python -m perfmodel.plan --model llama-7b"),
        ("python -m perfmodel.roofline --gpu a100", "python -m perfmodel.roofline --gpu a100"),
    ]
    assert problems == [
        "page.md:4: 'make everything' is no command the docs test can check",
        "page.md:6: a marker for decoder.ablation stands for no command of the block below it",
    ]


def test_a_failing_command_is_seen_as_failing():
    done = run_command("python -m perfmodel.roofline --gpu no-such-gpu")
    assert done.status == 1 and "no-such-gpu" in done.stderr


def test_the_readme_guides_a_newcomer_in_a_few_screens():
    """The house rule: the README at most 250 lines; depth lives in docs/."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 250, f"README.md has {lines} lines; move depth to docs/"
