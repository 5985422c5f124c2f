"""Where the shipped checkpoint configs are (perfmodel/models/checkpoints/SOURCES.md says whose
each is): the drafters and targets the speculation commands and the published check price."""

from __future__ import annotations

from pathlib import Path

CHECKPOINTS = Path(__file__).resolve().parent / "checkpoints"
