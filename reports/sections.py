"""The sections of the reports build page, one function each, in page order.

Each writes its heading, paragraphs, figures and tables to the Page; the tables come from
reports.tables and the sentences built from data from reports.prose. `figure(name,
drawn, caption, sources)` (from reports.build) writes one PNG beside the page and embeds the
figure (its SVG where smaller, reports.render.Drawn).
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pandas as pd

from perfmodel.acceptance.trees import export_tree
from perfmodel.latency.step import StepFlavor
from perfmodel.planning import simulation_summary
from perfmodel.planning.capacity import PlanResult
from perfmodel.planning.drafter_choice import best_drafters
from perfmodel.planning.drafters import DRAFTER_NAMES, Drafter
from perfmodel.planning.schedule import view_evidence
from reports import drafter_prose, prose, tables
from reports.answer import EVIDENCE_CSS, evidence
from reports.answer_page import legend
from reports.html import Cell, Page
from reports.render import Drawn, png_only
from reports.report import Report
from reports.roofline_page import stand_in_note

ENGINES = ("reference", "tensorrt-llm", "vllm")

FigureWriter = Callable[[str, Callable[[], Drawn], str, tuple[str, ...]], None]


def stand_in(page: Page, report: Report) -> None:
    """Above everything: the device shown is another CPU's measurements, not this machine's."""
    if report.view.stand_in_for:
        page.paragraph(stand_in_note(report.view), note=True)


def intro(page: Page, report: Report, validation: pd.DataFrame) -> None:
    page.paragraph(prose.intro_text(report, validation))


def glance(page: Page, report: Report, sims: pd.DataFrame, planned, validation: pd.DataFrame) -> None:
    report.facts = prose.glance_facts(report, sims, planned, validation)
    page.heading("At a glance")
    page.bullets(report.facts)


def roofline_section(page: Page, figure: FigureWriter, roof, op_errors) -> None:
    section = None
    for planned in roof:
        if planned.section != section:
            section = planned.section
            page.heading(section if "variations" in section else f"Rooflines: {section}")
            if "variations" in section:
                page.paragraph(
                    "Tree decoding processes q candidate tokens per sequence at once: "
                    "the linear layers' intensity grows with b x q, "
                    "attention's with q alone (each sequence reads its own KV cache). Paper Figs 18-20 and Tables 6-8."
                )
        sources = tuple(sorted(set(planned.points["source"])))
        # PNG only: a roofline's cloud of points weighs more as SVG on a GPU's grid
        figure(planned.name, png_only(planned.png), f"{', '.join(sources)}: {planned.caption}", sources)
        if "variations" in section:
            for source in sources:
                page.paragraph(
                    f"{source.capitalize()}: attained TFLOP/s (operational intensity, FLOP/byte) "
                    "per candidates q (paper Tables 6-8 style)."
                )
                page.table(tables.variation_table(planned.points[planned.points["source"] == source]))
        shown = tables.points_table(planned.points)
        page.table(shown, summary=f"points of this figure ({len(shown)})")


SPEEDUP_CAPTIONS = {
    "speedup-a": (
        "predicted: (a) speedup vs tree size at b=1, s=1024, "
        "with what makes it (acceptance and step-time overhead); stars mark optima."
    ),
    "speedup-b": "predicted: (b) speedup vs tree size per batch at s=1024, and the best tree per batch.",
    "speedup-c": "predicted: (c) speedup vs tree size per context length at b=4, and the best tree per context.",
    "draft-model": "predicted: speculative decoding with a draft model vs Medusa's best at b=1, s=1024.",
}


def speedup_section(
    page: Page, figure: FigureWriter, report: Report, sims, draft, speed_pngs, extra_pngs, validation
) -> None:
    device = report.view
    page.heading("Speedup: simulated (paper App. G.3) and measured")
    page.paragraph(
        "speedup(n) = acceptance(n) / (T_step(n) / T_step(1)) for a tree of n tokens, root included. "
        "Paper step: the App. G.3 "
        "simplified block (q, k, v, QK^T, PV, up, gate, down); "
        "full step: the whole model (norms, o, LM head, Medusa heads, verification). "
        + (
            "Traced step: every kernel the reference decoder's step launches (python -m decoder.trace), each priced "
            "by the latency source, memory-bound ones by their bytes, plus each launch. "
            if StepFlavor.TRACED in set(sims["step"])
            else ""
        )
        + f"Acceptance: {report.acceptance.choice.label}. Latency: {sims['latency_model'].iloc[0]}."
    )
    if "closed-loop" in extra_pngs:  # measured first: the predictions below are read against it
        page.paragraph(" ".join(prose.closed_loop_facts(report, sims, validation)))
        figure(
            "closed-loop",
            extra_pngs["closed-loop"],
            "measured and predicted: the reference decoder's speedup per tree size, timed on this device, "
            "against the closed-loop prediction.",
            ("measured", "predicted"),
        )
    page.preformatted(
        "\n".join(
            line.removeprefix("  ") for line in simulation_summary.summary_lines(device, report.dtype, sims, draft)
        )
    )
    for name, png in speed_pngs.items():
        caption = next(text for prefix, text in SPEEDUP_CAPTIONS.items() if name.startswith(prefix))
        figure(name, png, caption, ("predicted",))
    if "closed-loop" not in extra_pngs:
        page.paragraph(
            "No measured speedups for this device and model. "
            "python -m perfmodel.validate (--csv FILE, then --validation FILE here) "
            "runs the reference decoder on this machine and compares its speedups with the prediction.",
            note=True,
        )
    shown = tables.optima_table(sims)
    page.table(shown, summary=f"predicted: the optimum of every curve ({len(shown)})")


DRAFTERS_HEADING = "Drafters: Medusa heads, EAGLE, a draft model"
BEST_CSS = "td.best { font-weight: bold; }"


def drafter_section(
    page: Page, report: Report, compared: pd.DataFrame, drafters: list[Drafter], measured: pd.DataFrame | None = None
) -> None:
    """Simulation (b) per drafter (compared: simulations.device_table of `drafters` over the
    page's whole-step flavours): per flavour where each drafter wins and a table of each
    one's best tree and speedup per batch, every cell keyed by what it rests on (as the
    decision map's), the fastest in bold; then what each drafter's acceptance rests on.
    measured: closed-loop rows of EAGLE-drafted trees on this device (sources.load_validation),
    shown first where there are any."""
    page.heading(DRAFTERS_HEADING)
    if measured is not None and len(measured):
        page.paragraph(drafter_prose.measured_drafting_text(measured, report.view.spec.key))
    page.paragraph(
        "Three ways to draft the tokens a step verifies, priced alike: speedup = tokens per step x T(plain) / "
        "T(step). The Medusa heads draft the tree inside the step, in one parallel pass; EAGLE drafts it depth "
        "by depth (one decoder layer and the LM head a pass) before the target verifies it; a draft model takes "
        "gamma steps of its own, then the target verifies the gamma + 1 tokens, a chain. Each drafter's best tree "
        f"per batch at context {int(compared['seq_len'].iloc[0])} (the paper's simulation (b)), "
        f"latency: {compared['latency_model'].iloc[0]}. "
        "python -m perfmodel.speedup --drafter all prints the same, and per context."
    )
    chosen = best_drafters(compared)
    name = view_evidence(report.view, report.step)
    said = evidence(name)
    page.style(EVIDENCE_CSS).style(BEST_CSS)
    for step in dict.fromkeys(compared["step"]):
        page.paragraph(drafter_prose.drafter_wins_text(chosen, step))
        table = tables.drafter_table(chosen, step)
        rows = [
            [
                str(row["batch"]),
                *(
                    Cell(row[d], f"ev-{name}" + (" best" if d == row["best drafter"] else ""), said.key, said.words)
                    for d in DRAFTER_NAMES.values()
                ),
                row["best drafter"],
            ]
            for _, row in table.iterrows()
        ]
        page.cell_table(list(table.columns), rows)
    legend(page, {name})
    page.paragraph("What each drafter's numbers rest on:")
    page.bullets(drafter_prose.drafter_sources(drafters))
    caveat = drafter_prose.through_origin_text(drafters)
    if caveat:
        page.paragraph(caveat, note=True)


def acceptance_section(page: Page, figure: FigureWriter, report: Report, extra_pngs) -> None:
    acceptance = report.acceptance
    page.heading("Acceptance")
    if acceptance.measured:
        page.paragraph(prose.acceptance_record_text(acceptance))
        figure(
            "acceptance",
            extra_pngs["acceptance"],
            "measured: head top-k accuracy, accepted length per step and tokens per step per tree size; "
            "predicted: the fitted curves.",
            ("measured", "predicted"),
        )
    else:
        page.paragraph(
            f"No measured acceptance record for {report.model.name}: "
            f"the speedups use {acceptance.choice.label}, the Medusa paper's fit to "
            "its Vicuna-7B tree ablation. "
            "A record (python -m decoder.measure --model DIR --out acc.json, then --acceptance acc.json) adds "
            "the per-head top-k accuracy heat map, the accepted-length histogram and measured tokens per step.",
            note=True,
        )
        figure(
            "acceptance", extra_pngs["acceptance"], "predicted: the acceptance curve the speedups use.", ("predicted",)
        )


def tree_section(page: Page, figure: FigureWriter, report: Report, tree, best, extra_pngs) -> None:
    page.heading("Recommended tree")
    if tree is None:
        page.paragraph(
            "At batch 1 and context 1024 no tree beats plain decoding on this device (predicted): do not speculate."
        )
        return
    figure(
        "recommended-tree",
        extra_pngs["recommended-tree"],
        f"predicted: the best tree at b=1, s=1024 for the {report.step_phrase}. {tree.note}",
        ("predicted",),
    )
    formats = "\n\n".join(f"{engine}:\n{json.dumps(export_tree(tree.tree, engine))}" for engine in ENGINES)
    page.preformatted(
        formats,
        summary=(
            f"the tree as {len(tree.tree.paths)} paths, for the reference implementation, "
            "TensorRT-LLM (medusa_choices) and vLLM (speculative_token_tree)"
        ),
    )
    page.paragraph(f"Best tree size per batch at context 1024, {report.step_phrase} (predicted):")
    page.table(tables.best_per_batch(best, report.flavor))


def ablation_section(page: Page, figure: FigureWriter, report: Report, ablation: pd.DataFrame, extra_pngs) -> None:
    page.heading("Tree ablation (Medusa paper Fig. 4)")
    if not len(ablation):
        page.paragraph(
            f"No tree ablation of {report.model.name}. python -m decoder.ablation --csv FILE decodes held-out prompts "
            "with random dense trees and the greedy sparse trees on this machine (then --ablation FILE here).",
            note=True,
        )
        return
    page.paragraph(prose.ablation_text(ablation, report.view.spec.key))
    figure(
        "tree-ablation",
        extra_pngs["tree-ablation"],
        "measured (filled) and predicted (hollow): (a) tokens per step and (b) speedup against the number of "
        "candidates, for random dense trees and the greedy sparse trees.",
        ("measured", "predicted"),
    )
    page.table(tables.percent(tables.ablation_table(ablation)), summary=f"every tree ({len(ablation)})")


def capacity_section(page: Page, figure: FigureWriter, planned, extra_pngs) -> None:
    page.heading("Capacity planning")
    if not isinstance(planned, PlanResult):
        page.paragraph(f"Predicted by perfmodel.plan: {planned}.")
        return
    page.paragraph(
        "Predicted by perfmodel.plan: memory fit (weights + Medusa heads + KV cache), "
        "then per batch the best tree, its latency and throughput. "
        f"Step latency: {planned.devices['latency_model'].iloc[0]}."
    )
    page.preformatted(planned.summary())
    figure(
        "capacity",
        extra_pngs["capacity"],
        "predicted: per-token latency and device throughput per batch, best tree and plain decoding.",
        ("predicted",),
    )
    page.table(tables.capacity_table(planned), summary=f"predicted: every batch ({len(planned.bands)})")


def error_section(page: Page, op_errors, report: Report, validation: pd.DataFrame) -> None:
    page.heading("Prediction error")
    said = False
    operators = tables.operator_errors(op_errors)
    if len(operators):
        page.paragraph(f"Operators: predicted time ({report.latency.label}) vs measured time, {tables.ERROR_HEADER}.")
        page.table(tables.percent(operators))
        said = True
    acceptance = report.acceptance
    if acceptance.measured:
        table = tables.acceptance_errors(acceptance)
        page.paragraph(prose.acceptance_error_text(acceptance, table))
        page.table(tables.percent(table))
        said = True
    if len(validation):
        page.paragraph(
            "Speedup (closed loop, perfmodel.validate): the reference decoder timed on this device "
            "vs the prediction from measured operator times and the host overhead of plain decoding."
        )
        page.table(tables.percent(tables.closed_loop_table(validation)))
        said = True
    if not said:
        page.paragraph(
            "No measurements of this device and model meet a prediction here. "
            "Operator sweeps (python -m profilers.sweep), acceptance "
            "records (python -m decoder.measure) and closed-loop runs (python -m perfmodel.validate) each add a table.",
            note=True,
        )


def inputs_section(page: Page, report: Report, config, validation: pd.DataFrame, ablation: pd.DataFrame) -> None:
    page.heading("Inputs")
    page.bullets(prose.input_items(report, config, validation, ablation))
    page.paragraph(prose.plain_step_text(report))
