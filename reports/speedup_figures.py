"""Speedup figures: the Medusa paper's Appendix G.3 simulations and the draft-model comparison.

Every figure draws predictions (python -m perfmodel.speedup says which latency and
acceptance model in the subtitle), the paper's simplified step as a solid line, the
whole-model step dashed and the traced step (--step traced) dash-dotted, the optimum of
each curve as a star, and plain decoding (speedup 1) as a dotted line.
"""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from perfmodel.acceptance.rates import AcceptanceChoice
from perfmodel.measured.device_view import DeviceView
from perfmodel.planning.simulations import SIMULATIONS, STEP_LABELS, optima, size_text
from reports.figure_layout import Label, fit_bottom, header, legend_below, place_labels
from reports.plotting import (
    SIZE_LABEL,
    level_colors,
    log2_axis,
    mark_optimum,
    marker_handles,
    size_label,
    speedup_axes,
    subplots,
)
from reports.render import FigureJob

STEP_LINES = {"paper": "-", "full": "--", "traced": "-."}
STEP_COLORS = {"paper": "#1f5fa8", "full": "#c4391d", "traced": "#7b3fa0"}
SETTING_LABELS = {"batch": ("batch size b", "b"), "seq_len": ("sequence length s (tokens)", "s")}
AT_LEAST = "\u2265"  # an optimum at the edge of the search is a lower bound


def _optimum_text(best: pd.Series, at_edge: bool) -> str:
    if best["tree_size"] == 1:
        return "do not speculate"
    return f"best n{'≥' if at_edge else '='}{best['tree_size']}: {best['speedup']:.2f}x"


def candidates_figure(table: pd.DataFrame, title: str, subtitle: str) -> Figure:
    """Simulation (a): speedup against tree size per step model, and what makes it:
    acceptance (tokens per step) and overhead (Medusa step time / plain step time)."""
    fig, (left, right) = subplots(1, 2, figsize=(13.5, 6.2))
    any_edge = False
    for step, rows in table.groupby("step", sort=False):
        rows = rows.sort_values("tree_size")
        color = STEP_COLORS[step]
        line = left.plot(rows["tree_size"], rows["speedup"], ls=STEP_LINES[step], color=color, lw=2)[0]
        best, at_edge = mark_optimum(left, rows, "tree_size", "speedup", color)
        line.set_label(f"{STEP_LABELS[step]}: {_optimum_text(best, at_edge)}")
        any_edge |= at_edge
        right.plot(
            rows["tree_size"],
            rows["overhead"],
            ls=STEP_LINES[step],
            color=color,
            lw=2,
            label=f"overhead, {STEP_LABELS[step]}",
        )
    acc = table.drop_duplicates("tree_size").sort_values("tree_size")
    right.plot(acc["tree_size"], acc["acceptance"], color="#2a8c3c", lw=2, label="acceptance (tokens per step)")
    for ax in (left, right):
        log2_axis(ax, table["tree_size"], SIZE_LABEL)
    speedup_axes(left, "speedup = acceptance / overhead")
    left.set_ylim(0, max(table["speedup"].max(), 1.0) * 1.1)
    right.axhline(1.0, color="black", ls=":", lw=1.2)
    right.set_ylim(0, max(acc["acceptance"].max(), table["overhead"].max(), 1.5) * 1.1)
    right.set_ylabel("tokens per step  /  step time ratio T(n)/T(1)")
    right.set_title("acceptance grows as log n; overhead turns up once compute-bound", fontsize=11, y=1.01)
    right.grid(True, alpha=0.3)
    fig.subplots_adjust(left=0.06, right=0.985, top=header(fig, title, subtitle), wspace=0.2)
    legends = [
        legend_below(fig, left, left.get_legend_handles_labels()[0] + marker_handles(any_edge), ncol=2),
        legend_below(fig, right, right.get_legend_handles_labels()[0], ncol=2),
    ]
    fit_bottom(fig, legends)
    return fig


