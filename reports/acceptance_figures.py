"""Acceptance figures: what a decoder.measure record says about the Medusa heads, and the
candidate tree drawn as a tree.

A record's data are measured; the curves fitted to them (log fit, head-accuracy model)
and the paper's preset are predictions, and each figure's legend says which is which.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import NullLocator

from perfmodel.acceptance.record import AcceptanceRecord
from perfmodel.acceptance.trees import Tree, path_value
from reports.figure_layout import fit_bottom, header, legend_below, suptitle
from reports.plotting import PLAIN, subplots


def accuracy_heatmap(ax, accuracy: np.ndarray) -> None:
    """Heads x ranks: a_k^(i), how often the i-th ranked prediction of head k is the token
    the model itself produces k+1 positions later (paper 2.3.3)."""
    heads, topk = accuracy.shape
    image = ax.imshow(accuracy * 100, cmap="viridis", aspect="auto", vmin=0, vmax=max(accuracy.max() * 100, 1))
    for k in range(heads):
        for i in range(topk):
            value = accuracy[k, i] * 100
            light = value > accuracy.max() * 100 * 0.6
            ax.text(i, k, f"{value:.1f}", ha="center", va="center", fontsize=8, color="black" if light else "white")
    ax.set_xticks(range(topk), [f"{i}" for i in range(topk)])
    ax.set_yticks(range(heads), [f"head {k + 1}" for k in range(heads)])
    ax.set_xlabel("rank i of the head's prediction (0 = its top-1)")
    ax.set_ylabel("Medusa head k (predicts token t+k+1)")
    ax.set_title("measured: head accuracy a_k^(i) (% of positions)", fontsize=11, y=1.01)
    ax.figure.colorbar(image, ax=ax, fraction=0.05, pad=0.02, label="accuracy (%)")


def length_histogram(ax, histogram: dict[str, int]) -> list:
    """Share of Medusa steps accepting 1, 2, ... tokens (the root, always accepted, included);
    returns the legend handles."""
    lengths = np.array(sorted(int(k) for k in histogram))
    counts = np.array([histogram[str(k)] for k in lengths], dtype=float)
    share = counts / counts.sum() * 100
    ax.bar(lengths, share, color="#2a8c3c", width=0.7, label=f"{int(counts.sum()):,} steps")
    mean = float((lengths * counts).sum() / counts.sum())
    ax.axvline(mean, color="black", ls="--", lw=1.2, label=f"mean {mean:.2f} tokens/step")
    for x, y in zip(lengths, share):
        ax.annotate(f"{y:.0f}%", (x, y), xytext=(0, 3), textcoords="offset points", ha="center", fontsize=8)
    ax.set_xticks(lengths)
    ax.set_ylim(0, share.max() * 1.15)  # room for the share labels above the bars
    ax.set_xlabel("tokens accepted in a step (root included)")
    ax.set_ylabel("share of steps (%)")
    ax.set_title("measured: accepted length per step", fontsize=11, y=1.01)
    ax.grid(True, axis="y", alpha=0.3)
    return ax.get_legend_handles_labels()[0]


@dataclass(frozen=True)
class Curve:
    """An acceptance model drawn against tree size. A model floored at one token per step
    (a log fit below 1) names where: `clamped_below` is the n under which its formula is
    replaced by 1, and `formula` gives the unclamped values so the figure can show them."""

    x: np.ndarray
    y: np.ndarray
    clamped_below: float = 1.0
    formula: object = None  # n -> the model's values before the floor


def acceptance_curve(ax, measured: list[tuple[int, float]], curves: dict[str, Curve]) -> list:
    """Tokens per step against tree size: measured points and the models' curves, each
    clamp drawn (the formula dotted where it falls below 1) and named in the legend.
    Returns the legend handles."""
    styles = ["-", "--", ":", "-."]
    colors = ["#1f5fa8", "#c4391d", "#6c7a89", "#8e44ad"]
    handles = []
    for i, (label, curve) in enumerate(curves.items()):
        color = colors[i % 4]
        handles += ax.plot(curve.x, curve.y, styles[i % 4], color=color, lw=1.8, label=f"predicted: {label}")
        if curve.clamped_below > 1 and curve.formula is not None:
            below = np.geomspace(1, curve.clamped_below, 30)
            ax.plot(below, curve.formula(below), ":", color=color, lw=1.2)
            handles.append(
                Line2D(
                    [],
                    [],
                    ls=":",
                    color=color,
                    lw=1.2,
                    label=f"its formula below 1 token/step, n < {curve.clamped_below:.1f}: clamped to 1 (the root)",
                )
            )
    if measured:
        x, y = zip(*measured)
        handles += ax.plot(x, y, "o", color="black", ms=7, label="measured (decoder.measure)")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(PLAIN)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("tree size n (tokens per step, root included)")
    ax.set_ylabel("accepted tokens per step")
    ax.set_ylim(bottom=0)
    ax.set_title("acceptance vs tree size", fontsize=11, y=1.01)
    ax.grid(True, alpha=0.3)
    return handles


def acceptance_figure(record: AcceptanceRecord | None, curves: dict[str, Curve], title: str) -> Figure:
    """With a record: its heat map, histogram and acceptance curve; without one, the curve alone."""
    if record is None:
        fig, ax = subplots(figsize=(8, 6))
        handles = acceptance_curve(ax, [], curves)
        fig.subplots_adjust(left=0.09, right=0.97, top=suptitle(fig, title))
        fit_bottom(fig, [legend_below(fig, ax, handles, ncol=1, fontsize=8)])
        return fig
    fig, axes = subplots(1, 3, figsize=(16, 6.2), gridspec_kw={"width_ratios": [1.35, 1, 1.1]})
    accuracy_heatmap(axes[0], record.accuracy)
    histogram_handles = length_histogram(axes[1], record.accepted_length_histogram)
    measured = list(zip(record.tree_sizes, record.tokens_per_step))
    handles = acceptance_curve(axes[2], measured, curves)
    fig.subplots_adjust(left=0.07, right=0.985, top=suptitle(fig, title), wspace=0.3)
    legends = [
        legend_below(fig, axes[1], histogram_handles, ncol=1, fontsize=8),
        legend_below(fig, axes[2], handles, ncol=1, fontsize=8),
    ]
    fit_bottom(fig, legends)
    return fig


def tree_layout(tree: Tree) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of every token, root first in the tree's token order: x = depth, one row per
    leaf in path order, and a parent on the row of its first child, so that every node is
    level only with its own descendants (the elbows run down to the later children)."""
    children: dict[tuple, list[tuple]] = {(): []}
    for path in tree.paths:
        children.setdefault(path, [])
        children[path[:-1]].append(path)
    y: dict[tuple, float] = {}
    next_row = [0.0]

    def place(path: tuple) -> float:
        kids = sorted(children[path])
        if not kids:
            y[path] = next_row[0]
            next_row[0] += 1
        else:
            y[path] = [place(k) for k in kids][0]
        return y[path]

    place(())
    order = [(), *tree.paths]
    return np.array([len(p) for p in order], dtype=float), np.array([y[p] for p in order])


