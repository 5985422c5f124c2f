"""The bounds a model's shapes are checked against when a ModelConfig is made: one line
naming the field and what is allowed, before anything is priced with it."""

from __future__ import annotations

import dataclasses

from perfmodel.base.checks import is_count
from perfmodel.base.errors import PerfkitError

# Bounds on a config's sizes, far past any model's (hidden sizes of tens of thousands, vocabularies
# of a few hundred thousand tokens, contexts of a few million): costs multiply three of them in
# 64-bit integers, which a 2^40 hidden size overflows.
MAX_DIMENSION = 2**20
MAX_HEADS = 64
MAX_CONTEXT = 2**24


def check_shape(model) -> None:
    """One line for a ModelConfig field out of its bounds (its int fields: counted ones, the
    Medusa heads and MTP modules, from 0 to MAX_HEADS, sizes from 1 to MAX_DIMENSION)."""
    if not isinstance(model.tie_word_embeddings, bool):
        raise PerfkitError(
            f"model {model.name}: tie_word_embeddings must be true or false, got {model.tie_word_embeddings!r}"
        )
    context = model.max_context
    if context is not None and not is_count(context):
        raise PerfkitError(f"model {model.name}: max_context must be an integer >= 1 or None, got {context!r}")
    if context is not None and context > MAX_CONTEXT:
        raise PerfkitError(f"model {model.name}: max_context must be at most {MAX_CONTEXT:,}, got {context!r}")
    for f in dataclasses.fields(model):
        value = getattr(model, f.name)
        if f.type != "int":
            continue
        counted = f.name in ("medusa_heads", "mtp_layers")
        smallest = 0 if counted else 1
        largest = MAX_HEADS if counted else MAX_DIMENSION
        if not is_count(value, smallest) or value > largest:
            raise PerfkitError(
                f"model {model.name}: {f.name} must be an integer from {smallest} to {largest:,}, got {value!r}"
            )
    moe_layers = model.moe.moe_layers if model.moe is not None else 0
    windowed = model.window.layers if model.window is not None else 0
    for part, counted in (("expert", moe_layers), ("windowed", windowed)):
        if counted > model.num_layers:
            raise PerfkitError(f"model {model.name}: {counted} {part} layers of its {model.num_layers}")
    if model.num_heads % model.num_kv_heads:
        raise PerfkitError(
            f"model {model.name}: num_heads ({model.num_heads}) must be a multiple of num_kv_heads "
            f"({model.num_kv_heads})"
        )
