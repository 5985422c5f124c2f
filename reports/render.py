"""Render many matplotlib figures at once, in parallel worker processes: as PNG for the
commands that write figure files, and as PNG and SVG for a page, which embeds the smaller.

Drawing a figure is single-threaded CPU work in matplotlib; independent figures on
separate cores are the one large saving left once a figure is drawn efficiently.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from matplotlib.figure import Figure

from reports.figure_cache import FigureCache
from reports.plotting import png_bytes, svg_bytes


@dataclass(frozen=True)
class FigureJob:
    """`draw(**kwargs)` returns a Figure; `draw` must be a module-level function (picklable)."""

    draw: Callable[..., Figure]
    kwargs: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Drawn:
    """A figure for a page: its PNG (the file beside the page), and its SVG where that is the
    smaller (a line plot's is a third to a fifth of the PNG and sharp at any zoom; a cloud of
    thousands of roofline points is larger as SVG), else None."""

    png: bytes
    svg: bytes | None = None


def png_only(png: Callable[[], bytes]) -> Callable[[], Drawn]:
    """A PNG getter (Renderer.submit's) as a Drawn getter."""
    return lambda: Drawn(png())


def _render(job: FigureJob) -> bytes:
    return png_bytes(job.draw(**job.kwargs))


def _draw(job: FigureJob) -> Drawn:
    fig = job.draw(**job.kwargs)
    png, svg = png_bytes(fig), svg_bytes(fig)
    return Drawn(png, svg if len(svg) < len(png) else None)


class Renderer:
    """Renders submitted figures in worker processes while the caller goes on working.

    `submit` returns a function that gives the PNG bytes, waiting for them if needed; `draw`
    one that gives the figure as a page shows it (Drawn). With one worker (or no fork on this
    platform) figures render in this process, lazily.
    """

    def __init__(self, workers: int | None = None, cache: FigureCache | None = None):
        self.cache = cache
        workers = workers or os.cpu_count() or 1
        # fork shares the already-imported matplotlib with the workers; where it is missing
        # (macOS, Windows) a spawn would re-import everything, which costs more than it saves.
        # Fonts load in each worker, in parallel: warming them up here first (so the workers
        # would share them) cost more wall time on two cores than it saved.
        parallel = workers > 1 and "fork" in multiprocessing.get_all_start_methods()
        self.pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) if parallel else None
        self.frozen = False

    def submit(self, job: FigureJob) -> Callable[[], bytes]:
        key = self.cache.key("png", job.draw, job.kwargs) if self.cache else None
        kept = self.cache.get(key) if key else None
        if kept is not None:
            return lambda: kept[0]
        rendered = self._submit(_render, job)
        return self._kept(key, rendered, lambda png: self.cache.put(key, png))

    def draw(self, job: FigureJob) -> Callable[[], Drawn]:
        key = self.cache.key("page", job.draw, job.kwargs) if self.cache else None
        kept = self.cache.get(key) if key else None
        if kept is not None:
            return lambda: Drawn(*kept)
        drawn = self._submit(_draw, job)
        return self._kept(key, drawn, lambda figure: self.cache.put(key, figure.png, figure.svg, page=True))

    @staticmethod
    def _kept(key: str | None, get: Callable[[], object], keep: Callable[[object], None]) -> Callable[[], object]:
        """`get`, keeping what it gives in the cache the first time (where it has a key)."""
        if key is None:
            return get
        done: list = []

        def get_and_keep():
            if not done:
                done.append(get())
                keep(done[0])
            return done[0]

        return get_and_keep

    def _submit(self, work: Callable[[FigureJob], object], job: FigureJob) -> Callable[[], object]:
        if self.pool is None:
            return lambda: work(job)
        if not self.frozen:
            # The first submit forks the workers. They share this process's memory until they
            # write to it, and a garbage collection writes to every object it scans: frozen,
            # the objects made so far are left out of collections (a tenth of a command's CPU).
            gc.freeze()
            self.frozen = True
        return self.pool.submit(work, job).result

    def __enter__(self) -> Renderer:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if self.cache is not None and exc_type is None:
            self.cache.prune()
        if self.pool is not None:
            # after an error nobody waits for the figures still being drawn
            self.pool.shutdown(wait=exc_type is None, cancel_futures=True)
        if self.frozen:
            gc.unfreeze()  # this process collects its garbage as before