def tree_figure(tree: Tree, accuracy: np.ndarray | None, title: str, subtitle: str) -> Figure:
    """The tree left to right, root at depth 0; a node's label is its rank in its head's
    top-k; colour is the node's predicted acceptance probability when accuracies are known."""
    x, y = tree_layout(tree)
    leaves = int(y.max()) + 1
    fig, ax = subplots(figsize=(11, min(max(3.6, 0.2 * leaves + 2.1), 22)))
    parents = tree.parents
    for i, p in enumerate(parents):
        if p >= 0:
            ax.plot([x[p], x[p], x[i]], [y[p], y[i], y[i]], color="#999999", lw=0.8, zorder=1)
    if accuracy is not None:
        values = np.array([1.0] + [path_value(p, accuracy) for p in tree.paths])
        nodes = ax.scatter(
            x, y, c=values * 100, cmap="viridis", vmin=0, vmax=100, s=150, edgecolors="black", linewidths=0.5, zorder=2
        )
        fig.colorbar(nodes, ax=ax, fraction=0.03, pad=0.01, label="P(accepted), predicted (%)")
    else:
        ax.scatter(x, y, color="#9ecae1", s=150, edgecolors="black", linewidths=0.5, zorder=2)
    dark = values < 0.5 if accuracy is not None else np.zeros(len(x), dtype=bool)
    for xi, yi, path, white in zip(x[1:], y[1:], tree.paths, dark[1:]):
        # gid: a label drawn on its own node by design (the figure tests tell it from a stray label)
        ax.text(
            xi,
            yi,
            str(path[-1]),
            ha="center",
            va="center",
            fontsize=7,
            zorder=3,
            color="white" if white else "black",
            gid="on-marker",
        )
    ax.annotate("root", (0, y[0]), xytext=(-12, 0), textcoords="offset points", ha="right", va="center", fontsize=9)
    ax.set_xticks(range(tree.depth + 1), ["root"] + [f"head {k}" for k in range(1, tree.depth + 1)])
    ax.set_xlim(-0.6, tree.depth + 0.4)
    ax.set_ylim(leaves - 0.4, -0.6)
    ax.set_yticks([])
    ax.set_xlabel("depth (the Medusa head whose prediction the node is); node label = its rank in that head's top-k")
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    fig.subplots_adjust(left=0.06, right=0.97, top=header(fig, title, subtitle), bottom=0.75 / fig.get_figheight())
    return fig
