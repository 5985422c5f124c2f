"""One decoding step of a whole model: which operators it runs, how often, and what it costs.

A step is a list of `StepOp`s, each an operator of perfmodel.models.operators run `count` times
in a phase. Three inventories:

- `paper`: the paper's simplified Llama block (Appendix G.3): XW_Q, XW_K, XW_V, QK^T, PV,
  XW_u, XW_g, XW_d, one layer, verification ignored. A preset for reproducing its figures.
- `full`: everything a serving engine runs per step: per layer two norms, the fused QKV
  projection, RoPE, the KV-cache write, fused attention over the context plus the tree,
  o, two residual adds, the fused gate+up projection, SiLU-and-multiply, down; once the
  embedding, the final norm and the LM head over every token; and for Medusa the heads
  (on one token per sequence), building the candidates, verifying them, building the tree
  mask and moving the accepted KV entries. What the latency source's stack runs fused, it
  prices fused (perfmodel.latency.fusion: an engine's residual add + RMSNorm as one
  `add_norm`, TensorRT-LLM's RoPE and KV-cache write inside attention).
- `reference`: `full` as this toolkit's reference decoder runs it: separate q/k/v and
  gate/up projections (as its checkpoint stores them), and it also builds the attention
  mask and commits the accepted (one-token) path in plain decoding steps.

Latency comes from a `LatencySource`: anything with `op_time(op, phase, batch, seq_len,
candidates) -> seconds` (numpy arrays in, an array out). perfmodel.latency.roofline.RooflineLatency
predicts from a spec; perfmodel.latency.calibration.MeasuredLatency interpolates a measured sweep
and FittedRoofline fits the roofline to one.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

import numpy as np
import pandas as pd

from perfmodel.base.errors import PerfkitError
from perfmodel.latency.fusion import UNFUSED, Fusion, stack_fusion
from perfmodel.latency.step_cost import PricedBySource
from perfmodel.models.config import ModelConfig


class StepFlavor(StrEnum):
    """Which step a model prices: the paper's simplified Llama block, the whole model from its
    operator inventory, the reference implementation's step, or the decoder's traced kernels
    (perfmodel.latency.traced). A str: it prints and writes as its name; code compares members."""

    PAPER = "paper"
    FULL = "full"
    REFERENCE = "reference"
    TRACED = "traced"


FLAVORS = (StepFlavor.PAPER, StepFlavor.FULL, StepFlavor.REFERENCE)  # what StepModel prices

# What the full step (an engine's kernels, its CUDA-graph replays) leaves out, said above every
# point answer that prices it: both sides of its speedup lack them, the speculative step more of them.
FULL_STEP_LEAVES_OUT = (
    "  full leaves out: the sampler (a rejection sampler over every verified token when speculating) and the "
    "engine's per-iteration host work outside its CUDA graphs, for the plain and the speculative step alike: no GPU "
    "engine's speculative step has been measured here to price them (python -m perfmodel.published_check: what the "
    "published engine rows imply beyond the step)"
)


# The name a windowed layer's attention goes by in a step's breakdown (perfmodel.models.window)
WINDOW_ATTENTION = "sdpa_window"


class LatencySource(Protocol):
    def op_time(self, op: str, phase: str, batch, seq_len, candidates) -> np.ndarray: ...


@dataclass(frozen=True)
class StepOp:
    """`op` run `count` times per step.

    `tokens` says what it runs on: "step" (the step's tokens: 1 per sequence in plain
    decoding, the tree's q in a Medusa step) or "last" (one token per sequence, as the
    Medusa heads read the last accepted token's hidden state). `kv` adds the step's own
    tokens to the attended length (fused attention and the mask see the context plus the
    tree); the paper's qk/pv attend to the s cached tokens only.
    """

    op: str
    count: int = 1
    tokens: str = "step"
    kv: bool = False
    label: str = ""
    window: int | None = None  # attention over the last `window` cached tokens only (perfmodel.models.window)

    @property
    def name(self) -> str:
        return self.label or self.op


def check_flavor(flavor: str) -> None:
    if flavor not in FLAVORS:
        raise PerfkitError(f"unknown step flavor {flavor!r}; choose from: {', '.join(FLAVORS)}")


def layer_ops(model: ModelConfig, flavor: str, fusion: Fusion = UNFUSED) -> tuple[StepOp, ...]:
    """The ops every token runs through: each layer's (the paper's one layer) and, outside the
    paper's step, the embedding. The full step runs what `fusion` fuses fused: each residual
    add with the norm after it (the last with the final norm), RoPE and the KV write inside
    attention."""
    check_flavor(flavor)
    if flavor == StepFlavor.PAPER:
        mlp = ("router", "moe") if model.moe else ("up", "gate", "down")
        attention = ("mla",) if model.mla else ("q", "k", "v", "qk", "pv")
        return tuple(StepOp(op) for op in (*attention, *mlp))
    layers = model.num_layers
    fused = flavor == StepFlavor.FULL
    fusion = fusion if fused else UNFUSED
    norms = (StepOp("add_norm", 2 * layers),) if fusion.add_norm else (StepOp("norm", 2 * layers),)
    residuals = () if fusion.add_norm else (StepOp("residual", 2 * layers),)
    return (*norms, *attention_block(model, fused, fusion), *residuals, *mlp_ops(model, fused), StepOp("embed"))


def attention_block(model: ModelConfig, fused: bool, fusion: Fusion) -> tuple[StepOp, ...]:
    """Each layer's attention from its input norm to its output projection: q/k/v (fused or
    not), RoPE and the KV write (inside attention where `fusion` says so), attention and o; a
    latent-attention layer's one module (perfmodel.models.mla_operators), which runs all of it."""
    layers = model.num_layers
    if model.mla is not None:
        return (StepOp("mla", layers, kv=True),)
    rope_kv = () if fusion.rope_kv_in_attention else tuple(StepOp(op, layers) for op in ("rope", "kv_write"))
    qkv = tuple(StepOp(op, layers) for op in (("qkv",) if fused else ("q", "k", "v")))
    return (*qkv, *rope_kv, *attention_ops(model), StepOp("o", layers))


