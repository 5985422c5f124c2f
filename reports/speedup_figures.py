"""Speedup figures: the Medusa paper's Appendix G.3 simulations and the draft-model comparison.

Every figure draws predictions (python -m perfmodel.speedup says which latency and
acceptance model in the subtitle), the paper's simplified step as a solid line and the
whole-model step dashed, the optimum of each curve as a star, and plain decoding (speedup
1) as a dotted line.
"""

from __future__ import annotations

import textwrap

# roofline_figures selects the file-only backend before pyplot is imported.
from reports.roofline_figures import PLAIN, _level_colors

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from perfmodel.speedup import STEP_LABELS

STEP_LINES = {"paper": "-", "full": "--"}
STEP_COLORS = {"paper": "#1f5fa8", "full": "#c4391d"}
SETTING_LABELS = {"batch": ("batch size b", "b"), "seq_len": ("sequence length s (tokens)", "s")}
SIZE_LABEL = "tree size n (tokens per step, root included)"


def _log2_axis(ax, values, label: str) -> None:
    values = np.asarray(sorted(set(values)))
    ax.set_xscale("log", base=2)
    ax.set_xlim(values.min() / 1.15, values.max() * 1.15)
    ticks = 2.0 ** np.arange(np.floor(np.log2(values.min())), np.ceil(np.log2(values.max())) + 1)
    ax.set_xticks(ticks)
    ax.xaxis.set_major_formatter(PLAIN)
    ax.xaxis.set_minor_locator(plt.NullLocator())
    ax.set_xlabel(label)


def _speedup_axes(ax, title: str, ylabel: str = "predicted speedup (x plain decoding)") -> None:
    ax.axhline(1.0, color="black", ls=":", lw=1.2, zorder=1)
    ax.set_ylim(bottom=0)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=11, y=1.01)
    ax.grid(True, alpha=0.3)


def _star(ax, x, y, color) -> None:
    ax.plot([x], [y], marker="*", ms=15, color=color, mec="black", mew=0.7, ls="", zorder=5)


def header(fig: Figure, title: str, subtitle: str) -> float:
    """Title and a wrapped subtitle above the panels; returns the panels' top (figure fraction)."""
    width, height = fig.get_size_inches()
    lines = textwrap.wrap(subtitle, int(width * 15))  # about 15 characters per inch at 8.5 pt
    fig.suptitle(title, fontsize=13, y=1 - 0.12 / height, va="top")
    fig.text(0.5, 1 - 0.45 / height, "\n".join(lines), ha="center", va="top", fontsize=8.5, color="#333333", linespacing=1.3)
    return 1 - (0.45 + 0.17 * len(lines) + 0.4) / height


def _optimum_text(best: pd.Series) -> str:
    if best["tree_size"] == 1:
        return "do not speculate"
    return f"best n={best['tree_size']}: {best['speedup']:.2f}x"


def _marker_handles() -> list:
    """Legend entries for the optimum star and the plain-decoding line."""
    return [
        Line2D([], [], color="gray", marker="*", ms=12, mec="black", ls="", label="optimum of a curve"),
        Line2D([], [], color="black", ls=":", label="plain decoding (1x)"),
    ]


