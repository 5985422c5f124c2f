"""python -m reports.startup_benchmark: how long the two commands a newcomer runs first take.

Runs `python -m perfmodel.roofline --gpu a100` and `python -m reports build --gpu a100
--model llama-7b` as a user runs them, each in a fresh interpreter writing to a scratch
folder, and prints the median wall time of each over --repeat runs, with the machine's
cores and load. A benchmark, not a test: the times depend on the machine and on what else
runs on it (the targets are 2 s and 3 s on 2 idle cores).
"""

from __future__ import annotations

import os
import shlex
import statistics
import sys
import tempfile
from dataclasses import dataclass, field

from perfmodel.cli import Parser, positive_int, run
from perfmodel.cli.fields import add_options, option, read_options
from perfmodel.cli.wall_time import interpreter_seconds, machine_line
from reports.figure_cache import FOLDER_VARIABLE as FIGURES_VARIABLE
from reports.figure_cache import OFF


@dataclass(frozen=True)
class Command:
    line: str  # as a user types it; each run adds its own output folder

    def argv(self, out: str) -> list[str]:
        return [sys.executable, *shlex.split(self.line)[1:], f"--out={out}"]


COMMANDS = (
    Command("python -m perfmodel.roofline --gpu a100"),
    Command("python -m reports build --gpu a100 --model llama-7b"),
)


def wall_time(command: Command, out: str) -> float:
    """Seconds from starting the interpreter to its exit; a failed run is an error naming it."""
    # A newcomer's first run: no figure kept from an earlier one (reports.figure_cache).
    env = {**os.environ, FIGURES_VARIABLE: OFF}
    return interpreter_seconds(command.argv(out)[1:], env, command.line)


def timings(command: Command, repeat: int) -> list[float]:
    with tempfile.TemporaryDirectory(prefix="perfkit-startup-") as scratch:
        return [wall_time(command, os.path.join(scratch, f"run-{i}")) for i in range(repeat)]


def summary_line(command: Command, times: list[float]) -> str:
    spread = f" ({min(times):.2f}-{max(times):.2f} s)" if len(times) > 1 else ""
    runs = f"{len(times)} run{'s' if len(times) > 1 else ''}"
    return f"{command.line}: {statistics.median(times):.2f} s wall, median of {runs}{spread}"


@dataclass(frozen=True)
class BenchmarkOptions:
    """The command's one option (perfmodel.cli.fields)."""

    repeat: int = field(
        default=5,
        metadata=option("--repeat", "runs of each command (default %(default)s)", type=positive_int, metavar="N"),
    )


def build_parser() -> Parser:
    p = Parser(prog="python -m reports.startup_benchmark", description=__doc__.split("\n\n")[0])
    add_options(p, BenchmarkOptions)
    return p


def main(argv: list[str] | None = None) -> int:
    args = read_options(BenchmarkOptions, build_parser().parse_args(argv))
    print(machine_line())
    for command in COMMANDS:
        print(summary_line(command, timings(command, args.repeat)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
