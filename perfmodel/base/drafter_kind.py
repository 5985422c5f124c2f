"""Who drafts the tokens a speculative step verifies: the Medusa heads, an EAGLE or EAGLE-3
head, a checkpoint's own MTP module(s), a draft model or n-gram lookup in the context. A str
(StrEnum): it prints, compares and writes to JSON as its name; code compares it with its
members, never with text."""

from __future__ import annotations

from enum import StrEnum


class DrafterKind(StrEnum):
    MEDUSA = "medusa"
    EAGLE = "eagle"
    DRAFT = "draft"
    EAGLE3 = "eagle3"
    MTP = "mtp"
    NGRAM = "ngram"


# The drafters that draft at the feature level, pass by pass, each pass one (or a few) decoder
# layer(s) and an LM head: their steps are EAGLE's (perfmodel.latency.eagle) with their own weights.
FEATURE_DRAFTERS = (DrafterKind.EAGLE, DrafterKind.EAGLE3, DrafterKind.MTP)
# The drafters that propose one path only (a chain): n-gram lookup and a draft model.
CHAIN_DRAFTERS = (DrafterKind.DRAFT, DrafterKind.NGRAM)
# The drafters without a shipped acceptance curve: priced and scheduled from a measured acceptance only.
MEASURED_ONLY = (DrafterKind.EAGLE3, DrafterKind.MTP, DrafterKind.NGRAM)


class DrafterChoice(StrEnum):
    """Which drafters a search prices: one kind, each band's best of the three simulated ones
    (best), or those three side by side (all)."""

    MEDUSA = "medusa"
    EAGLE = "eagle"
    DRAFT = "draft"
    EAGLE3 = "eagle3"
    MTP = "mtp"
    NGRAM = "ngram"
    BEST = "best"
    ALL = "all"
