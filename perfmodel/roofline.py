"""python -m perfmodel.roofline: the paper's Appendix G rooflines for a device and models.

Draws, for each model, the op groups qkv, qk/pv and up/gate/down in prefill and decode
over the paper's grid (Figs 9-17), and the Medusa variation studies (Figs 18-20), as PNGs
and one self-contained HTML page, and writes the full grid as a data-contract CSV.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from perfmodel.cli import Parser, positive_int, run
from perfmodel.contract import COLUMNS, KEY_COLUMNS, POINT_COLUMNS, write_table
from perfmodel.device_view import DeviceView, device_key, gemv_bandwidth_gb_s, is_cpu_name, resolve_view
from perfmodel.dtypes import DTYPES, check_dtype, default_dtype
from perfmodel.errors import PerfkitError
from perfmodel.grid import PAPER_GRID, QUICK_GRID, Grid
from perfmodel.hardware import HardwareSpec, resolve_spec
from perfmodel.latency import predict_table
from perfmodel.models import ModelConfig, load_model
from perfmodel.operators import DEFAULT_OPS, OP_GROUPS

DEFAULT_MODELS = ("llama-7b", "llama-13b", "llama-33b")
DEFAULT_OUT = Path("perf-reports") / "roofline"
VARIATION_BATCH = 16  # paper Fig 18: attention at b=16 over (s, q)
VARIATION_SEQ = 1024  # paper Fig 19: attention at s=1024 over (b, q)
MAIN_PHASES = ("prefill", "decode")


def ceilings(view: DeviceView, dtype: str):
    """The lines to draw: datasheet (GPUs), measured (when known), the latency model's derating."""
    from reports.roofline_figures import Ceiling

    spec, params, lines = view.spec, view.params, []
    if not view.is_cpu:
        lines.append(Ceiling(f"datasheet: {spec.peak_tflops[dtype]:g} TFLOP/s, {spec.memory_bandwidth_gb_s:g} GB/s", spec.peak_flops(dtype), spec.bandwidth))
    measured = view.ceilings or {}
    if dtype in measured.get("peak_tflops", {}):
        peak, bandwidth = measured["peak_tflops"][dtype], gemv_bandwidth_gb_s(measured)
        lines.append(Ceiling(f"measured: {peak:.3g} TFLOP/s, {bandwidth:.3g} GB/s", peak * 1e12, bandwidth * 1e9, color="#1e7d32"))
    if (params.compute_efficiency, params.memory_efficiency) != (1.0, 1.0):
        lines.append(
            Ceiling(
                f"model: x{params.compute_efficiency:g} compute, x{params.memory_efficiency:g} bandwidth",
                spec.peak_flops(dtype) * params.compute_efficiency,
                spec.bandwidth * params.memory_efficiency,
                style="--",
                color="#888888",
            )
        )
    return lines


def closest(values, target: int) -> int:
    """The grid value nearest `target` on a log scale (the paper's setting when present)."""
    return min(values, key=lambda v: (abs(math.log(v / target)), v))


def variation_studies(grid: Grid) -> list[dict]:
    """The three Medusa variation studies over the (possibly narrowed) grid, each pinned to
    the paper's batch or sequence length, or the grid's closest value to it."""
    b, s = closest(grid.batches, VARIATION_BATCH), closest(grid.seq_lens, VARIATION_SEQ)
    return [
        dict(
            name=f"medusa-attention-b{b}",
            ops=OP_GROUPS["qk/pv"],
            grid=Grid((b,), grid.seq_lens, grid.candidates),
            line_by="seq_len",
            what=f"attention (QK^T, PV) at batch {b} over sequence length and candidates (paper Fig 18)",
        ),
        dict(
            name=f"medusa-attention-s{s}",
            ops=OP_GROUPS["qk/pv"],
            grid=Grid(grid.batches, (s,), grid.candidates),
            line_by="batch",
            what=f"attention (QK^T, PV) at sequence length {s} over batch and candidates (paper Fig 19)",
        ),
        dict(
            name="medusa-up-gate-down",
            ops=OP_GROUPS["up/gate/down"],
            grid=Grid(grid.batches, (s,), grid.candidates),
            line_by="batch",
            what="up/gate/down projections over batch and candidates (paper Fig 20)",
        ),
    ]


