"""The page of python -m perfmodel.roofline: its figures submitted for rendering, the device
and ceilings tables, and the prediction errors, written as PNGs and one HTML page.
reports.build reuses the device description and the figures.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from perfmodel.base.units import flops_text
from perfmodel.latency.roofline import predict_table
from perfmodel.latency.roofline_table import (
    MAIN_PHASES,
    ceilings,
    format_ceiling,
    matching_measurements,
    prediction_error,
    variation_studies,
)
from perfmodel.latency.source import view_latency
from perfmodel.measured.contract import POINT_COLUMNS
from perfmodel.measured.device_view import DeviceView
from perfmodel.models.operators import DEFAULT_OPS, op_groups
from reports.html import Page
from reports.render import FigureJob
from reports.roofline_figures import roofline_panels, variation_figure
from reports.tables import ERROR_HEADER, percent, signed_errors


@dataclass(frozen=True)
class PlannedFigure:
    section: str
    name: str  # file name without .png
    png: Callable[[], bytes]  # waits for the renderer
    caption: str
    points: pd.DataFrame


def submit_roofline_figures(renderer, view: DeviceView, models, variation_model, dtype, grid, latency: str = "auto"):
    """Submit every figure for rendering; return them with the tables behind them."""
    spec, params, measured = view.spec, view.params, view.measured
    lines = ceilings(view, dtype)
    tables, errors, figures = [], [], []
    # one latency source per model, however many figures draw it
    sources = {model: view_latency(view, model, dtype, latency) for model in dict.fromkeys([*models, variation_model])}
    for model in models:
        source = sources[model]
        predicted = predict_table(spec, model, dtype, grid, ops=DEFAULT_OPS, params=params, latency=source)
        mine = matching_measurements(measured, spec, model, dtype)
        tables += [predicted, mine]
        errors.append(prediction_error(predicted, mine))
        points = pd.concat([predicted, mine], ignore_index=True)
        groups = op_groups(model)  # an MoE model's MLP group is its router and experts
        main_ops = [op for group in groups.values() for op in group]
        points = points[points["op"].isin(main_ops) & points["phase"].isin(MAIN_PHASES)]
        title = f"{model.name} on {spec.name} ({', '.join(filter(None, (dtype, model.precision)))})"
        # a quantized checkpoint's linear layers meet their format's peak: its ceiling beside the dtype's
        drawn = lines + ([format_ceiling(spec, model.weights)] if model.weights else [])
        job = FigureJob(
            roofline_panels, dict(points=points, ceilings=drawn, groups=groups, phases=MAIN_PHASES, title=title)
        )
        caption = (
            f"{title}: op groups {', '.join(groups)} in prefill and decode, coloured by batch. "
            f"Predicted points' latency: {source.label}."
        )
        figures.append(
            PlannedFigure(
                f"{model.name}: operators in prefill and decode",
                f"roofline-{model.name}",
                renderer.submit(job),
                caption,
                points,
            )
        )

    mine = matching_measurements(measured, spec, variation_model, dtype)
    for study in variation_studies(grid, variation_model):
        predicted = predict_table(
            spec,
            variation_model,
            dtype,
            study["grid"],
            ops=study["ops"],
            phases=("tree",),
            params=params,
            latency=sources[variation_model],
        )
        points = pd.concat([predicted, mine.merge(predicted[POINT_COLUMNS], on=POINT_COLUMNS)], ignore_index=True)
        title = f"{variation_model.name} on {spec.name} ({dtype}): {study['what']}"
        job = FigureJob(variation_figure, dict(points=points, ceilings=lines, title=title, line_by=study["line_by"]))
        section = f"{variation_model.name}: Medusa tree decoding variations"
        figures.append(
            PlannedFigure(section, f"{study['name']}-{variation_model.name}", renderer.submit(job), title + ".", points)
        )
    return figures, tables, errors


def write_page(out: Path, view: DeviceView, dtype, figures, errors) -> Path:
    """PNG files plus one self-contained HTML page holding the same figures and their points."""
    spec = view.spec
    page = Page(f"Roofline: {spec.name}, {dtype}")
    page.paragraph(
        "Points are predicted (hollow markers) from the device's datasheet ceilings and the latency model's "
        "efficiency factors, unless marked measured (filled markers, from a profiler sweep). "
        "Operational intensity counts each matmul input read once and its output written once (paper Table 5)."
    )
    if view.stand_in_for:
        page.paragraph(stand_in_note(view), note=True)
    describe_device(page, view, dtype)
    section = None
    for figure in figures:
        png = figure.png()
        (out / f"{figure.name}.png").write_bytes(png)
        if figure.section != section:
            page.heading(section := figure.section)
        page.figure(png, figure.caption, tuple(sorted(set(figure.points["source"]))))
        shown = figure.points[
            ["op", "phase", "batch", "seq_len", "candidates", "intensity", "tflops", "time_s", "source"]
        ]
        shown = shown.assign(time_s=shown["time_s"] * 1e6).rename(columns={"time_s": "time_us"})
        page.table(shown, summary=f"points of this figure ({len(shown)})")
    describe_errors(page, pd.concat(errors, ignore_index=True))
    return page.write(out / "roofline.html")


def describe_device(page, view: DeviceView, dtype: str) -> None:
    spec, params = view.spec, view.params
    page.heading("Device")
    rows = [("name", spec.name, "", spec.source_of("name"))]
    for field, unit in [
        ("memory_gb", "GB"),
        ("memory_bandwidth_gb_s", "GB/s"),
        ("memory_bus_width_bits", "bits"),
        ("memory_clock_mhz", "MHz"),
        ("boost_clock_mhz", "MHz"),
        ("sm_count", ""),
        ("l2_cache_mb", "MB"),
    ]:
        value = getattr(spec, field)
        if value is not None:
            rows.append((field, f"{value:g}", unit, spec.source_of(field)))
    for key, value in spec.peak_tflops.items():
        rows.append((f"peak_tflops.{key}", *rate_cell(value, key), spec.source_of(f"peak_tflops.{key}")))
    page.table(pd.DataFrame(rows, columns=["field", "value", "unit", "source"]))
    if spec.computed_bandwidth_gb_s:
        page.paragraph(
            f"Cross-check: 2 x memory clock x bus width / 8 = {spec.computed_bandwidth_gb_s:,.0f} GB/s "
            f"against the datasheet's {spec.memory_bandwidth_gb_s:,.0f} GB/s."
        )
    if spec.notes:
        page.paragraph(f"Notes: {spec.notes}")
    page.heading("Ceilings and latency model")
    lines = ceilings(view, dtype)
    scale, prefix = (1e12, "T") if max(c.peak_flops for c in lines) >= 1e12 else (1e9, "G")
    page.table(
        pd.DataFrame(
            [(c.label.split(":")[0], c.peak_flops / scale, c.bandwidth / 1e9, c.ridge) for c in lines],
            columns=["ceiling", f"peak {dtype} {prefix}FLOP/s", "bandwidth GB/s", "ridge FLOP/byte"],
        )
    )
    if view.ceilings:
        measured = view.ceilings
        rows = [
            (f"bandwidth ({name})", value, "GB/s", measured["noise"].get(name))
            for name, value in measured["bandwidth_gb_s"].items()
        ]
        rows += [
            (f"matmul {d}", *rate_cell(value, d), measured["noise"].get(d))
            for d, value in measured["peak_tflops"].items()
        ]
        rows += [
            (f"matmul {d}", float("nan"), f"not measured: {why}", None)
            for d, why in measured.get("skipped", {}).items()
        ]
        page.paragraph(
            f"Measured ceilings of {measured['device']} ({measured['measured_at']}): "
            "STREAM copy and triad and a read-only matrix-vector stream on arrays far beyond the last-level cache, "
            "and the best large square matmul per dtype; noise = IQR / median."
        )
        page.table(pd.DataFrame(rows, columns=["measurement", "value", "unit", "noise"]))
    if view.is_cpu:
        overhead = (
            "the per-kernel overhead measured with the ceilings (one tiny linear layer, dispatch to result)"
            if measured_overhead(view)
            else (
                "an assumed per-kernel overhead: "
                "these ceilings were measured before the toolkit timed one; re-measure to replace it"
            )
        )
        page.paragraph(
            "Predicted kernel time = max(FLOPs / measured peak, bytes / measured read bandwidth) "
            f"+ {params.kernel_overhead_s * 1e6:.3g} us "
            f"per kernel, {overhead}. Measured ceilings are already achievable, so they are not derated; "
            "decode-time linears "
            "read each weight once, so the read-only stream is their bandwidth."
        )
    else:
        page.paragraph(
            f"Predicted kernel time = max(FLOPs / (peak x {params.compute_efficiency:g}), "
            f"bytes / (bandwidth x {params.memory_efficiency:g})) "
            f"+ {params.kernel_overhead_s * 1e6:g} us per kernel ({params.label}). "
            "The efficiencies are public achievable fractions "
            "(bf16 GEMM 81-87% of peak on A100, HBM reads about 88% of datasheet); "
            "the overhead is a kernel launch's floor."
        )


def rate_cell(tera: float, dtype: str) -> tuple[str, str]:
    """A peak given in TFLOP/s (TOPS for int8) as (value, unit), in the unit that keeps three
    significant digits: a CPU's 0.000997 TFLOP/s reads 0.997 GFLOP/s."""
    unit = "OPS" if dtype == "int8" else "FLOP/s"
    if tera >= 1:
        return f"{tera:g}", f"T{unit}"
    value, unit = flops_text(tera * 1e12, unit).split(" ")
    return value, unit


def measured_overhead(view: DeviceView) -> bool:
    return bool(view.ceilings and view.ceilings.get("kernel_overhead_us"))


def stand_in_note(view: DeviceView) -> str:
    return (
        f"Stand-in: this machine's CPU ({view.stand_in_for}) has no stored measurements, "
        f"so this page shows {view.spec.key}, "
        f"measured on another machine. Its numbers are that machine's, not this one's. To measure this machine: "
        "python -m perfmodel.roofline --gpu cpu --measure (a few minutes), "
        "or python -m reports build --gpu cpu --measure --model MODEL."
    )


def describe_errors(page, errors: pd.DataFrame) -> None:
    if errors.empty:
        return
    page.heading("Prediction error (predicted vs measured)")
    page.paragraph(f"Operator times, {ERROR_HEADER}.")
    page.table(percent(signed_errors(errors, ["model", "op", "phase"])))
