"""A serving engine's own speculative decoding, as profilers.engine measures it: none, the
model's Medusa heads, or n-gram lookup. A str (StrEnum): it prints, compares and writes to
JSON as its name; code compares it with its members, never with text."""

from __future__ import annotations

from enum import StrEnum


class EngineSpeculation(StrEnum):
    OFF = "off"
    MEDUSA = "medusa"
    NGRAM = "ngram"
