"""Figures of python -m reports compare: one model on several devices, one colour per device."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator

from perfmodel.latency.roofline_table import Ceiling
from reports.figure_layout import Label, fit_bottom, header, legend_below, place_labels
from reports.plotting import (
    PLAIN,
    SIZE_LABEL,
    device_colors,
    log2_axis,
    mark_optimum,
    marker_handles,
    size_label,
    speedup_axes,
    subplots,
)

CEILING_STYLES = {"datasheet": "-", "model": "--", "measured": ":"}
CEILING_KINDS = {"datasheet": "datasheet", "model": "latency model (predicted)", "measured": "measured"}


def ceilings_figure(ceilings: dict[str, list[Ceiling]], title: str, subtitle: str) -> Figure:
    """Every device's rooflines on one log-log plot: datasheet solid, latency model dashed,
    measured dotted; each device's ridges marked, the label saying which roofline's ridge."""
    fig, ax = subplots(figsize=(12, 7.4))
    colors = device_colors(list(ceilings))
    lo, hi = 0.1, max(c.ridge for lines in ceilings.values() for c in lines) * 8
    x = np.logspace(np.log10(lo), np.log10(hi), 200)
    ridges = []
    for device, lines in ceilings.items():
        for c in lines:
            kind = c.label.split(":")[0]
            ax.plot(
                x,
                np.minimum(c.peak_flops, c.bandwidth * x) / 1e12,
                CEILING_STYLES.get(kind, "-"),
                color=colors[device],
                lw=1.8 if kind != "model" else 1.2,
                label=f"{device}, {c.label}",
            )
        main = lines[0]
        ax.plot([main.ridge], [main.peak_flops / 1e12], "o", color=colors[device], ms=6)
        ridges.append(Label(main.ridge, main.peak_flops / 1e12, f"{main.ridge:.0f}", colors[device]))
    kinds = {CEILING_KINDS.get(c.label.split(":")[0], "") for lines in ceilings.values() for c in lines[:1]}
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(top=max(c.peak_flops for lines in ceilings.values() for c in lines) / 1e12 * 3)
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_minor_locator(NullLocator())
        axis.set_major_formatter(PLAIN)
    ax.set_xlabel("operational intensity (FLOP/byte)")
    ax.set_ylabel("attainable performance (TFLOP/s)")
    ax.set_title(
        f"rooflines (dot and label: the ridge of each {' / '.join(sorted(kinds))} roofline, FLOP/byte)",
        fontsize=11,
        y=1.01,
    )
    ax.grid(True, alpha=0.3)
    fig.subplots_adjust(left=0.07, right=0.98, top=header(fig, title, subtitle))
    fit_bottom(fig, [legend_below(fig, ax, ax.get_legend_handles_labels()[0], ncol=2, fontsize=7.5)])
    place_labels(ax, ridges)
    return fig


def speedup_comparison_figure(sims: pd.DataFrame, title: str, subtitle: str) -> Figure:
    """Left: speedup vs tree size at b=1, s=1024 per device (optimum starred, or marked as
    a bound at the largest size). Right: the best speedup per batch at s=1024, labelled
    with its tree size."""
    fig, (left, right) = subplots(1, 2, figsize=(14, 6.6))
    colors = device_colors(sims["device"])
    any_edge = False
    labels = []
    largest = sims["tree_size"].max()
    for device, rows in sims.groupby("device", sort=False):
        color = colors[device]
        a = rows[rows["simulation"] == "a"].sort_values("tree_size")
        line = left.plot(a["tree_size"], a["speedup"], color=color, lw=2)[0]
        best, at_edge = mark_optimum(left, a, "tree_size", "speedup", color)
        line.set_label(f"{device}: best n{'≥' if at_edge else '='}{best['tree_size']} ({best['speedup']:.2f}x)")
        any_edge |= at_edge
        b = rows[(rows["simulation"] == "b") & rows["best"]].sort_values("batch")
        right.plot(b["batch"], b["speedup"], "-o", ms=4, color=color, lw=2, label=device)
        # one label per run of equal sizes: a row of identical labels says nothing new
        shown = b[b["tree_size"].ne(b["tree_size"].shift())]
        labels += [
            Label(r.batch, r.speedup, size_label(r.tree_size, r.tree_size == largest), color)
            for r in shown.itertuples()
        ]
    log2_axis(left, sims["tree_size"], SIZE_LABEL)
    speedup_axes(left, "b=1, s=1024: speedup vs tree size")
    left.set_ylim(0, max(sims["speedup"].max(), 1.0) * 1.12)
    b_rows = sims[sims["simulation"] == "b"]
    log2_axis(right, b_rows["batch"], "batch size b")
    speedup_axes(right, "s=1024: best speedup per batch (label: tree size n where it changes)")
    right.set_ylim(0, max(b_rows["speedup"].max(), 1.0) * 1.18)
    fig.subplots_adjust(left=0.06, right=0.985, top=header(fig, title, subtitle), wspace=0.2)
    legends = [
        legend_below(fig, left, left.get_legend_handles_labels()[0] + marker_handles(any_edge), ncol=2),
        legend_below(fig, right, right.get_legend_handles_labels()[0] + marker_handles(False)[-1:], ncol=3),
    ]
    fit_bottom(fig, legends)
    place_labels(right, labels, fontsize=7.5)
    return fig


def latency_figure(steps: pd.DataFrame, title: str, subtitle: str) -> Figure:
    """Plain decoding step time against batch, one line per device (context 1024)."""
    fig, ax = subplots(figsize=(11, 6.2))
    colors = device_colors(steps["device"])
    for device, rows in steps.groupby("device", sort=False):
        rows = rows.sort_values("batch")
        ax.plot(rows["batch"], rows["plain_step_ms"], "-o", ms=4, color=colors[device], lw=2, label=device)
    log2_axis(ax, steps["batch"], "batch size b")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(PLAIN)
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_ylabel("plain decoding step (ms), whole model")
    ax.set_title("decode step latency at context 1024", fontsize=11, y=1.01)
    ax.grid(True, which="major", alpha=0.3)
    fig.subplots_adjust(left=0.08, right=0.98, top=header(fig, title, subtitle))
    fit_bottom(fig, [legend_below(fig, ax, ax.get_legend_handles_labels()[0], ncol=5, fontsize=9)])
    return fig
