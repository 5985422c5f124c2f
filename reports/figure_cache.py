"""Figures already drawn, kept by what they show: a rebuild draws again only the figures whose
data, drawing code or matplotlib changed.

A figure's key hashes how it is rendered (a PNG, or a page's PNG and SVG), its drawing
function's name, its arguments as pickled, matplotlib's version and settings, and the source
of the packages that compute and draw figures (perfmodel, reports). Drawing is deterministic
(the SVG's ids come from a fixed salt, no dates are written), so an equal key gives the bytes
drawing would give. Arguments that cannot be pickled are drawn every time.

The cache lives in $MEDUSA_PERFKIT_FIGURES, else beside the measurements
($MEDUSA_PERFKIT_HOME/figures, ~/.cache/medusa-perfkit/figures by default);
MEDUSA_PERFKIT_FIGURES=off draws every figure. It keeps the most recently used figures up to
LIMIT_BYTES.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import matplotlib

from perfmodel.measured.store import user_measurements_dir

FOLDER_VARIABLE = "MEDUSA_PERFKIT_FIGURES"
OFF = "off"
LIMIT_BYTES = 256 * 2**20
# What a page keeps of a figure: its PNG, and its SVG where that is the smaller (an empty
# .svg file records that it is not).
PNG, SVG = ".png", ".svg"
SOURCE_PACKAGES = ("perfmodel", "reports")


@cache
def code_fingerprint() -> str:
    """A hash of what draws figures: matplotlib's version and settings, and the sources of
    SOURCE_PACKAGES as installed (an edit to either makes every key new)."""
    digest = hashlib.sha256(f"matplotlib {matplotlib.__version__}\n".encode())
    digest.update(repr(sorted((k, repr(v)) for k, v in matplotlib.rcParams.items())).encode())
    root = Path(__file__).resolve().parents[1]
    for package in SOURCE_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


@dataclass(frozen=True)
class FigureCache:
    folder: Path
    limit_bytes: int = LIMIT_BYTES

    def key(self, kind: str, draw, kwargs: dict) -> str | None:
        """The key of draw(**kwargs) rendered as `kind`; None where its arguments cannot be
        pickled (such a figure is drawn every time)."""
        try:
            arguments = pickle.dumps(kwargs, protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, TypeError, AttributeError):
            return None
        digest = hashlib.sha256()
        for part in (kind, draw.__module__, draw.__qualname__, code_fingerprint()):
            digest.update(part.encode() + b"\0")
        digest.update(arguments)
        return digest.hexdigest()

    def get(self, key: str) -> tuple[bytes, bytes | None] | None:
        """A kept figure's PNG and, where kept, its SVG (None where the page keeps none or the
        figure was rendered as a PNG only); None where the key is not kept."""
        png, svg = self.folder / (key + PNG), self.folder / (key + SVG)
        try:
            png_bytes = png.read_bytes()
            svg_bytes = svg.read_bytes() if svg.exists() else None
        except OSError:
            return None
        os.utime(png)  # most recently used: the last to be pruned
        return png_bytes, svg_bytes or None

    def put(self, key: str, png: bytes, svg: bytes | None = None, page: bool = False) -> None:
        """Keep a figure (a page's: with its SVG, or an empty .svg where it keeps none). The PNG
        is written last: a key whose PNG exists is complete. A cache that cannot be written is
        skipped (the figure was drawn; only the next build's saving is lost)."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            if page:
                self._write(self.folder / (key + SVG), svg or b"")
            self._write(self.folder / (key + PNG), png)
        except OSError:
            pass

    def prune(self) -> None:
        """Delete the least recently used figures past limit_bytes."""
        try:
            pngs = sorted(self.folder.glob("*" + PNG), key=lambda p: p.stat().st_mtime, reverse=True)
            total = 0
            for png in pngs:
                svg = png.with_suffix(SVG)
                total += png.stat().st_size + (svg.stat().st_size if svg.exists() else 0)
                if total > self.limit_bytes:
                    _remove((png, svg))
        except OSError:
            pass  # another build pruned or wrote at the same time: the next prune sees it

    @staticmethod
    def _write(path: Path, data: bytes) -> None:
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=path.suffix)
        try:
            with os.fdopen(handle, "wb") as file:
                file.write(data)
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise


def _remove(paths: Iterable[Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


def figure_cache() -> FigureCache | None:
    """The cache the environment names (module doc); None where it is off."""
    named = os.environ.get(FOLDER_VARIABLE)
    if named is not None and named.strip().lower() in (OFF, ""):
        return None
    return FigureCache(Path(named).expanduser() if named else user_measurements_dir().parent / "figures")
