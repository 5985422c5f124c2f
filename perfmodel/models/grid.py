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

import math
from dataclasses import dataclass, replace

import numpy as np

from perfmodel.base.checks import is_count
from perfmodel.base.dtypes import ELEMENT_BYTES
from perfmodel.base.errors import PerfkitError
from perfmodel.models.config import ModelConfig
from perfmodel.models.operators import ALL_OPS, LINEAR_OPS, OPS, PHASES, Phase, cost_of, op_kernels


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
            bad = [v for v in values if not is_count(v)]
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
        cands = self.candidates if phase == Phase.TREE else (1,)
        points = [(b, s, q) for b in self.batches for s in self.seq_lens for q in cands]
        if phase == Phase.PREFILL and op in LINEAR_OPS and self.linear_tokens:
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
    if not is_count(largest):
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


# Costs are computed for many grid points at once in numpy's int64, which wraps around
# silently: a FLOP count past 2^63 comes out negative, and the figures' axes NaN.
INT64_MAX = int(np.iinfo(np.int64).max)
WIDEST_DTYPE = max(ELEMENT_BYTES, key=ELEMENT_BYTES.get)  # bytes are checked at the widest element


def largest_point(grid: Grid, op: str, phase: str) -> tuple[int, int, int]:
    """The grid point of `op` in `phase` with the largest cost: every cost grows with
    batch, sequence length and candidates."""
    seq_lens = grid.seq_lens + (grid.linear_tokens if phase == Phase.PREFILL and op in LINEAR_OPS else ())
    return max(grid.batches), max(seq_lens), max(grid.candidates) if phase == Phase.TREE else 1


def cost_fits(op: str, phase: str, model: ModelConfig, b: int, s: int, q: int) -> bool:
    """Whether int64 arithmetic costs this point exactly (it agrees with Python's ints)."""
    if max(b, s, q) > INT64_MAX:
        return False
    exact = cost_of(op_kernels(op, phase, model, b, s, q), WIDEST_DTYPE)
    if max(exact.flops, exact.bytes) > INT64_MAX:
        return False
    wide = cost_of(op_kernels(op, phase, model, *(np.array([v], dtype=np.int64) for v in (b, s, q))), WIDEST_DTYPE)
    # an overflow wraps around, far from the exact count; an MoE layer's expected bytes are fractional
    with np.errstate(over="ignore"):
        return all(
            math.isclose(float(got[0]), float(want), rel_tol=1e-9)
            for got, want in ((wide.flops, exact.flops), (wide.bytes, exact.bytes))
        )


def largest_fitting(fits, low: int, high: int) -> int | None:
    """The largest n in [low, high] with fits(n), where fits holds up to some n and not
    past it; None if it holds nowhere."""
    high = min(high, INT64_MAX)
    if low > high or not fits(low):
        return None
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    return low


def failing_point(model: ModelConfig, grid: Grid, ops, phases) -> tuple[str, str, int, int, int] | None:
    """The first (op, phase, b, s, q) whose cost at the grid's largest point does not fit int64."""
    for op in ops:
        if op == "medusa_heads" and model.medusa_heads == 0:
            continue
        for phase in phases:
            b, s, q = largest_point(grid, op, phase)
            if not cost_fits(op, phase, model, b, s, q):
                return op, phase, b, s, q
    return None


def check_arithmetic(model: ModelConfig, grid: Grid, ops=OPS, phases=PHASES) -> None:
    """Refuse a grid whose largest point a model cannot be costed at (a FLOP or byte count
    past 64-bit integers), naming the point and the longest sequence (at the grid's
    batches) and largest batch (at its sequence lengths) that fit."""
    failing = failing_point(model, grid, ops, phases)
    if failing is None:
        return
    op, phase, b, s, q = failing

    def with_seq(n: int) -> Grid:
        return replace(grid, seq_lens=(n,), linear_tokens=tuple(t for t in grid.linear_tokens if t <= n))

    cands = max(grid.candidates) if Phase.TREE in phases else 1
    longest = largest_fitting(lambda n: failing_point(model, with_seq(n), ops, phases) is None, cands, s)
    largest = largest_fitting(lambda n: failing_point(model, replace(grid, batches=(n,)), ops, phases) is None, 1, b)
    fits = [
        f"seq_len up to {longest:,} at batch {max(grid.batches):,}" if longest else "",
        f"batch up to {largest:,} at seq_len {max(grid.seq_lens):,}" if largest else "",
    ]
    raise PerfkitError(
        f"{model.name} {op}/{phase} at batch {b:,}, seq_len {s:,}, candidates {q:,} costs more FLOPs or bytes than "
        f"64-bit integers count (about {INT64_MAX:.2e}); {' or '.join(f for f in fits if f) or 'not even batch 1'} fits"
    )


def check_ops(ops, phases) -> None:
    """One line naming an op or phase that is not one (ALL_OPS, PHASES)."""
    for op in ops:
        if op not in ALL_OPS:
            raise PerfkitError(f"unknown op {op!r}; choose from: {', '.join(ALL_OPS)}")
    for phase in phases:
        if phase not in PHASES:
            raise PerfkitError(f"unknown phase {phase!r}; choose from: {', '.join(PHASES)}")


def iter_blocks(model: ModelConfig, grid: Grid = PAPER_GRID, ops=OPS, phases=PHASES):
    """(op, phase, points) per op and phase; points is an int64 array of (batch, seq_len,
    candidates) rows (Grid.points: linear ops in prefill include the grid's linear_tokens).
    Ops the model lacks (medusa_heads with no heads) are left out. A grid too large to cost
    in int64 is a PerfkitError (check_arithmetic)."""
    check_ops(ops, phases)
    check_arithmetic(model, grid, ops, phases)
    for op in ops:
        if op == "medusa_heads" and model.medusa_heads == 0:
            continue
        for phase in phases:
            yield op, phase, np.array(grid.points(phase, op), dtype=np.int64).reshape(-1, 3)


def iter_points(model: ModelConfig, grid: Grid = PAPER_GRID, ops=OPS, phases=PHASES):
    """(op, phase, batch, seq_len, candidates) for every grid point, as Python ints."""
    for op, phase, points in iter_blocks(model, grid, ops, phases):
        for b, s, q in points.tolist():
            yield op, phase, b, s, q
