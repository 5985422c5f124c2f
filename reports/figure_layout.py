"""Where a figure's words go: titles that wrap, legends outside the data, and labels placed
next to their points without covering another point or label.

matplotlib places a legend inside the axes (`loc="best"` only minimises overlap) and an
annotation exactly where it is told, so a dense figure hides its own data. These helpers
measure text in display space, which is only right once the figure's layout is final:
call them after `subplots_adjust`, last.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

import numpy as np
from matplotlib.axes import Axes
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.transforms import Bbox

CHARS_PER_INCH = {13: 8.6, 12: 9.3, 11: 10.2, 8.5: 15.0}  # DejaVu Sans, average width


def wrap(text: str, width_in: float, fontsize: float) -> str:
    """Break text into lines that fit width_in inches at fontsize points."""
    per_inch = CHARS_PER_INCH.get(fontsize, 8.6 * 13 / fontsize)
    return "\n".join(textwrap.wrap(text, max(int(width_in * per_inch), 20)))


def header(fig: Figure, title: str, subtitle: str) -> float:
    """Title and subtitle above the panels, both wrapped to the figure's width; returns the
    panels' top (figure fraction)."""
    width, height = fig.get_size_inches()
    title = wrap(title, width - 0.4, 13)
    lines = wrap(subtitle, width - 0.4, 8.5).splitlines()
    title_lines = title.count("\n") + 1
    fig.suptitle(title, fontsize=13, y=1 - 0.12 / height, va="top", linespacing=1.15)
    below_title = 0.12 + 0.24 * title_lines + 0.09
    fig.text(
        0.5,
        1 - below_title / height,
        "\n".join(lines),
        ha="center",
        va="top",
        fontsize=8.5,
        color="#333333",
        linespacing=1.3,
    )
    return 1 - (below_title + 0.17 * len(lines) + 0.4) / height


def suptitle(fig: Figure, title: str, fontsize: float = 12) -> float:
    """A wrapped figure title alone; returns the top of the panels (figure fraction)."""
    width, height = fig.get_size_inches()
    text = wrap(title, width - 0.4, fontsize)
    fig.suptitle(text, fontsize=fontsize, y=1 - 0.1 / height, va="top", linespacing=1.15)
    return 1 - (0.1 + 0.22 * (text.count("\n") + 1) + 0.42) / height


def legend_below(fig: Figure, axes: Axes | list[Axes], handles: list, ncol: int, fontsize: float = 8.5) -> Legend:
    """A legend under the given panels (centred on them), at the bottom of the figure, so
    it can never cover their data; fewer columns where it would not fit the figure's width,
    shifted sideways where it would cross the figure's edge. `fit_bottom` then makes room."""
    axes = axes if isinstance(axes, list) else [axes]
    left = min(ax.get_position().x0 for ax in axes)
    right = max(ax.get_position().x1 for ax in axes)
    renderer = fig.canvas.get_renderer()
    width_px = fig.get_figwidth() * fig.dpi
    for columns in range(max(ncol, 1), 0, -1):
        legend = fig.legend(
            handles=handles,
            loc="lower center",
            bbox_to_anchor=((left + right) / 2, 0.005),
            ncol=columns,
            fontsize=fontsize,
            frameon=False,
            columnspacing=1.4,
            handlelength=2.2,
        )
        box = legend.get_window_extent(renderer)
        if box.width <= width_px - 8 or columns == 1:
            break
        legend.remove()
    shift = max(4 - box.x0, 0) - max(box.x1 - (width_px - 4), 0)
    if shift:
        legend.set_bbox_to_anchor(((left + right) / 2 + shift / width_px, 0.005), transform=fig.transFigure)
    return legend


def fit_bottom(fig: Figure, legends: list[Legend]) -> None:
    """Raise the panels' bottom until the tick labels and axis titles clear the legends below."""
    renderer = fig.canvas.get_renderer()
    top_of_legends = max(legend.get_window_extent(renderer).y1 for legend in legends)
    height_px = fig.get_figheight() * fig.dpi
    fig.subplots_adjust(bottom=(top_of_legends + 0.62 * fig.dpi) / height_px)
    lowest = min(
        ax.get_tightbbox(renderer).y0 for ax in fig.axes if ax.get_visible() and ax.get_label() != "<colorbar>"
    )
    if lowest < top_of_legends + 4:  # taller tick labels than the first guess allowed
        fig.subplots_adjust(bottom=fig.subplotpars.bottom + (top_of_legends + 4 - lowest) / height_px)


