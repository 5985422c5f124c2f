"""What an argument must be, said once: a count (an integer, never a bool) of at least some
least value, or a real number (never a bool), finite. Callers keep their own messages, which
name the argument and what is allowed; these say whether a value is one."""

from __future__ import annotations

import math
from numbers import Integral, Real


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
