"""The tree a decoder should run: the performance model's best tree size from measured step
times and the heads' accuracies, or none where no tree beats plain decoding.

speedup(n) = acceptance(n) x T(1) / T(n), with T(n) the measured time of a decoding step
with a tree of n tokens (root included; n = 1 is plain decoding) at the decoder's batch and
context, and acceptance(n) the expected tokens per step of the greedy tree of n tokens built
from the heads' top-k accuracies (perfmodel.acceptance.trees). The best size is picked by the same rule
as every other best tree (perfmodel.planning.simulations.pick_best).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from perfmodel.acceptance.trees import Tree, expected_acceptance, greedy_tree
from perfmodel.base.errors import PerfkitError
from perfmodel.planning.simulations import pick_best


@dataclass(frozen=True)
class TreeChoice:
    """The chosen size (1: decode plainly), its predicted speedup, and the table behind it."""

    size: int
    speedup: float
    table: pd.DataFrame = field(repr=False)  # tree_size, step_s, acceptance, speedup
    latency: str = ""  # where the step times come from
    margin: float = 0.0  # how far a tree had to beat plain decoding to be chosen (a share)

    @property
    def speculate(self) -> bool:
        return self.size > 1

    def tree(self, accuracy) -> Tree | None:
        """The greedy tree of the chosen size, or None for plain decoding."""
        return greedy_tree(np.asarray(accuracy), self.size - 1) if self.speculate else None

    def describe(self) -> str:
        if not self.speculate:
            best = self.table[self.table["tree_size"] > 1].sort_values("speedup").iloc[-1]
            by = f" by more than {self.margin:.0%}" if self.margin else ""
            return (
                f"decoding plainly: no tree beats it{by} (the best, {int(best['tree_size'])} tokens, is predicted at "
                f"{best['speedup']:.2f}x) [{self.latency}]"
            )
        return f"tree of {self.size} tokens, predicted {self.speedup:.2f}x plain decoding [{self.latency}]"


def choose_tree(
    step_times: Mapping[int, float],
    accuracy,
    latency: str = "",
    batch_efficiency: Mapping[int, float] | None = None,
    margin: float = 0.0,
) -> TreeChoice:
    """The best tree size among those timed. step_times: tree size -> seconds per step, with
    size 1 (plain decoding) among them. accuracy: (heads, topk) head accuracies.
    batch_efficiency: tree size -> the share of the accepted tokens a batch turns into
    progress (a batch steps until its slowest sequence is done, so sequences that accept
    more wait; 1 at batch 1), as measured; it scales the acceptance. margin: how far (a
    share) the best tree's predicted speedup must exceed 1 to be chosen over plain decoding,
    for step times measured no closer than that."""
    if not (np.isfinite(margin) and 0 <= margin < 1):
        raise PerfkitError(f"margin must be a share in [0, 1), got {margin}")
    if 1 not in step_times:
        raise PerfkitError(f"the step times need plain decoding (tree size 1); got sizes {sorted(step_times)}")
    accuracy = np.asarray(accuracy, dtype=float)
    sizes = np.array(sorted(step_times), dtype=np.int64)
    if (sizes < 1).any() or not all(np.isfinite(step_times[n]) and step_times[n] > 0 for n in sizes):
        raise PerfkitError(f"step times must be positive seconds per tree size >= 1, got {dict(step_times)}")
    acceptance = np.array(
        [1.0 if n == 1 else expected_acceptance(greedy_tree(accuracy, n - 1), accuracy) for n in sizes]
    )
    if batch_efficiency is not None:
        acceptance = acceptance * np.array([batch_efficiency.get(int(n), 1.0) if n > 1 else 1.0 for n in sizes])
    step = np.array([step_times[n] for n in sizes], dtype=float)
    table = pd.DataFrame(
        {
            "batch": 0,
            "tree_size": sizes,
            "step_s": step,
            "acceptance": acceptance,
            "speedup": acceptance * step[0] / step,
        }
    )
    best = pick_best(table, ["batch"]).iloc[0]
    if best["speedup"] <= 1 + margin:
        best = table.iloc[0]  # plain decoding: no tree is predicted faster by more than the margin
    return TreeChoice(int(best["tree_size"]), float(best["speedup"]), table.drop(columns="batch"), latency, margin)
