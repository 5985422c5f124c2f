"""An MoE layer's fused experts timed from the engines' own measurements (the `moe` tables
perfmodel.measured.aiconfigurator imports): the layer's time at the step's tokens, for the
model's expert shape (hidden size, expert size, top-k, experts), the experts' format, the split
over the tensor-parallel degree and the routing (perfmodel.models.moe).

Which rows: the stack the step is priced on where it measured that layer, else the device's
first engine that did (ENGINES order; the label says whose); of the splits the model allows,
the first measured (tensor-parallel experts, the engines' default, before expert parallelism).
Where an engine timed two kernels at a point (SGLang's FlashInfer beside its Triton), the
faster is kept; TensorRT-LLM's NVFP4 min-latency kernel (LOW_LATENCY_KERNELS, three times its
CUTLASS kernel's speed) prices decoding steps only, as TensorRT-LLM runs it in generation and
aiconfigurator reads it (a prefill priced on it came out at 0.54-0.63 of the peer's TTFT on
the B200).

Between measured token counts the time is interpolated linearly, as measured: an engine's
kernel choice can make more tokens faster (TensorRT-LLM on the H100, Qwen3-235B-A22B's layer split 8 ways: 2.5 ms at
768 tokens, 0.39 ms at 1,024), and holding the curve non-decreasing would carry such a point
to every larger step (a prefill of 1,024 tokens priced 4x what the peer reads from the same
rows). Past the largest count (16,384 tokens, a compute-bound layer) it grows in proportion to
the tokens, at the largest step's time per token (as the peer extrapolates: the slope between
the last two rows, often sub-linear there, put a 65,536-token prefill of gpt-oss 30% under it).

A shape no engine measured on the device is refused in one line naming the shapes that were:
nothing stands in for a measured layer (the datasheet roofline prices it only where asked for,
--latency datasheet).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodel.base.errors import PerfkitError
from perfmodel.base.precision import SIXTEEN_BIT
from perfmodel.latency.gemm_grid import preferred_stacks
from perfmodel.measured.aiconfigurator import MOE, MOE_SHAPE, ShippedStack
from perfmodel.measured.evidence import DeviceEvidence
from perfmodel.models.config import ModelConfig
from perfmodel.models.operators import Phase

# Kernels an engine runs in its generation steps only, not in prefill (the module doc).
LOW_LATENCY_KERNELS = ("moe_torch_flow_min_latency",)


def curve(rows) -> tuple[np.ndarray, np.ndarray]:
    """Token counts and seconds of a split's rows, the fastest kernel at each count."""
    fastest = rows.groupby("num_tokens")["time_s"].min()
    return fastest.index.to_numpy(dtype=float), fastest.to_numpy(dtype=float)


def experts_dtype(model: ModelConfig, dtype: str) -> str:
    """The format the experts' rows are named by: the experts' own (gpt-oss's mxfp4), else the
    weights' format, else bf16 for 16 bits (the tables time bf16; fp16 runs at the same rate)."""
    fmt = model.moe.experts_format or model.weights
    return str(fmt) if fmt is not None else "bf16" if dtype in SIXTEEN_BIT else dtype


@dataclass(frozen=True)
class MoeTimes:
    """One measured curve: the layer's seconds against the step's tokens."""

    stack: ShippedStack
    moe_tp: int
    moe_ep: int
    dtype: str
    routing: str
    tokens: np.ndarray
    seconds: np.ndarray
    prefill: tuple[np.ndarray, np.ndarray]  # (tokens, seconds) of the kernels prefill runs

    def time(self, tokens, phase: str = Phase.DECODE) -> np.ndarray:
        grid, seconds = self.prefill if phase == Phase.PREFILL else (self.tokens, self.seconds)
        x = np.asarray(tokens, dtype=float)
        inside = np.interp(x, grid, seconds)
        return np.where(x > grid[-1], seconds[-1] * x / grid[-1], inside)

    @property
    def split(self) -> str:
        if self.moe_tp * self.moe_ep == 1:
            return "on one device"
        return f"tensor-parallel experts (moe_tp {self.moe_tp})" if self.moe_tp > 1 else f"ep {self.moe_ep}"

    @property
    def label(self) -> str:
        return (
            f"experts: measured {self.dtype} MoE layers ({self.stack.describe()}; {self.split}, {self.routing} routing)"
        )


def moe_times(evidence: DeviceEvidence, stack: str | None, model: ModelConfig, dtype: str) -> MoeTimes:
    """The measured curve of `model`'s MoE layer (a shard: its tp is the degree) on the device
    (the module doc says which rows); one line where none is measured."""
    moe = model.moe
    key = ("moe_times", stack, model.hidden_size, moe, model.tp, experts_dtype(model, dtype))
    return evidence.derived(key, lambda: _moe_times(evidence, stack, model, dtype))


def _moe_times(evidence: DeviceEvidence, stack: str | None, model: ModelConfig, dtype: str) -> MoeTimes:
    moe, fmt = model.moe, experts_dtype(model, dtype)
    holding = preferred_stacks([s for s in evidence.with_table(MOE) if not s.is_torch], stack)
    shape = (model.hidden_size, moe.expert_size, moe.top_k, moe.experts)
    for held in holding:
        rows = held.table(MOE)
        rows = rows[(rows[MOE_SHAPE].to_numpy() == shape).all(axis=1) & (rows["dtype"] == fmt)]
        rows = rows[rows["distribution"] == moe.routing]
        for moe_tp, moe_ep in moe.splits(model.tp):
            split = rows[(rows["moe_tp"] == moe_tp) & (rows["moe_ep"] == moe_ep)]
            if len(split) >= 2:
                general = split[~split["kernel_source"].isin(LOW_LATENCY_KERNELS)]
                prefill = curve(general) if len(general) >= 2 else curve(split)
                return MoeTimes(held, moe_tp, moe_ep, fmt, str(moe.routing), *curve(split), prefill)
    raise PerfkitError(unmeasured(evidence, model, fmt, holding))


def unmeasured(evidence: DeviceEvidence, model: ModelConfig, fmt: str, holding: list[ShippedStack]) -> str:
    """The line refusing a layer no stack measured, naming what they did measure in its format."""
    moe = model.moe
    wanted = (
        f"hidden {model.hidden_size}, {moe.experts} experts of {moe.expert_size}, top-{moe.top_k}, {fmt}, "
        f"{moe.routing} routing, split {moe.split} over {model.tp} device(s)"
    )
    measured: set[tuple[int, ...]] = set()
    for held in holding:
        rows = held.table(MOE)
        measured |= set(rows.loc[rows["dtype"] == fmt, MOE_SHAPE].drop_duplicates().itertuples(False, None))
    shapes = ", ".join(f"{h}/{i}/top-{k}/{e}" for h, i, k, e in sorted(measured)) or "none"
    hint = (
        " (that shape is measured, at other splits: try --moe-parallel auto, or another --tp)"
        if (model.hidden_size, moe.expert_size, moe.top_k, moe.experts) in measured
        else f"; {fmt} shapes measured there (hidden/expert size/top-k/experts): {shapes}"
    )
    return f"{model.name}: no MoE layer of {wanted} is measured on {evidence.key}{hint}"
