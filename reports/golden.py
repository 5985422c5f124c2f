"""python -m reports.golden --against REF: every documented command's output, and every file it
writes, byte for byte against another version of the code (a refactor's check: nothing a user
sees may change).

The commands are the README's and docs' samples (`<!-- sample: ... -->`, reports.readme_samples)
and the examples that write files (GOLDEN_COMMANDS: report builds, a comparison, figures,
schedules). Each runs as a user runs it: a new interpreter in a fresh empty folder with an empty
measurements home, once with the code of this checkout and once with REF's (a commit, exported
with `git archive`, or a folder holding another checkout: --tree). Then every file under both
folders is compared, and standard output with it. Lines that end in a wall time and the folder's
own path are the only things left out, as every run's differ.

Exit status 0 when everything is identical, 1 when something differs (each difference is
named, with its first differing line for text), 2 on bad usage.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from perfmodel.base.errors import PerfkitError
from perfmodel.base.output_locks import FOLDER_LOCK
from perfmodel.cli import Parser, most_jobs, run
from perfmodel.cli.fields import add_options, option, read_options
from perfmodel.measured.store import HOME_VARIABLE
from reports.figure_cache import FOLDER_VARIABLE as FIGURES_VARIABLE
from reports.figure_cache import OFF
from reports.readme_samples import ROOT, WALL_TIME, doc_files, find_samples

# The examples that write files (reports, figures, tables): their files are what a refactor
# most easily changes without a sample noticing.
GOLDEN_COMMANDS = (
    "python -m reports build --gpu h100 --model llama-2-70b --tp auto --rate 5 --prompt-len 1024 --response-len 256",
    "python -m reports build --gpu h100 --model llama-7b --step traced",
    "python -m reports compare --gpu a100 h100 l40s --model llama-7b",
    "python -m perfmodel.speedup --gpu a100 h100 --model llama-7b",
    "python -m perfmodel.schedule --gpu h100 --model llama-7b --tp auto",
    "python -m perfmodel.plan --model llama-7b --gpu a100 h100 --step traced --launch eager --prompt-len 512 "
    "--response-len 128",
    "python -m perfmodel.speedup --gpu h100 --model llama-7b --step traced --launch graph --tree-size 64 --batch 4 "
    "--context 1024 --acceleration 2.4",
)
# A command's output file that is not a result: the run's own stdout and stderr.
STDOUT, STDERR = "stdout.txt", "stderr.txt"
TEXT_SUFFIXES = {".txt", ".md", ".csv", ".json", ".html", ".svg", ".yaml", ".log", ".tex"}
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def documented_commands(files: Iterable[Path] | None = None) -> list[str]:
    """Every sample command of the README and docs, once each, in page order."""
    seen: dict[str, None] = {}
    for path in files or doc_files():
        for sample in find_samples(path.read_text(encoding="utf-8").split("\n"), path.name):
            seen.setdefault(sample.command, None)
    return list(seen)


def golden_commands() -> list[str]:
    return list(dict.fromkeys([*documented_commands(), *GOLDEN_COMMANDS]))


def slug(command: str) -> str:
    """A folder name for a command: its words, shortened, made safe."""
    words = shlex.split(command)
    words = words[2:] if words[:2] == ["python", "-m"] else words
    return re.sub(r"[^A-Za-z0-9._-]+", "_", "_".join(words))[:120].strip("_")


def record_command(command: str, tree: Path, folder: Path) -> int:
    """Run `command` with the code of `tree` in the empty `folder` (its measurements home inside
    it) and keep its standard output and error there; its exit status."""
    folder.mkdir(parents=True)
    argv = shlex.split(command)
    if argv[:2] == ["python", "-m"]:
        argv = [sys.executable, *argv[1:]]
    elif argv[:1] == ["medusa-perfkit"]:
        script = "import sys; from perfmodel.cli.console import main; sys.exit(main())"
        argv = [sys.executable, "-c", script, *argv[1:]]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")])),
        HOME_VARIABLE: str(folder / "home"),
        "MPLBACKEND": "Agg",
        FIGURES_VARIABLE: OFF,  # every figure drawn by the tree's own code
        "NO_COLOR": "1",
    }
    with open(folder / STDOUT, "wb") as out, open(folder / STDERR, "wb") as err:
        return subprocess.run(argv, cwd=folder, env=env, stdout=out, stderr=err, check=False).returncode


def comparable(path: Path, folder: Path) -> bytes:
    """A file's bytes as compared: text without wall-time lines, colour codes and the run's
    folder; any other file as it is."""
    data = path.read_bytes()
    if path.suffix not in TEXT_SUFFIXES:
        return data
    text = ANSI.sub("", data.decode("utf-8", errors="replace")).replace(str(folder), "<folder>")
    keep = [line.rstrip() for line in text.splitlines() if not WALL_TIME.search(line)]
    if path.name == STDERR:  # progress bars redraw; warnings name the interpreter's paths
        keep = [line for line in keep if line.startswith(("error", "Error", "Traceback"))]
    return "\n".join(keep).encode()


def files_under(folder: Path) -> dict[str, Path]:
    """The files a run left, less the folder locks it held (empty files, not outputs)."""
    return {str(p.relative_to(folder)): p for p in sorted(folder.rglob("*")) if p.is_file() and p.name != FOLDER_LOCK}


@dataclass(frozen=True)
class Difference:
    command: str
    file: str
    what: str

    def __str__(self) -> str:
        return f"{self.command}\n    {self.file}: {self.what}"


def first_difference(a: bytes, b: bytes) -> str:
    lines_a, lines_b = a.split(b"\n"), b.split(b"\n")
    for i, (x, y) in enumerate(zip(lines_a, lines_b)):
        if x != y:
            return f"line {i + 1}: {x.decode(errors='replace')[:100]!r} became {y.decode(errors='replace')[:100]!r}"
    if len(lines_a) != len(lines_b):
        return f"{len(lines_a)} lines became {len(lines_b)}"
    return f"{len(a)} bytes became {len(b)} (binary)"


def compare_runs(command: str, before: Path, after: Path) -> Iterator[Difference]:
    """What differs between two runs of `command` (each folder as record_command left it)."""
    old, new = files_under(before), files_under(after)
    for name in sorted(old.keys() | new.keys()):
        if name not in new:
            yield Difference(command, name, "written before, not after")
        elif name not in old:
            yield Difference(command, name, "written after, not before")
        else:
            a, b = comparable(old[name], before), comparable(new[name], after)
            if a != b:
                yield Difference(command, name, first_difference(a, b))


def export_commit(ref: str, into: Path) -> Path:
    """The tracked files of commit `ref` of this checkout, written under `into`."""
    try:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], capture_output=True, check=True).stdout
    except FileNotFoundError:
        raise PerfkitError("--against needs git on the PATH (or give --tree FOLDER)") from None
    except subprocess.CalledProcessError as exc:
        raise PerfkitError(f"--against {ref}: git cannot export it: {exc.stderr.decode().strip()}") from None
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def check(commands: list[str], before_tree: Path, after_tree: Path, work: Path, jobs: int) -> list[Difference]:
    """Run every command with both trees under `work` and return what differs."""

    def both(index_command: tuple[int, str]) -> list[Difference]:
        index, command = index_command
        name = f"{index:02d}-{slug(command)}"
        status = [
            record_command(command, tree, work / side / name)
            for side, tree in (("before", before_tree), ("after", after_tree))
        ]
        found = list(compare_runs(command, work / "before" / name, work / "after" / name))
        if status[0] != status[1]:
            found.insert(0, Difference(command, "exit status", f"{status[0]} became {status[1]}"))
        mark = "identical" if not found else f"{len(found)} difference(s)"
        print(f"[{index + 1}/{len(commands)}] {mark}: {command}", flush=True)
        return found

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return [d for found in pool.map(both, enumerate(commands)) for d in found]


WHERE = ("where", False)  # --against or --tree


@dataclass(frozen=True)
class GoldenOptions:
    """The command's options, each declared once (perfmodel.cli.fields)."""

    against: str | None = field(
        default=None,
        metadata=option(
            "--against", "a commit (or branch, tag) of this checkout to compare with", metavar="REF", exclusive=WHERE
        ),
    )
    tree: Path | None = field(
        default=None,
        metadata=option(
            "--tree", "another checkout's folder to compare with", type=Path, metavar="FOLDER", exclusive=WHERE
        ),
    )
    command: list[str] | None = field(
        default=None,
        metadata=option(
            "--command",
            "compare this command line only (may repeat; default: every documented sample and GOLDEN_COMMANDS)",
            action="append",
            metavar="CMD",
        ),
    )
    list: bool = field(
        default=False, metadata=option("--list", "print the commands compared and stop", action="store_true")
    )
    jobs: int = field(
        default_factory=most_jobs,
        metadata=option("--jobs", "commands run at once (default and most: one a core)", type=int, metavar="N"),
    )
    keep: Path | None = field(
        default=None,
        metadata=option("--keep", "keep both runs' folders here (default: removed)", type=Path, metavar="DIR"),
    )


