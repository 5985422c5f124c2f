"""python -m reports build: everything the toolkit knows about one (device, model) on one page.

One self-contained HTML file (figures embedded, nothing fetched) and the same figures as
PNG files beside it: the device and its ceilings, rooflines per op group and phase, the
Medusa variation studies with their TFLOP/s and intensity tables, simulated (and, where
measured, real) speedups, acceptance data, the recommended tree, a capacity plan, and the
prediction error wherever predictions and measurements meet.
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel import simulations as speedup
from perfmodel.acceptance import PAPER_ACCEPTANCE, HeadAccuracyAcceptance, fit_error
from perfmodel.device_view import DeviceView, is_cpu_name, resolve_view
from perfmodel.dtypes import check_dtype, default_dtype
from perfmodel.errors import PerfkitError
from perfmodel.grid import PAPER_GRID, QUICK_GRID
from perfmodel.latency import RooflineLatency
from perfmodel.measurements import stored_closed_loops
from perfmodel.models import ModelConfig, load_model
from perfmodel.plan import BAND_SHOWN, PlanResult, plan
from perfmodel.step import StepModel
from perfmodel.trees import export_tree
from profilers.sweep import measure_now
from reports.acceptance_figures import Curve, acceptance_figure, tree_figure
from reports.capacity_figures import capacity_figure
from reports.html import Page
from reports.render import FigureJob, Renderer
from reports.roofline_page import (
    describe_device,
    stand_in_note,
    submit_roofline_figures,
)
from reports.sources import (
    ReportAcceptance,
    load_validation,
    recommended_tree,
    report_acceptance,
)
from reports.speedup_figures import closed_loop_figure, submit_speedup_figures

FLAVORS = ("paper", "full")
ENGINES = ("reference", "tensorrt-llm", "vllm")


@dataclass(frozen=True)
class BuildConfig:
    model: str
    out: Path | Callable[[str], Path]  # a folder, or one made from the key of the device shown
    gpu: str | None = None
    spec: Path | None = None
    dtype: str | None = None
    measurements: tuple[Path, ...] = ()
    acceptance: str | None = None  # a decoder.measure record, "paper", or None (the checkpoint's own, else paper)
    validation: tuple[Path, ...] = ()  # perfmodel.validate CSVs (default: the device's shipped ones)
    prompt_len: int = 512
    response_len: int = 256
    latency_ms: float | None = None
    jobs: int | None = None
    measure: bool = False  # first sweep this machine's device for the model (stored for later runs)


@dataclass
class Report:
    """What a build gathered, for the page and for the caller (tests, scripts)."""

    view: DeviceView
    model: ModelConfig
    dtype: str
    acceptance: ReportAcceptance
    html: Path | None = None
    figures: list[str] = field(default_factory=list)  # PNG file names, in page order
    facts: list[str] = field(default_factory=list)  # the "at a glance" sentences


def load_inputs(config: BuildConfig, log=print) -> tuple[DeviceView, ModelConfig, str, ReportAcceptance, pd.DataFrame]:
    model = load_model(config.model)
    files = list(config.measurements)
    if config.measure:
        dtype = check_dtype(config.dtype or default_dtype("cpu" if is_cpu_name(config.gpu) else "cuda"))
        files = [*files, *measure_now(config.gpu, config.spec, [model], dtype, QUICK_GRID, log)]
    view = resolve_view(config.gpu, config.spec, files, log)
    dtype = check_dtype(config.dtype or default_dtype("cpu" if view.is_cpu else "cuda"))
    view.spec.peak_flops(dtype)  # one clear line when the device has no such peak
    acceptance = report_acceptance(config.acceptance, config.model)
    validation = load_validation(
        list(config.validation) or stored_closed_loops(view.spec.key), view.spec.key, model.name
    )
    return view, model, dtype, acceptance, validation


def build(config: BuildConfig, log=print) -> Report:
    started = time.perf_counter()
    view, model, dtype, acceptance, validation = load_inputs(config, log)
    if callable(config.out):
        config = replace(config, out=config.out(view.spec.key))
    report = Report(view, model, dtype, acceptance)
    spec = view.spec
    device = speedup.Device(spec, view.params, view.is_cpu)
    grid = QUICK_GRID if view.is_cpu else PAPER_GRID
    where = f"{model.name} on {spec.name} ({dtype})"
    log(f"building the report for {where} ...")

    with Renderer(config.jobs) as renderer:
        roof, tables, op_errors = submit_roofline_figures(renderer, view, [model], model, dtype, grid)
        sims = speedup.device_table(device, model, dtype, FLAVORS, acceptance.choice)
        draft = speedup.draft_model_table()
        speed_pngs = submit_speedup_figures(renderer, device, model, dtype, sims, draft, acceptance.choice)
        best = speedup.optima(sims)
        head = best[(best["simulation"] == "a") & (best["step"] == "full")].iloc[0]
        tree = (
            recommended_tree(int(head["tree_size"]), acceptance, bool(head["at_edge"])) if head["speculate"] else None
        )
        planned = capacity_plan(model, view, dtype, acceptance, config)
        jobs = extra_jobs(where, report, sims, planned, tree, validation, config)
        extra_pngs = {name: renderer.submit(job) for name, job in jobs.items()}

        config.out.mkdir(parents=True, exist_ok=True)
        page = Page(f"Medusa performance report: {where}", contents=True)
        pngs = {}

        def figure(name: str, png_getter, caption: str, sources: tuple[str, ...]) -> None:
            png = png_getter()
            (config.out / f"{name}.png").write_bytes(png)
            report.figures.append(f"{name}.png")
            page.figure(png, caption, sources)
            pngs[name] = png

        intro(page, report, config, validation)
        glance(page, report, sims, planned, validation)
        describe_device(page, view, dtype)
        roofline_section(page, figure, roof, op_errors)
        speedup_section(page, figure, report, sims, draft, speed_pngs, extra_pngs, validation)
        acceptance_section(page, figure, report, extra_pngs)
        tree_section(page, figure, report, tree, best, extra_pngs)
        capacity_section(page, figure, planned, extra_pngs)
        error_section(page, op_errors, report, validation)
        inputs_section(page, report, config, validation)
        report.html = page.write(config.out / "report.html")
    size = report.html.stat().st_size
    elapsed = time.perf_counter() - started
    log(f"  {len(report.figures)} figures, report.html {size / 1e6:.1f} MB in {config.out}/ ({elapsed:.1f} s)")
    return report


def capacity_plan(model, view: DeviceView, dtype: str, acceptance: ReportAcceptance, config) -> PlanResult | str:
    """perfmodel.plan on this device, or why the model cannot be served on it."""
    try:
        return plan(
            model,
            [view.spec],
            dtype,
            prompt_len=config.prompt_len,
            response_len=config.response_len,
            latency_target_s=config.latency_ms / 1e3 if config.latency_ms else None,
            acceptance=acceptance.choice.model,
            params=view.params,
        )
    except PerfkitError as exc:  # the model does not fit: a finding of the report, not a failure
        return str(exc)


# --------------------------------------------------------------------------- figures


def acceptance_curves(acceptance: ReportAcceptance) -> dict[str, Curve]:
    """The acceptance models to draw against tree size (the one the speedups use first),
    each log curve with where it is clamped at one token per step."""
    sizes = np.unique(np.geomspace(1, 256, 40).round().astype(int))
    choice = acceptance.choice
    log = choice.curve
    formula = f"{log.a:.3f} + {log.b:.3f} ln n" if log.a else f"{log.b:.3f} ln n"
    log_name = f"{'paper' if log is PAPER_ACCEPTANCE else 'log'} fit {formula}"
    heads_name = "best tree from head accuracies"

    def log_curve(model) -> Curve:
        return Curve(sizes, model(sizes), model.clamped_below(), model.unclamped)

    curves = {}
    if isinstance(choice.trees, HeadAccuracyAcceptance):
        few = sizes[sizes <= 128]
        used = choice.model is choice.trees
        curves[f"{heads_name}{' (used for speedups)' if used else ''}"] = Curve(few, choice.trees(few))
        curves[f"{log_name}{'' if used else ' (used for speedups)'}"] = log_curve(log)
    else:
        curves[f"{log_name} (used for speedups)"] = log_curve(log)
    if log is not PAPER_ACCEPTANCE:
        curves[f"paper's fit {PAPER_ACCEPTANCE.b:.3f} ln n (Vicuna-7B)"] = log_curve(PAPER_ACCEPTANCE)
    return curves


def extra_jobs(where, report: Report, sims, planned, tree, validation, config) -> dict[str, FigureJob]:
    """The report's own figures (the roofline and speedup commands draw the rest)."""

    acceptance = report.acceptance
    jobs = {}
    kind = "measured" if acceptance.measured else "predicted"
    what = " data and predicted fits" if acceptance.measured else " only: no measured record"
    title = f"Acceptance ({kind}{what}): {report.model.name}"
    jobs["acceptance"] = FigureJob(
        acceptance_figure, dict(record=acceptance.record, curves=acceptance_curves(acceptance), title=title)
    )
    if tree is not None:
        drawn = "" if tree.tree.size == tree.wanted else f"; drawn: the {tree.tree.size}-token reference tree"
        title = f"Predicted best tree size at b=1, s=1024 (whole-model step): {tree.wanted_text} tokens{drawn}. {where}"
        subtitle = f"{tree.tree.size} tokens drawn, {tree.tree.depth} heads deep. {tree.note}"
        jobs["recommended-tree"] = FigureJob(
            tree_figure, dict(tree=tree.tree, accuracy=tree.accuracy, title=title, subtitle=subtitle)
        )
    if isinstance(planned, PlanResult):
        subtitle = f"Predicted, not measured. {planned.summary().splitlines()[0]} Acceptance: {planned.acceptance}."
        jobs["capacity"] = FigureJob(
            capacity_figure,
            dict(
                bands=planned.bands,
                title=f"Predicted capacity: {where}",
                subtitle=subtitle,
                latency_target_ms=config.latency_ms,
            ),
        )
    if len(validation):
        title = f"Closed loop: predicted vs measured Medusa speedup of the reference decoder, {where}"
        files = ", ".join(sorted(set(validation["file"])))
        subtitle = (
            f"Measured by python -m perfmodel.validate ({files}): "
            f"batch {validation['batch'].iloc[0]}, context {validation['context'].iloc[0]}."
        )
        jobs["closed-loop"] = FigureJob(closed_loop_figure, dict(table=validation, title=title, subtitle=subtitle))
    return jobs


