"""Roofline figures in the style of the Medusa paper's Appendix G (Figs 9-20).

Log-log attained TFLOP/s against operational intensity, the bandwidth and compute
ceilings with the ridge point, predicted points hollow and measured points filled.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import NullLocator

from perfmodel.base.provenance import Provenance
from perfmodel.latency.roofline_table import Ceiling
from reports.figure_layout import fit_bottom, legend_below, suptitle
from reports.plotting import PLAIN, level_colors, subplots

MARKERS = {
    "q": "o",
    "k": "s",
    "v": "^",
    "qkv": "D",
    "qk": "o",
    "pv": "s",
    "o": "v",
    "up": "o",
    "gate": "s",
    "down": "^",
    "lm_head": "P",
    "medusa_heads": "X",
}
OP_LABELS = {
    "q": "XW_Q",
    "k": "XW_K",
    "v": "XW_V",
    "qkv": "XW_QKV",
    "qk": "QK^T",
    "pv": "PV",
    "o": "XW_O",
    "up": "XW_u",
    "gate": "XW_g",
    "down": "XW_d",
    "lm_head": "LM head",
    "medusa_heads": "Medusa heads",
}
PHASE_LABELS = {"prefill": "prefill (init)", "decode": "decode (AR)", "tree": "Medusa tree decoding"}
AXIS_LABELS = {"batch": "batch", "seq_len": "sequence length", "candidates": "candidates"}
SHORT = {"batch": "b", "seq_len": "s", "candidates": "q"}


def draw_ceilings(ax, ceilings: list[Ceiling], xlim: tuple[float, float]) -> None:
    """Each roofline and its ridge, a thin vertical line in the roofline's own style; the
    legend (`_ceiling_handles`) says whose ridge each is and where."""
    x = np.logspace(np.log10(xlim[0]), np.log10(xlim[1]), 200)
    for c in ceilings:
        ax.plot(x, np.minimum(c.peak_flops, c.bandwidth * x) / 1e12, c.style, color=c.color, lw=1.4, label=c.label)
        ax.axvline(c.ridge, color=c.color, ls=c.style, lw=0.7, alpha=0.6)


def sources_title(title: str, sources) -> str:
    """What a figure shows, first: predicted, measured, or both."""
    sources = set(sources)
    words = (
        "Predicted and measured"
        if {"predicted", "measured"} <= sources
        else "Measured"
        if Provenance.MEASURED in sources
        else "Predicted"
    )
    return f"{words}: {title}"


ANY_SEQ_AREA = 30.0


def seq_sizes(values) -> dict:
    """Marker area per sequence length: longer sequences, larger markers."""
    values = sorted(set(values))
    return {v: 14 + 46 * (i / max(len(values) - 1, 1)) for i, v in enumerate(values)}


def _limits(points: pd.DataFrame, ceilings: list[Ceiling]) -> tuple[tuple[float, float], tuple[float, float]]:
    oi = points["intensity"] if len(points) else pd.Series([1.0, 100.0])
    tf = points["tflops"] if len(points) else pd.Series([1.0])
    ridge = max(c.ridge for c in ceilings)
    xlim = (10 ** np.floor(np.log10(min(oi.min(), 1.0))), 10 ** np.ceil(np.log10(max(oi.max(), ridge * 4))))
    peak = max(c.peak_flops for c in ceilings) / 1e12
    # From the slowest point (or 1/300 of peak, whichever is lower) to above the peak.
    ylim = (10 ** np.floor(np.log10(max(min(tf.min(), peak / 300), 1e-9))), peak * 2.5)
    return xlim, ylim


ANY_SEQ = -1  # a point standing for every sequence length: the op's cost does not depend on s


def collapse_sequence_lengths(points: pd.DataFrame) -> pd.DataFrame:
    """One point where an op's point is the same at every sequence length (the linear ops):
    seven equal rings on one spot read as a filled marker. A figure collapses its points once:
    the groups never span panels (op and phase are keys), so each panel's share is the same."""
    keys = ["op", "phase", "source", "batch", "candidates"]
    rounded = points.assign(_i=points["intensity"].round(9), _t=points["tflops"].round(9))
    distinct = rounded.groupby(keys)[["_i", "_t", "seq_len"]].transform("nunique")
    collapse = distinct[["_i", "_t"]].max(axis=1).eq(1) & distinct["seq_len"].gt(1)
    kept = points[~collapse]
    merged = points[collapse].drop_duplicates(keys).assign(seq_len=ANY_SEQ)
    return pd.concat([kept, merged], ignore_index=True)