def matching_measurements(measured: pd.DataFrame | None, spec: HardwareSpec, model: ModelConfig, dtype: str) -> pd.DataFrame:
    if measured is None:
        return pd.DataFrame(columns=COLUMNS)
    rows = measured[(measured["source"] == "measured") & (measured["model"] == model.name) & (measured["dtype"] == dtype)]
    return rows[rows["device"] == spec.key] if spec.key in set(rows["device"]) else rows


def prediction_error(predicted: pd.DataFrame, measured: pd.DataFrame) -> pd.DataFrame:
    """Measured vs predicted time per row of the same device and point; error = (predicted - measured) / measured."""
    if measured.empty:
        return measured
    both = measured.merge(predicted[KEY_COLUMNS + ["time_s"]], on=KEY_COLUMNS, suffixes=("_measured", "_predicted"))
    both["error"] = (both["time_s_predicted"] - both["time_s_measured"]) / both["time_s_measured"]
    return both


def build_parser() -> Parser:
    p = Parser(prog="python -m perfmodel.roofline", description=__doc__.split("\n\n")[0])
    device = p.add_mutually_exclusive_group(required=True)
    device.add_argument("--gpu", metavar="NAME", help="a device in hw_specs/ by name or alias (e.g. a100, h100), or cpu for this machine's CPU")
    device.add_argument("--spec", metavar="FILE", help="a device spec YAML file of your own (format: hw_specs/README.md)")
    p.add_argument("--model", nargs="+", metavar="NAME|PATH", help=f"model presets or config.json paths (default: the paper's {' '.join(DEFAULT_MODELS)}; on a CPU, or with --measure, llama-7b)")
    p.add_argument("--variation-model", metavar="NAME|PATH", help="model for the Medusa variation figures (default: the last --model, llama-33b as in the paper)")
    p.add_argument("--dtype", help=f"one of {', '.join(DTYPES)} (default fp16; fp32 on a CPU)")
    p.add_argument("--batch", nargs="+", type=positive_int, metavar="B", help="batch sizes (default 1..64, powers of two)")
    p.add_argument("--seq", nargs="+", type=positive_int, metavar="S", help="sequence lengths (default 128..8192, powers of two)")
    p.add_argument("--candidates", nargs="+", type=positive_int, metavar="Q", help="Medusa candidates (default 1,16,...,112)")
    p.add_argument("--medusa-heads", type=positive_int, metavar="K", help="Medusa heads for the medusa_heads op (default: the model's)")
    p.add_argument("--out", type=Path, metavar="DIR", help=f"output folder (default {DEFAULT_OUT}/<device>)")
    p.add_argument("--csv", type=Path, metavar="FILE", help="where to write the grid table (default DIR/roofline.csv)")
    p.add_argument("--measurements", type=Path, nargs="+", metavar="FILE", help="measured rows (data-contract CSV/Parquet) to overlay (default: the device's shipped sweeps)")
    p.add_argument("--measure", action="store_true", help="first run a quick sweep on this machine's device (--gpu cpu, or the GPU named), then draw it")
    p.add_argument("--jobs", type=positive_int, metavar="N", help="processes drawing figures (default: one per core)")
    return p


@dataclass(frozen=True)
class PlannedFigure:
    section: str
    name: str  # file name without .png
    png: Callable[[], bytes]  # waits for the renderer
    caption: str
    points: pd.DataFrame


