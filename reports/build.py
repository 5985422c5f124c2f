"""python -m reports build: everything the toolkit knows about one (device, model) on one page.

One self-contained HTML file (figures embedded, nothing fetched) and the same figures as
PNG files beside it. It opens with the answer (reports.answer: the tree to run at the
workload, the capacity line, the decision map), then: the device and its ceilings,
rooflines per op group and phase, the Medusa variation studies with their TFLOP/s and
intensity tables, simulated (and, where measured, real) speedups, the drafters compared
(Medusa heads, EAGLE, a draft model), acceptance data, the recommended tree, a capacity
plan, and the prediction error wherever predictions and measurements meet.

This module gathers the inputs and orchestrates; the page's sections are reports.sections,
its tables reports.tables and its sentences reports.prose.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.acceptance.rates import PAPER_ACCEPTANCE, HeadAccuracyAcceptance
from perfmodel.base.dtypes import check_dtype, default_dtype
from perfmodel.base.errors import PerfkitError
from perfmodel.base.output_locks import claimed_dir
from perfmodel.latency.step import StepFlavor, StepModel
from perfmodel.latency.tensor_parallel import TensorParallelStep, step_collectives
from perfmodel.latency.traced_step import TracedStep
from perfmodel.measured.device_view import DeviceView, is_cpu_name, resolve_view
from perfmodel.measured.store import stored_closed_loops, stored_tree_ablations
from perfmodel.models.config import ModelConfig, load_model
from perfmodel.models.grid import PAPER_GRID, QUICK_GRID
from perfmodel.planning import simulations
from perfmodel.planning.capacity import PlanRequest, PlanResult, plan, serving_plan
from perfmodel.planning.deployment import Deployment, DeploymentChoices, resolve
from perfmodel.planning.step_models import WHOLE_STEP_FLAVORS, check_flavors
from reports.ablation_figures import tree_ablation_figure
from reports.acceptance_figures import Curve, acceptance_figure, tree_figure
from reports.answer import gather, serving_answer
from reports.answer_page import answer_section
from reports.answer_words import chosen_degree
from reports.capacity_figures import capacity_figure
from reports.chain_section import chain_section, check_chain_request, measured_chains
from reports.figure_cache import figure_cache
from reports.html import Page
from reports.output_folder import staged
from reports.render import FigureJob, Renderer
from reports.report import BuildConfig, Report, latency_target_ms, simulated_flavors
from reports.roofline_page import describe_device, submit_roofline_figures
from reports.sections import (
    ablation_section,
    acceptance_section,
    capacity_section,
    drafter_section,
    error_section,
    glance,
    inputs_section,
    intro,
    roofline_section,
    speedup_section,
    stand_in,
    tree_section,
)
from reports.sources import (
    ReportAcceptance,
    load_ablation,
    load_validation,
    recommended_tree,
    report_acceptance,
    report_drafters,
)
from reports.speedup_figures import closed_loop_figure, speedup_jobs

DEFAULT_FOLDER = Path("perf-reports") / "report"


def default_folder(view: DeviceView, model: ModelConfig, dtype: str | None) -> Path:
    """perf-reports/report/<device>-<model>[-<dtype>]: the device shown (a CPU stand-in's key
    where this machine has no measurements), the dtype only where one was asked for."""
    return DEFAULT_FOLDER / f"{view.spec.key}-{model.name}{'-' + dtype if dtype else ''}"


def whole_step(
    view: DeviceView, model: ModelConfig, dtype: str, tp: int, latency, flavor: str = "full", tracer=None
) -> TensorParallelStep:
    """The whole-model step the page is priced at: the shard at degree tp, timed by the page's
    one latency source, plus its all-reduces (none at tp 1); its operator inventory (full) or
    the decoder's traced kernels (traced, with `tracer`)."""
    comm = step_collectives(view.evidence, tp, dtype, latency.stack)
    shard = model.shard(tp)
    step = (
        TracedStep(shard, latency, dtype, tracer) if flavor == StepFlavor.TRACED else StepModel(shard, latency, flavor)
    )
    return TensorParallelStep(step, tp, comm.all_reduce, dtype, comm.gather)


