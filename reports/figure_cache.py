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

Each kept figure has a record (KEY.json, written last) of its files' sizes and SHA-256: a
file cut short (a full disk) or changed since is found when read back, and the figure is
drawn again rather than embedded broken.
"""

from __future__ import annotations

import hashlib
import json
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
RECORD = ".json"  # the sizes and hashes of a kept figure's files
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
        figure was rendered as a PNG only); None where the key is not kept, or its files are
        not what its record says (the figure is drawn again, and put() keeps it whole)."""
        paths = self._paths(key)
        try:
            record = json.loads(paths[RECORD].read_bytes())
            if not isinstance(record, dict) or PNG not in record or not set(record) <= {PNG, SVG}:
                return None
            kept = {suffix: paths[suffix].read_bytes() for suffix in record}
        except (OSError, ValueError):
            return None
        if record != _record(kept):
            return None
        os.utime(paths[PNG])  # most recently used: the last to be pruned
        return kept[PNG], kept.get(SVG) or None

    def put(self, key: str, png: bytes, svg: bytes | None = None, page: bool = False) -> None:
        """Keep a figure (a page's: with its SVG, or an empty .svg where it keeps none). The
        record is written last: a key whose record exists is complete. A cache that cannot be
        written is skipped (the figure was drawn; only the next build's saving is lost)."""
        paths = self._paths(key)
        kept = {PNG: png, **({SVG: svg or b""} if page else {})}
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            for suffix, data in kept.items():
                self._write(paths[suffix], data)
            self._write(paths[RECORD], json.dumps(_record(kept), sort_keys=True).encode())
        except OSError:
            pass

    def _paths(self, key: str) -> dict[str, Path]:
        return {suffix: self.folder / (key + suffix) for suffix in (PNG, SVG, RECORD)}

    def prune(self) -> None:
        """Delete the least recently used figures past limit_bytes."""
        try:
            pngs = sorted(self.folder.glob("*" + PNG), key=lambda p: p.stat().st_mtime, reverse=True)
            total = 0
            for png in pngs:
                svg = png.with_suffix(SVG)
                total += png.stat().st_size + (svg.stat().st_size if svg.exists() else 0)
                if total > self.limit_bytes:
                    _remove((png, svg, png.with_suffix(RECORD)))
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


def _record(files: dict[str, bytes]) -> dict[str, list]:
    """What a kept figure's files must be read back as: each one's size and SHA-256."""
    return {suffix: [len(data), hashlib.sha256(data).hexdigest()] for suffix, data in files.items()}


def figure_cache() -> FigureCache | None:
    """The cache the environment names (module doc); None where it is off."""
    named = os.environ.get(FOLDER_VARIABLE)
    if named is not None and named.strip().lower() in (OFF, ""):
        return None
    return FigureCache(Path(named).expanduser() if named else user_measurements_dir().parent / "figures")
