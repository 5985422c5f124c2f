"""A latent-attention layer's module timed from the engines' own measurements (the
`mla_module` tables perfmodel.measured.aiconfigurator imports): DeepSeek-V3's attention module,
its projections, attention over the cached latents and output projection, per layer on one
device, at the device's share of the heads, in the projections' and the KV cache's formats.

Which rows: the stack the step is priced on where it measured the module, else the device's
first engine that did (ENGINES order; the label says whose). Only DeepSeek-V3's module shapes
were measured (hidden 7168, query latent 1536, KV latent 512, rotary key 64, value 128, at 1-128
heads: Kimi-K2's 64 heads are DeepSeek-V3's at tp 2); another shape, a head count or a format
not measured is refused in one line naming what was.

Reading a table (ModuleCurves): each measured batch is a curve in the sequence length,
interpolated linearly as measured; past its longest length a decoding step's module grows
linearly (attention over the cache is linear in its length: the slope of the last two rows) and
a prefill's as a + b s + c s^2 through the last two rows (causal attention is quadratic in the
prompt; c = 0 where they say otherwise). Between measured batches the time is interpolated
linearly in the batch; past the largest it grows in proportion to the batch.

A tree (or a chain) of q tokens per sequence is priced as q sequences of one token each over
the same context: the generation tables timed one query token per sequence, and this is how
aiconfigurator prices DeepSeek's MTP steps (its generation batch scaled by the tokens per step).
It is an upper bound where the kernel takes several queries per sequence at once (FlashMLA reads
a sequence's cache once for all of them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from perfmodel.base.errors import PerfkitError
from perfmodel.base.precision import SIXTEEN_BIT
from perfmodel.latency.gemm_grid import preferred_stacks
from perfmodel.measured.aiconfigurator import MLA_MODULE, ShippedStack
from perfmodel.measured.evidence import DeviceEvidence
from perfmodel.models.config import ModelConfig
from perfmodel.models.latent_attention import DEEPSEEK_V3
from perfmodel.models.operators import Phase


@dataclass(frozen=True)
class ModuleCurves:
    """One phase's measured module times: a curve in the sequence length per measured batch."""

    batches: np.ndarray
    lengths: tuple[np.ndarray, ...]
    seconds: tuple[np.ndarray, ...]
    quadratic: bool  # past the longest length: a prefill's quadratic growth, else a decoding step's linear

    @classmethod
    def of(cls, rows: pd.DataFrame, quadratic: bool) -> ModuleCurves:
        fastest = rows.groupby(["batch", "seq_len"])["time_s"].min().reset_index()
        curves = [part for _, part in fastest.groupby("batch") if len(part) >= 2]
        return cls(
            np.array([float(part["batch"].iloc[0]) for part in curves]),
            tuple(part["seq_len"].to_numpy(dtype=float) for part in curves),
            tuple(part["time_s"].to_numpy(dtype=float) for part in curves),
            quadratic,
        )

    def along(self, i: int, length: np.ndarray) -> np.ndarray:
        """Batch i's curve at `length` (the module doc says how past its longest)."""
        s, t = self.lengths[i], self.seconds[i]
        inside = np.interp(length, s, t)
        (s1, s2), (t1, t2) = s[-2:], t[-2:]
        if self.quadratic:
            c = max((t2 / s2 - t1 / s1) / (s2 - s1), 0.0)
            beyond = (t2 / s2 - c * s2) * length + c * length**2
        else:
            beyond = t2 + max((t2 - t1) / (s2 - s1), 0.0) * (length - s2)
        return np.where(length > s2, beyond, inside)

    def time(self, batch, length) -> np.ndarray:
        b, s = (np.asarray(x, dtype=float) for x in np.broadcast_arrays(batch, length))
        flat_b, grid = b.ravel(), self.batches
        at = np.stack([self.along(i, s.ravel()) for i in range(len(grid))])  # (measured batches, points)
        hi = np.clip(np.searchsorted(grid, flat_b), 0, len(grid) - 1)
        lo = np.maximum(hi - 1, 0)
        points = np.arange(flat_b.size)
        span = grid[hi] - grid[lo]
        w = np.divide(flat_b - grid[lo], span, out=np.zeros_like(flat_b), where=span > 0).clip(0.0, 1.0)
        inside = at[lo, points] + w * (at[hi, points] - at[lo, points])
        return np.where(flat_b > grid[-1], at[-1] * flat_b / grid[-1], inside).reshape(b.shape)


