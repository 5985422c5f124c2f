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
from perfmodel.measured.store import stored_closed_loops
from perfmodel.planning.capacity import PlanResult
from perfmodel.planning.lengths import Workload
from perfmodel.planning.schedule import speculation_schedule
from perfmodel.planning.schedule_bands import DEFAULT_MAX_BATCH, default_batches
from perfmodel.planning.schedule_format import ScheduleBand, SpeculationSchedule
from perfmodel.serving.capacity import ServingAnswer, ServingOption, serve
from perfmodel.serving.summary import option_line
from reports.html import Cell, Page
from reports.prose import capacity_fact, measured_pays_at, shown_path
from reports.sources import load_validation

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
    report, planned: PlanResult | str, validation: pd.DataFrame, config, tracer=None, serving=None
) -> PageAnswer:
    """The answer of one device's page (reports.build): the schedule of the page's very step
    (device view, degree, latency source, step flavour), the closed loop's cells, the serving
    simulation where the workload has a rate (`serving`, where the build already ran it)."""
    settings = config.workload
    schedule = speculation_schedule(
        report.model,
        report.view,
        report.tp,
        report.dtype,
        report.acceptance.choice,
        config.latency,
        config.step,
        tracer,
        batches=map_batches(planned),
        medusa=settings.medusa,
    )
    serving = serving or serving_answer(
        report.model,
        [report.view],
        report.dtype,
        report.acceptance.choice,
        config.tp,
        settings,
        config.latency,
        config.step,
        tracer,
    )
    return PageAnswer(
        settings, step_context(settings), schedule, measured_cells(schedule, validation), planned, serving
    )


def workload_of(settings: WorkloadSettings) -> Workload:
    return Workload(settings.prompt, settings.response, settings.latency_target_s)


def step_context(settings: WorkloadSettings) -> int:
    """The average decoding step's context, mean prompt + half the mean response: a trace's
    own lengths where one is given, else --prompt-len and --response-len."""
    trace = settings.serving is not None and settings.serving[0].trace is not None
    if not trace:
        return workload_of(settings).step_context
    requests = settings.serving[0].sample()
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


def serving_answer(model, views, dtype, acceptance, tp, settings: WorkloadSettings, latency, step="full", tracer=None):
    """serve()'s answer for the workload's rate or trace (None without one): the page's
    tensor-parallel degree, or every usable one where it is auto (tp None)."""
    if settings.serving is None:
        return None
    workload, targets, engine = settings.serving
    return serve(
        model,
        views,
        workload,
        targets,
        acceptance,
        dtype,
        tp,
        settings.medusa,
        engine,
        latency,
        step=step,
        tracer=tracer,
    )


# ----------------------------------------------------------------------------- words


def served_text(workload) -> str:
    """The requests served: a trace by its path as the page shows paths (no home folders)."""
    if workload.trace is None:
        return workload.describe()
    rate = f" at {workload.rate:g} requests/s" if workload.rate else ""
    return f"trace {shown_path(workload.trace)}{rate}"


def workload_text(settings: WorkloadSettings, context: int) -> str:
    """The workload the answer answers, as the user gave it."""
    said = [f"prompts {settings.prompt} tokens, responses {settings.response} tokens"]
    if settings.serving is not None:
        workload, targets, engine = settings.serving
        said = [served_text(workload), f"targets: {targets.describe()}", f"{engine.prefill} prefill"]
        if workload.trace is not None:  # its lengths are the trace's: the capacity plan's are still these
            said.append(f"capacity plan for prompts {settings.prompt}, responses {settings.response} tokens")
    said[0] += f" (average decoding context {context} tokens)"
    if settings.latency_target_s is not None:
        said.append(f"at most {settings.latency_target_s * 1e3:g} ms per token")
    return f"Workload: {'; '.join(said)}; Medusa {settings.medusa}."


def tree_sentence(answer: PageAnswer) -> str:
    """The tree to run at the workload's batch and context: the measured best where a closed
    loop measured that cell, else the decision map's (predicted)."""
    batch, whence = answer.batch
    row, column = answer.here
    cell = answer.cells()[row][column]
    at = f"at batch {batch} ({whence}) and context {answer.context}"
    best = None if answer.serving is None else answer.serving.best
    if best is not None and best.medusa == "off" and cell.tree_size > 1:
        return (
            "Recommended: Medusa off: the serving simulation below ranks it first (the fewest devices for the rate, "
            f"then the most tokens/s per device). {at.capitalize()} the map's fastest step would be a tree of "
            f"{cell.tree_size} tokens at {cell.speedup:.2f}x plain decoding ({evidence(cell.evidence).words})."
        )
    if cell.measured:
        what = f"a tree of {cell.tree_size} tokens" if cell.tree_size > 1 else "no tree (plain decoding)"
        return (
            f"Recommended {at}: {what}, measured: the closed loop's fastest tree there ran at {cell.speedup:.2f}x "
            "plain decoding."
        )
    said = evidence(cell.evidence).words
    if cell.tree_size > 1:
        return f"Recommended {at}: a tree of {cell.tree_size} tokens, {cell.speedup:.2f}x plain decoding ({said})."
    return f"Recommended {at}: no tree; plain decoding is the fastest there ({said})."


