"""The best chain length per batch for any drafter, from the per-position acceptance a team
measured, and the batch from which speculation stops paying.

A chain's per-position rates (vLLM's /metrics: of the drafts, the share accepted at position
j, every earlier one accepted too) give the tokens per step of every shorter chain too: a chain
of K drafts yields 1 + r_1 + ... + r_K (perfmodel.planning.drafter_point.tokens_per_step). So
for each batch the chain of K = 1 .. len(rates) drafts is priced (drafter_point), and the K of
the highest speedup kept; where none beats plain decoding (speedup <= 1) the answer is not to
speculate. The search is over the chain lengths the rates cover: a longer chain's acceptance is
not measured, and is not guessed.
"""

from __future__ import annotations

import pandas as pd

from perfmodel.latency.tensor_parallel import TensorParallelStep
from perfmodel.planning.drafter_point import DraftedShape, drafter_point, tokens_per_step
from perfmodel.planning.drafters import Drafter
from perfmodel.planning.simulations import loses_from

# The batches searched: a decode batch from one sequence to an engine's usual cap.
CHAIN_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CHAIN_CHOICE_COLUMNS = (
    "step",
    "drafter",
    "batch",
    "context",
    "chain",
    "acceleration",
    "plain_step_ms",
    "step_ms",
    "speedup",
    "ms_per_token",
    "speculate",
    "latency_model",
    "source",
)


def best_chains(
    steps: dict[str, TensorParallelStep], drafter: Drafter, rates, context: int, batches=CHAIN_BATCHES
) -> pd.DataFrame:
    """Per flavour in `steps` and batch, the chain of 1 .. len(rates) drafts of the highest
    speedup (rows of CHAIN_CHOICE_COLUMNS; chain 0 and speedup 1 where none pays)."""
    tokens_per_step(rates)  # the rates checked once, in one line
    rows = []
    for batch in batches:
        points = pd.concat(
            [
                drafter_point(steps, drafter, DraftedShape.of(None, k), batch, context, tokens_per_step(rates[:k]))
                for k in range(1, len(rates) + 1)
            ],
            ignore_index=True,
        )
        for flavor, chains in points.groupby("step", sort=False):
            best = chains.loc[chains["speedup"].idxmax()]
            pays = bool(best["speedup"] > 1)
            rows.append(
                {
                    "step": flavor,
                    "drafter": drafter.name,
                    "batch": batch,
                    "context": context,
                    "chain": int(best["draft_passes"]) if pays else 0,
                    "acceleration": float(best["acceleration"]) if pays else 1.0,
                    "plain_step_ms": float(best["plain_step_ms"]),
                    "step_ms": float(best["step_ms"]) if pays else float(best["plain_step_ms"]),
                    "speedup": float(best["speedup"]) if pays else 1.0,
                    "ms_per_token": float(best["ms_per_token"]) if pays else float(best["plain_step_ms"]),
                    "speculate": pays,
                    "latency_model": best["latency_model"],
                    "source": "predicted",
                }
            )
    return pd.DataFrame(rows, columns=list(CHAIN_CHOICE_COLUMNS))


def chain_lines(rows: pd.DataFrame) -> list[str]:
    """Per flavour: the best chain and its speedup per batch, and where speculation stops."""
    lines = []
    for flavor, part in rows.groupby("step", sort=False):
        lost = loses_from(part, "batch")
        cells = [
            f"b={r.batch} K={r.chain} {r.speedup:.2f}x" if r.speculate else f"b={r.batch} do not speculate"
            for r in part.sort_values("batch").itertuples()
            if lost is None or r.batch < lost
        ]
        if lost is not None:
            cells.append(f"do not speculate from batch {lost} on")
        lines.append(f"  {flavor}: " + ", ".join(cells))
    return lines