def plan_figures(renderer, view: DeviceView, models, variation_model, dtype, grid):
    """Submit every figure for rendering; return them with the tables behind them."""
    from reports.render import FigureJob
    from reports.roofline_figures import roofline_panels, variation_figure

    spec, params, measured = view.spec, view.params, view.measured
    lines = ceilings(view, dtype)
    tables, errors, figures = [], [], []
    main_ops = [op for group in OP_GROUPS.values() for op in group]
    for model in models:
        predicted = predict_table(spec, model, dtype, grid, ops=DEFAULT_OPS, params=params)
        mine = matching_measurements(measured, spec, model, dtype)
        tables += [predicted, mine]
        errors.append(prediction_error(predicted, mine))
        points = pd.concat([predicted, mine], ignore_index=True)
        points = points[points["op"].isin(main_ops) & points["phase"].isin(MAIN_PHASES)]
        title = f"{model.name} on {spec.name} ({dtype})"
        job = FigureJob(roofline_panels, dict(points=points, ceilings=lines, groups=OP_GROUPS, phases=MAIN_PHASES, title=title))
        caption = f"{title}: op groups qkv, qk/pv, up/gate/down in prefill and decode, coloured by batch."
        figures.append(PlannedFigure(f"{model.name}: operators in prefill and decode", f"roofline-{model.name}", renderer.submit(job), caption, points))

    mine = matching_measurements(measured, spec, variation_model, dtype)
    for study in variation_studies(grid):
        predicted = predict_table(spec, variation_model, dtype, study["grid"], ops=study["ops"], phases=("tree",), params=params)
        points = pd.concat([predicted, mine.merge(predicted[POINT_COLUMNS], on=POINT_COLUMNS)], ignore_index=True)
        title = f"{variation_model.name} on {spec.name} ({dtype}): {study['what']}"
        job = FigureJob(variation_figure, dict(points=points, ceilings=lines, title=title, line_by=study["line_by"]))
        section = f"{variation_model.name}: Medusa tree decoding variations"
        figures.append(PlannedFigure(section, f"{study['name']}-{variation_model.name}", renderer.submit(job), title + ".", points))
    return figures, tables, errors