@dataclass(frozen=True)
class MlaTimes:
    """One device's measured module: decoding and prefill curves of one stack, head count and formats."""

    stack: ShippedStack
    heads: int
    dtype: str  # the projections' format
    kv_cache: str
    decode: ModuleCurves
    prefill: ModuleCurves

    def time(self, phase: str, batch, seq_len, q_len) -> np.ndarray:
        """Seconds of one layer's module: a prefill of `batch` prompts of `seq_len`, or a decoding
        step of `q_len` tokens per sequence over `seq_len` attended tokens (the module doc)."""
        if phase == Phase.PREFILL:
            return self.prefill.time(batch, seq_len)
        return self.decode.time(np.asarray(batch) * np.asarray(q_len), seq_len)

    @property
    def label(self) -> str:
        return (
            f"latent attention: measured {self.dtype} DeepSeek-V3 MLA modules over a {self.kv_cache} cache "
            f"({self.stack.describe()}; {self.heads} heads a device)"
        )


def module_formats(model: ModelConfig, dtype: str) -> tuple[str, str]:
    """The projections' and the cache's formats the rows are named by (bf16 for 16 bits)."""
    sixteen = "bf16" if dtype in SIXTEEN_BIT else dtype
    return str(model.weights or sixteen), str(model.kv_cache or sixteen)


def mla_times(evidence: DeviceEvidence, stack: str | None, model: ModelConfig, dtype: str) -> MlaTimes:
    """The measured module of `model` (a shard: its heads are the device's) on the device (the
    module doc says which rows); one line where none is measured."""
    key = ("mla_times", stack, model.hidden_size, model.mla, model.num_heads, module_formats(model, dtype))
    return evidence.derived(key, lambda: _mla_times(evidence, stack, model, dtype))


def _mla_times(evidence: DeviceEvidence, stack: str | None, model: ModelConfig, dtype: str) -> MlaTimes:
    fmt, cache = module_formats(model, dtype)
    holding = preferred_stacks([s for s in evidence.with_table(MLA_MODULE) if not s.is_torch], stack)
    if (model.hidden_size, model.mla) == DEEPSEEK_V3:
        for held in holding:
            rows = held.table(MLA_MODULE)
            rows = rows[(rows["num_heads"] == model.num_heads) & (rows["dtype"] == fmt) & (rows["kv_cache"] == cache)]
            decode, prefill = (rows[rows["phase"] == phase] for phase in (Phase.DECODE, Phase.PREFILL))
            if len(decode) >= 4 and len(prefill) >= 4:
                curves = ModuleCurves.of(decode, False), ModuleCurves.of(prefill, True)
                return MlaTimes(held, model.num_heads, fmt, cache, *curves)
    raise PerfkitError(unmeasured(evidence, model, fmt, cache, holding))


def unmeasured(evidence: DeviceEvidence, model: ModelConfig, fmt: str, cache: str, holding: list) -> str:
    """The line refusing a module no stack measured, naming what they did measure."""
    wanted = f"{model.num_heads} heads a device, {fmt} projections, {cache} KV cache"
    if not holding:
        return (
            f"{model.name}: no engine measured latent attention on {evidence.key} (DeepSeek-V3's MLA module is "
            "measured on the H100, H200, B200, B300, GB200, GB300, L40S and RTX PRO 6000; or --latency datasheet)"
        )
    if (model.hidden_size, model.mla) != DEEPSEEK_V3:
        return (
            f"{model.name}: its latent attention (hidden {model.hidden_size}, {model.mla.describe()}) is not "
            "DeepSeek-V3's, the one MLA module the engines measured (hidden 7168, query latent 1536, KV latent 512 + "
            "rotary key 64, value 128); --latency datasheet prices it from the roofline"
        )
    measured = set()
    for held in holding:
        rows = held.table(MLA_MODULE)
        measured |= set(rows[["num_heads", "dtype", "kv_cache"]].drop_duplicates().itertuples(False, None))
    shown = ", ".join(f"{n} heads {d}/{c}" for n, d, c in sorted(measured))
    return f"{model.name}: no MLA module of {wanted} is measured on {evidence.key}; measured: {shown}"