def attention_ops(model: ModelConfig) -> tuple[StepOp, ...]:
    """Each layer's fused attention: over the whole context, or in a windowed layer over its window."""
    window = model.window
    if window is None:
        return (StepOp("sdpa", model.num_layers, kv=True),)
    full = (StepOp("sdpa", model.num_layers - window.layers, kv=True),) if window.layers < model.num_layers else ()
    return (*full, StepOp("sdpa", window.layers, kv=True, label=WINDOW_ATTENTION, window=window.tokens))


def mlp_ops(model: ModelConfig, fused: bool) -> tuple[StepOp, ...]:
    """Each layer's MLP: a dense one (gate and up, fused or not, the activation, down), or in an
    MoE model's expert layers the router, the fused experts and any shared expert."""
    dense = model.dense_layers
    ops = (("gate_up",) if fused else ("gate", "up")) + ("act", "down")
    experts = ("router", "moe", "shared_expert") if model.moe and model.moe.shared_size else ("router", "moe")
    moe = tuple(StepOp(op, model.num_layers - dense) for op in experts) if model.moe else ()
    return tuple(StepOp(op, dense) for op in ops if dense) + moe


def step_inventory(
    model: ModelConfig, flavor: str, medusa: bool, with_heads: bool = True, fusion: Fusion = UNFUSED
) -> tuple[StepOp, ...]:
    """The ops of one plain (medusa=False) or Medusa tree (medusa=True) decoding step.
    with_heads=False: a tree step whose tree another drafter drafted (EAGLE, a draft model,
    priced apart: perfmodel.latency.eagle), so without the heads and the candidates built
    from them; it still verifies the tree and commits the accepted path."""
    per_token = layer_ops(model, flavor, fusion)
    if flavor == StepFlavor.PAPER:
        return per_token
    once = (StepOp("norm", label="final_norm"), StepOp("lm_head"), StepOp("verify"))
    # The reference decoder builds the mask and commits the accepted path (a one-token
    # path in plain decoding) in every step; an engine does so in Medusa steps only.
    every_step = flavor == StepFlavor.REFERENCE
    mask = (StepOp("mask", kv=True),) if medusa or every_step else ()
    heads = medusa and with_heads and model.medusa_heads > 0
    tree = (StepOp("medusa_heads", tokens="last"), StepOp("candidates")) if heads else ()
    drafted = heads or (medusa and not with_heads)
    commit = (StepOp("kv_move"),) if drafted or every_step else ()
    return per_token + once + mask + tree + commit