def step_tracer(step: str):
    """The decoder's tracer where the page is priced by the traced step, else None. Imported
    here only then: it loads torch (about a second), which a report of the other steps never
    needs. Contexts past the model's trained one are traced as the simulations price them."""
    if step != StepFlavor.TRACED:
        return None
    from decoder.trace import StepTracer

    return StepTracer(beyond_context=True)


def load_inputs(
    config: BuildConfig, log=print
) -> tuple[DeviceView, ModelConfig, str, ReportAcceptance, pd.DataFrame, pd.DataFrame]:
    model = load_model(config.model)
    files = list(config.measurements)
    if config.measure:
        # Only a --measure build loads the sweeper: it imports torch (about a second), which a
        # report from specs and stored measurements never needs.
        from profilers.sweep_runs import measure_now

        dtype = check_dtype(config.dtype or default_dtype("cpu" if is_cpu_name(config.gpu) else "cuda"))
        files = [*files, *measure_now(config.gpu, config.spec, [model], dtype, QUICK_GRID, log)]
    view = resolve_view(config.gpu, config.spec, files, log)
    dtype = check_dtype(config.dtype or default_dtype("cpu" if view.is_cpu else "cuda"))
    view.spec.peak_flops(dtype)  # one clear line when the device has no such peak
    acceptance = report_acceptance(config.acceptance, config.model)
    key, given = view.spec.key, list(config.validation)
    validation = load_validation(given or stored_closed_loops(key), key, model.name)
    # closed loops whose trees EAGLE drafted: evidence for the drafters' section, not the heads'
    drafted = load_validation(given or stored_closed_loops(key, drafter="eagle"), key, model.name, "eagle")
    ablation = load_ablation(list(config.ablation) or stored_tree_ablations(), key, model.name)
    return view, model, dtype, acceptance, validation, drafted, ablation


