"""Reading a tree ablation (the Medusa paper's Fig. 4, measured by decoder.ablation): how
much a dense tree gives up against the greedy sparse trees at the same number of candidates."""

from __future__ import annotations

import numpy as np
import pandas as pd


def dense_against_sparse(table: pd.DataFrame) -> pd.DataFrame:
    """Each dense tree inside the sparse trees' range of candidates against the sparse curve
    there (interpolated): relative tokens per step and speedup, measured."""
    sparse = table[table["kind"] == "sparse"].sort_values("nodes")
    dense = table[table["kind"] == "dense"]
    if not len(sparse):
        return pd.DataFrame(columns=["setting", "nodes", "acceptance_vs_sparse", "speedup_vs_sparse"])
    inside = dense[dense["nodes"].between(sparse["nodes"].min(), sparse["nodes"].max())]
    out = inside[["setting", "nodes"]].copy()
    for column in ("acceptance", "speedup"):
        curve = np.interp(inside["nodes"], sparse["nodes"], sparse[f"measured_{column}"])
        out[f"{column}_vs_sparse"] = inside[f"measured_{column}"].to_numpy() / curve - 1
    return out.sort_values("nodes").reset_index(drop=True)