def scatter(ax, points: pd.DataFrame, color_by: str, colors: dict, sizes: dict) -> None:
    """Colour by `color_by`, area by sequence length; predicted hollow and thin-edged so
    that overlapping rings stay rings, measured filled on top. `points`: collapsed
    (collapse_sequence_lengths)."""
    for (op, source), group in points.groupby(["op", "source"], sort=False):
        measured = source == Provenance.MEASURED
        level_colors = [colors[v] for v in group[color_by]]
        ax.scatter(
            group["intensity"],
            group["tflops"],
            marker=MARKERS.get(op, "o"),
            s=[sizes.get(v, ANY_SEQ_AREA) * (1.2 if measured else 1.0) for v in group["seq_len"]],
            facecolors=level_colors if measured else "none",
            edgecolors="black" if measured else level_colors,
            linewidths=0.5 if measured else 0.8,
            alpha=1.0 if measured else 0.8,
            zorder=3 if measured else 2,
        )


def _style_axes(ax, xlim, ylim, title: str) -> None:
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    # Minor ticks on many-decade log axes cost seconds of layout and add nothing here.
    ax.xaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_minor_locator(NullLocator())
    # Plain numbers ("0.1", "1000") instead of mathtext powers: as clear, and far cheaper to lay out.
    ax.xaxis.set_major_formatter(PLAIN)
    ax.yaxis.set_major_formatter(PLAIN)
    ax.set_xlabel("operational intensity (FLOP/byte)")
    ax.set_ylabel("attained performance (TFLOP/s)")
    ax.set_title(title, fontsize=11, y=1.01)  # an explicit y skips a costly auto-placement pass
    ax.grid(True, which="major", alpha=0.3)


def _ceiling_handles(ceilings: list[Ceiling]) -> list:
    return [
        Line2D(
            [],
            [],
            ls=c.style,
            color=c.color,
            label=f"{c.label}\n  its ridge (thin vertical line): {c.ridge:.0f} FLOP/B",
        )
        for c in ceilings
    ]


def _op_handles(ops) -> list:
    """One entry per marker shape, naming every op drawn with it (one shape per op in a panel)."""
    by_marker: dict[str, list[str]] = {}
    for op in dict.fromkeys(ops):
        by_marker.setdefault(MARKERS.get(op, "o"), []).append(OP_LABELS.get(op, op))
    return [
        Line2D([], [], ls="", marker=m, mfc="none", mec="gray", label=" / ".join(names))
        for m, names in by_marker.items()
    ]


def _size_handles(sizes: dict, collapsed: pd.DataFrame) -> list:
    if len(sizes) < 2:
        return []
    handles = [
        Line2D([], [], ls="", marker="o", mfc="none", mec="gray", ms=np.sqrt(area), label=f"s={v}")
        for v, area in sizes.items()
    ]
    if not (collapsed["seq_len"] == ANY_SEQ).any():
        return handles
    return handles + [
        Line2D(
            [],
            [],
            ls="",
            marker="o",
            mfc="none",
            mec="gray",
            ms=np.sqrt(ANY_SEQ_AREA),
            label="any s (an op that s does not change)",
        )
    ]


def _level_handles(color_by: str, colors: dict) -> list:
    return [Line2D([], [], ls="", marker="o", mfc=c, mec=c, label=f"{SHORT[color_by]}={v}") for v, c in colors.items()]


def _source_handles(sources) -> list:
    out = []
    if Provenance.PREDICTED in set(sources):
        out.append(Line2D([], [], ls="", marker="o", mfc="none", mec="black", label="predicted (hollow)"))
    if Provenance.MEASURED in set(sources):
        out.append(Line2D([], [], ls="", marker="o", mfc="gray", mec="black", label="measured (filled)"))
    return out