def build(config: BuildConfig, log=print) -> Report:
    started = time.perf_counter()
    # The report folder is claimed before any work (a bad --out costs one line, not a sweep) and
    # held to the end: a second build into it is refused (perfmodel.base.output_locks.claimed_dir).
    with ExitStack() as held:
        if config.out is not None:
            held.enter_context(claimed_dir(config.out, "report folder"))
        check_flavors([config.step], WHOLE_STEP_FLAVORS)
        check_chain_request(config)
        view, model, dtype, acceptance, validation, drafted, ablation = load_inputs(config, log)
        model.require_heads("there is no tree to report (perfmodel.roofline and perfmodel.plan answer for it)")
        tracer = step_tracer(config.step)  # one for the plan and the simulations: each point traced once
        grid = QUICK_GRID if view.is_cpu else PAPER_GRID
        with Renderer(config.jobs, figure_cache()) as renderer:
            # The rooflines depend on the device and the model alone: the workers draw them while
            # the plan and the speedups are computed.
            roof, tables, op_errors = submit_roofline_figures(
                renderer, view, [model], model, dtype, grid, config.latency
            )
            # the plan next: it says whether the model fits at --tp (or picks the degree), and the
            # speedups are then priced at that degree, so every section is of one deployment
            # With a rate and --tp auto, the degree is the serving simulation's (the fewest devices
            # for the rate within the targets), and the whole page is of that deployment.
            # The deployment is resolved here, once: every section is priced from it.
            choices = DeploymentChoices(dtype, config.tp, config.latency, config.step, tracer)
            (resolved,) = resolve(model, [view], choices)
            serving = None
            if config.tp is None and config.workload.simulated:
                serving = serving_answer(resolved, acceptance.choice, config.workload)
            degree = chosen_degree(serving) or config.tp
            request = PlanRequest(
                config.workload.workload.prompt,
                config.workload.workload.response,
                config.workload.targets.latency_s,
                acceptance=acceptance.choice.model,
                medusa=config.workload.medusa,
            )
            tp, planned = serving_plan(resolved if degree is None else resolved.at(degree), request)
            deployment = resolved.at(tp)
            if config.tp is None:
                why = (
                    "the serving simulation's choice (the fewest devices for the rate)"
                    if degree is not None
                    else "the capacity plan's choice (the most tokens/s per device)"
                )
                log(f"--tp auto: {tp} device(s) per replica, {why}")
            if config.out is None:  # the default folder is held from when it is named
                claimed = claimed_dir(default_folder(view, model, config.dtype), "report folder")
                config = replace(config, out=held.enter_context(claimed))
            # The device is resolved here, once: its latency source and the step it prices go to the
            # sections and their sentences with the report, which never resolve it again.
            latency = deployment.step_model(StepFlavor.FULL).shard.latency
            step = whole_step(view, model, dtype, tp, latency, config.step, tracer)
            report = Report(view, model, dtype, acceptance, latency, step, tp)
            where = f"{model.name} on {view.spec.name}{f' x{tp} (tensor parallel)' if tp > 1 else ''} ({dtype})"
            log(f"building the report for {where} ...")

            flavors = simulated_flavors(config.step)
            sims = simulations.device_table(deployment, flavors, acceptance.choice)
            draft = simulations.draft_model_table()
            drafters = report_drafters(acceptance, config.model)
            compared = drafter_table(deployment, flavors, drafters)
            context = int(config.workload.workload.step_context)
            chains = measured_chains(config, deployment, report.flavor, context)
            speed_jobs = speedup_jobs(view, model, dtype, sims, draft, acceptance.choice)
            speed_pngs = {name: renderer.draw(job) for name, job in speed_jobs.items()}
            best = simulations.optima(sims)
            head = best[(best["simulation"] == "a") & (best["step"] == report.flavor)].iloc[0]
            tree = (
                recommended_tree(int(head["tree_size"]), acceptance, bool(head["at_edge"]))
                if head["speculate"]
                else None
            )
            answer = gather(report, planned, validation, config, deployment, serving)
            jobs = extra_jobs(where, report, sims, planned, tree, validation, config)
            if len(ablation):
                jobs["tree-ablation"] = ablation_job(ablation, report)
            extra_pngs = {name: renderer.draw(job) for name, job in jobs.items()}

            with staged(config.out) as folder:
                page = Page(f"Medusa performance report: {where}", contents=True)

                def figure(name: str, drawn, caption: str, sources: tuple[str, ...]) -> None:
                    shown = drawn()
                    (folder / f"{name}.png").write_bytes(shown.png)
                    report.figures.append(f"{name}.png")
                    page.figure(shown.png, caption, sources, shown.svg)

                stand_in(page, report)
                answer_section(page, report, answer, validation)
                intro(page, report, validation)  # what the numbers rest on, ending the answer
                page.contents_here()
                glance(page, report, sims, planned, validation)
                describe_device(page, view, dtype)
                roofline_section(page, figure, roof, op_errors)
                speedup_section(page, figure, report, sims, draft, speed_pngs, extra_pngs, validation)
                drafter_section(page, report, compared, drafters, drafted)
                chain_section(page, chains)
                acceptance_section(page, figure, report, extra_pngs)
                tree_section(page, figure, report, tree, best, extra_pngs)
                ablation_section(page, figure, report, ablation, extra_pngs)
                capacity_section(page, figure, planned, extra_pngs)
                error_section(page, op_errors, report, validation)
                inputs_section(page, report, config, validation, ablation)
                report.html = config.out / page.write(folder / "report.html").name  # there once staged() swaps it in
        size = report.html.stat().st_size
        elapsed = time.perf_counter() - started
        log(f"  {len(report.figures)} figures, report.html {size / 1e6:.1f} MB in {config.out}/ ({elapsed:.1f} s)")
        return report


