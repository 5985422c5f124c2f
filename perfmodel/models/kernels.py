"""The kernels an operator runs (perfmodel.models.operators says which, with what shapes):
matmuls, fused attention, memory-bound elementwise work, and their FLOP and byte counts
(perfmodel.models.operators's module doc gives the counting convention)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Matmul:
    """(batch, m, k) @ (batch, k, n) -> (batch, m, n).

    `weight` marks a linear layer: the right operand is a (k, n) parameter shared by all
    m token rows, and batch is 1. Dimensions may be numpy integer arrays (one element per
    grid point) so a whole sweep is costed at once; the shape properties need ints.
    """

    batch: int
    m: int
    k: int
    n: int
    weight: bool = False

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.k * self.n

    @property
    def elements(self) -> int:
        """Elements moved: both inputs read once, the output written once."""
        return self.batch * (self.m * self.k + self.k * self.n + self.m * self.n)

    @property
    def left_shape(self) -> tuple[int, ...]:
        return (self.m, self.k) if self.weight else (self.batch, self.m, self.k)

    @property
    def right_shape(self) -> tuple[int, ...]:
        return (self.k, self.n) if self.weight else (self.batch, self.k, self.n)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.m, self.n) if self.weight else (self.batch, self.m, self.n)


@dataclass(frozen=True)
class FusedAttention:
    """softmax(Q K^T / sqrt(d) + mask) V in one kernel, for `batch` sequences.

    Q and the output are (batch, heads, q_len, d); K and V are (batch, kv_heads, kv_len, d).
    The score matrix never reaches memory, so bytes are Q, K, V read and the output
    written. `causal` (prefill) kernels skip the masked upper triangle, so they count
    (kv_len + 1) / (2 kv_len) of the dense FLOPs; tree and decode masks are computed densely.
    """

    batch: int
    heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    head_dim: int
    causal: bool = False

    @property
    def flops(self):
        if self.causal:  # dense * (kv_len + 1) / (2 kv_len), exactly, without the cubic int64 intermediate
            return 2 * self.batch * self.heads * self.q_len * (self.kv_len + 1) * self.head_dim
        return 4 * self.batch * self.heads * self.q_len * self.kv_len * self.head_dim

    @property
    def elements(self):
        return self.batch * self.head_dim * (2 * self.heads * self.q_len + 2 * self.kv_heads * self.kv_len)


@dataclass(frozen=True)
class Operand:
    """A tensor of a step op: the shape a benchmark allocates (or the op returns), and
    how many of its elements the op reads and writes. A gather reads some rows of its
    table and a cache write fills some slots of the cache, so these need not be the size."""

    shape: tuple
    reads: int = 0
    writes: int = 0


def read(*shape) -> Operand:
    return Operand(shape, reads=math.prod(shape))


def written(*shape) -> Operand:
    return Operand(shape, writes=math.prod(shape))


@dataclass(frozen=True)
class Elementwise:
    """A memory-bound kernel reading `reads` and writing `writes` elements, `flops` of math.

    `operands` names the tensors those elements belong to (see step_operands)."""

    reads: int
    writes: int
    flops: int
    operands: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def elements(self):
        return self.reads + self.writes


@dataclass(frozen=True)
class OpCost:
    flops: int
    bytes: int
    kernels: int

    @property
    def intensity(self):
        """Operational intensity in FLOP/byte (nan for an op that moves no bytes); an
        array when the cost is of many grid points."""
        flops, moved = np.asarray(self.flops, dtype=float), np.asarray(self.bytes, dtype=float)
        out = np.divide(flops, moved, out=np.full(np.broadcast(flops, moved).shape, np.nan), where=moved > 0)
        return float(out) if out.ndim == 0 else out
