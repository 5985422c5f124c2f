"""python -m perfmodel.search_benchmark: how long the README's serving search takes, beside
the floor no command goes under (a new interpreter importing the libraries it needs).

Each run is a new interpreter, as a user runs the command. It prints the median over
--repeat runs of:
- the import floor: `import pandas, matplotlib` alone, and the plan command's own imports;
- the search end to end: `python -m perfmodel.plan --model llama-2-70b --gpu h100 a100-sxm
  --tp auto --rate 50 --prompt-len 1024 --response-len 256 --tpot-ms 50` (SEARCH);
- its two parts, timed inside such an interpreter: the unloaded plan (which also loads the
  devices' measured tables) and the serving search (a simulation per rate tried, per device,
  tensor-parallel degree and Medusa setting).
A benchmark, not a test: the times depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import json
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

from perfmodel.base.errors import PerfkitError
from perfmodel.cli import Parser, positive_int
from perfmodel.cli.fields import add_options, option, read_options
from perfmodel.cli.wall_time import interpreter_seconds, machine_line
from reports.commands.plan import read_question

SEARCH = (
    "python -m perfmodel.plan --model llama-2-70b --gpu h100 a100-sxm --tp auto --rate 50 "
    "--prompt-len 1024 --response-len 256 --tpot-ms 50"
)
FLOORS = {
    "import pandas, matplotlib": "import pandas, matplotlib",
    "import the plan command": "import reports.commands.plan",
}


def search_parts(command: str = SEARCH) -> dict[str, float]:
    """Seconds of the command's unloaded plan and serving search, in this interpreter."""
    _, question = read_question(shlex.split(command)[3:])
    started = time.perf_counter()
    question.unloaded_plan()
    planned = time.perf_counter()
    question.serving_search()
    return {"unloaded plan": planned - started, "serving search": time.perf_counter() - planned}


def parts_in_new_interpreter(command: str = SEARCH) -> dict[str, float]:
    code = f"import json, reports.commands.search_benchmark as b; print(json.dumps(b.search_parts({command!r})))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise PerfkitError(f"timing the parts of {command} failed: {last}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def line(label: str, times: list[float]) -> str:
    spread = f" ({min(times):.2f}-{max(times):.2f})" if len(times) > 1 else ""
    return f"{label:<34} {statistics.median(times):6.2f} s{spread}"


@dataclass(frozen=True)
class SearchBenchmarkOptions:
    """The command's one option (perfmodel.cli.fields)."""

    repeat: int = field(
        default=3,
        metadata=option("--repeat", "runs of each (default %(default)s)", type=positive_int, metavar="N"),
    )


def build_parser() -> Parser:
    p = Parser(prog="python -m perfmodel.search_benchmark", description=__doc__.split("\n\n")[0])
    add_options(p, SearchBenchmarkOptions)
    return p


def main(argv: list[str] | None = None) -> int:
    args = read_options(SearchBenchmarkOptions, build_parser().parse_args(argv))
    command = SEARCH
    print(machine_line())
    print(f"{command}\nmedian of {args.repeat} new interpreter(s) each (min-max):")
    for label, code in FLOORS.items():
        print(line(f"floor: {label}", [interpreter_seconds(["-c", code]) for _ in range(args.repeat)]), flush=True)
    whole = [interpreter_seconds(shlex.split(command)[1:]) for _ in range(args.repeat)]
    print(line("the search, end to end", whole), flush=True)
    parts = [parts_in_new_interpreter(command) for _ in range(args.repeat)]
    for name in parts[0]:
        print(line(f"  of which the {name}", [p[name] for p in parts]), flush=True)
    return 0
