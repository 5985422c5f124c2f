"""The answer a report opens with, above its table of contents: the tree to run at the user's
workload, the capacity line, the decision map and what the numbers rest on.

The decision map is the speculation schedule (perfmodel.planning.schedule) of the page's
device, model and tensor-parallel degree: one row per batch band, one column per context
band, each cell the best tree (and its predicted speedup) or off, marked by what the number
rests on. A cell a closed loop measured shows the measurement instead: measured evidence
comes before prediction. The capacity line is the serving simulation's answer
(perfmodel.serving.capacity.serve) where the workload has a rate or a trace, else the
capacity plan's recommendation.

reports.build and reports.compare gather the inputs; this module words them and writes them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from perfmodel.cli.workload_options import WorkloadSettings
from perfmodel.planning.capacity import PlanResult
from perfmodel.planning.deployment import Deployment
from perfmodel.planning.schedule import ScheduleRequest, schedule_deployment
from perfmodel.planning.schedule_bands import DEFAULT_MAX_BATCH, default_batches
from perfmodel.planning.schedule_format import ScheduleBand, SpeculationSchedule
from perfmodel.serving.capacity import ServeRequest, serve_deployments
from perfmodel.serving.capacity_answer import ServingAnswer
from reports.html import Cell

HEADING = "The answer"


@dataclass(frozen=True)
class Evidence:
    """What a map cell's number rests on: a one-letter key on the cell, its colour, its words."""

    key: str
    color: str
    words: str


# By how close each comes to a measurement of the speedup itself, the closest first. The keys
# past the first are the latency source's modes (perfmodel.latency.source; ceilings: a CPU's).
EVIDENCE = {
    "closed-loop": Evidence("M", "#a5d6a7", "measured: the speedup itself, timed in a closed loop"),
    "measured": Evidence("O", "#c5e1a5", "predicted from operator times measured on the device"),
    "calibrated": Evidence("C", "#e6ee9c", "predicted by a latency model calibrated on the device's measurements"),
    "grid": Evidence("G", "#dcedc8", "predicted from an engine's GEMM grid measured on the device"),
    "transferred": Evidence("T", "#fff59d", "predicted from GEMMs transferred from measured devices"),
    "borrowed": Evidence("B", "#ffe0b2", "predicted by the calibration of a measured device of its architecture"),
    "ceilings": Evidence("R", "#e0e0e0", "predicted by the roofline of the CPU's measured ceilings"),
    "datasheet": Evidence("D", "#eceff1", "predicted by the datasheet roofline"),
}
UNKNOWN = Evidence("?", "#ffffff", "predicted (the latency source did not say what it rests on)")
EVIDENCE_CSS = "".join(f".ev-{name} {{ background: {e.color}; }}" for name, e in EVIDENCE.items())


def evidence(name: str) -> Evidence:
    return EVIDENCE.get(name, UNKNOWN)


@dataclass(frozen=True)
class MapCell:
    """One cell of the decision map: the tree (1 = off), its speedup, what that rests on."""

    tree_size: int
    speedup: float
    evidence: str  # an EVIDENCE name

    @property
    def measured(self) -> bool:
        return self.evidence == "closed-loop"

    @property
    def text(self) -> str:
        return f"tree {self.tree_size} · {self.speedup:.2f}x" if self.tree_size > 1 else "off"

    def cell(self, here: bool = False) -> Cell:
        said = evidence(self.evidence)
        css = f"ev-{self.evidence}" + (" here" if here else "")
        return Cell(self.text, css, said.key, f"{said.words}; {self.speedup:.2f}x plain decoding")


# ----------------------------------------------------------------------------- gathering


@dataclass(frozen=True)
class PageAnswer:
    """Everything the answer says, gathered once by the page's builder."""

    settings: WorkloadSettings
    context: int  # the workload's average decoding context: mean prompt + half the mean response
    schedule: SpeculationSchedule
    measured: dict[tuple[int, int], MapCell]  # (row, column) -> what a closed loop measured there
    planned: PlanResult | str
    serving: ServingAnswer | None

    @property
    def batch(self) -> tuple[int, str]:
        """The workload's batch and where it comes from: the serving simulation's mean batch,
        else the capacity plan's recommended batch, else 1."""
        best = None if self.serving is None else self.serving.best
        if best is not None:
            return max(1, round(best.mean_batch)), f"the simulation's mean batch at {best.load_rate:.3g} requests/s"
        row = self.planned.devices.iloc[0] if isinstance(self.planned, PlanResult) else None
        if row is not None and row["meets_latency"]:
            return int(row["batch"]), "the capacity plan's batch"
        return 1, "one sequence: the capacity plan recommends no batch"

    @property
    def here(self) -> tuple[int, int]:
        """The decision map's cell of the workload."""
        return grid_index(self.schedule.batch_grid, self.batch[0]), grid_index(self.schedule.context_grid, self.context)

    def cells(self) -> list[list[MapCell]]:
        """Rows of batches, columns of contexts: the schedule's choice, or the measurement."""
        schedule = self.schedule
        return [
            [
                self.measured.get((i, j)) or predicted_cell(schedule.band(batch, context))
                for j, context in enumerate(schedule.context_grid)
            ]
            for i, batch in enumerate(schedule.batch_grid)
        ]


