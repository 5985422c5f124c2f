"""A calibration's measured step times per tree size (StepProfile) and the checks that refuse a
profile measured on a machine changing speed under it: steps that fall as the tree grows, a
tree step over n + 1 plain steps, rounds that disagree, a plain step far above a probe's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# How far one tree size's rounds may spread (upper quartile over lower, less 1) before the
# calibration is taken as measured on a machine changing speed under it: interleaved rounds of
# a quiet machine agree within 10-15%, and one round of five caught by a burst of load leaves
# the quartiles where the others are.
ROUND_SPREAD = 0.3
# How far a calibration's plain step may be above the probe's. On a steady machine the two
# agree to 10-20%: the machine drifts that much over seconds (decoder.runs), the probe is a
# few steps long, and it runs at the calibration's mean context rather than over its range.
# A loaded CPU stretched the plain step 9x. 1.5 lies well clear of both.
PLAIN_STEP_FACTOR = 1.5
# How far a larger tree's step may fall below a smaller one's. A larger tree does all of a
# smaller one's work and more, so its step is never truly faster; on a CPU the steps of
# trees up to ~8 tokens cost the same, and their measured times scatter by a few percent on
# a quiet machine. A fall of more than 20% is the machine changing speed under the
# measurement, as on the loaded CPU where step times fell as the tree grew.
MONOTONE_SLACK = 0.2


@dataclass(frozen=True)
class StepProfile:
    """A calibration: seconds per step and batch efficiency by tree size, when and with
    which torch it was measured."""

    step_s: dict[int, float]
    batch_efficiency: dict[int, float]
    measured_at: float | None = None  # seconds since the epoch
    torch: str | None = None

    @property
    def plain_s(self) -> float:
        return self.step_s[1]

    def to_json(self) -> dict:
        return {
            "step_s": {str(n): v for n, v in sorted(self.step_s.items())},
            "batch_efficiency": {str(n): v for n, v in sorted(self.batch_efficiency.items())},
            "measured_at": self.measured_at,
            "torch": self.torch,
        }

    @classmethod
    def from_json(cls, entry: dict) -> StepProfile:
        step_s = {int(n): float(v) for n, v in entry["step_s"].items()}
        efficiency = {int(n): float(v) for n, v in entry["batch_efficiency"].items()}
        if 1 not in step_s or not all(np.isfinite(v) and v > 0 for v in step_s.values()):
            raise ValueError("step times need plain decoding and positive seconds")
        return cls(step_s, efficiency, entry.get("measured_at"), entry.get("torch"))


def falling_steps(step_s: dict[int, float], slack: float | None = None) -> str | None:
    """Where step time falls as the tree grows by more than `slack` (a share of the slowest
    smaller tree's step; default MONOTONE_SLACK), or None where it does not."""
    slack = MONOTONE_SLACK if slack is None else slack
    slowest, at = 0.0, 0
    for size in sorted(step_s):
        if step_s[size] < (1 - slack) * slowest:
            return (
                f"a step of {size} tokens took {step_s[size] * 1e3:.3g} ms, less than the {slowest * 1e3:.3g} ms of "
                f"{at} token{'s' if at > 1 else ''}"
            )
        if step_s[size] > slowest:
            slowest, at = step_s[size], size
    return None


def costly_trees(step_s: dict[int, float]) -> str | None:
    """Where a tree of n tokens took more than n + 1 plain steps, or None. Its forward does at
    most n plain forwards' work and the heads less than one more, so such a step was slowed by
    something else (a 2-token tree timed at 5x the plain step on a busy machine)."""
    plain = step_s[1]
    for size in sorted(step_s):
        if size > 1 and step_s[size] > (size + 1) * plain:
            return (
                f"a step of {size} tokens took {step_s[size] * 1e3:.3g} ms, more than {size + 1} plain steps "
                f"({plain * 1e3:.3g} ms each)"
            )
    return None


def unsteady_rounds(spread: dict[int, float] | None) -> str | None:
    """Where one tree size's calibration rounds disagree by more than ROUND_SPREAD, or None."""
    worst = max((spread or {}).items(), key=lambda item: item[1], default=None)
    if worst is None or worst[1] <= ROUND_SPREAD:
        return None
    return f"its rounds disagree by {worst[1]:.0%} at {worst[0]} token{'s' if worst[0] > 1 else ''}"


def slow_plain_step(profile: StepProfile, probe_s: float, factor: float | None = None) -> str | None:
    """Why the profile's plain step is implausibly slow next to the probe's (more than
    `factor` times it; default PLAIN_STEP_FACTOR), or None."""
    factor = PLAIN_STEP_FACTOR if factor is None else factor
    if profile.plain_s > factor * probe_s:
        return (
            f"its plain step ({profile.plain_s * 1e3:.3g} ms) is {profile.plain_s / probe_s:.1f}x this machine's now "
            f"({probe_s * 1e3:.3g} ms), more than {factor}x"
        )
    return None


def profile_problems(profile: StepProfile, probe_s: float) -> list[str]:
    """What makes a calibration implausible here: step times falling as the tree grows, a
    plain step much slower than the probe's, another torch."""
    checks = (falling_steps(profile.step_s), costly_trees(profile.step_s), slow_plain_step(profile, probe_s))
    problems = [p for p in checks if p]
    if profile.torch is not None and profile.torch != torch.__version__:
        problems.append(f"it was measured with torch {profile.torch}, this is {torch.__version__}")
    return problems
