"""An engine's own tree parameters, read as the shape a point prices: SGLang's EAGLE trees.

SGLang sizes an EAGLE (EAGLE-3, MTP/NEXTN) step by three server arguments:
--speculative-num-steps S (draft passes), --speculative-eagle-topk K (nodes each pass expands
and children each keeps) and --speculative-num-draft-tokens N (tokens verified, the root
included, reranked from what the passes drafted). That is EAGLE-2's top-k expansion
(perfmodel.latency.eagle.DraftShape) of depth S and top-k K verifying N tokens. The S passes
draft K + (S - 1) K^2 candidates at most, so N is at most one more; with K = 1 the tree is a
chain and N is S + 1.
"""

from __future__ import annotations

from perfmodel.base.errors import PerfkitError
from perfmodel.latency.eagle import DraftShape

# The keys, as SGLang's server arguments name them (with or without the speculative_ prefix,
# dashes or underscores).
ENGINE_TREE_KEYS = ("num_steps", "eagle_topk", "num_draft_tokens")


def engine_tree(values) -> tuple[int, DraftShape]:
    """(tokens verified, the drafted tree's shape) from KEY=VALUE texts of ENGINE_TREE_KEYS."""
    given: dict[str, int] = {}
    for text in values:
        key, sep, value = str(text).partition("=")
        name = key.strip().lower().replace("-", "_").removeprefix("speculative_")
        if not sep or name not in ENGINE_TREE_KEYS:
            raise PerfkitError(
                f"--engine-tree {text!r}: not a tree parameter; give KEY=VALUE for each of "
                f"{', '.join(ENGINE_TREE_KEYS)} (SGLang's --speculative-num-steps, --speculative-eagle-topk, "
                "--speculative-num-draft-tokens)"
            )
        if not value.strip().isdigit() or int(value) < 1:
            raise PerfkitError(f"--engine-tree {text!r}: {name} is a whole number >= 1")
        given[name] = int(value)
    missing = [key for key in ENGINE_TREE_KEYS if key not in given]
    if missing:
        raise PerfkitError(f"--engine-tree: give {', '.join(missing)} too (each of {', '.join(ENGINE_TREE_KEYS)})")
    steps, top_k, tokens = (given[key] for key in ENGINE_TREE_KEYS)
    most = steps + 1 if top_k == 1 else 1 + top_k + (steps - 1) * top_k**2
    if not 2 <= tokens <= most:
        raise PerfkitError(
            f"--engine-tree num_draft_tokens={tokens}: {steps} step(s) of top-{top_k} draft at most {most - 1} "
            f"token(s), so 2 to {most} are verified (the root included)"
        )
    return tokens, DraftShape(depth=steps, top_k=top_k)
