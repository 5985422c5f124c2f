"""Layers that attend to a sliding window of the last tokens only: gpt-oss alternates them with
layers attending to the whole context (its config.json's `layer_types`, `sliding_window`).

A windowed layer's attention reads at most `tokens` cached keys and values (the step's own
tokens besides), its KV cache holds at most that many, and its prefill runs the prompt in
windows. A window over every layer without `layer_types` (Mistral-7B v0.1's) is still refused
(perfmodel.models.unpriced): nothing here has checked it against an engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfmodel.base.checks import is_count
from perfmodel.base.errors import PerfkitError

SLIDING = "sliding_attention"


@dataclass(frozen=True)
class SlidingWindow:
    tokens: int  # the window: keys each query of a windowed layer attends to
    layers: int  # layers that attend to it (the rest attend to the whole context)

    def __post_init__(self) -> None:
        for name in ("tokens", "layers"):
            if not is_count(getattr(self, name)):
                raise PerfkitError(f"sliding window: {name} must be an integer >= 1, got {getattr(self, name)!r}")


def parse_window(cfg: dict, source: object) -> SlidingWindow | None:
    """The windowed layers a config.json lists in `layer_types` (None where it lists none)."""
    kinds = cfg.get("layer_types")
    if not isinstance(kinds, list) or SLIDING not in kinds:
        return None
    window = cfg.get("sliding_window")
    if not is_count(window):
        raise PerfkitError(f"{source}: layer_types names {SLIDING} layers but sliding_window is {window!r}")
    if len(kinds) != cfg.get("num_hidden_layers"):
        raise PerfkitError(f"{source}: layer_types lists {len(kinds)} layers of {cfg.get('num_hidden_layers')}")
    return SlidingWindow(window, kinds.count(SLIDING))


def kv_share(window: SlidingWindow | None, layers: int, tokens):
    """The share of a sequence's KV cache the layers keep over `tokens` cached tokens, against
    every layer keeping all of them: the windowed ones keep the last window's only."""
    if window is None:
        return 1.0
    kept = window.tokens / max(tokens, window.tokens)
    return (layers - window.layers + window.layers * kept) / layers
