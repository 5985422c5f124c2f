"""python -m reports.readme_samples [--check]: the README's sample outputs, produced by the
commands they show.

A sample is a fenced block right after a marker line naming its command:

    <!-- sample: python -m reports compare --gpu a100 a40 rtx-a6000 h100 -->

Each command runs as a user would run it, in a fresh empty folder (so its default output
paths read the same everywhere) with an empty measurements home (so nothing measured on
this machine leaks in), and its standard output becomes the block. Lines ending in a wall
time ("(1.8 s)") are progress, different on every run, and left out. Without --check the
README is rewritten; with it, nothing is written and the exit status is 1 when a block
differs from its command's output (the test suite runs it so).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from perfmodel.base.errors import PerfkitError
from perfmodel.cli import Parser, run
from perfmodel.measured.store import HOME_VARIABLE

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MARKER = re.compile(r"^<!-- sample: (python -m \S+(?: [^>]*)?) -->$")
WALL_TIME = re.compile(r"\(?\b\d+(?:\.\d+)? s\)?\s*$")
FENCE = "```"


@dataclass(frozen=True)
class Sample:
    command: str
    start: int  # index of the block's first line (after the opening fence)
    end: int  # index of the closing fence


def find_samples(lines: list[str]) -> list[Sample]:
    samples = []
    for i, line in enumerate(lines):
        found = MARKER.match(line)
        if not found:
            continue
        if i + 1 >= len(lines) or lines[i + 1] != FENCE:
            raise PerfkitError(f"README line {i + 1}: a sample marker must be followed by a {FENCE} line")
        end = next((j for j in range(i + 2, len(lines)) if lines[j] == FENCE), None)
        if end is None:
            raise PerfkitError(f"README line {i + 2}: the sample's block is never closed")
        samples.append(Sample(found.group(1), i + 2, end))
    return samples


def command_output(command: str) -> list[str]:
    """The command's standard output, progress lines left out, run as described above."""
    argv = shlex.split(command)
    with tempfile.TemporaryDirectory(prefix="readme-sample-") as folder:
        env = {
            **os.environ,
            HOME_VARIABLE: str(Path(folder) / "home"),
            "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        }
        done = subprocess.run(
            [sys.executable, *argv[1:]], cwd=folder, env=env, capture_output=True, text=True, check=False
        )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise PerfkitError(f"sample command failed (exit {done.returncode}): {command}: {last}")
    return [line.rstrip() for line in done.stdout.splitlines() if not WALL_TIME.search(line)]


def refresh(text: str) -> tuple[str, list[str]]:
    """The README with every sample block replaced by its command's output, and the
    commands whose block changed."""
    lines = text.split("\n")
    changed = []
    for sample in reversed(find_samples(lines)):
        output = command_output(sample.command)
        if lines[sample.start : sample.end] != output:
            changed.append(sample.command)
            lines[sample.start : sample.end] = output
    return "\n".join(lines), changed[::-1]


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m reports.readme_samples", description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="only compare; exit 1 when a sample is out of date")
    p.add_argument("--readme", type=Path, default=README, help="the file to check or rewrite (default: README.md)")
    args = p.parse_args(argv)
    try:
        text = args.readme.read_text(encoding="utf-8")
    except OSError as exc:
        raise PerfkitError(
            f"cannot read {args.readme}: {exc.strerror or exc} (samples live in a source checkout)"
        ) from None
    if not find_samples(text.split("\n")):
        raise PerfkitError(f"{args.readme}: no sample markers (<!-- sample: python -m ... -->)")
    new, changed = refresh(text)
    if args.check:
        for command in changed:
            print(f"out of date: {command} (python -m reports.readme_samples rewrites it)")
        return 1 if changed else 0
    if changed:
        args.readme.write_text(new, encoding="utf-8")
    for command in changed:
        print(f"rewrote: {command}")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
