"""What every command line of the toolkit shares: one-line errors and argument types."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from perfmodel.errors import PerfkitError


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line (the full usage is under --help)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def run(main: Callable[[list[str] | None], int | None], argv: list[str] | None = None) -> int:
    """Run a CLI's main; bad input becomes `error: ...` on stderr and exit status 1."""
    try:
        return main(argv) or 0
    except PerfkitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def flops_text(flops_per_s: float, unit: str = "FLOP/s") -> str:
    """A rate with three significant digits in the unit that keeps them: a CPU's 0.0017
    TFLOP/s reads 1.70 GFLOP/s, not 0.00 TFLOP/s."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M")):
        if flops_per_s >= scale:
            return f"{flops_per_s / scale:.3g} {prefix}{unit}"
    return f"{flops_per_s / 1e3:.3g} k{unit}"
