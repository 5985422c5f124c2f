"""python -m reports.readme_samples [--check] [FILE ...]: the sample outputs of the README and
of docs/, produced by the commands they show.

A sample is a fenced block right after a marker line naming its command:

    <!-- sample: python -m reports compare --gpu a100 a40 rtx-a6000 h100 -->

`medusa-perfkit <command> ...` names a command as well, and a trailing `| head -N` or
`| tail -N` keeps the first or last N lines of the output, so a page can show the part of a
long output it talks about. Each command runs as a user would run it, in a fresh empty
folder (so its default output paths read the same everywhere) with an empty measurements
home (so nothing measured on this machine leaks in), and its standard output becomes the
block. Lines ending in a wall time ("(1.8 s)") are progress, different on every run, and
left out. Without --check the files are rewritten; with it, nothing is written and the exit
status is 1 when a block differs from its command's output (the test suite checks so).

Commands run inside this process (the command's module imported and its main called), not
in a new interpreter: a page of docs names many commands, and starting Python and torch for
each would cost more than most of them take.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import re
import shlex
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from perfmodel.base.errors import PerfkitError
from perfmodel.cli import Parser, run
from perfmodel.cli.console import command_code
from perfmodel.cli.fields import POSITIONAL, add_options, option, read_options
from perfmodel.measured.store import HOME_VARIABLE

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CONSOLE_SCRIPT = "medusa-perfkit"
MARKER = re.compile(
    r"^<!-- sample: ((?:python -m \S+|" + CONSOLE_SCRIPT + r")(?: [^>|]*?)?)(?: \| (head|tail) -(\d+))? -->$"
)
WALL_TIME = re.compile(r"\(?\b\d+(?:\.\d+)? s\)?\s*$")
FENCE = "```"


@dataclass(frozen=True)
class Sample:
    command: str
    start: int  # index of the block's first line (after the opening fence)
    end: int  # index of the closing fence
    keep: tuple[str, int] | None = None  # ("head" | "tail", lines) where the marker cuts the output

    def shown(self, output: list[str]) -> list[str]:
        """The lines of the command's output the block shows."""
        if self.keep is None:
            return output
        how, count = self.keep
        return output[:count] if how == "head" else output[-count:]


@dataclass(frozen=True)
class Done:
    """What a command did: its exit status and what it wrote."""

    status: int
    stdout: str
    stderr: str

    def output_lines(self) -> list[str]:
        """Standard output without the progress lines that carry a wall time."""
        return [line.rstrip() for line in self.stdout.splitlines() if not WALL_TIME.search(line)]