# --------------------------------------------------------------------------- sections


def intro(page: Page, report: Report, config: BuildConfig, validation: pd.DataFrame) -> None:
    measured = []
    if report.view.measured is not None and len(report.view.measured):
        measured.append(f"{len(report.view.measured)} operator timings")
    if report.view.ceilings:
        measured.append("empirical ceilings")
    if report.acceptance.measured:
        measured.append("an acceptance record")
    if len(validation):
        measured.append("a closed-loop speedup run")
    have = (
        f"Measured data used: {', '.join(measured)}."
        if measured
        else (
            "No measured data for this device and model: every number here is predicted. "
            "Run python -m profilers.sweep on the device (--measurements FILE) "
            "and python -m decoder.measure (--acceptance FILE) to add measurements."
        )
    )
    if report.view.stand_in_for:
        page.paragraph(stand_in_note(report.view), note=True)
    page.paragraph(
        f"Written {datetime.date.today().isoformat()} by medusa-perfkit (python -m reports build). "
        "Every figure and table says whether it shows "
        "predicted numbers (from the device's datasheet or measured ceilings through the latency model) "
        "or measured ones, and where both "
        f"exist, the error between them. {have}"
    )


def glance(page: Page, report: Report, sims: pd.DataFrame, planned, validation: pd.DataFrame) -> None:
    device = speedup.Device(report.view.spec, report.view.params, report.view.is_cpu)
    best = speedup.optima(sims)
    ridge = speedup.ridge(device, report.dtype)
    facts = [f"Ridge of the latency model's roofline: {ridge:.0f} FLOP/byte (predicted)."]
    for step in FLAVORS:
        row = best[(best["simulation"] == "a") & (best["step"] == step)].iloc[0]
        facts.append(
            f"Batch 1, context 1024, {speedup.STEP_LABELS[step]}: {speedup.verdict(row).split(': ', 1)[1]} (predicted)."
        )
        rows = best[(best["simulation"] == "b") & (best["step"] == step)]
        lost = speedup.loses_from(rows, "batch")
        facts.append(
            f"Context 1024, {speedup.STEP_LABELS[step]}: "
            + (
                f"do not speculate from batch {lost} on (predicted)."
                if lost
                else f"speculation still pays at batch {rows['batch'].max()} (predicted)."
            )
        )
    row = planned.devices.iloc[0] if isinstance(planned, PlanResult) else {"fits": False, "note": planned}
    if row["fits"]:
        capacity = (
            f"Capacity: max batch {row['max_batch']:,} ({row['kv_mb_per_seq']:,.0f} MB of KV cache per sequence); "
        )
        if row["meets_latency"]:
            tree_text = ("a tree of " + str(row["tree_size"])) if row["speculate"] else "no tree"
            facts.append(
                capacity + f"recommended batch {row['batch']} with {tree_text}: "
                f"{row['per_token_ms']:.1f} ms/token, {row['total_tokens_s']:,.0f} tokens/s (predicted)."
            )
        else:
            facts.append(capacity + row["note"])
    else:
        facts.append(f"Capacity: {row['note']}")
    if len(validation):
        facts.append(
            f"Closed loop (measured): predicted speedups within {validation['error'].abs().max():.1%} "
            "of the measured ones over "
            f"tree sizes {', '.join(str(n) for n in validation['tree_size'])}."
        )
    report.facts = facts
    page.heading("At a glance")
    page.bullets(facts)