def sweep_figure(table: pd.DataFrame, line_by: str, title: str, subtitle: str) -> Figure:
    """Simulations (b) and (c): speedup against tree size with one line per batch (or
    sequence length), one panel per step model, and the optimum against the swept setting."""
    steps = list(table["step"].unique())
    label, short = SETTING_LABELS[line_by]
    colors = level_colors(table[line_by])
    fig, axes = subplots(1, len(steps) + 1, figsize=(6.0 * (len(steps) + 1), 6.6), squeeze=False)
    axes = list(axes[0])
    edges: dict[tuple, bool] = {}
    for ax, step in zip(axes, steps):
        for level, rows in table[table["step"] == step].groupby(line_by):
            rows = rows.sort_values("tree_size")
            ax.plot(rows["tree_size"], rows["speedup"], ls=STEP_LINES[step], color=colors[level], lw=1.6)
            _, edges[(step, level)] = mark_optimum(ax, rows, "tree_size", "speedup", colors[level])
        log2_axis(ax, table["tree_size"], SIZE_LABEL)
        speedup_axes(ax, f"{STEP_LABELS[step]}: one line per {short}")
        top = table.loc[table["step"] == step, "speedup"].max()
        ax.set_ylim(0, max(top, 1.0) * 1.12)

    summary = axes[-1]
    best = table[table["best"]]
    for step in steps:
        rows = best[best["step"] == step].sort_values(line_by)
        summary.plot(
            rows[line_by],
            rows["speedup"],
            ls=STEP_LINES[step],
            color=STEP_COLORS[step],
            lw=2,
            marker="o",
            ms=5,
            label=STEP_LABELS[step],
        )
    log2_axis(summary, table[line_by], label)
    summary.set_xlim(summary.get_xlim()[0] / 1.15, summary.get_xlim()[1] * 1.15)  # room for the labels at the ends
    speedup_axes(summary, f"best speedup per {short} (label: best tree size n)")
    summary.set_ylim(0, max(best["speedup"].max(), 1.0) * 1.25)
    fig.subplots_adjust(left=0.045, right=0.99, top=header(fig, title, subtitle), wspace=0.2)
    # simulation (c) follows the paper to s=8192, past some models' context: the legend says which lines cannot run
    beyond = set(table.loc[table["beyond_context"], line_by]) if "beyond_context" in table else set()
    handles = [
        Line2D([], [], color=c, lw=2, label=f"{short}={v}" + (" (past the model's context)" if v in beyond else ""))
        for v, c in colors.items()
    ]
    legends = [
        legend_below(fig, axes[:-1], handles + marker_handles(any(edges.values())), ncol=min(len(handles), 6) + 1),
        legend_below(fig, summary, summary.get_legend_handles_labels()[0] + marker_handles(False)[-1:], ncol=1),
    ]
    fit_bottom(fig, legends)
    # per setting, the step with the higher speedup labels its point above, the other below
    leader = (
        best.sort_values("speedup", ascending=False, kind="stable").drop_duplicates(line_by).set_index(line_by)["step"]
    )
    labels = [
        Label(
            row[line_by],
            row["speedup"],
            size_label(row["tree_size"], edges[(row["step"], row[line_by])]),
            STEP_COLORS[row["step"]],
            "above" if leader[row[line_by]] == row["step"] else "below",
        )
        for _, row in best.iterrows()
    ]
    place_labels(summary, labels)
    return fig


def draft_figure(draft: pd.DataFrame, medusa: dict[str, tuple[float, str]], title: str, subtitle: str) -> Figure:
    """Draft-model speculative decoding: walltime improvement E / (c gamma + 1) against the
    drafted tokens gamma, one line per acceptance rate alpha, beside Medusa's best speedup
    (step -> (speedup, its tree size as text, ">= 256" at the edge of the search))."""
    fig, ax = subplots(figsize=(12, 7.0))
    colors = level_colors(draft["alpha"])
    any_edge = False
    for alpha, rows in draft.groupby("alpha"):
        rows = rows.sort_values("gamma")
        line = ax.plot(rows["gamma"], rows["improvement"], color=colors[alpha], lw=1.8, marker="o", ms=4)[0]
        top, at_edge = mark_optimum(ax, rows, "gamma", "improvement", colors[alpha])
        line.set_label(f"draft model, alpha={alpha:g}: best gamma{AT_LEAST if at_edge else '='}{top['gamma']:g}")
        any_edge |= at_edge
    for step, (speedup, size) in medusa.items():
        ax.axhline(
            speedup,
            color=STEP_COLORS[step],
            ls=STEP_LINES[step],
            lw=2,
            label=f"Medusa best, {STEP_LABELS[step]}: {speedup:.2f}x (n {size})",
        )
    ax.set_xticks(sorted(draft["gamma"].unique()))
    ax.set_xlabel("drafted tokens per step gamma")
    speedup_axes(
        ax,
        f"draft step / target step c = {draft['cost_ratio'].iloc[0]:g}",
        "predicted walltime improvement (x plain decoding)",
    )
    ax.set_ylim(0, max(draft["improvement"].max(), *(speedup for speedup, _ in medusa.values()), 1.0) * 1.15)
    fig.subplots_adjust(left=0.07, right=0.98, top=header(fig, title, subtitle))
    handles = ax.get_legend_handles_labels()[0] + marker_handles(any_edge)
    fit_bottom(fig, [legend_below(fig, ax, handles, ncol=3)])
    return fig


