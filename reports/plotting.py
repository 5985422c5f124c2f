"""The figure constructor and the axis, colour and marker helpers the figure modules share.

Reports draw on Figure objects with their own Agg canvas and never import pyplot: pyplot
would pick (or need) a backend, and a library must not change the one its user chose.
"""

from __future__ import annotations

import io

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, NullLocator

__all__ = [
    "PLAIN",
    "SIZE_LABEL",
    "device_colors",
    "level_colors",
    "log2_axis",
    "mark_optimum",
    "marker_handles",
    "png_bytes",
    "size_label",
    "speedup_axes",
    "subplots",
    "svg_bytes",
]

PLAIN = FuncFormatter(lambda x, _: f"{x:g}")  # tick labels as plain numbers: 1, 10, 0.5
SIZE_LABEL = "tree size n (tokens per step, root included)"


def subplots(nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float], **kwargs):
    """A figure and its axes (as Figure.subplots returns them) on an Agg canvas of its own:
    headless whatever backend the user has, and the canvas gives the layout code a renderer."""
    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig, fig.subplots(nrows, ncols, **kwargs)


def png_bytes(fig: Figure, dpi: int = 100) -> bytes:
    buf = io.BytesIO()
    # zlib level 1: a third of the encode time of the default for files ~15% larger.
    fig.savefig(buf, format="png", dpi=dpi, pil_kwargs={"compress_level": 1})
    return buf.getvalue()


# Text kept as text (the page's fonts draw it, DejaVu Sans first as matplotlib laid it out):
# glyphs as paths would make an SVG as large as the PNG. A fixed salt gives the same ids each run.
SVG_STYLE = {"svg.fonttype": "none", "svg.hashsalt": "medusa-perfkit"}


def svg_bytes(fig: Figure) -> bytes:
    buf = io.BytesIO()
    with matplotlib.rc_context(SVG_STYLE):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    return buf.getvalue()


def level_colors(values) -> dict:
    """Ordered levels (batch sizes, lengths, rates): one viridis colour each, low to high."""
    values = sorted(set(values))
    cmap = matplotlib.colormaps["viridis"]
    return {v: cmap(i / max(len(values) - 1, 1) * 0.9) for i, v in enumerate(values)}


def device_colors(devices) -> dict:
    """Devices are categories, not levels: a qualitative palette keeps every line visible."""
    palette = matplotlib.colormaps["tab10"].colors
    return {d: palette[i % len(palette)] for i, d in enumerate(dict.fromkeys(devices))}


def log2_axis(ax, values, label: str) -> None:
    """A base-2 log x axis over `values`, ticked at the powers of two in plain numbers."""
    values = np.asarray(sorted(set(values)))
    ax.set_xscale("log", base=2)
    ax.set_xlim(values.min() / 1.15, values.max() * 1.15)
    ticks = 2.0 ** np.arange(np.floor(np.log2(values.min())), np.ceil(np.log2(values.max())) + 1)
    ax.set_xticks(ticks)
    ax.xaxis.set_major_formatter(PLAIN)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel(label)


def speedup_axes(ax, title: str, ylabel: str = "predicted speedup (x plain decoding)") -> None:
    """A speedup panel: plain decoding (1x) dotted, from zero up, gridded."""
    ax.axhline(1.0, color="black", ls=":", lw=1.2, zorder=1)
    ax.set_ylim(bottom=0)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=11, y=1.01)
    ax.grid(True, alpha=0.3)


def _star(ax, x, y, color) -> None:
    ax.plot([x], [y], marker="*", ms=15, color=color, mec="black", mew=0.7, ls="", zorder=5)


def _edge(ax, x, y, color) -> None:
    """A best value at the largest size searched is a bound: it points on, past the edge."""
    ax.plot([x], [y], marker=">", ms=11, color=color, mec="black", mew=0.7, ls="", zorder=5)


def mark_optimum(ax, rows: pd.DataFrame, x: str, y: str, color) -> tuple[pd.Series, bool]:
    """Star the best row of one curve, or mark it as a bound when it is the curve's last
    point; returns the row and whether it sits at the edge."""
    best = rows.loc[rows[y].idxmax()] if "best" not in rows else rows[rows["best"]].iloc[0]
    at_edge = bool(best[x] == rows[x].max() and best[x] > rows[x].min())
    (_edge if at_edge else _star)(ax, best[x], best[y], color)
    return best, at_edge


def marker_handles(edge: bool = True) -> list:
    """Legend entries for the optimum star (and the edge marker) and the plain-decoding line."""
    handles = [Line2D([], [], color="gray", marker="*", ms=12, mec="black", ls="", label="optimum of a curve")]
    if edge:
        handles.append(
            Line2D(
                [],
                [],
                color="gray",
                marker=">",
                ms=9,
                mec="black",
                ls="",
                label="best at the largest size searched (≥: a bound)",
            )
        )
    return handles + [Line2D([], [], color="black", ls=":", label="plain decoding (1x)")]


def size_label(tree_size: int, at_edge: bool) -> str:
    """A best tree size as a label: 'plain' for no tree, '≥n' for a bound."""
    if tree_size <= 1:
        return "plain"
    return f"≥{tree_size}" if at_edge else str(tree_size)