def candidates_figure(table: pd.DataFrame, title: str, subtitle: str) -> Figure:
    """Simulation (a): speedup against tree size per step model, and what makes it:
    acceptance (tokens per step) and overhead (Medusa step time / plain step time)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(13.5, 5.6))
    for step, rows in table.groupby("step", sort=False):
        rows = rows.sort_values("tree_size")
        color = STEP_COLORS[step]
        best = rows[rows["best"]].iloc[0]
        left.plot(rows["tree_size"], rows["speedup"], ls=STEP_LINES[step], color=color, lw=2, label=f"{STEP_LABELS[step]}: {_optimum_text(best)}")
        _star(left, best["tree_size"], best["speedup"], color)
        right.plot(rows["tree_size"], rows["overhead"], ls=STEP_LINES[step], color=color, lw=2, label=f"overhead, {STEP_LABELS[step]}")
    acc = table.drop_duplicates("tree_size").sort_values("tree_size")
    right.plot(acc["tree_size"], acc["acceptance"], color="#2a8c3c", lw=2, label="acceptance (tokens per step)")
    for ax in (left, right):
        _log2_axis(ax, table["tree_size"], SIZE_LABEL)
    _speedup_axes(left, "speedup = acceptance / overhead")
    left.legend(handles=left.get_legend_handles_labels()[0] + _marker_handles(), loc="upper left", fontsize=9)
    right.axhline(1.0, color="black", ls=":", lw=1.2)
    right.set_ylim(0, max(acc["acceptance"].max(), table["overhead"].max(), 1.5) * 1.1)
    right.set_ylabel("tokens per step  /  step time ratio T(n)/T(1)")
    right.set_title("acceptance grows as ln n; overhead turns up once compute-bound", fontsize=11, y=1.01)
    right.grid(True, alpha=0.3)
    right.legend(loc="upper left", fontsize=9)
    fig.subplots_adjust(left=0.06, right=0.985, top=header(fig, title, subtitle), bottom=0.1, wspace=0.2)
    return fig


def sweep_figure(table: pd.DataFrame, line_by: str, title: str, subtitle: str) -> Figure:
    """Simulations (b) and (c): speedup against tree size with one line per batch (or
    sequence length), one panel per step model, and the optimum against the swept setting."""
    steps = list(table["step"].unique())
    label, short = SETTING_LABELS[line_by]
    colors = _level_colors(table[line_by])
    fig, axes = plt.subplots(1, len(steps) + 1, figsize=(6.0 * (len(steps) + 1), 5.8), squeeze=False)
    axes = axes[0]
    for ax, step in zip(axes, steps):
        for level, rows in table[table["step"] == step].groupby(line_by):
            rows = rows.sort_values("tree_size")
            ax.plot(rows["tree_size"], rows["speedup"], ls=STEP_LINES[step], color=colors[level], lw=1.6)
            best = rows[rows["best"]].iloc[0]
            _star(ax, best["tree_size"], best["speedup"], colors[level])
        _log2_axis(ax, table["tree_size"], SIZE_LABEL)
        _speedup_axes(ax, f"{STEP_LABELS[step]}: one line per {short}")
        top = table.loc[table["step"] == step, "speedup"].max()
        ax.set_ylim(0, max(top, 1.0) * 1.12)
    handles = [Line2D([], [], color=c, lw=2, label=f"{short}={v}") for v, c in colors.items()]
    axes[0].legend(handles=handles + _marker_handles(), loc="upper left", fontsize=8, ncol=2)

    summary = axes[-1]
    best = table[table["best"]]
    # per setting, the step with the higher speedup labels its point above, the other below
    leader = best.sort_values("speedup", ascending=False, kind="stable").drop_duplicates(line_by).set_index(line_by)["step"]
    for step in steps:
        rows = best[best["step"] == step].sort_values(line_by)
        color = STEP_COLORS[step]
        summary.plot(rows[line_by], rows["speedup"], ls=STEP_LINES[step], color=color, lw=2, marker="o", ms=5, label=STEP_LABELS[step])
        for _, row in rows.iterrows():
            above = leader[row[line_by]] == step
            text = str(row["tree_size"]) if row["tree_size"] > 1 else "plain"
            summary.annotate(text, (row[line_by], row["speedup"]), xytext=(0, 7 if above else -13),
                             textcoords="offset points", ha="center", fontsize=8, color=color)  # fmt: skip
    _log2_axis(summary, table[line_by], label)
    summary.set_xlim(summary.get_xlim()[0] / 1.15, summary.get_xlim()[1] * 1.15)  # room for the labels at the ends
    _speedup_axes(summary, f"best speedup per {short} (label: best tree size n)")
    summary.set_ylim(0, max(best["speedup"].max(), 1.0) * 1.18)
    summary.legend(handles=summary.get_legend_handles_labels()[0] + _marker_handles()[-1:], loc="lower left", fontsize=9)
    fig.subplots_adjust(left=0.045, right=0.99, top=header(fig, title, subtitle), bottom=0.1, wspace=0.2)
    return fig


def draft_figure(draft: pd.DataFrame, medusa: dict[str, float], title: str, subtitle: str) -> Figure:
    """Draft-model speculative decoding: walltime improvement E / (c gamma + 1) against the
    drafted tokens gamma, one line per acceptance rate alpha, beside Medusa's best speedup."""
    fig, ax = plt.subplots(figsize=(12, 6.2))
    colors = _level_colors(draft["alpha"])
    for alpha, rows in draft.groupby("alpha"):
        rows = rows.sort_values("gamma")
        ax.plot(rows["gamma"], rows["improvement"], color=colors[alpha], lw=1.8, marker="o", ms=4, label=f"draft model, alpha={alpha:g}")
        top = rows.loc[rows["improvement"].idxmax()]
        _star(ax, top["gamma"], top["improvement"], colors[alpha])
    for step, speedup in medusa.items():
        ax.axhline(speedup, color=STEP_COLORS[step], ls=STEP_LINES[step], lw=2, label=f"Medusa best, {STEP_LABELS[step]}: {speedup:.2f}x")
    ax.set_xticks(sorted(draft["gamma"].unique()))
    ax.set_xlabel("drafted tokens per step gamma")
    _speedup_axes(ax, f"draft step / target step c = {draft['cost_ratio'].iloc[0]:g}", "predicted walltime improvement (x plain decoding)")
    ax.set_ylim(0, max(draft["improvement"].max(), *medusa.values(), 1.0) * 1.15)
    handles = ax.get_legend_handles_labels()[0] + _marker_handles()
    ax.legend(handles=handles, loc="lower right", fontsize=8.5, ncol=2)
    fig.subplots_adjust(left=0.07, right=0.98, top=header(fig, title, subtitle), bottom=0.1)
    return fig


