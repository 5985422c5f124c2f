"""The warm-up a twin run timed as decoding, taken back out of its steps.

A twin run records each setting's warm-up apart, in no step time: its `warmup_s` column (a
CUDA graph's capture, a compilation: decoder.static_step). The runs from before that column
captured each setting's CUDA graph (or compiled its step) inside their first timed step: the
twin warmed each setting with a 2-token run, and a static step is kept per shape, the KV
cache's length part of it, so the timed runs never reused the warm-up's. Such a run's
measured steps hold one capture per setting; it was not recorded, but the run shows it.
Measured minus the twin's own price (the step's kernels replayed on the device, through the
host and device queues: nothing of the measured steps calibrated into it), times the steps,
is nearly the same for every setting whatever its batch and tree: a per-step excess that
falls as 1/steps, not one that grows with the batch. A line through the run's settings,

    measured x steps = a x priced x steps + C,

gives that constant as its intercept C, taken as each setting's capture (a near 1: the price
holds once it is out).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from perfmodel.base.launch import Launch

WARMUP_COLUMN = "warmup_s"  # the twin's recorded warm-up of each setting (profilers.closed_loop.twin)
KEPT = (Launch.GRAPH, Launch.COMPILED)  # the regimes whose step is kept per shape: captured or compiled once
# How a run's capture is known: recorded apart, inferred from the fit, none in its steps, or
# not to be inferred (one setting, or a twin price calibrated on the measured plain step).
RECORDED, INFERRED, NONE, UNKNOWN = "recorded", "inferred", "none", "unknown"
PIPELINED = "pipeline"  # how the twin's pricing column starts where nothing was calibrated


@dataclass(frozen=True)
class CaptureFit:
    """measured x steps = slope x priced x steps + capture_s, over one run's settings."""

    slope: float
    capture_s: float
    excess_s: tuple[float, float]  # the least and the most of measured x steps - priced x steps
    settings: int

    @classmethod
    def of(cls, run: pd.DataFrame) -> CaptureFit:
        steps = run["measured_steps"].to_numpy(dtype=float)
        measured = run["measured_step_s"].to_numpy(dtype=float) * steps
        priced = run["predicted_step_s"].to_numpy(dtype=float) * steps
        slope, capture = np.polyfit(priced, measured, 1)
        excess = measured - priced
        return cls(float(slope), float(capture), (float(excess.min()), float(excess.max())), len(run))

    def label(self) -> str:
        low, high = self.excess_s
        return (
            f"inferred from the fit, not recorded: measured x steps = {self.slope:.2f} x the twin's replayed price x "
            f"steps + {self.capture_s * 1e3:.0f} ms over its {self.settings} settings (each setting's measured - "
            f"priced, x steps: {low * 1e3:.0f}-{high * 1e3:.0f} ms)"
        )


def capture_kind(run: pd.DataFrame, launch: Launch) -> str:
    """How the capture of a run's steps is known (RECORDED, INFERRED, NONE, UNKNOWN)."""
    if launch is Launch.EAGER:
        return NONE  # the eager loop has no step to warm up
    if WARMUP_COLUMN in run:
        return RECORDED
    if launch not in KEPT:
        return NONE  # a static step is built every call: nothing captured, nothing kept from a warm-up run
    pipelined = "pricing" in run and run["pricing"].astype(str).str.startswith(PIPELINED).all()
    fits = len(run) >= 2 and {"measured_steps", "predicted_step_s"} <= set(run)
    return INFERRED if pipelined and fits else UNKNOWN


def capture_fit(run: pd.DataFrame, launch: Launch) -> CaptureFit | None:
    """The fit of a run whose capture is inferred; None for the others."""
    return CaptureFit.of(run) if capture_kind(run, launch) == INFERRED else None


def without_capture(run: pd.DataFrame, launch: Launch) -> pd.DataFrame:
    """The run with each setting's capture (`capture`: how it is known; `capture_s`: the
    recorded or inferred seconds, NaN where none or unknown) and its measured step without
    it (`net_step_s`: a recorded capture was never in it; NaN where unknown)."""
    kind = capture_kind(run, launch)
    measured = run["measured_step_s"]
    if kind == RECORDED:
        return run.assign(capture=kind, capture_s=run[WARMUP_COLUMN], net_step_s=measured)
    if kind == INFERRED:
        capture = CaptureFit.of(run).capture_s
        return run.assign(capture=kind, capture_s=capture, net_step_s=measured - capture / run["measured_steps"])
    return run.assign(capture=kind, capture_s=np.nan, net_step_s=measured if kind == NONE else np.nan)


def twin_error(run: pd.DataFrame) -> float:
    """The median |error| of the twin's own price against the run's steps without the capture."""
    return float(np.median(np.abs(run["predicted_step_s"] / run["net_step_s"] - 1)))
