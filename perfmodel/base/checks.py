"""What an argument must be, said once: a count (an integer, never a bool) of at least some
least value, or a real number (never a bool), finite. Callers keep their own messages, which
name the argument and what is allowed; these say whether a value is one. And keyword options
shared out among the dataclasses that declare them (split_options)."""

from __future__ import annotations

import dataclasses
import math
from numbers import Integral, Real

from perfmodel.base.errors import PerfkitError


def is_integer(value) -> bool:
    """An integer, Python's or numpy's, and not a bool."""
    return isinstance(value, Integral) and not isinstance(value, bool)


def is_count(value, least: int = 1) -> bool:
    """An integer (is_integer) of at least `least`."""
    return is_integer(value) and value >= least


def is_real(value, finite: bool = True) -> bool:
    """A real number (Python's or numpy's, not a bool), finite unless `finite` is False."""
    if isinstance(value, bool) or not isinstance(value, Real):
        return False
    return math.isfinite(value) or not finite


def split_options(options: dict, kinds: tuple[type, ...], who: str) -> list[dict]:
    """`options` (keyword arguments) shared out among the dataclasses `kinds` by their field
    names, one dict per kind; an option none of them declares is one line naming it and
    every option `who` takes."""
    names = [{f.name for f in dataclasses.fields(kind) if f.init and not f.name.startswith("_")} for kind in kinds]
    known = set().union(*names)
    unknown = sorted(set(options) - known)
    if unknown:
        what = "unknown options" if len(unknown) > 1 else "an unknown option"
        raise PerfkitError(f"{who} got {what} {', '.join(map(repr, unknown))}; it takes: {', '.join(sorted(known))}")
    return [{k: v for k, v in options.items() if k in kind} for kind in names]