def roofline_panels(
    points: pd.DataFrame,
    ceilings: list[Ceiling],
    groups: dict[str, tuple[str, ...]],
    phases: tuple[str, ...],
    title: str,
    color_by: str = "batch",
) -> Figure:
    """One row per op group, one column per phase: the paper's Figs 9-17 layout."""
    xlim, ylim = _limits(points, ceilings)
    colors = level_colors(points[color_by])
    sizes = seq_sizes(points["seq_len"])
    fig, axes = subplots(
        len(groups),
        len(phases),
        figsize=(6.2 * len(phases), 4.6 * len(groups) + 1.0),
        squeeze=False,
        sharex=True,
        sharey=True,
    )
    collapsed = collapse_sequence_lengths(points)
    for r, (group, ops) in enumerate(groups.items()):
        for c, phase in enumerate(phases):
            ax = axes[r][c]
            draw_ceilings(ax, ceilings, xlim)
            panel = collapsed["op"].isin(ops) & (collapsed["phase"] == phase)
            scatter(ax, collapsed[panel], color_by, colors, sizes)
            _style_axes(ax, xlim, ylim, f"{group} - {PHASE_LABELS[phase]}")
            ax.label_outer()  # shared axes: tick labels and axis titles on the outer panels only
    ops = [op for group in groups.values() for op in group if op in set(points["op"])]
    handles = (
        _ceiling_handles(ceilings)
        + _op_handles(ops)
        + _level_handles(color_by, colors)
        + _size_handles(sizes, collapsed)
        + _source_handles(points["source"])
    )
    # Fixed margins: tight_layout measures every tick label and takes seconds.
    fig.subplots_adjust(
        left=0.07, right=0.98, top=suptitle(fig, sources_title(title, points["source"]), 13), hspace=0.3, wspace=0.18
    )
    fit_bottom(fig, [legend_below(fig, list(axes.flat), handles, ncol=4, fontsize=9)])
    return fig


def variation_figure(
    points: pd.DataFrame,
    ceilings: list[Ceiling],
    title: str,
    line_by: str,
) -> Figure:
    """Medusa variation study (paper Figs 18-20): the roofline coloured by candidates (area:
    sequence length), and attained TFLOP/s against candidates with one line per `line_by`
    value (marker shape: the op, so ops with equal rates still show)."""
    xlim, ylim = _limits(points, ceilings)
    q_colors = level_colors(points["candidates"])
    sizes = seq_sizes(points["seq_len"])
    fig, (left, right) = subplots(1, 2, figsize=(13.5, 6.6))
    draw_ceilings(left, ceilings, xlim)
    collapsed = collapse_sequence_lengths(points)
    scatter(left, collapsed, "candidates", q_colors, sizes)
    _style_axes(
        left,
        xlim,
        ylim,
        "roofline, coloured by candidates q" + (", area by sequence length s" if len(sizes) > 1 else ""),
    )
    left_handles = (
        _ceiling_handles(ceilings)
        + _op_handles(points["op"])
        + _level_handles("candidates", q_colors)
        + _size_handles(sizes, collapsed)
        + _source_handles(points["source"])
    )

    line_colors = level_colors(points[line_by])
    styles = ["-", "--", ":", "-."]
    ops = list(dict.fromkeys(points["op"]))
    for i, op in enumerate(ops):
        for source, sub in points[points["op"] == op].groupby("source"):
            for level, line in sub.groupby(line_by):
                line = line.sort_values("candidates")
                measured = source == Provenance.MEASURED
                right.plot(
                    line["candidates"],
                    line["tflops"],
                    styles[i % len(styles)],
                    marker=MARKERS.get(op, "o"),
                    markevery=1 if measured else (i, len(ops)),  # predicted ops take turns: equal lines still show each
                    mfc=line_colors[level] if measured else "none",
                    ms=4.5,
                    color=line_colors[level],
                    lw=1.2 if not measured else 0.8,
                )
    handles = [Line2D([], [], color=c, label=f"{SHORT[line_by]}={v}") for v, c in line_colors.items()]
    handles += [
        Line2D(
            [],
            [],
            ls=styles[i % len(styles)],
            marker=MARKERS.get(op, "o"),
            mfc="none",
            color="gray",
            label=OP_LABELS.get(op, op),
        )
        for i, op in enumerate(ops)
    ]
    if Provenance.MEASURED in set(points["source"]):
        handles += [
            Line2D([], [], color="gray", marker="o", mfc="none", label="predicted (hollow markers)"),
            Line2D([], [], color="gray", marker="o", ms=4, lw=0.8, label="measured (filled markers)"),
        ]
    right.set_yscale("log")
    right.yaxis.set_major_formatter(PLAIN)
    right.set_xlabel("candidate tokens q")
    right.set_ylabel("attained performance (TFLOP/s)")
    right.set_title(f"TFLOP/s vs candidates, one line per {AXIS_LABELS[line_by]}", fontsize=11, y=1.01)
    right.grid(True, alpha=0.3)
    fig.subplots_adjust(left=0.06, right=0.98, top=suptitle(fig, sources_title(title, points["source"])), wspace=0.2)
    legends = [
        legend_below(fig, left, left_handles, ncol=3, fontsize=7.5),
        legend_below(fig, right, handles, ncol=4, fontsize=8),
    ]
    fit_bottom(fig, legends)
    return fig
