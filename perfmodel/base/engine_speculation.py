"""A serving engine's own speculative decoding, as profilers.engine measures it: none, the
model's Medusa heads, its EAGLE drafter (in vLLM's layout), its draft model, or n-gram lookup. A str
(StrEnum): it prints, compares and writes to JSON as its name; code compares it with its
members, never with text."""

from __future__ import annotations

from enum import StrEnum


class EngineSpeculation(StrEnum):
    OFF = "off"
    MEDUSA = "medusa"
    EAGLE = "eagle"
    DRAFT = "draft"
    NGRAM = "ngram"


# vLLM's speculative_config `method` of each
VLLM_METHODS = {
    EngineSpeculation.MEDUSA: "medusa",
    EngineSpeculation.EAGLE: "eagle",
    EngineSpeculation.DRAFT: "draft_model",
    EngineSpeculation.NGRAM: "ngram",
}


# EAGLE's, a draft model's and n-gram's draft length: as many tokens as the bundled model's four Medusa heads propose
DRAFT_TOKENS = 4
