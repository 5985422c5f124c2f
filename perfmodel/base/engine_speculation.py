"""A serving engine's own speculative decoding, as profilers.engine measures it: none, the
model's Medusa heads, its EAGLE drafter (in vLLM's layout), or n-gram lookup. A str
(StrEnum): it prints, compares and writes to JSON as its name; code compares it with its
members, never with text."""

from __future__ import annotations

from enum import StrEnum


class EngineSpeculation(StrEnum):
    OFF = "off"
    MEDUSA = "medusa"
    EAGLE = "eagle"
    NGRAM = "ngram"


# EAGLE's and n-gram's draft length: as many tokens as the bundled model's four Medusa heads propose
DRAFT_TOKENS = 4
