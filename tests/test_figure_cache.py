"""Figures kept by what they show (reports.figure_cache): a rebuild gives the same files
without drawing, a changed argument draws again, the cache stays within its size and never
fails a build."""

from __future__ import annotations

import os

import pytest

from reports import render
from reports.__main__ import main as reports_main
from reports.figure_cache import FOLDER_VARIABLE, OFF, FigureCache, figure_cache
from reports.plotting import subplots
from reports.render import FigureJob, Renderer
from reports.roofline_figures import variation_figure


def tiny_figure():
    fig, ax = subplots(1, 1, figsize=(2, 2))
    ax.plot([0, 1], [0, 1])
    return fig


def files(folder) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def drawn(monkeypatch) -> list[str]:
    """The figures drawn (not taken from a cache), by drawing function."""
    names: list[str] = []
    for name in ("_draw", "_render"):
        real = getattr(render, name)

        def counted(job, real=real):
            names.append(job.draw.__name__)
            return real(job)

        monkeypatch.setattr(render, name, counted)
    return names


def test_a_rebuild_takes_every_figure_from_the_cache_and_writes_the_same_files(tmp_path, monkeypatch, drawn):
    monkeypatch.setenv(FOLDER_VARIABLE, str(tmp_path / "figures"))
    argv = ["compare", "--gpu", "a100", "h100", "--model", "llama-7b", "--jobs", "1", "--out"]
    assert reports_main([*argv, str(tmp_path / "drawn")]) == 0
    first_drawn = len(drawn)
    assert first_drawn >= 4 and any((tmp_path / "figures").iterdir())
    assert reports_main([*argv, str(tmp_path / "kept")]) == 0
    assert len(drawn) == first_drawn  # nothing drawn again
    assert files(tmp_path / "drawn") == files(tmp_path / "kept")


def test_a_figures_key_is_what_it_shows(tmp_path):
    cache = FigureCache(tmp_path)
    points = {"title": "a", "line_by": "batch"}
    key = cache.key("page", variation_figure, points)
    assert key == cache.key("page", variation_figure, dict(points))
    assert key != cache.key("page", variation_figure, {**points, "title": "b"})
    assert key != cache.key("png", variation_figure, points)
    assert cache.key("page", variation_figure, {"draw": lambda: None}) is None  # not picklable: drawn every time


def test_the_environment_names_the_cache_or_turns_it_off(tmp_path, monkeypatch):
    monkeypatch.setenv(FOLDER_VARIABLE, str(tmp_path / "kept"))
    assert figure_cache().folder == tmp_path / "kept"
    monkeypatch.setenv(FOLDER_VARIABLE, OFF)
    assert figure_cache() is None
    monkeypatch.delenv(FOLDER_VARIABLE)
    monkeypatch.setenv("MEDUSA_PERFKIT_HOME", str(tmp_path / "home"))
    assert figure_cache().folder == tmp_path / "home" / "figures"


def test_the_cache_keeps_the_most_recently_used_figures_within_its_limit(tmp_path):
    cache = FigureCache(tmp_path, limit_bytes=2500)
    for i in range(4):
        cache.put(f"k{i}", bytes(1000), page=True)
        os.utime(tmp_path / f"k{i}.png", (i, i))
    cache.get("k0")  # used now: the newest
    cache.prune()
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["k0.png", "k3.png"]
    assert cache.get("k1") is None and cache.get("k3") == (bytes(1000), None)


def test_a_cache_that_cannot_be_written_costs_only_the_saving(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    job = FigureJob(tiny_figure)
    with Renderer(1, FigureCache(blocker / "figures")) as renderer:
        assert renderer.submit(job)().startswith(b"\x89PNG")
        assert renderer.draw(job)().png.startswith(b"\x89PNG")