def prefill_inventory(model: ModelConfig, flavor: str, medusa: bool, fusion: Fusion = UNFUSED) -> tuple[StepOp, ...]:
    """The ops of a prompt's prefill: layer_ops over every prompt token, then the final norm,
    LM head (and Medusa heads, for the first tree's candidates) on the last token only, as
    engines compute logits for the last position. The paper's step is its layer alone."""
    if flavor == StepFlavor.PAPER:
        return layer_ops(model, flavor)
    last = (StepOp("norm", label="final_norm", tokens="last"), StepOp("lm_head", tokens="last"))
    heads = (StepOp("medusa_heads", tokens="last"),) if medusa and model.medusa_heads else ()
    return layer_ops(model, flavor, fusion) + last + heads


def step_calls(
    model: ModelConfig, flavor: str, batch, seq_len, candidates=1, with_heads: bool = True, fusion: Fusion = UNFUSED
):
    """(step op, phase, batch, seq_len, candidates, where) for every op call of the
    steps at the points given (broadcast arrays): the points each op runs at, and a
    mask of the step points they belong to. candidates == 1 is a plain decoding step;
    > 1 a Medusa tree step of that many tokens (root included) over a context of
    seq_len cached tokens (with_heads, fusion: as step_inventory). What a step runs needs
    no latency source: a measurement lists the calls it must time before it has any."""
    b, s, q = (np.asarray(x, dtype=np.int64) for x in np.broadcast_arrays(batch, seq_len, candidates))
    if (b < 1).any() or (s < 1).any() or (q < 1).any():
        raise PerfkitError("batch, seq_len and candidates must all be >= 1")
    medusa = q > 1
    for kind, where in ((False, ~medusa), (True, medusa)):
        if not where.any():
            continue
        bb, ss, qq = b[where], s[where], q[where]
        phase = "tree" if kind else "decode"
        for item in step_inventory(model, flavor, kind, with_heads, fusion):
            seen = ss if item.window is None else np.minimum(ss, item.window)
            if item.tokens == "last":
                yield item, "decode", bb, seen, np.ones_like(qq), where
            else:
                yield item, phase, bb, seen + qq if item.kv and kind else seen, qq if kind else np.ones_like(qq), where


def distinct_points(calls) -> list[tuple[str, str, int, int, int]]:
    """The distinct (op, phase, batch, seq_len, candidates) points of op calls (step op,
    phase, batch, seq_len, candidates arrays, ...), in order of first call."""
    points: dict[tuple[str, str, int, int, int], None] = {}
    for item, phase, b, s, q, *_ in calls:
        for point in zip(b.tolist(), s.tolist(), q.tolist()):
            points.setdefault((item.op, phase, *point), None)
    return list(points)


def op_points(
    model: ModelConfig, flavor: str, batch, seq_len, candidates=1, with_heads: bool = True
) -> list[tuple[str, str, int, int, int]]:
    """The distinct (op, phase, batch, seq_len, candidates) points the steps given run
    their ops at, in order of first call: what timing those steps takes."""
    return distinct_points(step_calls(model, flavor, batch, seq_len, candidates, with_heads))