def roofline_section(page: Page, figure, roof, op_errors) -> None:
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
        figure(planned.name, planned.png, f"{', '.join(sources)}: {planned.caption}", sources)
        if "variations" in section:
            for source in sources:
                page.paragraph(
                    f"{source.capitalize()}: attained TFLOP/s (operational intensity, FLOP/byte) "
                    "per candidates q (paper Tables 6-8 style)."
                )
                page.table(variation_table(planned.points[planned.points["source"] == source]))
        shown = planned.points[
            ["op", "phase", "batch", "seq_len", "candidates", "intensity", "tflops", "time_s", "source"]
        ]
        shown = shown.assign(time_s=shown["time_s"] * 1e6).rename(columns={"time_s": "time_us"})
        page.table(shown, summary=f"points of this figure ({len(shown)})")


def variation_table(points: pd.DataFrame) -> pd.DataFrame:
    """One row per (op, batch, seq_len), one column per q: 'TFLOP/s (FLOP/byte)'."""
    cells = points.assign(cell=[f"{t:.3g} ({i:.3g})" for t, i in zip(points["tflops"], points["intensity"])])
    table = cells.pivot_table(index=["op", "batch", "seq_len"], columns="candidates", values="cell", aggfunc="first")
    table.columns = [f"q={q}" for q in table.columns]
    return table.reset_index()


