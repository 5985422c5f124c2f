"""The answer section of a report page: the decision map (the schedule's band per batch and
context, predicted and measured cells marked), its legend, and the answer in words above it.
"""

from __future__ import annotations

import pandas as pd

from reports.answer import EVIDENCE, EVIDENCE_CSS, HEADING, MapCell, PageAnswer, band_labels, max_batch
from reports.answer_words import capacity_sentence, measured_sentence, rests_on, tree_sentence, workload_text
from reports.html import Page


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
