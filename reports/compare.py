"""python -m reports compare: one model on several devices, side by side.

The answer first (reports.answer: the capacity line, and a decision-map row per device at
the workload's context), then ceilings (datasheet, latency model, measured where shipped),
decode latency, the best tree and speedup per batch, and a capacity plan, each device in
its own column.
Every number is predicted unless the device has shipped measured ceilings, which are
labelled measured.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from perfmodel.base.dtypes import check_dtype, default_dtype
from perfmodel.base.errors import PerfkitError
from perfmodel.base.output_locks import claimed_dir
from perfmodel.cli.workload_options import WorkloadSettings
from perfmodel.latency import roofline_table
from perfmodel.latency.source import view_latency
from perfmodel.latency.step import StepFlavor, StepModel
from perfmodel.measured.device_view import DeviceView, resolve_view
from perfmodel.models.config import load_model
from perfmodel.planning import simulation_summary, simulations
from perfmodel.planning.capacity import PlanResult
from perfmodel.planning.deployment import DeploymentChoices, resolve
from perfmodel.planning.result import device_paragraph, overall, why_no_tree
from reports.answer import serving_answer
from reports.build import capacity_plan
from reports.capacity_figures import capacity_figure
from reports.compare_answer import compare_answer_line, compare_answer_section, device_answers
from reports.compare_figures import (
    ceilings_figure,
    latency_figure,
    speedup_comparison_figure,
)
from reports.figure_cache import figure_cache
from reports.html import Page
from reports.output_folder import staged
from reports.render import FigureJob, Renderer
from reports.report import DEFAULT_WORKLOAD, latency_target_ms
from reports.sources import report_acceptance

# perfmodel.latency.source modes, as a figure's subtitle names them (the full label is in the page's table)
MODE_TEXT = {
    "measured": "measured operator times",
    "calibrated": "calibrated on its measurements",
    "borrowed": "calibration borrowed from a measured device",
    "grid": "measured GEMM grid",
    "transferred": "GEMMs transferred from the measured devices",
    "datasheet": "datasheet roofline",
}
LATENCY_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CONTEXT = 1024


@dataclass(frozen=True)
class CompareConfig:
    gpus: tuple[str, ...]
    model: str
    out: Path
    dtype: str | None = None
    acceptance: str | None = None
    workload: WorkloadSettings = DEFAULT_WORKLOAD  # lengths, targets, rate or trace, Medusa setting
    jobs: int | None = None
    latency: str = "auto"  # perfmodel.latency.source choice
    tp: int | None = 1  # tensor-parallel degree of the answer and the capacity plans; None: each plan's choice


@dataclass
class Comparison:
    html: Path | None = None
    lines: list[str] = field(default_factory=list)  # one summary line per device
    figures: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def views(config: CompareConfig) -> tuple[list[tuple[DeviceView, str]], list[str]]:
    """(view, dtype) per device, each once, and the devices skipped for lack of a peak in the dtype."""

    if config.dtype:
        check_dtype(config.dtype)
    found, skipped = {}, []
    for name in config.gpus:
        view = resolve_view(name, None, [])
        dtype = config.dtype or default_dtype("cpu" if view.is_cpu else "cuda")
        if dtype not in view.spec.peak_tflops:
            skipped.append(f"{view.spec.key} (no {dtype} peak in its spec)")
            continue
        found.setdefault(view.spec.key, (view, dtype))
    if len(found) < 1:
        raise PerfkitError(f"no device to compare: {'; '.join(skipped)}")
    return list(found.values()), skipped


def device_rows(pairs, model) -> pd.DataFrame:
    rows = []
    for view, dtype in pairs:
        spec = view.spec
        measured = view.ceilings or {}
        peak = measured.get("peak_tflops", {}).get(dtype)
        bandwidth = max(measured["bandwidth_gb_s"].values()) if measured.get("bandwidth_gb_s") else None
        rows.append(
            {
                "device": spec.key,
                "name": spec.name,
                "dtype": dtype,
                "memory_gb": spec.memory_gb,
                "datasheet_tflops": None if view.is_cpu else spec.peak_tflops[dtype],
                "datasheet_gb_s": None if view.is_cpu else spec.memory_bandwidth_gb_s,
                "datasheet_ridge": None if view.is_cpu else spec.ridge_point(dtype),
                "model_ridge": simulation_summary.ridge(view, dtype),
                "measured_tflops": peak,
                "measured_gb_s": bandwidth,
            }
        )
    return pd.DataFrame(rows)


def latency_rows(pairs, model, latency: str = "auto") -> pd.DataFrame:
    rows = []
    for view, dtype in pairs:
        step = StepModel(model, view_latency(view, model, dtype, latency), "full")
        times = step.step_time(list(LATENCY_BATCHES), CONTEXT, 1)
        rows += [
            {"device": view.spec.key, "batch": b, "plain_step_ms": t * 1e3} for b, t in zip(LATENCY_BATCHES, times)
        ]
    return pd.DataFrame(rows)


def best_per_batch(sims: pd.DataFrame) -> pd.DataFrame:
    """Rows batch, columns device: 'n=40, 1.49x' or 'plain' (whole-model step, s=1024)."""
    best = simulations.optima(sims[(sims["simulation"] == "b") & (sims["step"] == StepFlavor.FULL)])
    best = best.assign(
        cell=[
            f"n{'>=' if r.at_edge else '='}{r.tree_size}, {r.speedup:.2f}x" if r.speculate else "plain (1.00x)"
            for r in best.itertuples()
        ]
    )
    table = best.pivot_table(index="batch", columns="device", values="cell", aggfunc="first")
    return table[list(dict.fromkeys(best["device"]))].reset_index()


def compare(config: CompareConfig, log=print) -> Comparison:
    """The comparison page, its folder claimed before any work and held to the end
    (perfmodel.base.output_locks.claimed_dir): a second comparison into it is refused."""
    with claimed_dir(config.out, "comparison folder"):
        return compare_in(config, log)


def compare_in(config: CompareConfig, log=print) -> Comparison:
    started = time.perf_counter()
    model = load_model(config.model)
    pairs, skipped = views(config)
    acceptance = report_acceptance(config.acceptance or "paper", config.model)
    result = Comparison(skipped=skipped)
    keys = [v.spec.key for v, _ in pairs]
    log(f"comparing {model.name} on {', '.join(keys)} ...")

    devices = device_rows(pairs, model)
    latency = latency_rows(pairs, model, config.latency)
    # each device's deployment resolved once (the simulations price it at one device, as the page says)
    deployments = [resolve(model, [v], DeploymentChoices(d, None, config.latency))[0] for v, d in pairs]
    sims = pd.concat(
        [simulations.device_table(d.at(1), ("full",), acceptance.choice) for d in deployments], ignore_index=True
    )
    results = [capacity_plan(model, v, d, acceptance, config) for v, d in pairs]
    answers = device_answers(deployments, acceptance, config, dict(zip(keys, results)))
    serving = serving_answer([d.at(config.tp) for d in deployments], acceptance.choice, config.workload)
    plans = [p for p in results if isinstance(p, PlanResult)]
    unplanned = [p for p in results if not isinstance(p, PlanResult)]
    if not plans:
        raise PerfkitError(f"{model.name} fits on none of the devices: {'; '.join(unplanned)}")
    bands = pd.concat([p.bands for p in plans], ignore_index=True)
    planned_devices = pd.concat([p.devices for p in plans], ignore_index=True)

    what = f"{model.name}, {', '.join(f'{v.spec.key} ({d})' for v, d in pairs)}"
    sources = {v.spec.key: view_latency(v, model, d, config.latency) for v, d in pairs}
    devices["latency"] = [sources[key].label for key in devices["device"]]
    predicted = (
        "Predicted, not measured (measured ceilings dotted where shipped). "
        f"Latency: {latency_modes(sources)} (each source in full in the page's ceilings table). "
        f"Acceptance: {acceptance.choice.label}."
    )
    # a quantized checkpoint's linear layers meet their format's peak: its ceiling beside the dtype's
    ceilings = {
        v.spec.key: roofline_table.ceilings(v, d)
        + ([roofline_table.format_ceiling(v.spec, model.weights)] if model.weights else [])
        for v, d in pairs
    }
    kinds = (
        "Datasheet, predicted and measured"
        if any(c.label.startswith("measured") for lines in ceilings.values() for c in lines)
        else "Datasheet and predicted"
    )
    jobs = {
        "compare-ceilings": FigureJob(
            ceilings_figure,
            dict(ceilings=ceilings, title=f"{kinds} rooflines side by side: {what}", subtitle=predicted),
        ),
        "compare-latency": FigureJob(
            latency_figure, dict(steps=latency, title=f"Predicted decode latency: {what}", subtitle=predicted)
        ),
        "compare-speedup": FigureJob(
            speedup_comparison_figure,
            dict(sims=sims, title=f"Predicted Medusa speedup, whole-model step: {what}", subtitle=predicted),
        ),
        "compare-capacity": FigureJob(
            capacity_figure,
            dict(
                bands=bands,
                title=f"Predicted capacity: {what}",
                subtitle=f"{predicted} {plans[0].summary().splitlines()[0]}",
                latency_target_ms=latency_target_ms(config.workload),
            ),
        ),
    }
    with Renderer(config.jobs, figure_cache()) as renderer, staged(config.out) as folder:
        drawn = {name: renderer.draw(job) for name, job in jobs.items()}
        page = Page(f"Medusa device comparison: {model.name}", contents=True)
        if skipped:
            page.paragraph(f"Skipped: {', '.join(skipped)}.", note=True)
        compare_answer_section(
            page,
            answers,
            compare_answer_line(serving, overall(planned_devices, plans[0].targets)),
            "Devices side by side for one model. Every number is predicted, except measured ceilings, which come "
            "from profiler sweeps shipped for that device, and closed-loop speedups (M). Step times come from each "
            f"device's latency source (the latency column below): {latency_modes(sources)}.",
        )
        page.contents_here()

        def figure(name: str, caption: str, sources=("predicted",)) -> None:
            shown = drawn[name]()
            (folder / f"{name}.png").write_bytes(shown.png)
            result.figures.append(f"{name}.png")
            page.figure(shown.png, caption, sources, shown.svg)

        has_measured = devices["measured_tflops"].notna().any()
        page.heading("Ceilings")
        page.table(devices)
        figure(
            "compare-ceilings",
            "datasheet and latency-model rooflines"
            + (", with measured ceilings" if has_measured else "")
            + " of every device.",
            ("predicted", "measured") if has_measured else ("predicted",),
        )
        page.heading("Decode latency")
        wide = latency.pivot_table(index="batch", columns="device", values="plain_step_ms")[keys].reset_index()
        page.paragraph(f"Predicted plain decoding step of the whole model (ms) at context {CONTEXT}, per batch.")
        page.table(wide)
        figure("compare-latency", "predicted: plain decoding step time against batch.")
        page.heading("Best tree and speedup per batch")
        page.paragraph(
            f"Predicted best tree size n and speedup at context {CONTEXT}, whole-model step; "
            "plain = no tree beats plain decoding."
        )
        page.table(best_per_batch(sims))
        figure("compare-speedup", "predicted: speedup vs tree size at batch 1, and the best speedup per batch.")
        page.heading("Capacity planning")
        page.preformatted(capacity_summary(plans, unplanned))
        columns = [
            "device",
            "max_batch",
            "batch",
            "tree",
            "per_token_ms",
            "user_tokens_s",
            "total_tokens_s",
            "meets_latency",
            "devices_needed",
        ]
        page.table(planned_devices[columns])
        figure("compare-capacity", "predicted: per-token latency and throughput per batch for every device.")
        result.html = config.out / page.write(folder / "compare.html").name  # there once staged() swaps it in

    best = simulations.optima(sims[sims["simulation"] == "a"])
    for key in keys:
        row = best[best["device"] == key].iloc[0]
        lost = simulations.loses_from(
            simulations.optima(sims[(sims["simulation"] == "b") & (sims["device"] == key)]), "batch"
        )
        plain_ms = latency[(latency["device"] == key) & (latency["batch"] == 1)]["plain_step_ms"].iloc[0]
        tree = (
            f"best tree {simulations.size_text(row)} ({row['speedup']:.2f}x) at b=1"
            if row["speculate"]
            else "no tree pays at b=1"
        )
        stop = f"plain decoding from batch {lost}" if lost else "speculation pays at every batch"
        result.lines.append(f"{key}: plain step {plain_ms:.2f} ms at b=1, s={CONTEXT}; {tree}; {stop} (predicted)")
    log(f"  {len(result.figures)} figures, compare.html in {config.out}/ ({time.perf_counter() - started:.1f} s)")
    return result


def latency_modes(sources: dict) -> str:
    """Which kind of latency source times each device (measured, calibrated, borrowed from a
    measured device, or the datasheet roofline), one phrase for all devices where they agree."""
    modes = {key: MODE_TEXT.get(source.mode, source.mode) for key, source in sources.items()}
    if len(set(modes.values())) == 1:
        return f"{next(iter(modes.values()))} on every device"
    return "; ".join(f"{key}: {mode}" for key, mode in modes.items())


def capacity_summary(plans, unplanned: list[str]) -> str:
    """The workload once, then a paragraph per device (each planned with its own latency
    parameters), the devices that cannot hold the model, and the overall answer."""

    header = plans[0].summary().split("\n\n")[0]
    paragraphs = [
        device_paragraph(row, p.bands[p.bands["device"] == row.device], p.targets, why_no_tree(p))
        for p in plans
        for row in p.devices.itertuples()
    ]
    devices = pd.concat([p.devices for p in plans], ignore_index=True)
    return "\n\n".join([header, *paragraphs, *unplanned, overall(devices, plans[0].targets)])