def point_boxes(ax: Axes, pad_px: float = 1.0) -> list[Bbox]:
    """Display-space boxes of every data point drawn in ax: line vertices (marker size, or
    the line's width where it has no marker) and scatter points. Lines spanning the axes
    (axhline, axvline) are reference lines, not data."""
    boxes = []
    scale = ax.figure.dpi / 72
    for line in ax.lines:
        if not line.get_visible() or line.get_transform() != ax.transData:
            continue
        xy = line.get_transform().transform(np.asarray(line.get_xydata(), dtype=float))
        marker = line.get_marker() not in (None, "None", "none", "", " ")
        half = (line.get_markersize() if marker else line.get_linewidth()) * scale / 2 + pad_px
        boxes += [
            Bbox([[x - half, y - half], [x + half, y + half]]) for x, y in xy if np.isfinite(x) and np.isfinite(y)
        ]
    for collection in ax.collections:
        if not isinstance(collection, PathCollection) or not collection.get_visible():
            continue
        xy = collection.get_offset_transform().transform(collection.get_offsets())
        sizes = collection.get_sizes()
        for i, (x, y) in enumerate(xy):
            half = np.sqrt(sizes[i % len(sizes)] if len(sizes) else 36) * scale / 2 + pad_px
            boxes.append(Bbox([[x - half, y - half], [x + half, y + half]]))
    return boxes


def overlap_area(a: Bbox, b: Bbox) -> float:
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return max(w, 0.0) * max(h, 0.0)


@dataclass(frozen=True)
class Label:
    """A text for the data point (x, y); `prefer` names the side tried first."""

    x: float
    y: float
    text: str
    color: object = "black"
    prefer: str = "above"


# (dx, dy) in points from the point to the text's anchor, with its alignment.
OFFSETS = {
    "above": ((0, 6), "center", "bottom"),
    "below": ((0, -6), "center", "top"),
    "right": ((7, 0), "left", "center"),
    "left": ((-7, 0), "right", "center"),
    "above right": ((5, 5), "left", "bottom"),
    "above left": ((-5, 5), "right", "bottom"),
    "below right": ((5, -5), "left", "top"),
    "below left": ((-5, -5), "right", "top"),
    "far above": ((0, 16), "center", "bottom"),
    "far below": ((0, -16), "center", "top"),
    "far right": ((14, 8), "left", "bottom"),
    "far left": ((-14, -8), "right", "top"),
    # a second ring, for crowded points (several devices' lines meeting at one batch)
    "far below right": ((12, -16), "left", "top"),
    "far above left": ((-12, 16), "right", "bottom"),
    "far above right": ((12, 16), "left", "bottom"),
    "far below left": ((-12, -16), "right", "top"),
    "farther below": ((0, -28), "center", "top"),
    "farther above": ((0, 28), "center", "bottom"),
}


def place_labels(ax: Axes, labels: list[Label], fontsize: float = 8, avoid: list[Bbox] | None = None) -> list:
    """Annotate each point on the first side (its preferred one first) where the text stays
    inside the axes and covers no data point, no other label and nothing in `avoid`; where
    every side is taken, the side covering least. Returns the annotations."""
    renderer = ax.figure.canvas.get_renderer()
    inside = ax.get_window_extent(renderer)
    points = point_boxes(ax)
    taken = list(avoid or [])
    placed = []
    for label in labels:
        text = ax.annotate(
            label.text,
            (label.x, label.y),
            xytext=(0, 0),
            textcoords="offset points",
            fontsize=fontsize,
            color=label.color,
        )
        sides = [label.prefer] + [side for side in OFFSETS if side != label.prefer]
        best = None
        for side in sides:
            (dx, dy), ha, va = OFFSETS[side]
            text.set_position((dx, dy))
            text.set_ha(ha)
            text.set_va(va)
            box = text.get_window_extent(renderer)
            outside = box.width * box.height - overlap_area(box, inside)
            # its own point counts too: a label must not sit on what it labels
            cost = outside * 10 + sum(overlap_area(box, b) for b in points) + sum(overlap_area(box, b) for b in taken)
            if best is None or cost < best[0]:
                best = (cost, side, box)
            if cost == 0:
                break
        _, side, box = best
        (dx, dy), ha, va = OFFSETS[side]
        text.set_position((dx, dy))
        text.set_ha(ha)
        text.set_va(va)
        taken.append(box)
        placed.append(text)
    return placed
