"""Every figure the reports draw, checked the way a reader looks at it: no legend or label
covers a data point or another label, nothing falls off the figure, and the title says
whether the figure is predicted or measured.

The figures are caught as the real commands render them (one process, `--jobs 1`), so
these are the PNGs a user gets."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure
from matplotlib.transforms import Bbox

from perfmodel.acceptance.reference_trees import VICUNA_7B_ORDER, vicuna_7b_prefix
from reports import render
from reports.__main__ import main as reports_main
from reports.acceptance_figures import tree_layout
from reports.figure_cache import FOLDER_VARIABLE as FIGURES_VARIABLE
from reports.figure_cache import OFF
from reports.plotting import subplots

SHIPPED_CPU = "cpu-intel-xeon-processor-2c"
GPUS = ["a100", "h100", "l40s", "a40", "rtx-a6000"]
FP8 = Path(__file__).resolve().parent / "data" / "model_configs" / "Qwen--Qwen3-32B-FP8_config.json"


@dataclass
class Box:
    what: str
    box: Bbox
    own: tuple | None = None  # a text's own anchor point: the point it sits on by design


@dataclass
class Problems:
    lines: list[str] = field(default_factory=list)

    def add(self, figure: str, text: str) -> None:
        self.lines.append(f"{figure}: {text}")


def data_points(ax) -> list[Box]:
    """Every plotted vertex and scatter point of ax, as a box of its marker (or line width)."""
    scale = ax.figure.dpi / 72
    out = []
    for line in ax.lines:
        if not line.get_visible() or line.get_transform() != ax.transData:
            continue  # axhline / axvline: reference lines across the axes, not data
        has_marker = str(line.get_marker()) not in ("None", "none", "", " ")
        half = (line.get_markersize() if has_marker else line.get_linewidth()) * scale / 2
        for x, y in ax.transData.transform(np.asarray(line.get_xydata(), dtype=float)):
            if np.isfinite(x) and np.isfinite(y):
                out.append(
                    Box(
                        f"point of line {line.get_label()!r}",
                        Bbox([[x - half, y - half], [x + half, y + half]]),
                        (x, y),
                    )
                )
    for collection in ax.collections:
        if isinstance(collection, PathCollection) and collection.get_visible():
            sizes = collection.get_sizes()
            for i, (x, y) in enumerate(collection.get_offset_transform().transform(collection.get_offsets())):
                half = np.sqrt(sizes[i % len(sizes)]) * scale / 2
                out.append(Box("scatter point", Bbox([[x - half, y - half], [x + half, y + half]]), (x, y)))
    return out


def overlaps(a: Bbox, b: Bbox, tolerance_px: float = 0.5) -> bool:
    return min(a.x1, b.x1) - max(a.x0, b.x0) > tolerance_px and min(a.y1, b.y1) - max(a.y0, b.y0) > tolerance_px


def figure_problems(name: str, fig: Figure, drawn: bool = False) -> list[str]:
    """drawn: the figure was just drawn on its canvas at its own dpi (as a PNG is saved), so
    every artist is where the PNG shows it; else it is drawn first."""
    if not drawn:
        fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    problems = Problems()
    frame = Bbox([[0, 0], [fig.get_figwidth() * fig.dpi, fig.get_figheight() * fig.dpi]])
    legends = [
        Box(f"legend {[t.get_text() for t in legend.get_texts()][:2]}", legend.get_window_extent(renderer))
        for legend in fig.legends
    ]
    points, labels = [], []
    for ax in fig.axes:
        if ax.get_label() == "<colorbar>":
            continue
        points += data_points(ax)
        if ax.get_legend() is not None:
            legends.append(Box(f"legend in {ax.get_title()!r}", ax.get_legend().get_window_extent(renderer)))
        for text in ax.texts:
            if not text.get_visible() or not text.get_text().strip():
                continue
            own = None
            if text.get_gid() == "on-marker":  # a node's label drawn on its node
                own = tuple(text.get_transform().transform(text.get_position()))
            labels.append(Box(f"label {text.get_text()!r}", text.get_window_extent(renderer), own))

    for box in legends + labels:
        if not (
            frame.x0 - 1 <= box.box.x0
            and box.box.x1 <= frame.x1 + 1
            and frame.y0 - 1 <= box.box.y0
            and box.box.y1 <= frame.y1 + 1
        ):
            problems.add(name, f"{box.what} falls off the figure")
        for point in points:
            if box.own is not None and np.allclose(point.own, box.own, atol=1.0):
                continue
            if overlaps(box.box, point.box):
                problems.add(name, f"{box.what} covers a {point.what}")
                break
    boxes = legends + labels
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            if overlaps(a.box, b.box):
                problems.add(name, f"{a.what} overlaps {b.what}")

    title = fig._suptitle
    if title is None or not title.get_text():
        problems.add(name, "has no title")
    else:
        if (
            not title.get_window_extent(renderer).fully_overlaps(frame)
            or title.get_window_extent(renderer).x0 < 0
            or title.get_window_extent(renderer).x1 > frame.x1
        ):
            problems.add(name, f"title is clipped: {title.get_text()!r}")
        if not any(word in title.get_text().lower() for word in ("predicted", "measured")):
            problems.add(name, f"title says neither predicted nor measured: {title.get_text()!r}")
    return problems.lines


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, list[str]]:
    """name -> problems, for every figure of a CPU report, a GPU report and a comparison."""
    found: dict[str, list[str]] = {}
    real = render.png_bytes

    def checked(fig: Figure, dpi: int = 100) -> bytes:
        title = fig._suptitle.get_text() if fig._suptitle is not None else "(untitled)"
        name = f"{len(found):02d} {title[:70]}"
        png = real(fig, dpi)
        found[name] = figure_problems(name, fig, drawn=dpi == fig.dpi)
        return png

    out = tmp_path_factory.mktemp("figures")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(render, "png_bytes", checked)
        patch.setenv(FIGURES_VARIABLE, OFF)  # every figure drawn, none taken from the run's cache
        assert (
            reports_main(
                ["build", "--gpu", SHIPPED_CPU, "--model", "bundled", "--out", str(out / "cpu"), "--jobs", "1"]
            )
            == 0
        )
        assert (
            # an FP8 checkpoint: its rooflines carry the format's ceiling beside the dtype's
            reports_main(["build", "--gpu", "h100", "--model", str(FP8), "--out", str(out / "h100"), "--jobs", "1"])
            == 0
        )
        assert (
            reports_main(
                ["compare", "--gpu", *GPUS, "--model", "llama-7b", "--out", str(out / "compare"), "--jobs", "1"]
            )
            == 0
        )
    return found


def test_every_report_figure_was_checked(rendered):
    titles = " | ".join(rendered)
    for kind in (
        "speedup vs tree size",
        "draft-model",
        "best tree size",
        "Closed loop",
        "Rooflines side by side",
        "capacity",
        "Acceptance",
    ):
        assert kind.lower() in titles.lower(), f"no {kind!r} figure among {titles}"
    assert len(rendered) >= 12 + 11 + 4  # CPU report (with its closed loop), GPU report, comparison


def test_no_legend_or_label_covers_data_or_another_label(rendered):
    problems = [line for lines in rendered.values() for line in lines]
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize("saved", [False, True], ids=["drawn-by-the-checker", "saved-as-png-first"])
def test_the_checker_sees_a_legend_on_the_data(saved):
    fig, ax = subplots(figsize=(4, 3))
    ax.plot(np.arange(10), np.arange(10), "o-", label="a line")
    ax.annotate("a label", (4.5, 4.5), fontsize=12)
    ax.legend(loc="center")
    fig.suptitle("Predicted: a figure that hides its data")
    if saved:  # as the report tests check them: the PNG's drawing placed every artist
        render.png_bytes(fig)
    problems = figure_problems("bad", fig, drawn=saved)
    assert any("legend" in p and "covers" in p for p in problems)
    assert any("label 'a label' covers" in p for p in problems)


def test_a_parent_sits_level_with_its_own_first_child_only():
    tree = vicuna_7b_prefix(len(VICUNA_7B_ORDER))
    x, y = tree_layout(tree)
    nodes = [(), *tree.paths]
    for i, path in enumerate(nodes):
        level = [nodes[j] for j in np.flatnonzero(y == y[i]) if j != i]
        # everything on a node's row is its ancestor or descendant: no unrelated neighbour
        assert all(other[: len(path)] == path or path[: len(other)] == other for other in level), (path, level)
