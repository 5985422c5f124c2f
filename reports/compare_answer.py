"""The answer of a comparison page: each device's answer (the schedule's map, the serving
option), one row per device side by side, and the line that says which device to run.
"""

from __future__ import annotations

from perfmodel.measured.store import stored_closed_loops
from perfmodel.planning.capacity import PlanResult
from perfmodel.planning.schedule import ScheduleRequest, schedule_deployment
from perfmodel.serving.capacity_answer import ServingAnswer
from reports.answer import (
    EVIDENCE_CSS,
    HEADING,
    MapCell,
    PageAnswer,
    band_labels,
    max_batch,
    measured_cells,
    step_context,
)
from reports.answer_page import legend
from reports.answer_words import serving_sentence, workload_text
from reports.html import Cell, Page
from reports.sources import load_validation

# ----------------------------------------------------------------------------- several devices


def device_answers(deployments, acceptance, config, plans: dict) -> dict[str, PageAnswer]:
    """Per device of a comparison: its schedule at the degree its plan priced (config.tp where
    the plan failed), on one batch grid for all, with the closed loops stored for it."""
    settings = config.workload
    context = step_context(settings)
    answers = {}
    for deployment in deployments:
        key = deployment.device
        planned = plans[key]
        tp = int(planned.devices["tensor_parallel"].iloc[0]) if isinstance(planned, PlanResult) else config.tp or 1
        request = ScheduleRequest(acceptance.choice, medusa=settings.medusa)
        schedule = schedule_deployment(deployment.at(tp), request)
        validation = load_validation(stored_closed_loops(key), key, deployment.model.name)
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