def closed_loop_figure(table: pd.DataFrame, title: str, subtitle: str) -> Figure:
    """perfmodel.validate's comparison: measured and predicted speedup per tree size (error
    labelled), and the acceptance behind them."""
    table = table.sort_values("tree_size")
    fig, (left, right) = plt.subplots(1, 2, figsize=(13.5, 5.4))
    left.plot(table["tree_size"], table["predicted_speedup"], "-", color=STEP_COLORS["paper"], lw=2, label="predicted (measured operators + host overhead)")
    left.plot(table["tree_size"], table["measured_speedup"], "o", color="black", ms=7, label="measured (reference decoder, tokens/s ratio)")
    for row in table.itertuples():
        left.annotate(f"{row.error:+.1%}", (row.tree_size, max(row.predicted_speedup, row.measured_speedup)), xytext=(0, 8), textcoords="offset points", ha="center", fontsize=8)
    right.plot(table["tree_size"], table["predicted_acceptance"], "-", color="#2a8c3c", lw=2, label="predicted (from head accuracies)")
    right.plot(table["tree_size"], table["measured_acceptance"], "o", color="black", ms=7, label="measured")
    for ax in (left, right):
        _log2_axis(ax, table["tree_size"], SIZE_LABEL)
        ax.grid(True, alpha=0.3)
    _speedup_axes(left, "speedup (label: error of the prediction)", "speedup (x plain decoding)")
    left.set_ylim(0, max(table["predicted_speedup"].max(), table["measured_speedup"].max(), 1.0) * 1.2)
    left.legend(handles=left.get_legend_handles_labels()[0] + _marker_handles()[-1:], loc="lower left", fontsize=8.5)
    right.set_ylim(0, table[["predicted_acceptance", "measured_acceptance"]].max().max() * 1.15)
    right.set_ylabel("accepted tokens per step")
    right.set_title("acceptance per step", fontsize=11, y=1.01)
    right.legend(loc="lower right", fontsize=8.5)
    fig.subplots_adjust(left=0.06, right=0.985, top=header(fig, title, subtitle), bottom=0.1, wspace=0.2)
    return fig