def write_page(out: Path, view: DeviceView, dtype, figures, errors) -> Path:
    """PNG files plus one self-contained HTML page holding the same figures and their points."""
    from reports.html import Page

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
        shown = figure.points[["op", "phase", "batch", "seq_len", "candidates", "intensity", "tflops", "time_s", "source"]]
        shown = shown.assign(time_s=shown["time_s"] * 1e6).rename(columns={"time_s": "time_us"})
        page.table(shown, summary=f"points of this figure ({len(shown)})")
    describe_errors(page, pd.concat(errors, ignore_index=True))
    return page.write(out / "roofline.html")


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    args = build_parser().parse_args(argv)
    cpu = is_cpu_name(args.gpu)
    dtype = check_dtype(args.dtype or default_dtype("cpu" if cpu else "cuda"))
    models = [load_model(m) for m in args.model or (["llama-7b"] if cpu or args.measure else DEFAULT_MODELS)]
    if args.medusa_heads:
        models = [m.with_medusa_heads(args.medusa_heads) for m in models]
    grid = (QUICK_GRID if cpu or args.measure else PAPER_GRID).narrowed(args.batch, args.seq, args.candidates)
    if args.measure:
        from profilers.sweep import measure_now

        files = measure_now(args.gpu, args.spec, models, dtype, grid)
    else:
        files = list(args.measurements or [])
    view = resolve_view(args.gpu, args.spec, files)
    out = args.out or DEFAULT_OUT / view.spec.key
    view.spec.peak_flops(dtype)
    variation_model = load_model(args.variation_model) if args.variation_model else models[-1]

    from reports.render import Renderer

    with Renderer(args.jobs) as renderer:
        figures, tables, errors = plan_figures(renderer, view, models, variation_model, dtype, grid)
        out.mkdir(parents=True, exist_ok=True)
        table = pd.concat([t for t in tables if not t.empty], ignore_index=True)
        csv_path = write_table(table, args.csv or out / "roofline.csv")
        html_path = write_page(out, view, dtype, figures, errors)
    measured = sum((t["source"] == "measured").sum() for t in tables)
    print(f"{view.spec.name} ({view.spec.key}), {dtype}: {len(figures)} figures in {out}/")
    if view.sources:
        print(f"  measured: {measured} rows from {', '.join(str(p) for p in view.sources)}")
    print(f"  html: {html_path}")
    print(f"  csv:  {csv_path} ({len(table)} rows)")
    print(f"  done in {time.perf_counter() - started:.1f} s")
    return 0


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
        rows.append((f"peak_tflops.{key}", f"{value:g}", "TOPS" if key == "int8" else "TFLOP/s", spec.source_of(f"peak_tflops.{key}")))
    page.table(pd.DataFrame(rows, columns=["field", "value", "unit", "source"]))
    if spec.computed_bandwidth_gb_s:
        page.paragraph(f"Cross-check: 2 x memory clock x bus width / 8 = {spec.computed_bandwidth_gb_s:,.0f} GB/s against the datasheet's {spec.memory_bandwidth_gb_s:,.0f} GB/s.")
    if spec.notes:
        page.paragraph(f"Notes: {spec.notes}")
    page.heading("Ceilings and latency model")
    lines = ceilings(view, dtype)
    page.table(
        pd.DataFrame(
            [(c.label.split(":")[0], c.peak_flops / 1e12, c.bandwidth / 1e9, c.ridge) for c in lines],
            columns=["ceiling", f"peak {dtype} TFLOP/s", "bandwidth GB/s", "ridge FLOP/byte"],
        )
    )
    if view.ceilings:
        measured = view.ceilings
        rows = [(f"bandwidth ({name})", value, "GB/s", measured["noise"].get(name)) for name, value in measured["bandwidth_gb_s"].items()]
        rows += [(f"matmul {d}", value, "TOPS" if d == "int8" else "TFLOP/s", measured["noise"].get(d)) for d, value in measured["peak_tflops"].items()]
        rows += [(f"matmul {d}", float("nan"), f"not measured: {why}", None) for d, why in measured.get("skipped", {}).items()]
        page.paragraph(f"Measured ceilings of {measured['device']} ({measured['measured_at']}): STREAM copy and triad and a read-only matrix-vector stream on arrays far beyond the last-level cache, and the best large square matmul per dtype; noise = IQR / median.")
        page.table(pd.DataFrame(rows, columns=["measurement", "value", "unit", "noise"]))
    if view.is_cpu:
        overhead = (
            "the per-kernel overhead measured with the ceilings (one tiny linear layer, dispatch to result)"
            if measured_overhead(view)
            else "an assumed per-kernel overhead: these ceilings were measured before the toolkit timed one; re-measure to replace it"
        )
        page.paragraph(
            f"Predicted kernel time = max(FLOPs / measured peak, bytes / measured read bandwidth) + {params.kernel_overhead_s * 1e6:.3g} us "
            f"per kernel, {overhead}. Measured ceilings are already achievable, so they are not derated; decode-time linears "
            "read each weight once, so the read-only stream is their bandwidth."
        )
    else:
        page.paragraph(
            f"Predicted kernel time = max(FLOPs / (peak x {params.compute_efficiency:g}), bytes / (bandwidth x {params.memory_efficiency:g})) "
            f"+ {params.kernel_overhead_s * 1e6:g} us per kernel ({params.label}). The efficiencies are public achievable fractions "
            "(bf16 GEMM 81-87% of peak on A100, HBM reads about 88% of datasheet); the overhead is a kernel launch's floor."
        )


def measured_overhead(view: DeviceView) -> bool:
    return bool(view.ceilings and view.ceilings.get("kernel_overhead_us"))


def stand_in_note(view: DeviceView) -> str:
    return (
        f"Stand-in: this machine's CPU ({view.stand_in_for}) has no stored measurements, so this page shows {view.spec.key}, "
        f"measured on another machine. Its numbers are that machine's, not this one's. To measure this machine: "
        f"python -m perfmodel.roofline --gpu cpu --measure (a few minutes), or python -m reports build --gpu cpu --measure --model MODEL."
    )


def describe_errors(page, errors: pd.DataFrame) -> None:
    if errors.empty:
        return
    page.heading("Prediction error (predicted vs measured)")
    summary = errors.groupby(["model", "op", "phase"]).agg(
        rows=("error", "size"),
        median_abs_error=("error", lambda e: e.abs().median()),
        max_abs_error=("error", lambda e: e.abs().max()),
    )
    page.table(summary.reset_index())


if __name__ == "__main__":
    sys.exit(run(main))
