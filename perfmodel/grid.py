"""Sweep grids over (batch, sequence length, candidates), and iteration over their points."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodel.errors import PerfkitError
from perfmodel.models import ModelConfig
from perfmodel.operators import ALL_OPS, OPS, PHASES


@dataclass(frozen=True)
class Grid:
    batches: tuple[int, ...]
    seq_lens: tuple[int, ...]
    candidates: tuple[int, ...]

    def __post_init__(self) -> None:
        for name in ("batches", "seq_lens", "candidates"):
            values = getattr(self, name)
            if not values:
                raise PerfkitError(f"grid {name} is empty")
            bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int) or v < 1]
            if bad:
                raise PerfkitError(f"grid {name} must be positive integers, got {bad[0]!r}")

    def narrowed(self, batches=None, seq_lens=None, candidates=None) -> Grid:
        """This grid with any given axis replaced (sorted, duplicates dropped)."""
        pick = lambda new, old: tuple(sorted(set(new))) if new else old  # noqa: E731
        return Grid(pick(batches, self.batches), pick(seq_lens, self.seq_lens), pick(candidates, self.candidates))

    def points(self, phase: str):
        """(batch, seq_len, candidates) for every setting of `phase`; only `tree` varies candidates."""
        cands = self.candidates if phase == "tree" else (1,)
        return [(b, s, q) for b in self.batches for s in self.seq_lens for q in cands]


# Paper Appendix G: batch 1..64 and sequence 128..8192 in powers of two (49 settings per
# op); candidates {1, 16, ..., 112} for Medusa tree decoding.
PAPER_GRID = Grid(
    batches=tuple(2**k for k in range(7)),
    seq_lens=tuple(2**k for k in range(7, 14)),
    candidates=(1, 16, 32, 48, 64, 80, 96, 112),
)

# A few settings of each axis, chosen so a whole sweep of a 7B model finishes in a few
# minutes on a small CPU: prefill at most 1024 tokens, decode and tree at the same (b, s).
QUICK_GRID = Grid(batches=(1, 2), seq_lens=(128, 512), candidates=(1, 16, 64))


def iter_blocks(model: ModelConfig, grid: Grid = PAPER_GRID, ops=OPS, phases=PHASES):
    """(op, phase, points) per op and phase; points is an int64 array of (batch, seq_len,
    candidates) rows. Ops the model lacks (medusa_heads with no heads) are left out."""
    for op in ops:
        if op not in ALL_OPS:
            raise PerfkitError(f"unknown op {op!r}; choose from: {', '.join(ALL_OPS)}")
        if op == "medusa_heads" and model.medusa_heads == 0:
            continue
        for phase in phases:
            if phase not in PHASES:
                raise PerfkitError(f"unknown phase {phase!r}; choose from: {', '.join(PHASES)}")
            yield op, phase, np.array(grid.points(phase), dtype=np.int64).reshape(-1, 3)


def iter_points(model: ModelConfig, grid: Grid = PAPER_GRID, ops=OPS, phases=PHASES):
    """(op, phase, batch, seq_len, candidates) for every grid point, as Python ints."""
    for op, phase, points in iter_blocks(model, grid, ops, phases):
        for b, s, q in points.tolist():
            yield op, phase, b, s, q