def drafter_table(deployment: Deployment, flavors, drafters) -> pd.DataFrame:
    """Simulation (b) of each drafter over the page's whole-step flavours (not the paper's
    block: the drafters differ in what a whole step holds), for the drafters' section."""
    by_batch = tuple(s for s in simulations.SIMULATIONS if s.key == "b")
    whole = [f for f in flavors if f in WHOLE_STEP_FLAVORS]
    return simulations.device_table(deployment, whole, drafters, simulations=by_batch)


def capacity_plan(model, view: DeviceView, dtype: str, acceptance: ReportAcceptance, config) -> PlanResult | str:
    """perfmodel.plan on this very view (its measurements and efficiencies, so the plan's
    latency source is the speedup sections'), or why the model cannot be served on it."""
    try:
        return plan(
            model,
            [view],
            dtype=dtype,
            prompt_len=config.workload.workload.prompt,
            response_len=config.workload.workload.response,
            latency_target_s=config.workload.targets.latency_s,
            latency=config.latency,
            acceptance=acceptance.choice.model,
            tensor_parallel=config.tp,
            medusa=config.workload.medusa,
        )
    except PerfkitError as exc:  # the model does not fit: a finding of the comparison, not a failure
        return str(exc)


# --------------------------------------------------------------------------- figures


def acceptance_curves(acceptance: ReportAcceptance) -> dict[str, Curve]:
    """The acceptance models to draw against tree size (the one the speedups use first),
    each log curve with where it is clamped at one token per step."""
    sizes = np.unique(np.geomspace(1, 256, 40).round().astype(int))
    choice = acceptance.choice
    log = choice.curve
    log_name = f"{'paper' if log is PAPER_ACCEPTANCE else 'log'} fit {log.formula()}"
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
        curves[f"paper's fit {PAPER_ACCEPTANCE.formula()} (Vicuna-7B)"] = log_curve(PAPER_ACCEPTANCE)
    return curves


def ablation_job(ablation: pd.DataFrame, report: Report) -> FigureJob:
    first = ablation.iloc[0]
    device = first["device"]
    elsewhere = "" if device == report.view.spec.key else f", not on {report.view.spec.key}"
    title = f"Tree ablation (Medusa paper Fig. 4), measured and predicted: {report.model.name} on {device}"
    subtitle = (
        f"python -m decoder.ablation ({', '.join(sorted(set(ablation['file'])))}): the reference decoder, greedy "
        f"acceptance, batch {first['batch']}, {first['prompts']} held-out prompts of {first['prompt_len']} tokens, "
        f"{first['new_tokens']} new tokens each; speedups timed on {device}{elsewhere}. Predicted: tokens per step "
        "from the heads' top-k accuracies, step time from a separate calibration of the decoder's steps."
    )
    return FigureJob(tree_ablation_figure, dict(table=ablation, title=title, subtitle=subtitle))


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
        title = (
            f"Predicted best tree size at b=1, s=1024 ({report.step_phrase}): {tree.wanted_text} tokens{drawn}. {where}"
        )
        subtitle = f"{tree.tree.size} tokens drawn, {tree.tree.depth} heads deep. {tree.note}"
        jobs["recommended-tree"] = FigureJob(
            tree_figure, dict(tree=tree.tree, accuracy=tree.accuracy, title=title, subtitle=subtitle)
        )
    if isinstance(planned, PlanResult):
        subtitle = (
            f"Predicted, not measured. {planned.summary().splitlines()[0]} Acceptance: {planned.acceptance}. "
            f"Latency: {planned.devices['latency_model'].iloc[0]}."
        )
        jobs["capacity"] = FigureJob(
            capacity_figure,
            dict(
                bands=planned.bands,
                title=f"Predicted capacity: {where}",
                subtitle=subtitle,
                latency_target_ms=latency_target_ms(config.workload),
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
