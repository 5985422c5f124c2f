"""Sweep grids over (batch, sequence length, candidates), and iteration over their points.

Linear ops (`LINEAR_OPS`: one GEMM against a weight) take time that depends on the token
count alone, and real GEMM latency is a staircase in it (cuBLAS changes tile and kernel
every few tokens). A grid may carry `linear_tokens`, token counts at which linear ops are
also measured; they are points the grid already has a form for: prefill of one sequence
of that many tokens, (batch 1, seq_len = tokens, candidates 1), the same (tokens x k)
GEMM a decode step of `tokens` sequences or a tree step of batch x candidates = tokens
runs. `fine_token_grid` is their one definition.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from perfmodel.errors import PerfkitError
from perfmodel.models import ModelConfig
from perfmodel.operators import ALL_OPS, LINEAR_OPS, OPS, PHASES


@dataclass(frozen=True)
class Grid:
    batches: tuple[int, ...]
    seq_lens: tuple[int, ...]
    candidates: tuple[int, ...]
    # Extra token counts for linear ops, measured as prefill rows (1, tokens, 1); none by default.
    linear_tokens: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("batches", "seq_lens", "candidates", "linear_tokens"):
            values = getattr(self, name)
            if not values and name != "linear_tokens":
                raise PerfkitError(f"grid {name} is empty")
            bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int) or v < 1]
            if bad:
                raise PerfkitError(f"grid {name} must be positive integers, got {bad[0]!r}")

    def narrowed(self, batches=None, seq_lens=None, candidates=None) -> Grid:
        """This grid with any given axis replaced (sorted, duplicates dropped)."""
        pick = lambda new, old: tuple(sorted(set(new))) if new else old  # noqa: E731
        return Grid(
            pick(batches, self.batches),
            pick(seq_lens, self.seq_lens),
            pick(candidates, self.candidates),
            self.linear_tokens,
        )

    def with_fine_tokens(self, fine: bool = True) -> Grid:
        """This grid with linear ops also at `fine_token_grid` up to its longest sequence
        (fine), or at its (batch, seq_len) settings only (not fine). Token counts beyond
        the longest sequence are the grid's own batch x seq_len points."""
        return replace(self, linear_tokens=fine_token_grid(max(self.seq_lens)) if fine else ())

    def points(self, phase: str, op: str | None = None):
        """(batch, seq_len, candidates) for every setting of `phase`, sorted; only `tree`
        varies candidates. A linear `op` in prefill also gets (1, t, 1) for each of the
        grid's `linear_tokens` t."""
        cands = self.candidates if phase == "tree" else (1,)
        points = [(b, s, q) for b in self.batches for s in self.seq_lens for q in cands]
        if phase == "prefill" and op in LINEAR_OPS and self.linear_tokens:
            points = sorted(set(points) | {(1, t, 1) for t in self.linear_tokens})
        return points


# Where GEMM latency steps: cuBLAS picks its tile and kernel by the token count, and the
# steps fall on multiples of 8 tokens (a 4096 x 22016 fp16 GEMM on an A100: ~116 us for
# 1-64 tokens, 125 us at 72, 150-157 us for 88-128, 205 us at 136). Past a few hundred
# tokens GEMMs are compute-bound and the steps are small against the time, so powers of two
# suffice there.
FINE_TOKEN_STEP = 8
FINE_TOKENS_UP_TO = 512


def fine_token_grid(largest: int) -> tuple[int, ...]:
    """Token counts at which to time linear ops: 1, 2 and 4 (the decode end), every 8 up to
    512 (8, 16, ..., 512), then powers of two (1024, 2048, ...); none above `largest`."""
    if isinstance(largest, bool) or not isinstance(largest, int) or largest < 1:
        raise PerfkitError(f"the fine token grid's largest token count must be a positive integer, got {largest!r}")
    fine = {1, 2, 4, *range(FINE_TOKEN_STEP, FINE_TOKENS_UP_TO + 1, FINE_TOKEN_STEP)}
    powers = {2**k for k in range(FINE_TOKENS_UP_TO.bit_length(), largest.bit_length())}
    return tuple(sorted(t for t in fine | powers if t <= largest))


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
    candidates) rows (Grid.points: linear ops in prefill include the grid's linear_tokens).
    Ops the model lacks (medusa_heads with no heads) are left out."""
    for op in ops:
        if op not in ALL_OPS:
            raise PerfkitError(f"unknown op {op!r}; choose from: {', '.join(ALL_OPS)}")
        if op == "medusa_heads" and model.medusa_heads == 0:
            continue
        for phase in phases:
            if phase not in PHASES:
                raise PerfkitError(f"unknown phase {phase!r}; choose from: {', '.join(PHASES)}")
            yield op, phase, np.array(grid.points(phase, op), dtype=np.int64).reshape(-1, 3)


def iter_points(model: ModelConfig, grid: Grid = PAPER_GRID, ops=OPS, phases=PHASES):
    """(op, phase, batch, seq_len, candidates) for every grid point, as Python ints."""
    for op, phase, points in iter_blocks(model, grid, ops, phases):
        for b, s, q in points.tolist():
            yield op, phase, b, s, q