def speedup_section(page: Page, figure, report: Report, sims, draft, speed_pngs, extra_pngs, validation) -> None:
    device = speedup.Device(report.view.spec, report.view.params, report.view.is_cpu)
    page.heading("Speedup: simulated (paper App. G.3) and measured")
    page.paragraph(
        "speedup(n) = acceptance(n) / (T_step(n) / T_step(1)) for a tree of n tokens, root included. "
        "Paper step: the App. G.3 "
        "simplified block (q, k, v, QK^T, PV, up, gate, down); "
        "full step: the whole model (norms, o, LM head, Medusa heads, verification). "
        f"Acceptance: {report.acceptance.choice.label}. Latency: {speedup.latency_label(report.view.params)}."
    )
    page.preformatted(
        "\n".join(line.removeprefix("  ") for line in speedup.summary_lines(device, report.dtype, sims, draft))
    )
    captions = {
        "speedup-a": (
            "predicted: (a) speedup vs tree size at b=1, s=1024, "
            "with what makes it (acceptance and step-time overhead); stars mark optima."
        ),
        "speedup-b": "predicted: (b) speedup vs tree size per batch at s=1024, and the best tree per batch.",
        "speedup-c": "predicted: (c) speedup vs tree size per context length at b=4, and the best tree per context.",
        "draft-model": "predicted: speculative decoding with a draft model vs Medusa's best at b=1, s=1024.",
    }
    for name, png in speed_pngs.items():
        caption = next(text for prefix, text in captions.items() if name.startswith(prefix))
        figure(name, png, caption, ("predicted",))
    if "closed-loop" in extra_pngs:
        figure(
            "closed-loop",
            extra_pngs["closed-loop"],
            "measured and predicted: the reference decoder's speedup per tree size, timed on this device, "
            "against the closed-loop prediction.",
            ("measured", "predicted"),
        )
    else:
        page.paragraph(
            "No measured speedups for this device and model. "
            "python -m perfmodel.validate (--csv FILE, then --validation FILE here) "
            "runs the reference decoder on this machine and compares its speedups with the prediction.",
            note=True,
        )
    shown = sims[sims["best"]][
        ["simulation", "step", "batch", "seq_len", "tree_size", "acceptance", "overhead", "speedup"]
    ]
    page.table(shown.reset_index(drop=True), summary=f"predicted: the optimum of every curve ({len(shown)})")