def measured_sentence(answer: PageAnswer) -> str | None:
    """What the closed loop measured in the map, said before any prediction; None where it
    measured nothing, or only the workload's cell (the tree sentence then says it)."""
    if not answer.measured or set(answer.measured) == {answer.here}:
        return None
    batches = band_labels(answer.schedule.batch_grid, max_batch(answer.planned))
    contexts = band_labels(answer.schedule.context_grid)
    said = [
        f"batch {batches[i]}, context {contexts[j]}: "
        + (
            f"the fastest tree, {c.tree_size} tokens, ran at {c.speedup:.2f}x plain decoding"
            if c.tree_size > 1
            else "no tree paid"
        )
        for (i, j), c in sorted(answer.measured.items())
    ]
    return f"Measured (closed loop, python -m perfmodel.validate; the M cells below): {'; '.join(said)}."


def serving_sentence(serving: ServingAnswer) -> str:
    """The serving simulation's answer in one sentence: the devices the rate needs, the
    latencies at the target percentile, the tokens/s, with or without Medusa."""
    q = serving.targets.percentile
    rate = "" if serving.target_rate is None else f" at {serving.target_rate:.3g} requests/s"
    head = f"Capacity{rate} (predicted by simulating the engine, {serving.engine.prefill} prefill): "
    best = serving.best
    if best is not None:
        return head + option_line(best, q) + "."
    return head + f"no configuration meets {serving.targets.describe()}; " + option_line(closest(serving), q) + "."


def chosen_degree(serving: ServingAnswer | None) -> int | None:
    """The tensor-parallel degree the serving answer deploys (or comes nearest with), None
    without one or where nothing fits."""
    if serving is None:
        return None
    option = serving.best or closest(serving)
    return option.tp if option.fits else None


def closest(serving: ServingAnswer) -> ServingOption:
    """The configuration nearest to meeting the targets: the one that serves most, else the first."""
    return max(serving.options, key=lambda o: (o.fits, o.max_rate))


def capacity_sentence(answer: PageAnswer, validation: pd.DataFrame) -> str:
    if answer.serving is not None:
        return serving_sentence(answer.serving)
    return capacity_fact(answer.planned, measured_pays_at(validation))


def stack_text(latency) -> str:
    """Whose measurements time the operators (perfmodel.latency.gemm_grid's stacks)."""
    stack = getattr(latency, "stack", None)
    return stack if stack else "none named (a roofline: no engine's or harness's operator timings)"


def regime_text(latency) -> str:
    """Which launch regime (perfmodel.base.launch) the page's step times assume."""
    if getattr(latency.spec, "kernel_launch_us", None) is None:
        return "this CPU's, kernels run one after another on the host's own thread, its measured per-op overhead each"
    return (
        "kernels back to back, as an engine's CUDA-graph step runs them (graph); the reference decoder's eager step, "
        "bound by its host on a GPU, is slower: python -m perfmodel.speedup --step traced --launch eager prices it"
    )


def rests_on(report, answer: PageAnswer, validation: pd.DataFrame) -> list[str]:
    """What the numbers rest on, measured before predicted."""
    acceptance = report.acceptance
    record = (
        f"measured by python -m decoder.measure ({acceptance.record_path.name})"
        if acceptance.measured
        else "not measured for this model"
    )
    measured = (
        f"measured in {len(answer.measured)} cell(s) (M) by the closed loop, python -m perfmodel.validate "
        f"({len(validation)} runs of the reference decoder); predicted in the others"
        if answer.measured
        else "predicted in every cell: no closed loop measured this device and model"
    )
    return [
        f"Decision map: {measured}.",
        f"Step times: {report.step.label} ({evidence(answer.schedule.evidence.split('/')[0]).words}).",
        f"Acceptance: {acceptance.choice.label}, {record}.",
        f"Software stack of the step times: {stack_text(report.latency)}.",
        f"Launch regime of the step times: {regime_text(report.latency)}.",
    ]


# ----------------------------------------------------------------------------- the page


def band_labels(grid, top: int | None = None) -> list[str]:
    """The floor rule's band of each grid point: 1-1023, 1024-2047, ..., the last 'g+' (it
    stands for what lies beyond too), or 'g' where g is the `top` value there is."""
    grid = [int(g) for g in grid]
    lows = [1, *grid[1:]]
    highs = [g - 1 for g in grid[1:]]
    last = str(grid[-1]) if top == grid[-1] else f"{grid[-1]}+"
    return [f"{lo}-{hi}" if hi > lo else str(lo) for lo, hi in zip(lows, highs)] + [last]


def legend(page: Page, shown: set[str]) -> None:
    """The evidence levels the map shows, closest to a measurement first."""
    page.legend([(MapCell(1, 1.0, name).cell(), e.words) for name, e in EVIDENCE.items() if name in shown])


