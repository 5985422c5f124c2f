"""Medusa speedup: acceleration rate over step overhead, and the best tree size.

speedup(n) = acc(n) / (T_step(n) / T_step(1)) for a tree of n tokens (root included), a
step model (perfmodel.step) and an acceptance model (perfmodel.acceptance). n = 1 is plain
decoding (speedup 1); where no n > 1 beats it, the answer is "do not speculate".
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfmodel.errors import PerfkitError
from perfmodel.step import StepModel

# Tree sizes searched for the optimum: dense where trees are common, up to 256 tokens.
CANDIDATE_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256)


def speedup_table(step: StepModel, acceptance, batch, seq_len, sizes=CANDIDATE_SIZES) -> pd.DataFrame:
    """One row per (batch, seq_len, tree size): step times, overhead, acceptance, speedup.

    batch and seq_len are ints or 1-D sequences; every combination with every size is
    evaluated in one vectorised pass.
    """
    batches = np.atleast_1d(np.asarray(batch, dtype=np.int64))
    seqs = np.atleast_1d(np.asarray(seq_len, dtype=np.int64))
    sizes = np.atleast_1d(np.asarray(sizes, dtype=np.int64))
    if (sizes < 1).any():
        raise PerfkitError(f"tree sizes must be >= 1, got {sizes.min()}")
    b, s, n = (a.ravel() for a in np.meshgrid(batches, seqs, sizes, indexing="ij"))
    plain = step.step_time(b, s, 1)
    medusa = np.where(n > 1, step.step_time(b, s, n), plain)
    acc = np.where(n > 1, acceptance(n), 1.0)
    overhead = medusa / plain
    return pd.DataFrame(
        {
            "batch": b,
            "seq_len": s,
            "tree_size": n,
            "plain_step_s": plain,
            "medusa_step_s": medusa,
            "overhead": overhead,
            "acceptance": acc,
            "speedup": acc / overhead,
            "tokens_per_s_per_seq": acc / medusa,
        }
    )


def best_sizes(table: pd.DataFrame) -> pd.DataFrame:
    """The best tree size per (batch, seq_len) of a speedup_table; `speculate` is False
    (best size 1, speedup 1) where no tree beats plain decoding."""
    idx = table.groupby(["batch", "seq_len"])["speedup"].idxmax()
    best = table.loc[idx].reset_index(drop=True)
    best["speculate"] = (best["tree_size"] > 1) & (best["speedup"] > 1.0)
    return best


def verdict(row) -> str:
    """A sentence a person can act on, for one row of best_sizes."""
    if not row["speculate"]:
        return f"batch {row['batch']}, context {row['seq_len']}: do not speculate (no tree beats plain decoding)"
    return (
        f"batch {row['batch']}, context {row['seq_len']}: tree of {row['tree_size']} tokens, "
        f"{row['acceptance']:.2f} tokens/step at {row['overhead']:.2f}x step time -> {row['speedup']:.2f}x"
    )
