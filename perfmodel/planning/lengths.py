"""A length distribution in tokens (prompts, responses): its mean for latency and its p95 for
memory. The workload (perfmodel.planning.workload) holds one for prompts and one for responses."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from perfmodel.base.checks import is_real
from perfmodel.base.errors import PerfkitError

DEFAULT_PROMPT_LEN = 512
DEFAULT_RESPONSE_LEN = 256


@dataclass(frozen=True)
class Lengths:
    """A length distribution in tokens: its mean (for latency) and its p95 (for memory)."""

    mean: float
    p95: int

    @classmethod
    def of(cls, value, name: str = "length") -> Lengths:
        """From an int, a (mean, p95) tuple, a sequence/array of samples, or a Lengths."""
        if isinstance(value, Lengths):
            return cls.checked(value.mean, value.p95, name)
        if isinstance(value, tuple) and len(value) == 2:
            return cls.checked(value[0], value[1], name)
        if isinstance(value, (Sequence, np.ndarray)) and not isinstance(value, (str, bytes)):
            samples = np.asarray(value)
            if samples.size == 0 or samples.dtype.kind not in "iuf":
                raise PerfkitError(f"{name}: samples must be a non-empty list of token counts, got {value!r}")
            if not np.isfinite(samples).all() or (samples < 1).any():
                raise PerfkitError(
                    f"{name}: every sample must be >= 1 token, got {samples[~(samples >= 1)].ravel()[:3].tolist()}"
                )
            return cls.checked(float(samples.mean()), math.ceil(float(np.quantile(samples, 0.95))), name)
        return cls.checked(value, value, name, labels=("", ""))

    @classmethod
    def checked(cls, mean, p95, name: str, labels=(" mean", " p95")) -> Lengths:
        for what, x in zip(labels, (mean, p95)):
            if not is_real(x) or x < 1:
                raise PerfkitError(
                    f"{name}{what} must be a number of tokens >= 1, got {x!r} (give an int, a (mean, p95) pair or a "
                    "list of samples)"
                )
        if p95 < mean:
            raise PerfkitError(f"{name}: p95 ({p95}) must be >= the mean ({mean})")
        return cls(float(mean), math.ceil(p95))

    def __str__(self) -> str:
        return f"{self.mean:g}" if self.mean == self.p95 else f"mean {self.mean:g}, p95 {self.p95}"
