"""Capacity-planning figures: per batch, the latency a user sees and the tokens/s a
device serves, with plain decoding and with the best Medusa tree (perfmodel.plan bands)."""

from __future__ import annotations

# roofline_figures selects the file-only backend before pyplot is imported.
from reports.roofline_figures import PLAIN
from reports.speedup_figures import _log2_axis, header

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import LogLocator, NullLocator


def device_colors(devices) -> dict:
    """Devices are categories, not levels: a qualitative palette keeps every line visible."""
    palette = plt.get_cmap("tab10").colors
    return {d: palette[i % len(palette)] for i, d in enumerate(dict.fromkeys(devices))}


def plain_per_token_ms(bands: pd.DataFrame) -> pd.Series:
    """Plain decoding's per-token latency: a band's speedup is plain over Medusa per-token time."""
    return bands["per_token_ms"] * bands["speedup"]


def capacity_figure(bands: pd.DataFrame, title: str, subtitle: str, latency_target_ms: float | None = None) -> Figure:
    """Per-token latency and aggregate tokens/s against batch, one colour per device; solid
    with the best tree (its size labelled), dotted plain decoding."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(13.5, 5.6))
    colors = device_colors(bands["device"])
    for device, rows in bands.groupby("device", sort=False):
        rows = rows.sort_values("batch")
        color = colors[device]
        plain_ms = plain_per_token_ms(rows)
        left.plot(rows["batch"], rows["per_token_ms"], "-o", ms=4, color=color, lw=2, label=f"{device}: best tree")
        left.plot(rows["batch"], plain_ms, ":", color=color, lw=1.5, label=f"{device}: plain decoding")
        right.plot(rows["batch"], rows["total_tokens_s"], "-o", ms=4, color=color, lw=2, label=f"{device}: best tree")
        right.plot(rows["batch"], rows["batch"] * 1e3 / plain_ms, ":", color=color, lw=1.5, label=f"{device}: plain decoding")
        for row in rows.itertuples():
            text = str(row.tree_size) if row.speculate else "none"
            left.annotate(text, (row.batch, row.per_token_ms), xytext=(0, -13), textcoords="offset points", ha="center", fontsize=7.5, color=color)
    if latency_target_ms is not None:
        left.axhline(latency_target_ms, color="#c4391d", ls="--", lw=1.2, label=f"target {latency_target_ms:g} ms/token")
    for ax in (left, right):
        _log2_axis(ax, bands["batch"], "batch size (sequences decoded together)")
        ax.set_yscale("log")
        # 1-2-5 steps in plain numbers: these axes span one to three decades
        ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
        ax.yaxis.set_major_formatter(PLAIN)
        ax.yaxis.set_minor_locator(NullLocator())
        ax.grid(True, which="major", alpha=0.3)
    left.set_ylabel("per-token latency per user (ms)")
    left.set_title("latency a user sees (label: best tree size, none = plain)", fontsize=11, y=1.01)
    left.legend(fontsize=8, loc="upper left")
    right.set_ylabel("output tokens/s of the device (all users)")
    right.set_title("throughput the device serves", fontsize=11, y=1.01)
    right.legend(fontsize=8, loc="upper left")
    fig.subplots_adjust(left=0.07, right=0.985, top=header(fig, title, subtitle), bottom=0.1, wspace=0.22)
    return fig