def gather(
    report, planned: PlanResult | str, validation: pd.DataFrame, config, deployment: Deployment, serving=None
) -> PageAnswer:
    """The answer of one device's page (reports.build): the schedule of the page's very
    deployment (device view, degree, latency source, step flavour: its own step model), the
    closed loop's cells, the serving simulation where the workload has a rate (`serving`,
    where the build already ran it)."""
    settings = config.workload
    request = ScheduleRequest(report.acceptance.choice, map_batches(planned), medusa=settings.medusa)
    schedule = schedule_deployment(deployment, request)
    serving = serving or serving_answer(deployment, report.acceptance.choice, settings)
    return PageAnswer(
        settings, step_context(settings), schedule, measured_cells(schedule, validation), planned, serving
    )


def step_context(settings: WorkloadSettings) -> int:
    """The average decoding step's context, mean prompt + half the mean response: a trace's
    own lengths where one is given, else --prompt-len and --response-len."""
    if settings.workload.trace is None:
        return settings.workload.step_context
    requests = settings.workload.sample()
    return max(1, round(float(np.mean(requests.prompt) + np.mean(requests.output) / 2)))


def max_batch(planned: PlanResult | str) -> int | None:
    """The most sequences the KV cache holds (None where the model does not fit)."""
    fits = isinstance(planned, PlanResult) and bool(planned.devices["fits"].iloc[0])
    return int(planned.devices["max_batch"].iloc[0]) if fits else None


def map_batches(planned: PlanResult | str) -> np.ndarray:
    """The map's batches: every power of two up to the largest batch that fits (and that batch),
    at most the schedule's default top; the default grid where the model does not fit."""
    return default_batches(min(max_batch(planned) or DEFAULT_MAX_BATCH, DEFAULT_MAX_BATCH))


def grid_index(grid, value: float) -> int:
    """The floor rule's cell of `value` (the first cell from 1, the last and beyond)."""
    return max(0, int(np.searchsorted(np.asarray(grid), value, side="right")) - 1)


def predicted_cell(band: ScheduleBand) -> MapCell:
    return MapCell(band.tree_size, band.speedup, band.evidence)


def measured_cells(schedule: SpeculationSchedule, validation: pd.DataFrame) -> dict[tuple[int, int], MapCell]:
    """The cells a closed loop measured: its fastest tree there, or off where none beat plain
    decoding (the speedup then the best tree's, below 1)."""
    if not len(validation):
        return {}
    rows = validation.assign(
        row=[grid_index(schedule.batch_grid, b) for b in validation["batch"]],
        column=[grid_index(schedule.context_grid, c) for c in validation["context"]],
    )
    cells = {}
    for at, group in rows.groupby(["row", "column"]):
        best = group.loc[group["measured_speedup"].idxmax()]
        size = int(best["tree_size"]) if best["measured_speedup"] > 1 else 1
        cells[(int(at[0]), int(at[1]))] = MapCell(size, float(best["measured_speedup"]), "closed-loop")
    return cells


def serving_answer(deployments, acceptance, settings: WorkloadSettings):
    """serve()'s answer for the workload's rate or trace (None without one) over deployments
    (perfmodel.planning.deployment): each one's tensor-parallel degree, or every usable one
    where it has none (tp None)."""
    if not settings.simulated:
        return None
    request = ServeRequest(acceptance, settings.medusa, settings.engine)
    return serve_deployments(deployments, settings.workload, settings.targets, request)


# ----------------------------------------------------------------------------- the page


def band_labels(grid, top: int | None = None) -> list[str]:
    """The floor rule's band of each grid point: 1-1023, 1024-2047, ..., the last 'g+' (it
    stands for what lies beyond too), or 'g' where g is the `top` value there is."""
    grid = [int(g) for g in grid]
    lows = [1, *grid[1:]]
    highs = [g - 1 for g in grid[1:]]
    last = str(grid[-1]) if top == grid[-1] else f"{grid[-1]}+"
    return [f"{lo}-{hi}" if hi > lo else str(lo) for lo, hi in zip(lows, highs)] + [last]