@dataclass(frozen=True)
class StepModel(PricedBySource):
    """Step latency of a model from a latency source, for plain and Medusa steps
    (with_heads=False: tree steps verifying a tree another drafter drafted, step_inventory)."""

    model: ModelConfig
    latency: LatencySource
    flavor: str = "full"
    with_heads: bool = True

    def __post_init__(self) -> None:
        check_flavor(self.flavor)

    @property
    def label(self) -> str:
        """The latency source's label, and what the step runs fused where it fuses anything."""
        fusion = self.fusion
        if fusion == UNFUSED:
            return self.latency.label
        shared = self.model.moe is not None and bool(self.model.moe.shared_size)
        return f"{self.latency.label}; the step as the engine runs it: {fusion.describe(shared)}"

    @property
    def fusion(self) -> Fusion:
        """What the step runs fused: the full step as its latency source's stack runs it
        (perfmodel.latency.fusion); the paper's and the reference decoder's steps unfused."""
        return stack_fusion(getattr(self.latency, "stack", None)) if self.flavor == StepFlavor.FULL else UNFUSED

    def calls(self, batch, seq_len, candidates=1):
        """The op calls of the steps at the points given (step_calls)."""
        return step_calls(self.model, self.flavor, batch, seq_len, candidates, self.with_heads, self.fusion)

    def op_times(self, batch, seq_len, candidates=1) -> dict[str, np.ndarray]:
        """Seconds per step spent in each op (summed over its count), broadcast over the
        arrays given (see `calls`)."""
        shape = np.broadcast(batch, seq_len, candidates).shape
        out: dict[str, np.ndarray] = {}
        for item, phase, b, s, q, where in self.calls(batch, seq_len, candidates):
            full = out.setdefault(item.name, np.zeros(shape))
            full[where] += item.count * np.asarray(self.latency.op_time(item.op, phase, b, s, q), dtype=float)
        if self.fusion.shared_expert_stream and "shared_expert" in out:
            # beside the router and the routed experts (perfmodel.latency.fusion): what it takes beyond them
            tokens = np.broadcast_to(np.asarray(batch) * np.asarray(candidates), shape)
            beyond = np.maximum(out["shared_expert"] - out["router"] - out["moe"], 0.0)
            out["shared_expert"] = np.where(tokens <= self.fusion.shared_expert_stream, beyond, out["shared_expert"])
        return out

    def step_time(self, batch, seq_len, candidates=1) -> np.ndarray:
        """Seconds per decoding step."""
        return sum(self.op_times(batch, seq_len, candidates).values())

    def prefill_time(self, batch, prompt_len, medusa: bool = False) -> np.ndarray:
        """Seconds to prefill `batch` prompts of `prompt_len` tokens each (arrays broadcast):
        prefill_inventory's ops, the per-token ones at the prefill phase over the prompt."""
        b, s = (np.asarray(x, dtype=np.int64) for x in np.broadcast_arrays(batch, prompt_len))
        if (b < 1).any() or (s < 1).any():
            raise PerfkitError("batch and prompt_len must both be >= 1")
        total = np.zeros(b.shape)
        for item in prefill_inventory(self.model, self.flavor, medusa, self.fusion):
            phase = "decode" if item.tokens == "last" else "prefill"
            # a windowed layer runs the prompt as windows, each attending to one window's keys
            seen = s if item.window is None else np.minimum(s, item.window)
            windows = s / seen
            time = np.asarray(self.latency.op_time(item.op, phase, b, seen, np.ones_like(b)), dtype=float)
            total += item.count * windows * time
        return total

    def overhead(self, batch, seq_len, candidates) -> np.ndarray:
        """Medusa step latency over plain step latency (the paper's "overhead")."""
        return self.step_time(batch, seq_len, candidates) / self.step_time(batch, seq_len, 1)

    def breakdown(self, batch: int, seq_len: int, candidates: int = 1) -> pd.DataFrame:
        """Per-op seconds of one step, largest first, with each op's share."""
        times = {k: float(np.asarray(v).ravel()[0]) for k, v in self.op_times(batch, seq_len, candidates).items()}
        total = sum(times.values())
        df = pd.DataFrame({"op": list(times), "time_s": list(times.values())})
        df["share"] = df["time_s"] / total
        return df.sort_values("time_s", ascending=False, ignore_index=True)
