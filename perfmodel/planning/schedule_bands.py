"""A speculation schedule's grid and bands: the batches and contexts it is evaluated at, the
best choice per cell, and the cells merged into bands by the floor rule (perfmodel.planning.schedule's
module doc).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfmodel.planning.medusa_setting import MedusaSetting
from perfmodel.planning.schedule_format import ScheduleBand
from perfmodel.planning.simulations import pick_best

DEFAULT_MAX_BATCH = 256
DEFAULT_CONTEXTS = (512, 1024, 2048, 4096, 8192, 16384)


def default_batches(max_batch: int = DEFAULT_MAX_BATCH) -> np.ndarray:
    """Every power of two up to max_batch, and max_batch itself."""
    powers = 2 ** np.arange(int(np.log2(max_batch)) + 1)
    return np.union1d(powers, [max_batch]).astype(np.int64)


def default_contexts(max_context: int | None) -> np.ndarray:
    """DEFAULT_CONTEXTS within the model's trained context (that context itself where it is
    shorter than the first)."""
    if max_context is None:
        return np.array(DEFAULT_CONTEXTS, dtype=np.int64)
    kept = [c for c in DEFAULT_CONTEXTS if c <= max_context]
    return np.array(kept or [max_context], dtype=np.int64)


def best_cells(table: pd.DataFrame, medusa: str) -> pd.DataFrame:
    """The chosen row per (batch, seq_len): pick_best among the sizes `medusa` allows, in
    (batch, seq_len) order."""
    eligible = None
    if medusa != MedusaSetting.AUTO:
        eligible = table["tree_size"] > 1 if medusa == MedusaSetting.ON else table["tree_size"] == 1
    if medusa == MedusaSetting.ON and not eligible.any():
        eligible = None  # nothing but plain decoding to choose from (a model without heads)
    best = pick_best(table, eligible=eligible)
    return best.sort_values(["batch", "seq_len"], kind="stable").reset_index(drop=True)


def grid_ranges(grid: np.ndarray) -> list[tuple[int, int]]:
    """The floor rule: (low, high) each grid point stands for."""
    lows = [1, *grid[1:].tolist()]
    highs = [*(grid[1:] - 1).tolist(), int(grid[-1])]
    return list(zip(lows, highs))


def runs(values: list) -> list[tuple[int, int]]:
    """(first, last) index of each run of equal consecutive values."""
    out, start = [], 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[start]:
            out.append((start, i - 1))
            start = i
    return out


Choice = tuple[str, int]  # what a cell runs: (drafter or OFF, tree size)


def merge_bands(
    chosen: list[list[Choice]], speedups: np.ndarray, batches, contexts, drafted: dict[Choice, dict], evidence: str
) -> list[ScheduleBand]:
    """Bands from the grid's (batch x context) choices: runs of one drafter and tree along
    batch per context, then neighbouring contexts with the same runs merged. drafted: each
    choice's band fields (drafted_fields)."""
    batch_span, context_span = grid_ranges(batches), grid_ranges(contexts)
    columns = [tuple((a, b, chosen[a][c]) for a, b in runs([row[c] for row in chosen])) for c in range(len(contexts))]
    bands = []
    for first, last in runs(columns):
        for a, b, choice in columns[first]:
            bands.append(
                ScheduleBand(
                    batch_span[a][0],
                    batch_span[b][1],
                    context_span[first][0],
                    context_span[last][1],
                    speedup=float(speedups[a : b + 1, first : last + 1].min()),
                    evidence=evidence,
                    **drafted[choice],
                )
            )
    return bands