def doc_files() -> list[Path]:
    """The files whose samples are checked: the README and every page under docs/."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def find_samples(lines: list[str], name: str = "README") -> list[Sample]:
    samples = []
    for i, line in enumerate(lines):
        found = MARKER.match(line)
        if not found:
            continue
        if i + 1 >= len(lines) or lines[i + 1] != FENCE:
            raise PerfkitError(f"{name} line {i + 1}: a sample marker must be followed by a {FENCE} line")
        end = next((j for j in range(i + 2, len(lines)) if lines[j] == FENCE), None)
        if end is None:
            raise PerfkitError(f"{name} line {i + 2}: the sample's block is never closed")
        keep = (found.group(2), int(found.group(3))) if found.group(2) else None
        samples.append(Sample(found.group(1).strip(), i + 2, end, keep))
    return samples


def console_script_target() -> str:
    """'module:function' of the console script, as pyproject.toml declares it (read from the
    source tree, so a checkout whose install predates the script still finds it)."""
    try:
        import tomllib  # Python >= 3.11; the metadata of the install serves older ones
    except ModuleNotFoundError:
        from importlib.metadata import entry_points

        found = [e.value for e in entry_points(group="console_scripts") if e.name == CONSOLE_SCRIPT]
    else:
        scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
        found = [scripts.get("project", {}).get("scripts", {}).get(CONSOLE_SCRIPT)]
    if not found or not found[0]:
        raise PerfkitError(f"pyproject.toml declares no {CONSOLE_SCRIPT} console script under [project.scripts]")
    return found[0]


def entry_point(argv: list[str]) -> tuple[Callable[[list[str] | None], int | None], list[str]]:
    """The main function a command line calls and the arguments it passes it:
    `python -m pkg.mod ARGS` -> pkg.mod's main (a package's __main__'s), `medusa-perfkit
    ARGS` -> the console script's function."""
    if argv[:2] == ["python", "-m"] and len(argv) > 2:
        module = importlib.import_module(command_code(argv[2]))
        if not hasattr(module, "main"):
            module = importlib.import_module(f"{argv[2]}.__main__")
        return module.main, argv[3:]
    if argv[:1] == [CONSOLE_SCRIPT]:
        module_name, _, function = console_script_target().partition(":")
        return getattr(importlib.import_module(module_name), function), argv[1:]
    raise PerfkitError(f"not a command the docs can run: {shlex.join(argv)} (python -m ... or {CONSOLE_SCRIPT} ...)")


@contextlib.contextmanager
def fresh_folder() -> Iterator[Path]:
    """A new empty working folder with an empty measurements home, as a first-time user has;
    the previous folder and home come back afterwards."""
    before_dir, before_home = os.getcwd(), os.environ.get(HOME_VARIABLE)
    with tempfile.TemporaryDirectory(prefix="doc-command-") as folder:
        os.environ[HOME_VARIABLE] = str(Path(folder) / "home")
        os.chdir(folder)
        try:
            yield Path(folder)
        finally:
            os.chdir(before_dir)
            if before_home is None:
                os.environ.pop(HOME_VARIABLE, None)
            else:
                os.environ[HOME_VARIABLE] = before_home


def exit_status(exc: SystemExit) -> int:
    """The status a process exiting so would give its shell (sys.exit's rules)."""
    return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)


def run_command(command: str) -> Done:
    """Run a documented command line in a fresh folder (above), in this process."""
    argv = shlex.split(command)
    main, args = entry_point(argv)
    out, err = io.StringIO(), io.StringIO()
    with fresh_folder(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = run(main, args)
        except SystemExit as exc:  # argparse's exits: --help (0) and usage errors (2)
            status = exit_status(exc)
    return Done(status, out.getvalue(), err.getvalue())


def command_output(command: str) -> list[str]:
    """The command's standard output, progress lines left out; a failure is an error."""
    done = run_command(command)
    if done.status != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise PerfkitError(f"sample command failed (exit {done.status}): {command}: {last}")
    return done.output_lines()


def refresh(text: str, name: str = "README", outputs: dict[str, list[str]] | None = None) -> tuple[str, list[str]]:
    """The text with every sample block replaced by its command's output, and the commands
    whose block changed. `outputs` keeps each command's output for the next page that shows it."""
    outputs = {} if outputs is None else outputs
    lines = text.split("\n")
    changed = []
    for sample in reversed(find_samples(lines, name)):
        if sample.command not in outputs:
            outputs[sample.command] = command_output(sample.command)
        output = sample.shown(outputs[sample.command])
        if lines[sample.start : sample.end] != output:
            changed.append(sample.command)
            lines[sample.start : sample.end] = output
    return "\n".join(lines), changed[::-1]


@dataclass(frozen=True)
class SampleOptions:
    """The command's options, each declared once (perfmodel.cli.fields)."""

    check: bool = field(
        default=False,
        metadata=option("--check", "only compare; exit 1 when a sample is out of date", action="store_true"),
    )
    files: tuple[Path, ...] = field(
        default=(),
        metadata=option(
            POSITIONAL,
            "the files to check or rewrite (default: README.md and every docs/**/*.md)",
            nargs="*",
            type=Path,
            metavar="FILE",
        ),
    )
    # the older spelling of FILE, kept for scripts that use it
    readme: list[Path] = field(
        default_factory=list, metadata=option("--readme", argparse.SUPPRESS, type=Path, action="append")
    )


def build_parser() -> Parser:
    p = Parser(prog="python -m reports.readme_samples", description=__doc__.split("\n\n")[0])
    add_options(p, SampleOptions)
    return p


def main(argv: list[str] | None = None) -> int:
    args = read_options(SampleOptions, build_parser().parse_args(argv))
    files = [*args.files, *args.readme] or doc_files()
    stale = 0
    with_markers = 0
    outputs: dict[str, list[str]] = {}
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise PerfkitError(
                f"cannot read {path}: {exc.strerror or exc} (samples live in a source checkout)"
            ) from None
        if not find_samples(text.split("\n"), path.name):
            continue
        with_markers += 1
        new, changed = refresh(text, path.name, outputs)
        stale += len(changed)
        if args.check:
            for command in changed:
                print(f"out of date: {command} (in {path.name}; python -m reports.readme_samples rewrites it)")
            continue
        if changed:
            path.write_text(new, encoding="utf-8")
        for command in changed:
            print(f"rewrote: {command} (in {path.name})")
    if not with_markers:
        names = ", ".join(str(path) for path in files)
        raise PerfkitError(f"{names}: no sample markers (<!-- sample: python -m ... -->)")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(run(main))
