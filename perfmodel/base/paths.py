"""Where the toolkit's own files are: its root, under which the shipped measurements and the
bundled model live (an editable checkout and an installed wheel alike)."""

from __future__ import annotations

from pathlib import Path

TOOLKIT_ROOT = Path(__file__).resolve().parents[2]