def closed_loop_figure(table: pd.DataFrame, title: str, subtitle: str) -> Figure:
    """perfmodel.validate's comparison: measured and predicted speedup per tree size (error
    labelled), and the acceptance behind them."""
    table = table.sort_values("tree_size")
    fig, (left, right) = subplots(1, 2, figsize=(13.5, 6.0))
    left.plot(
        table["tree_size"],
        table["predicted_speedup"],
        "-",
        color=STEP_COLORS["paper"],
        lw=2,
        label="predicted (measured operators + host overhead)",
    )
    left.plot(
        table["tree_size"],
        table["measured_speedup"],
        "o",
        color="black",
        ms=7,
        label="measured (reference decoder, tokens/s ratio)",
    )
    right.plot(
        table["tree_size"],
        table["predicted_acceptance"],
        "-",
        color="#2a8c3c",
        lw=2,
        label="predicted (from head accuracies)",
    )
    right.plot(table["tree_size"], table["measured_acceptance"], "o", color="black", ms=7, label="measured")
    for ax in (left, right):
        log2_axis(ax, table["tree_size"], SIZE_LABEL)
        ax.grid(True, alpha=0.3)
    speedup_axes(left, "speedup (label: error of the prediction)", "speedup (x plain decoding)")
    left.set_ylim(0, max(table["predicted_speedup"].max(), table["measured_speedup"].max(), 1.0) * 1.25)
    right.set_ylim(0, table[["predicted_acceptance", "measured_acceptance"]].max().max() * 1.15)
    right.set_ylabel("accepted tokens per step")
    right.set_title("acceptance per step", fontsize=11, y=1.01)
    fig.subplots_adjust(left=0.06, right=0.985, top=header(fig, title, subtitle), wspace=0.2)
    legends = [
        legend_below(fig, left, left.get_legend_handles_labels()[0] + marker_handles(False)[-1:], ncol=1),
        legend_below(fig, right, right.get_legend_handles_labels()[0], ncol=1),
    ]
    fit_bottom(fig, legends)
    labels = [Label(r.tree_size, r.measured_speedup, f"{r.error:+.1%}") for r in table.itertuples()]
    place_labels(left, labels)
    return fig


def submit_speedup_figures(
    renderer,
    device: DeviceView,
    model,
    dtype: str,
    table: pd.DataFrame,
    draft: pd.DataFrame,
    acceptance: AcceptanceChoice,
) -> dict:
    """Submit the device's four figures for rendering; returns file name -> function giving the PNG bytes."""
    jobs = speedup_jobs(device, model, dtype, table, draft, acceptance)
    return {name: renderer.submit(job) for name, job in jobs.items()}


def speedup_jobs(
    device: DeviceView, model, dtype: str, table: pd.DataFrame, draft: pd.DataFrame, acceptance: AcceptanceChoice
) -> dict[str, FigureJob]:
    """The device's four speedup figures to draw, by file name (without .png)."""
    where = f"{model.name} on {device.spec.name} ({dtype})"
    latency = table["latency_model"].iloc[0]
    subtitle = f"Predicted speedup (step latency: {latency}). Acceptance: {acceptance.label}."
    jobs = {}
    for sim in SIMULATIONS:
        rows = table[table["simulation"] == sim.key]
        title = f"({sim.key}) predicted Medusa speedup vs tree size: {where}, {sim.what}"
        if sim.line_by:
            jobs[f"speedup-{sim.key}-{sim.name}"] = FigureJob(
                sweep_figure, dict(table=rows, line_by=sim.line_by, title=title, subtitle=subtitle)
            )
        else:
            jobs[f"speedup-{sim.key}-{sim.name}"] = FigureJob(
                candidates_figure, dict(table=rows, title=title, subtitle=subtitle)
            )
    best_a = optima(table[table["simulation"] == "a"])
    medusa = {row["step"]: (row["speedup"], size_text(row)) for _, row in best_a.iterrows()}
    title = f"Predicted: draft-model speculative decoding vs Medusa's best at b=1, s=1024, {where}"
    draft_sub = (
        "Draft model (Leviathan et al.): E = (1 - alpha^(gamma+1)) / (1 - alpha) tokens per step, "
        f"improvement E / (c gamma + 1). Medusa: {subtitle}"
    )
    jobs["draft-model-vs-medusa"] = FigureJob(
        draft_figure, dict(draft=draft, medusa=medusa, title=title, subtitle=draft_sub)
    )
    return jobs
