"""What every command line of the toolkit shares: one-line errors and argument types."""

from __future__ import annotations

import argparse
import gc
import os
import sys
from collections.abc import Callable

from perfmodel.base.errors import PerfkitError
from perfmodel.latency.choice import LatencyChoice


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line (the full usage is under --help)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")

    def parse_known_args(self, args=None, namespace=None):
        parsed, rest = super().parse_known_args(args, namespace)
        # --latency and --stack are one choice (perfmodel.latency.choice.LatencyChoice).
        if isinstance(getattr(parsed, "latency", None), str) and hasattr(parsed, "stack"):
            parsed.latency = LatencyChoice.of(parsed.latency, parsed.stack)
        return parsed, rest


# The largest sizes a command line takes: a batch of 2^20 sequences (a 7B model's KV cache
# for that many 1-token sequences alone is 0.5 TB) and 2^24 tokens (beyond the longest
# context windows published). Whether a model's costs at a grid's largest point fit int64
# depends on the model: perfmodel.models.grid.check_arithmetic says.
MAX_BATCH = 1 << 20
MAX_TOKENS = 1 << 24
MAX_COUNT = (1 << 31) - 1  # any other count (processes, prompts, steps): a signed 32-bit int


def bounded_int(limit: int, what: str) -> Callable[[str], int]:
    """An argparse type: an integer from 1 to `limit`; anything else is a one-line usage
    error naming the value and the range (`what` says what the limit is)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
        if value > limit:
            raise argparse.ArgumentTypeError(f"must be at most {limit:,} ({what}), got {text!r}")
        return value

    return parse


positive_int = bounded_int(MAX_COUNT, "the largest signed 32-bit integer")
batch_size = bounded_int(MAX_BATCH, "2^20 sequences")
token_count = bounded_int(MAX_TOKENS, "2^24 tokens")


def most_jobs() -> int:
    """The most processes a --jobs runs at once: one a core. More only queue for the cores
    (each a fork holding the command's memory), and thousands stall the whole machine."""
    return os.cpu_count() or 1


def job_count(text: str) -> int:
    """--jobs as argparse reads it: 1 to most_jobs(), checked when parsed."""
    return bounded_int(most_jobs(), "this machine's cores")(text)


# Garbage collection while a command runs: the first generation is collected after this many
# new container objects instead of Python's 700.
COMMAND_GC_THRESHOLD = 50_000


def run(main: Callable[[list[str] | None], int | None], argv: list[str] | None = None) -> int:
    """Run a CLI's main; bad input becomes `error: ...` on stderr and exit status 1."""
    # A command builds tables and figures it keeps to the end; collecting every 700 new
    # objects scans them over and over (about a twentieth of a roofline's wall time) to find
    # cycles that are rare here. Put back afterwards, for callers that go on (tests, notebooks).
    thresholds = gc.get_threshold()
    gc.set_threshold(COMMAND_GC_THRESHOLD, *thresholds[1:])
    try:
        return main(argv) or 0
    except PerfkitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader left (`| head`): what is still buffered goes nowhere, not into a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:
        # What the outputs checked before the work could not foresee (a disk filling up during
        # it): one line naming the file; the writes themselves leave whole files or none.
        where = f": {exc.filename}" if exc.filename else ""
        print(f"error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1
    finally:
        gc.set_threshold(*thresholds)


TP_HELP = (
    "devices per model replica, tensor parallel (default 1; auto: the capacity plan's choice, the degree up to 8 "
    "with the most tokens/s per device among those that fit)"
)


def tp_degree(text: str) -> int | None:
    """The --tp option of every command that takes it: a positive integer, or auto (None:
    perfmodel.planning.capacity picks the degree)."""
    if text == "auto":
        return None
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (or auto)") from None


def number_in(low: float, high: float, what: str) -> Callable[[str], float]:
    """An argparse type: a number from low to high, `what` saying which in its error."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be a number {what}, got {text!r}")
        return value

    return parse


def positive_number(text: str) -> float:
    """A finite number > 0 (a rate, a latency target)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        finite = " finite" if value == float("inf") else ""  # inf is > 0: say what else it lacks
        raise argparse.ArgumentTypeError(f"must be a{finite} number > 0, got {text!r}")
    return value


def positive_number_up_to(limit: float, what: str) -> Callable[[str], float]:
    """An argparse type: a finite number > 0 (positive_number) and at most `limit`, where a
    larger one would overflow what the command derives from it (`what` says what the limit is)."""

    def parse(text: str) -> float:
        value = positive_number(text)
        if value > limit:
            raise argparse.ArgumentTypeError(f"must be at most {limit:,.15g} ({what}), got {text!r}")
        return value

    return parse