def decision_map(page: Page, answer: PageAnswer) -> None:
    schedule = answer.schedule
    cells = answer.cells()
    here = answer.here
    page.heading("Decision map", level=3)
    page.paragraph(
        f"The map of {schedule.model} on {schedule.device}"
        + (f" x{schedule.tp} (tensor parallel)" if schedule.tp > 1 else "")
        + f", Medusa {schedule.medusa}: the tree to run (tokens, root included) or off per batch (rows) and "
        "context (columns, tokens), with its speedup over plain decoding, the lowest of its band. The outlined "
        "cell is the workload's; the letter says what each number rests on."
    )
    labels = band_labels(schedule.batch_grid, max_batch(answer.planned))
    rows = [
        [label, *(c.cell((i, j) == here) for j, c in enumerate(row))]
        for i, (label, row) in enumerate(zip(labels, cells))
    ]
    page.style(EVIDENCE_CSS)
    page.cell_table(["batch \\ context", *band_labels(schedule.context_grid)], rows)
    legend(page, {cell.evidence for row in cells for cell in row})


def answer_section(page: Page, report, answer: PageAnswer, validation: pd.DataFrame) -> None:
    """The page's first section: the tree, the capacity line, the decision map, the evidence."""
    page.heading(HEADING)
    page.paragraph(workload_text(answer.settings, answer.context), note=True)
    measured = measured_sentence(answer)
    if measured:  # measured evidence before prediction
        page.paragraph(measured)
    page.paragraph(tree_sentence(answer))
    page.paragraph(capacity_sentence(answer, validation))
    decision_map(page, answer)
    page.heading("What the numbers rest on", level=3)
    page.bullets(rests_on(report, answer, validation))


# ----------------------------------------------------------------------------- several devices


def device_answers(model, pairs, acceptance, config, plans: dict) -> dict[str, PageAnswer]:
    """Per device of a comparison: its schedule at the degree its plan priced (config.tp where
    the plan failed), on one batch grid for all, with the closed loops stored for it."""
    settings = config.workload
    context = step_context(settings)
    answers = {}
    for view, dtype in pairs:
        key = view.spec.key
        planned = plans[key]
        tp = int(planned.devices["tensor_parallel"].iloc[0]) if isinstance(planned, PlanResult) else config.tp or 1
        schedule = speculation_schedule(
            model, view, tp, dtype, acceptance.choice, config.latency, medusa=settings.medusa
        )
        validation = load_validation(stored_closed_loops(key), key, model.name)
        answers[key] = PageAnswer(settings, context, schedule, measured_cells(schedule, validation), planned, None)
    return answers


def room_cell(answer: PageAnswer, batch: int) -> Cell | None:
    """A cell the device cannot run: the model does not fit, or the batch is past what its KV
    cache holds; None where it can."""
    top = max_batch(answer.planned)
    if top is None:
        return Cell("does not fit", note=str(answer.planned))
    if batch > top:
        return Cell("no room", note=f"the KV cache holds {top} sequence(s) of this workload at most")
    return None


def device_cells(answer: PageAnswer) -> dict[int, MapCell]:
    """A device's map at the workload's context: per batch band it can run, its cell."""
    column = answer.here[1]
    cells = zip(answer.schedule.batch_grid, answer.cells())
    return {int(b): row[column] for b, row in cells if room_cell(answer, b) is None}


def device_row(key: str, answer: PageAnswer) -> list:
    tp = answer.schedule.tp
    label = key + (f" x{tp}" if tp > 1 else "")
    cells = device_cells(answer)
    return [label, *(cells[b].cell() if b in cells else room_cell(answer, b) for b in answer.schedule.batch_grid)]


def compare_answer_section(page: Page, answers: dict[str, PageAnswer], answer_line: str, intro: str) -> None:
    """The comparison's first section: the answer line, then one decision-map row per device."""
    first = next(iter(answers.values()))
    page.heading(HEADING)
    page.paragraph(workload_text(first.settings, first.context), note=True)
    page.paragraph(answer_line)
    page.heading("Decision map", level=3)
    page.paragraph(
        f"At the workload's context ({first.context} tokens): per device and batch, the tree to run "
        "(tokens, root included) or off, with its speedup over plain decoding; the letter says what it rests on."
    )
    page.style(EVIDENCE_CSS)
    page.cell_table(
        ["device \\ batch", *band_labels(first.schedule.batch_grid)],
        [device_row(key, answer) for key, answer in answers.items()],
    )
    legend(page, {cell.evidence for answer in answers.values() for cell in device_cells(answer).values()})
    page.paragraph(intro, note=True)


def compare_answer_line(serving: ServingAnswer | None, overall_text: str) -> str:
    """The serving simulation's answer across the devices, else the capacity plans' overall one."""
    if serving is not None:
        return serving_sentence(serving)
    return f"Capacity plan (predicted): {overall_text}"