def acceptance_section(page: Page, figure, report: Report, extra_pngs) -> None:
    acceptance = report.acceptance
    page.heading("Acceptance")
    if acceptance.measured:
        record = acceptance.record
        page.paragraph(
            f"Measured by python -m decoder.measure ({acceptance.record_path.name}): "
            f"{record.get('prompts')} held-out prompts x "
            f"{record.get('new_tokens_per_prompt')} tokens, {record['acceptance']['scheme']} acceptance, "
            f"batch {record.get('batch')}; "
            f"{record['mean_accepted_tokens']:.2f} tokens per step with its tree of {record['tree']['size']} tokens "
            f"(lossless: {record.get('lossless')}). Model: {Path(str(record.get('model'))).name}."
        )
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


def tree_section(page: Page, figure, report: Report, tree, best, extra_pngs) -> None:
    page.heading("Recommended tree")
    if tree is None:
        page.paragraph(
            "At batch 1 and context 1024 no tree beats plain decoding on this device (predicted): do not speculate."
        )
        return
    figure(
        "recommended-tree",
        extra_pngs["recommended-tree"],
        f"predicted: the best tree at b=1, s=1024 for the whole-model step. {tree.note}",
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
    rows = best[(best["simulation"] == "b") & (best["step"] == "full")][["batch", "tree_size", "speedup", "speculate"]]
    page.paragraph("Best tree size per batch at context 1024, whole-model step (predicted):")
    page.table(rows.reset_index(drop=True))


def capacity_section(page: Page, figure, planned, extra_pngs) -> None:
    page.heading("Capacity planning")
    if not isinstance(planned, PlanResult):
        page.paragraph(f"Predicted by perfmodel.plan: {planned}.")
        return
    page.paragraph(
        "Predicted by perfmodel.plan: memory fit (weights + Medusa heads + KV cache), "
        "then per batch the best tree, its latency and throughput."
    )
    page.preformatted(planned.summary())
    figure(
        "capacity",
        extra_pngs["capacity"],
        "predicted: per-token latency and device throughput per batch, best tree and plain decoding.",
        ("predicted",),
    )
    page.table(planned.bands[BAND_SHOWN], summary=f"predicted: every batch ({len(planned.bands)})")


def error_section(page: Page, op_errors, report: Report, validation: pd.DataFrame) -> None:
    page.heading("Prediction error")
    errors = (
        pd.concat([e for e in op_errors if not e.empty], ignore_index=True)
        if any(not e.empty for e in op_errors)
        else pd.DataFrame()
    )
    said = False
    if len(errors):
        summary = errors.groupby(["op", "phase"]).agg(
            rows=("error", "size"),
            median_abs_error=("error", lambda e: e.abs().median()),
            max_abs_error=("error", lambda e: e.abs().max()),
        )
        page.paragraph(
            "Operators: predicted time (roofline latency model) vs measured time, "
            "error = (predicted - measured) / measured."
        )
        page.table(percent(summary.reset_index()))
        said = True
    acceptance = report.acceptance
    if acceptance.measured:
        rows = acceptance.record["per_tree_size"]
        sizes = np.array([r["tree_size"] for r in rows])
        measured = np.array([r["mean_accepted_tokens"] for r in rows])
        table = pd.DataFrame({"tree_size": sizes, "measured_tokens_per_step": measured})
        for label, model in [("log_fit", acceptance.choice.curve), ("head_accuracy", acceptance.choice.trees)]:
            if model is not None:
                table[f"{label}_predicted"] = model(sizes)
                table[f"{label}_error"] = (table[f"{label}_predicted"] - measured) / measured
        page.paragraph(
            "Acceptance: tokens per step per tree size, measured vs predicted. "
            f"Log fit: {fit_error(acceptance.choice.curve(sizes), measured)}. "
            f"The speedups use {acceptance.choice.label}."
        )
        page.table(percent(table))
        said = True
    if len(validation):
        columns = [
            "tree_size",
            "batch",
            "context",
            "measured_acceptance",
            "predicted_acceptance",
            "measured_speedup",
            "predicted_speedup",
            "error",
        ]
        page.paragraph(
            "Speedup (closed loop, perfmodel.validate): the reference decoder timed on this device "
            "vs the prediction from measured operator times and the host overhead of plain decoding."
        )
        page.table(percent(validation[columns]))
        said = True
    if not said:
        page.paragraph(
            "No measurements of this device and model meet a prediction here. "
            "Operator sweeps (python -m profilers.sweep), acceptance "
            "records (python -m decoder.measure) and closed-loop runs (python -m perfmodel.validate) each add a table.",
            note=True,
        )


def percent(table: pd.DataFrame) -> pd.DataFrame:
    """Error columns as signed percentages, the way people read them."""
    return table.assign(**{c: [f"{v:+.1%}" for v in table[c]] for c in table.columns if c.endswith("error")})


def shown_path(path) -> str:
    """A path relative to the working folder where it is under it (no home folders in reports)."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return path.name


def inputs_section(page: Page, report: Report, config: BuildConfig, validation: pd.DataFrame) -> None:
    page.heading("Inputs")
    m = report.model
    spec_text = "built from measured ceilings" if report.view.is_cpu else "hw_specs/" + report.view.spec.key + ".yaml"
    record_path = report.acceptance.record_path
    acceptance_text = shown_path(record_path) if record_path else "the paper preset"
    runs_text = ", ".join(sorted(set(validation["file"]))) if len(validation) else "none"
    items = [
        f"Device: {report.view.spec.name} ({report.view.spec.key}), spec {spec_text}.",
        f"Model: {m.name}: hidden {m.hidden_size}, intermediate {m.intermediate_size}, {m.num_layers} layers, "
        f"{m.num_heads} query / {m.num_kv_heads} key-value heads, vocabulary {m.vocab_size}, "
        f"{m.medusa_heads} Medusa heads; dtype {report.dtype}.",
        f"Operator measurements: {measurement_note(report)}.",
        f"Acceptance: {acceptance_text}.",
        f"Closed-loop runs: {runs_text}.",
        f"Workload for capacity planning: prompts {config.prompt_len} tokens, responses {config.response_len} tokens"
        + (f", latency target {config.latency_ms:g} ms/token." if config.latency_ms else ", no latency target."),
    ]
    page.bullets(items)
    report_step = StepModel(m, RooflineLatency(report.view.spec, m, report.dtype, report.view.params), "full")
    page.paragraph(
        "Predicted plain decoding step of the whole model at batch 1, context 1024: "
        f"{float(report_step.step_time(1, 1024, 1)) * 1e3:.2f} ms."
    )


def measurement_note(report: Report) -> str:
    view = report.view
    if not view.sources:
        return "none"
    files = ", ".join(shown_path(p) for p in view.sources)
    models = view.models()
    if report.model.name in models:
        return files
    return (
        f"{files} (of {', '.join(models) or 'no model'}; "
        f"none of {report.model.name}, so its operators are predicted only)"
    )
