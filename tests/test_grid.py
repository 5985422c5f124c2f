"""The sweep grids: the fine token grid of linear ops, and the points it adds."""

from __future__ import annotations

import pytest

from perfmodel.base.errors import PerfkitError
from perfmodel.models.grid import PAPER_GRID, QUICK_GRID, Grid, fine_token_grid, iter_blocks, iter_points
from perfmodel.models.operators import ATTENTION_OPS, LINEAR_OPS, PHASES, op_kernels
from tests.conftest import TINY

EVERY_8_TO_512 = tuple(range(8, 513, 8))


def test_fine_token_grid_is_every_8_tokens_to_512_then_powers_of_two():
    assert fine_token_grid(8192) == (1, 2, 4, *EVERY_8_TO_512, 1024, 2048, 4096, 8192)
    assert fine_token_grid(512) == (1, 2, 4, *EVERY_8_TO_512)
    assert fine_token_grid(5000) == (1, 2, 4, *EVERY_8_TO_512, 1024, 2048, 4096)  # none above the largest
    assert fine_token_grid(1023) == fine_token_grid(512)
    assert fine_token_grid(100) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96)
    assert fine_token_grid(3) == (1, 2) and fine_token_grid(1) == (1,)
    grid = fine_token_grid(1 << 20)
    assert len(grid) == 3 + 64 + 11 and grid[-1] == 1 << 20


@pytest.mark.parametrize("largest", [0, -8, 2.5, True, "512"])
def test_fine_token_grid_needs_a_positive_integer(largest):
    with pytest.raises(PerfkitError, match="largest token count must be a positive integer"):
        fine_token_grid(largest)


def test_linear_ops_get_the_token_counts_as_prefill_rows_of_one_sequence():
    grid = Grid(batches=(2, 4), seq_lens=(16, 64), candidates=(1, 8)).with_fine_tokens()
    assert grid.linear_tokens == fine_token_grid(64) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
    coarse = grid.with_fine_tokens(False)
    assert coarse == Grid((2, 4), (16, 64), (1, 8)) and coarse.linear_tokens == ()
    for op in LINEAR_OPS:
        prefill = grid.points("prefill", op)
        extra = [(1, t, 1) for t in grid.linear_tokens]
        assert prefill == sorted(coarse.points("prefill") + extra) and len(set(prefill)) == len(prefill)
        for t in grid.linear_tokens:  # the same GEMM as t tokens of any phase: (t x k) by the weight
            (matmul,) = op_kernels(op, "prefill", TINY, 1, t, 1)
            (decode,) = op_kernels(op, "decode", TINY, t, 100, 1)
            assert matmul.m == t and matmul == decode
        for phase in ("decode", "tree"):
            assert grid.points(phase, op) == coarse.points(phase)
    for op in (*ATTENTION_OPS, "sdpa", "medusa_heads", "norm"):  # attention and the rest keep their grid
        for phase in PHASES:
            assert grid.points(phase, op) == coarse.points(phase)


def test_token_points_on_the_grid_already_are_not_repeated():
    fine = PAPER_GRID.with_fine_tokens()
    assert fine.linear_tokens == fine_token_grid(8192)
    points = fine.points("prefill", "up")
    # 1024..8192 tokens at batch 1, and 128, 256 and 512, are the paper grid's own settings.
    assert len(points) == len(set(points)) == 49 + len(fine.linear_tokens) - 7
    assert QUICK_GRID.with_fine_tokens().linear_tokens == fine_token_grid(512)


def test_narrowing_keeps_the_token_counts_and_they_are_validated():
    fine = QUICK_GRID.with_fine_tokens()
    assert fine.narrowed(batches=[4]).linear_tokens == fine.linear_tokens
    assert QUICK_GRID.narrowed(seq_lens=[40]).with_fine_tokens().linear_tokens == (1, 2, 4, 8, 16, 24, 32, 40)
    with pytest.raises(PerfkitError, match="linear_tokens must be positive integers"):
        Grid((1,), (8,), (1,), linear_tokens=(8, 0))


def test_iteration_yields_the_token_points_for_linear_ops_only():
    grid = Grid((2,), (16,), (1,)).with_fine_tokens()
    points = list(iter_points(TINY, grid, ops=("up", "qk"), phases=("prefill", "decode")))
    up_prefill = [(b, s, q) for op, phase, b, s, q in points if (op, phase) == ("up", "prefill")]
    assert up_prefill == [(1, 1, 1), (1, 2, 1), (1, 4, 1), (1, 8, 1), (1, 16, 1), (2, 16, 1)]
    assert [p for p in points if p[0] == "qk"] == [("qk", "prefill", 2, 16, 1), ("qk", "decode", 2, 16, 1)]
    blocks = {(op, phase): pts for op, phase, pts in iter_blocks(TINY, grid, ("up",), ("prefill",))}
    assert blocks[("up", "prefill")].tolist() == [list(p) for p in up_prefill]