def build_parser() -> Parser:
    p = Parser(prog="python -m reports.golden", description=__doc__.split("\n\n")[0])
    add_options(p, GoldenOptions)
    return p


def main(argv: list[str] | None = None) -> int:
    args = read_options(GoldenOptions, build_parser().parse_args(argv))
    commands = args.command or golden_commands()
    if args.list:
        print("\n".join(commands))
        return 0
    if args.against is None and args.tree is None:
        raise PerfkitError("say what to compare with: --against REF (a commit) or --tree FOLDER (a checkout)")
    if args.jobs < 1:
        raise PerfkitError(f"--jobs must be at least 1, got {args.jobs}")
    if args.jobs > most_jobs():
        raise PerfkitError(f"--jobs must be at most {most_jobs()} (this machine's cores), got {args.jobs}")
    if args.keep is not None and args.keep.exists() and any(args.keep.iterdir()):
        raise PerfkitError(f"--keep {args.keep}: the folder is not empty")
    with tempfile.TemporaryDirectory(prefix="golden-") as temp:
        work = args.keep or Path(temp)
        if args.tree is not None:
            if not (args.tree / "perfmodel").is_dir():
                raise PerfkitError(f"--tree {args.tree}: not a medusa-perfkit checkout (no perfmodel/ folder in it)")
            before = args.tree.resolve()
        else:
            before = export_commit(args.against, Path(temp) / "tree")
        print(f"comparing {len(commands)} command(s): {args.against or before} before, {ROOT} after", flush=True)
        differences = check(commands, before, ROOT, work, args.jobs)
    for difference in differences:
        print(difference)
    said = "everything identical" if not differences else f"{len(differences)} difference(s)"
    print(f"{said} over {len(commands)} command(s)")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(run(main))
