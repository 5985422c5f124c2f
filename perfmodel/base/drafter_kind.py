"""Who drafts the tokens a speculative step verifies: the Medusa heads, an EAGLE head or a
draft model. A str (StrEnum): it prints, compares and writes to JSON as its name; code
compares it with its members, never with text."""

from __future__ import annotations

from enum import StrEnum


class DrafterKind(StrEnum):
    MEDUSA = "medusa"
    EAGLE = "eagle"
    DRAFT = "draft"


class DrafterChoice(StrEnum):
    """Which drafters a search prices: one kind, each band's best of the three (best), or every
    kind side by side (all)."""

    MEDUSA = "medusa"
    EAGLE = "eagle"
    DRAFT = "draft"
    BEST = "best"
    ALL = "all"
